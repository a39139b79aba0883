"""`finetune`: capture (or reuse) self-distillation data, train, evaluate, write a vLLM-ready draft only if it gains.

The result is written only when its held-out gain over its source is resolved (eaglekit.finetune.evaluate:
the paired interval over every condition clears zero); otherwise nothing is written and the measurement is said,
unless `keep_unresolved`, which writes it and records so. The output keeps the source's layout, config and
every tensor that was not trained byte for byte; trained tensors are written in their source dtype. It is built
in a staging directory, validated as vLLM will read it, and only then moved into place, so a failed or killed
run leaves no output.
"""

from __future__ import annotations

import dataclasses
import json
import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from eaglekit import __version__
from eaglekit.errors import CheckpointError, NoGain, OutputError, UsageError
from eaglekit.families import load_draft
from eaglekit.finetune.data import DataOptions, TrainingData, build_data, split_validation, target_identity
from eaglekit.finetune.evaluate import EvalOptions, Evaluation, held_out_prompts
from eaglekit.io.dtypes import torch_dtype
from eaglekit.io.jsonfile import load_json_object
from eaglekit.io.outputs import OUTPUT, Role, read_roles, refuse_clobber, target_roles
from eaglekit.quantization import scheme
from eaglekit.redact import public_path, public_report
from eaglekit.spec import DraftSpec
from eaglekit.target import TargetInfo, read_target

Stage = Callable[[str, int, int], None]
WRITABLE_DTYPES = ("F32", "BF16", "F16")  # trained tensors are written back in their source dtype


@dataclass(frozen=True)
class FinetuneOptions:
    target: str
    data: DataOptions = DataOptions()
    train: Any = None  # eaglekit.finetune.train.TrainOptions (imported lazily: it needs torch)
    eval: EvalOptions | None = EvalOptions()
    device: str = "cpu"
    target_dtype: str = "float32"  # the target's dtype for capture and evaluation
    target_quantization: str | None = None  # capture from, and evaluate against, the target with these numerics
    checkpoint_dir: str | None = None  # default: DST + ".checkpoint" (removed after a successful run)
    checkpoint_every: int = 0
    resume: bool = False
    force: bool = False
    plot: str | None = None  # PNG path of the loss and per-depth accuracy curves
    warm_start: str = "auto"  # auto: set up what upgrade switched on untrained (eaglekit.finetune.warm_start)
    validation_fraction: float = 0.1  # captured sequences held out to select the checkpoint
    from_scratch: bool = False  # re-initialise every trained weight: retrain as EAGLE-3.1
    keep_unresolved: bool = False  # write the output even without a resolved held-out gain over its source
    store: str | None = None  # a hidden-state store (eaglekit capture): the target's decoder is never loaded
    max_resident_shards: int = 2  # store shards decoded in memory at once
    soft_targets: int = 0  # from a store: train on the target's top-k next-token probabilities (0: greedy labels)


@dataclass
class FinetuneReport:
    source: dict[str, Any]
    output: dict[str, Any]
    target: str
    data: dict[str, Any]
    training: dict[str, Any]
    options: dict[str, Any]
    evaluation: dict[str, Any] = field(default_factory=dict)
    evaluation_prompts: str | None = None
    findings: list[dict[str, Any]] = field(default_factory=list)
    plot: str | None = None
    notes: list[str] = field(default_factory=list)
    timings: dict[str, float] = field(default_factory=dict)
    written: str = ""  # why the output was written (written_because)
    rank: int = 0  # under torchrun only rank 0 evaluates, writes and reports

    def gains(self) -> list[dict[str, Any]]:
        """τ after minus τ before, per condition (template and context)."""
        def key(e: dict[str, Any]) -> tuple[str, int]:
            return e["template"], e["context_tokens"]

        before = {key(e): e for e in self.evaluation.get("before", [])}
        return [{"template": a["template"], "context_tokens": a["context_tokens"],
                 "acceptance_length_gain": round(a["acceptance_length"] - before[key(a)]["acceptance_length"], 4)}
                for a in self.evaluation.get("after", []) if key(a) in before]

    def to_dict(self) -> dict[str, Any]:
        served = scheme(self.options.get("target_quantization"))
        return {
            "eaglekit_version": __version__, "source": self.source, "output": self.output, "target": self.target,
            **({"target_quantization": served.to_dict()} if served else {}),
            "data": self.data, "training": self.training, "options": self.options,
            "evaluation": {**self.evaluation, "prompts": self.evaluation_prompts, "gain": self.gains()},
            "written": self.written, "findings": self.findings, "plot": self.plot, "notes": self.notes,
            "timings": {k: round(v, 3) for k, v in self.timings.items()},
        }


