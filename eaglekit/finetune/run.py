"""`finetune`: capture (or reuse) self-distillation data, train, evaluate, write a vLLM-ready draft only if it gains.

The result is written only when its held-out gain over its source is resolved (eaglekit.finetune.evaluate:
the paired interval over every condition clears zero); otherwise nothing is written and the measurement is said,
unless `keep_unresolved`, which writes it and records so. The output keeps the source's layout, config and
every tensor that was not trained byte for byte; trained tensors are written in their source dtype. It is built
in a staging directory, validated as vLLM will read it, and only then moved into place, so a failed or killed
run leaves no output (eaglekit.finetune.output).

`finetune` runs as phases: check the options and read the source and target (eaglekit.finetune.prepare), build
the data, set up the drafter and its warm start, train, then evaluate against the source and write.
"""

from __future__ import annotations

import dataclasses
import os
import time
from dataclasses import dataclass, field
from typing import Any

from eaglekit import __version__
from eaglekit.errors import CheckpointError, NoGain
from eaglekit.finetune.data import TrainingData, split_validation
from eaglekit.finetune.evaluate import EvalOptions, Evaluation, held_out_prompts
from eaglekit.finetune.options import FinetuneOptions, checked_options, options_dict
from eaglekit.finetune.prepare import Run, prepare
from eaglekit.progress import Progress, Within, quiet
from eaglekit.quantization import scheme
from eaglekit.redact import public_path, public_report
from eaglekit.runner import ENGINE_ALONE
from eaglekit.spec import DraftSpec


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


def _fingerprint(hashes: dict[str, str], data: TrainingData, opts: FinetuneOptions) -> str:
    from eaglekit.capture.plan import content_address

    return content_address({"source": hashes, "data": data.digest, "train": options_dict(opts)["train"],
                            "warm_start": opts.warm_start, "from_scratch": opts.from_scratch,
                            "validation_fraction": opts.validation_fraction})


def _paired_evaluation(run: Run, output: str, ev: EvalOptions, progress: Progress) -> Evaluation:
    """The output against its source on held-out prompts under every condition: one target pass per prompt and
    condition for both (compare), or, in vLLM, one engine run per draft over every condition's prompts."""
    opts = run.opts
    progress = Within(progress, "held-out evaluation")
    if run.eval_engine == ENGINE_ALONE:
        import torch

        from eaglekit.decode.compare import compare_in_vllm

        if run.device.type == "cuda":  # vLLM sizes itself by the device's free memory: return training's cache
            torch.cuda.empty_cache()

        served = compare_in_vllm(run.spec.path, output, opts.target,
                                 ev.decode_options(dtype=opts.target_dtype, engine=opts.engine), progress=progress)
        return Evaluation.of(served.sweep, served.describe())
    from eaglekit.decode.compare import compare_conditions

    # a quantized target is evaluated in float64 (quantization.py: its own rounding must not flip the format's)
    dtype = "auto" if opts.target_quantization else opts.target_dtype
    decode = dataclasses.replace(ev.decode_options(opts.device, dtype), target_quantization=opts.target_quantization)
    return Evaluation.of(compare_conditions(run.spec.path, output, opts.target, decode, progress=progress))


def _provenance(source: str, spec: DraftSpec, opts: FinetuneOptions, data: TrainingData, result,
                hashes: dict[str, str], target: dict[str, str] | None, warm: list[str],
                evaluation: Evaluation | None = None, written: str = "") -> dict[str, Any]:
    previous = spec.config.get("eaglekit")
    last = result.history[-1] if result.history else None
    return public_report({  # written into config.json and the weights' metadata, which a push publishes
        "version": __version__, "command": "finetune", "function": "trained", "source": public_path(source),
        "source_eagle_version": spec.eagle_version, "source_files": hashes,
        "source_provenance": previous if isinstance(previous, dict) else None,
        "target": public_path(opts.target), "target_identity": target,
        "data": {"source": data.source, "sha256": data.digest, "sequences": data.sequences,
                 "positions": data.positions},
        "options": options_dict(opts)["train"], "evaluation_options": options_dict(opts)["eval"],
        "warm_start": warm, "steps": result.steps, "trained_tensors": list(result.trained),
        "world_size": result.world_size,
        "final_loss": round(last.loss, 6) if last else None,
        "final_accuracy": [round(a, 4) for a in last.accuracy] if last else None,
        "selected_step": result.selected_step, "selected_by": result.selected_by,
        "paired_evaluation": [p.to_dict() for p in evaluation.paired] if evaluation is not None else None,
        "held_out_gain": evaluation.gain.to_dict() if evaluation is not None else None,
        "evaluation_measured_by": evaluation.measured_by if evaluation is not None else None,
        "written": written,
    })