def _source_spec(source: str, info: TargetInfo) -> DraftSpec:
    spec = load_draft(source, target=info)
    if not spec.facts.vllm_layout:
        raise UsageError(f"finetune trains drafts in vLLM's layout; this one reads as {spec.family}: run "
                         f"`eaglekit upgrade {source} DIR` first and fine-tune DIR", spec.path)
    if spec.aux.ids is None:
        raise CheckpointError("the draft records no aux layer ids, so the states to train on are unknown", spec.path)
    odd = sorted({r.dtype for r in spec.tensors.values() if r.dtype not in WRITABLE_DTYPES and r.dtype[0] == "F"})
    if odd:
        raise CheckpointError(f"{odd[0]} tensors cannot be fine-tuned (only F32 / BF16 / F16 drafts)", spec.path)
    return spec


def _refuse_clobber(spec: DraftSpec, destination: str, checkpoint_dir: str, opts: FinetuneOptions) -> None:
    """Every path finetune writes (the output, --plot, the checkpoint folder, the data cache) against everything
    it reads, before any work."""
    from eaglekit.finetune.data import default_cache_dir

    writes = [Role(OUTPUT, destination), Role("--plot", opts.plot or ""),
              Role("--checkpoint-dir" if opts.checkpoint_dir else "--checkpoint-dir (default OUT.checkpoint)",
                   checkpoint_dir, makes_parents=True)]
    if not opts.data.hidden_states and not opts.store:  # captured data is cached; states read elsewhere are not
        writes.append(Role("--cache-dir" if opts.data.cache_dir else "--cache-dir (default)",
                           opts.data.cache_dir or default_cache_dir(), makes_parents=True))
    reads = [*read_roles("source", spec.path), *target_roles(opts.target),
             *read_roles("--hidden-states", opts.data.hidden_states), *read_roles("--data", opts.data.data_file),
             *read_roles("--store", opts.store),
             *read_roles("--eval-prompts", opts.eval.prompts_file if opts.eval else None)]
    refuse_clobber(writes, reads)


def _check_evaluation(opts: FinetuneOptions, info: TargetInfo) -> None:
    """What the held-out evaluation after training would refuse, refused before it: its settings, its prompts,
    and its decode against the target's context."""
    from eaglekit.decode.setup import refuse_context_past_target

    if opts.eval is None or opts.data.hidden_states or opts.store:  # states read from elsewhere: not evaluated
        return
    opts.eval.check()
    held_out_prompts(opts.eval)
    refuse_context_past_target(opts.eval.decode_options(), info.max_position_embeddings, "--eval-context-tokens")


def _target_tensor(target_dir: str, names: tuple[str, ...]):
    """One tensor straight from the target's safetensors (the embedding a draft borrows), without the model."""
    from safetensors import safe_open

    index = os.path.join(target_dir, "model.safetensors.index.json")
    if os.path.isfile(index):
        weight_map = load_json_object(index, "target index").get("weight_map")
        weight_map = weight_map if isinstance(weight_map, dict) else {}
    else:
        weight_map = {n: "model.safetensors" for n in names}
    for name in names:
        path = os.path.join(target_dir, str(weight_map.get(name, "")))
        if os.path.isfile(path):
            with safe_open(path, "pt") as fh:
                if name in fh.keys():
                    return fh.get_tensor(name)
    raise CheckpointError(f"the target has none of {', '.join(names)}", target_dir)


def _fingerprint(hashes: dict[str, str], data: TrainingData, opts: FinetuneOptions) -> str:
    from eaglekit.finetune.data import content_address

    return content_address({"source": hashes, "data": data.digest, "train": _options_dict(opts)["train"],
                            "warm_start": opts.warm_start, "from_scratch": opts.from_scratch,
                            "validation_fraction": opts.validation_fraction})