def kept_the_source(result, warm_changed: set[str], opts: FinetuneOptions) -> bool:
    """True when held-out selection kept the weights the run started from and nothing else changed them: the
    output would be the source again, so there is nothing to measure or write."""
    return (result.selected_step is not None and result.resumed_from is None and bool(result.validation)
            and result.selected_step == result.validation[0].step and not warm_changed and not opts.from_scratch)


def _no_step_gained(result) -> str:
    """The held-out scores that kept the source: its own and the best any training step reached."""
    start, *later = result.validation
    best = max(later, key=lambda v: (v.rank, -v.step), default=None)
    after = (f", best training step {best.selection_score:.3f} (loss {best.loss:.4g}) at step {best.step}" if best
             else "")
    return (f"no training step scored above the source on the held-out sequences ({result.selected_by}: the "
            f"source {start.selection_score:.3f} (loss {start.loss:.4g}){after})")


def written_because(evaluation: Evaluation | None) -> str:
    """Why an output was written, for its report and provenance."""
    if evaluation is None:
        return "not evaluated (--no-eval, --import or --store): written unmeasured"
    return "resolved gain" if evaluation.gained else "without a resolved gain (--keep-unresolved)"


def finetune(source: str, destination: str, opts: FinetuneOptions, *, progress: Progress | None = None,
             on_step=None) -> FinetuneReport:
    """Fine-tune `source` against `opts.target` with the training-time test; write the result to `destination`.
    `progress` hears of every long step (load, data, each training step, evaluation, write); `on_step` gets each
    step's figures (eaglekit.finetune.train.train)."""
    from eaglekit.finetune.distributed import leave_distributed

    started = time.perf_counter()
    run = prepare(source, destination, checked_options(opts))
    try:
        return _phases(run, source, destination, started, quiet(progress), on_step)
    finally:
        leave_distributed(run.ranks)


def _phases(run: Run, source: str, destination: str, started: float, progress: Progress,
            on_step) -> FinetuneReport:
    data = _load_data(run, progress)
    progress.stage("setting up the drafter")
    drafter, warm = _set_up_drafter(run, data)
    result, checkpoints, hashes = _train(run, drafter, data, warm, on_step, progress)
    if kept_the_source(result, warm.changed, run.opts) and not run.opts.keep_unresolved:
        raise NoGain(f"no gain found, nothing was written: {_no_step_gained(result)}; the output would equal its "
                     "input (--keep-unresolved writes it anyway)", os.path.abspath(destination))
    report = FinetuneReport(
        source={"path": run.spec.path, "given": source, "family": run.spec.family,
                "eagle_version": run.spec.eagle_version},
        output={"path": os.path.abspath(destination), "files": []}, target=run.opts.target, data=data.to_dict(),
        training=result.to_dict(), options=options_dict(run.opts), notes=run.notes + list(data.notes),
        rank=run.ranks.rank)
    if not run.ranks.main:
        return report
    _evaluate_and_write(run, report, drafter, data, result, set(result.trained) | warm.changed, hashes, progress)
    if run.opts.plot and result.history:
        from eaglekit.finetune.plot import plot_history

        report.plot = plot_history(result.history, run.opts.plot, title=os.path.basename(os.path.abspath(destination)))
    if not run.opts.checkpoint_dir:
        checkpoints.remove(folder=run.remove_checkpoint_dir)
    report.notes = run.notes + list(data.notes)
    run.timings["total_s"] = time.perf_counter() - started
    report.timings = run.timings
    return report