def _paired_evaluation(source: str, output: str, opts: FinetuneOptions, ev: EvalOptions,
                       on_stage: Stage | None) -> Evaluation:
    """The output against its source on held-out prompts under every condition, one target pass per prompt and
    condition for both (compare)."""
    from eaglekit.decode.compare import compare_conditions

    progress = (lambda done, total, name: on_stage("held-out τ, output vs source (paired)", done, total)) \
        if on_stage else None
    # a quantized target is evaluated in float64 (quantization.py: its own rounding must not flip the format's)
    dtype = "auto" if opts.target_quantization else opts.target_dtype
    decode = dataclasses.replace(ev.decode_options(opts.device, dtype), target_quantization=opts.target_quantization)
    return Evaluation.of(compare_conditions(source, output, opts.target, decode, on_prompt=progress))


def _provenance(source: str, spec: DraftSpec, opts: FinetuneOptions, data: TrainingData, result,
                hashes: dict[str, str], target_files: dict[str, str] | None, warm: list[str],
                evaluation: Evaluation | None = None, written: str = "") -> dict[str, Any]:
    previous = spec.config.get("eaglekit")
    last = result.history[-1] if result.history else None
    return public_report({  # written into config.json and the weights' metadata, which a push publishes
        "version": __version__, "command": "finetune", "function": "trained", "source": public_path(source),
        "source_eagle_version": spec.eagle_version, "source_files": hashes,
        "source_provenance": previous if isinstance(previous, dict) else None,
        "target": public_path(opts.target), "target_files": target_files,
        "data": {"source": data.source, "sha256": data.digest, "sequences": data.sequences,
                 "positions": data.positions},
        "options": _options_dict(opts)["train"], "evaluation_options": _options_dict(opts)["eval"],
        "warm_start": warm, "steps": result.steps, "trained_tensors": list(result.trained),
        "world_size": result.world_size,
        "final_loss": round(last.loss, 6) if last else None,
        "final_accuracy": [round(a, 4) for a in last.accuracy] if last else None,
        "selected_step": result.selected_step, "selected_by": result.selected_by,
        "paired_evaluation": [p.to_dict() for p in evaluation.paired] if evaluation is not None else None,
        "held_out_gain": evaluation.gain.to_dict() if evaluation is not None else None,
        "written": written,
    })


def written_because(evaluation: Evaluation | None) -> str:
    """Why an output was written, for its report and provenance."""
    if evaluation is None:
        return "not evaluated (--no-eval, --hidden-states or --store): written unmeasured"
    return "resolved gain" if evaluation.gained else "without a resolved gain (--keep-unresolved)"


def _out_tensors(spec: DraftSpec, drafter, trained: set[str]):
    """Every source tensor under its source name: trained ones from the drafter, the rest copied verbatim."""
    import torch

    from eaglekit.io.writer import ByteRange, OutTensor

    params = dict(drafter.named_parameters())
    tensors = []
    for name, ref in sorted(spec.tensors.items(), key=lambda kv: kv[1].source_name):
        if name in trained:
            value = params[name].detach().to("cpu", torch_dtype(ref.dtype))
            if not bool(torch.isfinite(value).all()):
                raise OutputError(f"trained {name} has values that overflow {ref.dtype} (or are not finite): "
                                  "lower --lr or train in fp32", spec.path)

            def chunks(v=value):
                yield v.contiguous().view(torch.uint8).numpy().tobytes()

            tensors.append(OutTensor(ref.source_name, ref.dtype, tuple(ref.shape), chunks))
        else:
            tensors.append(OutTensor(ref.source_name, ref.dtype, tuple(ref.shape),
                                     ByteRange(os.path.join(spec.path, ref.file), ref.data_start, ref.data_end)))
    return tensors


def _check_output(path: str, spec: DraftSpec, info: TargetInfo) -> list[dict[str, Any]]:
    """The written draft read back: same flags, ids and tensor set as the source, and vLLM's rules pass."""
    from eaglekit.rules import run_rules

    out = load_draft(path, target=info)
    problems = []
    if out.aux.ids != spec.aux.ids:
        problems.append(f"aux ids read back as {out.aux.ids}, the source has {spec.aux.ids}")
    if out.flags != spec.flags:
        problems.append(f"flags read back as {out.flags}, the source has {spec.flags}")
    if set(out.tensors) != set(spec.tensors):
        problems.append("the tensor set differs from the source's")
    if problems:
        raise OutputError(f"the fine-tuned draft does not read back as written, nothing was written: {problems[0]}",
                          path)
    findings = [f.to_dict() for f in run_rules(out, target=info, engine="vllm").findings]
    errors = [f for f in findings if f["severity"] == "error"]
    if errors:
        raise OutputError(f"the fine-tuned draft fails validation, nothing was written: [{errors[0]['code']}] "
                          f"{errors[0]['message']}", path)
    return findings