def _load_data(run: Run, progress: Progress) -> TrainingData:
    """The training data: from a store (the decoder is never loaded), from --import's files, or captured by the
    main rank into a store in the cache, which the other ranks then read. Data as wide as the draft reads, or
    refused."""
    from eaglekit.finetune.data import captured_data, imported_data
    from eaglekit.finetune.distributed import barrier

    opts, info, ranks = run.opts, run.info, run.ranks
    t = time.perf_counter()
    assert run.spec.aux.ids is not None, "_source_spec refuses a draft without aux ids"
    aux_ids = tuple(sorted(run.spec.aux.ids))
    if opts.store:
        from eaglekit.capture.reader import read_training_store

        progress.stage("reading the store")
        states = read_training_store(opts.store, info, aux_ids, device=str(run.device),  # labels: a [rows, V] product
                                     max_resident=opts.max_resident_shards, quantization=opts.target_quantization,
                                     soft_targets=opts.soft_targets)
        data = TrainingData.of(states)
    elif opts.import_dir:
        progress.stage("reading the imported states")
        data = imported_data(opts.import_dir, aux_ids, opts.captured_ids)
    else:
        if ranks.main:
            data = captured_data(info, aux_ids, opts, str(run.device), progress=progress)
        barrier(ranks)
        if not ranks.main:  # the main rank has just captured it into the cache
            data = captured_data(info, aux_ids, opts, str(run.device))
    run.timings["data_s"] = time.perf_counter() - t
    k_t = data.aux.shape[1]
    if k_t != len(aux_ids) * info.hidden_size:
        raise CheckpointError(f"captured states are {k_t} wide, the draft reads {len(aux_ids)} × {info.hidden_size}",
                              opts.store or opts.import_dir or opts.target)
    return data


def _borrowed_head(run: Run):
    """(embedding, lm_head) of the target for a draft that has none of its own (None where it has it), read from
    the target's files; rounded through the run's target dtype where the target runs here, as it computes them."""
    from eaglekit.capture.head import load_head
    from eaglekit.target_model import resolve_dtype

    spec = run.spec
    if spec.has_embed_tokens and spec.has_lm_head:
        return None, None
    head = load_head(run.info)
    if not run.reads_states:
        dtype = resolve_dtype(run.opts.target_dtype, str(run.device))
        head.embed_tokens, head.lm_head = (t.to(dtype).float() for t in (head.embed_tokens, head.lm_head))
    return (None if spec.has_embed_tokens else head.embed_tokens), (None if spec.has_lm_head else head.lm_head)


def _set_up_drafter(run: Run, data: TrainingData):
    """The drafter built from the source, borrowing the target's embedding and head where the draft has none; then
    re-initialised (--from-scratch) or warm-started (what upgrade switched on untrained, fitted to the data)."""
    import torch

    from eaglekit.drafter.model import Drafter
    from eaglekit.finetune import warm_start

    spec, opts = run.spec, run.opts
    embed, head = _borrowed_head(run)
    drafter = Drafter.from_spec(spec, device=run.device, dtype=torch.float32, embed_tokens=embed, lm_head=head)
    if run.unevaluated is not None:
        served = " --engine vllm" if opts.store else ""  # a store's target is typically too large to load here
        run.notes.append(f"held-out evaluation skipped ({run.unevaluated}); measure with "
                         f"`eaglekit compare {run.source} {run.destination} --target {opts.target}{served}` where "
                         "the whole target is at hand")
    elif run.eval_engine_why is not None:
        run.notes.append(f"held-out evaluation in vLLM ({run.eval_engine_why}): both drafts served on every "
                         "condition's first turns, paired by vLLM's per-request counters")
    if opts.from_scratch:
        run.notes.append(reinitialise(drafter, opts.train.seed))
        warm = warm_start.WarmStart()
    else:
        warm = warm_start.apply(drafter, spec, data, opts.warm_start)
    run.notes.extend(warm.notes)
    return drafter, warm