def _write(destination: str, spec: DraftSpec, drafter, trained: set[str],
           provenance: Callable[[Evaluation | None], dict[str, Any]], info: TargetInfo, force: bool,
           judge: Callable[[str], Evaluation | None]) -> tuple[list[str], list[dict[str, Any]], Evaluation | None]:
    """Write into a staging directory, validate it, let `judge` measure it against the source (it raises to
    refuse), then publish with the measurement in the provenance."""
    from eaglekit.io.publish import Staged, publish
    from eaglekit.io.writer import write_checkpoint_weights, write_json

    tensors = _out_tensors(spec, drafter, trained)

    def write(stage: Staged, evaluation: Evaluation | None = None) -> None:
        block = provenance(evaluation)
        write_checkpoint_weights(stage.path, tensors, {"format": "pt", "eaglekit": json.dumps(block, sort_keys=True)})
        write_json(os.path.join(stage.path, "config.json"), {**spec.config, "eaglekit": block})

    def read_back(stage: Staged) -> tuple[list[dict[str, Any]], Evaluation | None]:
        findings = _check_output(stage.path, spec, info)
        evaluation = judge(stage.path)
        if evaluation is not None:  # the same weights, with the measurement in their provenance
            write(stage, evaluation)
        return findings, evaluation

    checked = publish(destination, write, replace=force, folder=True, read_back=read_back)
    assert checked is not None, "read_back returns its findings"
    findings, evaluation = checked
    return sorted(os.listdir(destination)), findings, evaluation


def finetune(source: str, destination: str, opts: FinetuneOptions, *, on_stage: Stage | None = None,
             on_step=None) -> FinetuneReport:
    """Fine-tune `source` against `opts.target` with the training-time test; write the result to `destination`."""
    import torch

    from eaglekit.drafter.model import Drafter
    from eaglekit.finetune.checkpoints import Checkpoints
    from eaglekit.finetune.distributed import barrier, init_distributed
    from eaglekit.finetune.train import TrainOptions, train
    from eaglekit.io.publish import check_destination
    from eaglekit.plotting import check_plot_path
    from eaglekit.provenance import hash_files, source_files
    from eaglekit.target_model import load_target, resolve_device

    started = time.perf_counter()
    train_opts = opts.train or TrainOptions()
    opts = FinetuneOptions(**{**opts.__dict__, "train": train_opts})
    train_opts.check()
    opts.data.check()
    if not 0 <= opts.validation_fraction < 1:
        raise UsageError("--validation-fraction must lie in [0, 1) (0: keep the last step, no selection)")
    if opts.store and opts.data != DataOptions(cache_dir=opts.data.cache_dir):
        raise UsageError("--store brings its own sequences: it cannot be combined with --data, --generate, "
                         "--context-tokens, --code-tokens, --templates or --hidden-states")
    if opts.soft_targets and not opts.store:
        raise UsageError("--soft-targets needs --store: the teacher's probabilities are computed from a store's id-L "
                         "states (eaglekit capture)")
    if opts.soft_targets < 0:
        raise UsageError("--soft-targets must not be negative (0: the target's greedy tokens as labels)")
    if opts.checkpoint_every < 0:
        raise UsageError("--checkpoint-every must not be negative (0: only on Ctrl-C or SIGTERM)")
    if train_opts.depth > opts.data.max_length:
        raise UsageError(f"--depth {train_opts.depth} exceeds --max-length {opts.data.max_length}: deeper steps "
                         "would have no labels")
    info = read_target(opts.target, decoder=not opts.store)  # a store needs only the target's head tensors
    spec = _source_spec(source, info)
    _check_evaluation(opts, info)
    checkpoint_dir = opts.checkpoint_dir or os.path.abspath(destination) + ".checkpoint"
    _refuse_clobber(spec, destination, checkpoint_dir, opts)
    check_destination(destination, replace=opts.force)
    Checkpoints(checkpoint_dir).check()
    # the default folder is removed after a successful run only if eaglekit made it
    remove_checkpoint_dir = not opts.checkpoint_dir and Checkpoints(checkpoint_dir).made_by_eaglekit()
    if opts.plot:
        check_plot_path(opts.plot)
    device = torch.device(resolve_device(opts.device))
    ranks = init_distributed(device)
    if ranks.world > 1 and device.type == "cuda":
        device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", ranks.rank)))
    timings: dict[str, float] = {}
    notes: list[str] = []

    t = time.perf_counter()
    hidden_states_mode = bool(opts.data.hidden_states or opts.store)
    target = None if hidden_states_mode else load_target(opts.target, device=str(device), dtype=opts.target_dtype,
                                                         quantization=opts.target_quantization)
    if target is not None and target.num_layers != info.num_layers:
        raise CheckpointError(f"target has {target.num_layers} layers, its config says {info.num_layers}", opts.target)
    assert spec.aux.ids is not None, "_source_spec refuses a draft without aux ids"
    aux_ids = tuple(sorted(spec.aux.ids))
    if opts.store:
        from eaglekit.capture.reader import read_training_store

        data = read_training_store(opts.store, info, aux_ids, device=str(device),  # labels: a [rows, V] product
                                   max_resident=opts.max_resident_shards, quantization=opts.target_quantization,
                                   soft_targets=opts.soft_targets)
    else:
        if ranks.main:
            data = build_data(target, opts.target, aux_ids, opts.data, on_stage=on_stage)
        barrier(ranks)
        if not ranks.main:  # the main rank has just cached it
            data = build_data(target, opts.target, aux_ids, opts.data)
    timings["data_s"] = time.perf_counter() - t
    k_t = data.aux.shape[1]
    if k_t != len(aux_ids) * info.hidden_size:
        raise CheckpointError(f"captured states are {k_t} wide, the draft reads {len(aux_ids)} × {info.hidden_size}",
                              opts.store or opts.data.hidden_states or opts.target)

    if target is not None:
        embed, head = target.embed_tokens, target.lm_head
    else:
        embed = None if spec.has_embed_tokens else _target_tensor(opts.target, ("model.embed_tokens.weight",))
        head = None if spec.has_lm_head else _target_tensor(opts.target, ("lm_head.weight",))
    drafter = Drafter.from_spec(spec, device=device, dtype=torch.float32, embed_tokens=embed, lm_head=head)

    if opts.eval is not None and target is None:
        why = "--store" if opts.store else "--hidden-states"
        notes.append(f"held-out evaluation skipped ({why}: the target is not loaded); measure with "
                     f"`eaglekit compare {source} {destination} --target {opts.target}`")
    del target  # compare loads its own; training needs only the captured data

    from eaglekit.finetune import warm_start

    if opts.from_scratch:
        notes.append(reinitialise(drafter, train_opts.seed))
        warm = warm_start.WarmStart()
    else:
        warm = warm_start.apply(drafter, spec, data, opts.warm_start)
    notes += warm.notes
    train_data, held_out = split_validation(data, opts.validation_fraction)
    if held_out is None:
        why = ("--validation-fraction 0" if opts.validation_fraction <= 0
               else "too few captured sequences to hold any out")
        notes.append(f"{why}: the last step's weights are kept")
    hashes = hash_files(spec.path, source_files(spec))
    checkpoints = Checkpoints(checkpoint_dir, opts.checkpoint_every, _fingerprint(hashes, data, opts))
    t = time.perf_counter()
    drafter.train()
    result = train(drafter, train_data, train_opts, ranks=ranks, checkpoints=checkpoints, resume=opts.resume,
                   on_step=on_step, lr_scales=warm.lr_scales, validation=held_out,
                   select_k=opts.eval.k if opts.eval is not None else EvalOptions().k)
    drafter.eval()
    timings["train_s"] = time.perf_counter() - t
    if held_out is not None and result.selected_step is not None and result.selected_step != result.steps:
        notes.append(f"kept the weights of step {result.selected_step} of {result.steps}: the best on the "
                     f"{held_out.sequences} held-out sequences ({result.selected_by})")
    report = FinetuneReport(
        source={"path": spec.path, "given": source, "family": spec.family, "eagle_version": spec.eagle_version},
        output={"path": os.path.abspath(destination), "files": []}, target=opts.target, data=data.to_dict(),
        training=result.to_dict(), options=_options_dict(opts), notes=notes + list(data.notes), rank=ranks.rank)
    if not ranks.main:
        return report

    eval_opts = None if hidden_states_mode else opts.eval
    if eval_opts is not None:
        name, prompts = held_out_prompts(eval_opts)
        report.evaluation_prompts = eval_opts.describe(name, len(prompts))

    def judge(staged: str) -> Evaluation | None:
        """The staged output against its source, paired; refuses (nothing is published) without a resolved gain."""
        if eval_opts is None:
            return None
        t = time.perf_counter()
        evaluation = _paired_evaluation(spec.path, staged, opts, eval_opts, on_stage)
        timings["eval_s"] = time.perf_counter() - t
        if not evaluation.gained and not opts.keep_unresolved:
            raise NoGain(f"no gain found, nothing was written: {evaluation.describe()} (--keep-unresolved writes it "
                         "anyway)", os.path.abspath(destination))
        return evaluation

    t = time.perf_counter()
    if on_stage:
        on_stage("writing and validating the output", 0, 1)
    target_files = None if hidden_states_mode else target_identity(opts.target)

    def provenance(evaluation: Evaluation | None) -> dict[str, Any]:
        return _provenance(source, spec, opts, data, result, hashes, target_files, notes, evaluation,
                           written_because(evaluation))

    changed = set(result.trained) | warm.changed
    report.output["files"], report.findings, evaluation = _write(destination, spec, drafter, changed, provenance,
                                                                 info, opts.force, judge)
    report.written = written_because(evaluation)
    if evaluation is not None:
        report.evaluation = {"before": [p.before for p in evaluation.paired],
                             "after": [p.after for p in evaluation.paired],
                             "paired": [p.to_dict() for p in evaluation.paired], "overall": evaluation.gain.to_dict()}
        if not evaluation.gained:
            notes.append(f"written without a resolved gain (--keep-unresolved): {evaluation.describe()}")
    timings["write_s"] = time.perf_counter() - t - timings.get("eval_s", 0.0)
    if opts.plot and result.history:
        from eaglekit.finetune.plot import plot_history

        report.plot = plot_history(result.history, opts.plot, title=os.path.basename(os.path.abspath(destination)))
    if not opts.checkpoint_dir:
        checkpoints.remove(folder=remove_checkpoint_dir)
    report.notes = notes + list(data.notes)
    timings["total_s"] = time.perf_counter() - started
    report.timings = timings
    return report