def _train(run: Run, drafter, data: TrainingData, warm, on_step, progress: Progress):
    """Train on all but the held-out sequences, which choose the step whose weights are kept; checkpoints carry
    a fingerprint of the source, data and options, so a resume takes only this run's. (result, checkpoints,
    source hashes)."""
    from eaglekit.finetune.checkpoints import Checkpoints
    from eaglekit.finetune.train import train
    from eaglekit.provenance import hash_files, source_files

    opts, notes = run.opts, run.notes
    train_data, held_out = split_validation(data, opts.validation_fraction)
    if held_out is None:
        why = ("--validation-fraction 0" if opts.validation_fraction <= 0
               else "too few captured sequences to hold any out")
        notes.append(f"{why}: the last step's weights are kept")
    hashes = hash_files(run.spec.path, source_files(run.spec))
    checkpoints = Checkpoints(run.checkpoint_dir, opts.checkpoint_every, _fingerprint(hashes, data, opts))
    t = time.perf_counter()
    drafter.train()
    result = train(drafter, train_data, opts.train, ranks=run.ranks, checkpoints=checkpoints, resume=opts.resume,
                   on_step=on_step, progress=progress, lr_scales=warm.lr_scales, validation=held_out,
                   select_k=opts.eval.k if opts.eval is not None else EvalOptions().k)
    drafter.eval()
    run.timings["train_s"] = time.perf_counter() - t
    if held_out is not None and result.selected_step is not None and result.selected_step != result.steps:
        notes.append(f"kept the weights of step {result.selected_step} of {result.steps}: the best on the "
                     f"{held_out.sequences} held-out sequences ({result.selected_by})")
    return result, checkpoints, hashes


def _evaluate_and_write(run: Run, report: FinetuneReport, drafter, data: TrainingData, result, changed: set[str],
                        hashes: dict[str, str], progress: Progress) -> None:
    """Write the output staged, measure it against its source on held-out prompts, and publish it only with a
    resolved gain (or --keep-unresolved, which says so): a fine-tune that does not help is not written."""
    from eaglekit.finetune.output import write_output
    from eaglekit.provenance import target_identity

    opts, destination = run.opts, run.destination
    eval_opts = opts.eval if run.evaluates else None
    if eval_opts is not None:
        name, prompts = held_out_prompts(eval_opts)
        report.evaluation_prompts = eval_opts.describe(name, len(prompts))

    def judge(staged: str) -> Evaluation | None:
        """The staged output against its source, paired; refuses (nothing is published) without a resolved gain."""
        if eval_opts is None:
            return None
        t = time.perf_counter()
        evaluation = _paired_evaluation(run, staged, eval_opts, progress)
        run.timings["eval_s"] = time.perf_counter() - t
        if not evaluation.gained and not opts.keep_unresolved:
            found = "no resolved gain" if evaluation.gain.too_few else "no gain found"
            raise NoGain(f"{found}, nothing was written: {evaluation.describe()} (--keep-unresolved writes it "
                         "anyway)", os.path.abspath(destination))
        return evaluation

    t = time.perf_counter()
    target = None if run.reads_states else target_identity(run.info)

    def provenance(evaluation: Evaluation | None) -> dict[str, Any]:
        return _provenance(run.source, run.spec, opts, data, result, hashes, target, run.notes, evaluation,
                           written_because(evaluation))

    report.output["files"], report.findings, evaluation = write_output(destination, run.spec, drafter, changed,
                                                                       provenance, run.info, opts.force, judge,
                                                                       progress)
    report.written = written_because(evaluation)
    if evaluation is not None:
        report.evaluation = {"measured_by": evaluation.measured_by, "before": [p.before for p in evaluation.paired],
                             "after": [p.after for p in evaluation.paired],
                             "paired": [p.to_dict() for p in evaluation.paired], "overall": evaluation.gain.to_dict()}
        if not evaluation.gained:
            run.notes.append(f"written without a resolved gain (--keep-unresolved): {evaluation.describe()}")
    run.timings["write_s"] = time.perf_counter() - t - run.timings.get("eval_s", 0.0)


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