def reinitialise(drafter, seed: int) -> str:
    """Fresh weights for everything the draft trains (HF's Llama initialisation, seeded); the vocabulary map and
    the embedding shared with the target stay: retraining as EAGLE-3.1 rather than fine-tuning the EAGLE-3
    function."""
    import torch

    keep = {n: p.detach().clone() for n, p in drafter.named_parameters() if n.startswith("embed_tokens.")}
    torch.manual_seed(seed)
    drafter.reset_parameters()
    with torch.no_grad():
        for name, p in drafter.named_parameters():
            if name in keep:
                p.copy_(keep[name])
    return f"--from-scratch: every trained weight re-initialised (seed {seed}); the vocabulary map and the " \
           "embedding kept"


def _options_dict(opts: FinetuneOptions) -> dict[str, Any]:
    from dataclasses import asdict

    def plain(v):
        return list(v) if isinstance(v, tuple) else v

    return {
        "data": {k: plain(v) for k, v in asdict(opts.data).items()},
        "train": {k: plain(v) for k, v in asdict(opts.train).items()},
        "eval": {k: plain(v) for k, v in asdict(opts.eval).items()} if opts.eval else None,
        "device": opts.device, "target_dtype": opts.target_dtype, "target_quantization": opts.target_quantization,
        "warm_start": opts.warm_start,
        "checkpoint_every": opts.checkpoint_every,
        "resume": opts.resume, "validation_fraction": opts.validation_fraction, "from_scratch": opts.from_scratch,
        "keep_unresolved": opts.keep_unresolved, "store": opts.store, "max_resident_shards": opts.max_resident_shards,
        "soft_targets": opts.soft_targets,
    }
