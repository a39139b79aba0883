"""What `finetune` refuses before any work, and the run it prepares: the source draft and the target's config
read, every written path checked against everything read, the evaluation's settings, the checkpoint folder and the
plot path; a refusal after capture or training would cost the whole run.
"""

from __future__ import annotations

import os
import shlex
from dataclasses import dataclass, field
from typing import Any

from eaglekit.errors import CheckpointError, EngineMissing, UsageError
from eaglekit.families import load_draft
from eaglekit.finetune.evaluate import AUTO, held_out_prompts
from eaglekit.finetune.options import FinetuneOptions
from eaglekit.io.header import HeaderEntry
from eaglekit.io.outputs import OUTPUT, Role, read_roles, refuse_clobber, target_roles
from eaglekit.quantization import refuse_emulation_on_declared
from eaglekit.runner import ENGINE_ALONE, REFERENCE
from eaglekit.spec import DraftSpec
from eaglekit.target import TargetInfo, holds_decoder, read_target, target_tensors

WRITABLE_DTYPES = ("F32", "BF16", "F16")  # trained tensors are written back in their source dtype


@dataclass
class Run:
    """What the phases of one fine-tuning share: the paths, the checked options, what was read of the source and
    the target, where it runs, and the notes and timings the report collects along the way."""

    source: str
    destination: str
    opts: FinetuneOptions
    info: TargetInfo
    spec: DraftSpec
    checkpoint_dir: str
    remove_checkpoint_dir: bool  # the default folder goes after a successful run only if eaglekit made it
    device: Any = None
    ranks: Any = None
    notes: list[str] = field(default_factory=list)
    timings: dict[str, float] = field(default_factory=dict)
    unevaluated: str | None = None  # why a run on read states has no held-out paired check (None: it has one)
    eval_engine: str = REFERENCE  # who decodes the paired check: the reference (loaded here) or vLLM
    eval_engine_why: str | None = None  # why auto chose vLLM (the target does not fit here)

    @property
    def reads_states(self) -> bool:
        """States read from elsewhere (--import, --store): training never loads the target's decoder."""
        return bool(self.opts.import_dir or self.opts.store)

    @property
    def evaluates(self) -> bool:
        """Whether the output is measured against its source before it is written: always, unless --no-eval, or
        states read from elsewhere without a target that can be loaded here for the paired check."""
        return self.opts.eval is not None and self.unevaluated is None


LOADABLE_SHARE = 0.8  # of free memory, the most a target loaded for the held-out check may take


def prepare(source: str, destination: str, opts: FinetuneOptions) -> Run:
    """Read the source and the target's config and refuse, before any work, what the run would refuse at its end
    (every written path, the checkpoint folder, the plot, who decodes the held-out check and its settings); then
    join the ranks."""
    import torch

    from eaglekit.finetune.checkpoints import Checkpoints
    from eaglekit.finetune.distributed import init_distributed
    from eaglekit.io.publish import check_destination
    from eaglekit.plotting import check_plot_path
    from eaglekit.target_model import resolve_device

    info = read_target(opts.target, decoder=not opts.store)  # a store needs only the target's head tensors
    refuse_emulation_on_declared(opts.target_quantization, info)
    spec = _source_spec(source, info)
    checkpoint_dir = opts.checkpoint_dir or os.path.abspath(destination) + ".checkpoint"
    _refuse_clobber(spec, destination, checkpoint_dir, opts)
    check_destination(destination, replace=opts.force)
    Checkpoints(checkpoint_dir).check()
    remove_checkpoint_dir = not opts.checkpoint_dir and Checkpoints(checkpoint_dir).made_by_eaglekit()
    if opts.plot:
        check_plot_path(opts.plot)
    run = Run(source, destination, opts, info, spec, checkpoint_dir, remove_checkpoint_dir)
    run.device = torch.device(resolve_device(opts.device))
    if int(os.environ.get("WORLD_SIZE", "1")) > 1 and run.device.type == "cuda":  # torchrun: one GPU per rank
        run.device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", os.environ.get("RANK", "0"))))
    if opts.eval is not None:
        _choose_eval_engine(run)
    if run.evaluates:
        _check_evaluation(opts, info)
    run.ranks = init_distributed(run.device)
    return run


def _choose_eval_engine(run: Run) -> None:
    """Who decodes the paired check, decided before training: the reference where the target loads here; vLLM where
    asked (--eval-engine vllm) or, under auto, where a store's target is too large for this device; neither where
    the folder holds no decoder or the states were read from files (the run says why it is unmeasured). vLLM is
    probed now: a missing engine is refused (or, under auto, said) before any training."""
    from eaglekit.runtime.engine import check_engine_available

    opts, info = run.opts, run.info
    assert opts.eval is not None
    asked = opts.eval.engine
    if opts.import_dir:
        run.unevaluated = "--import: the target is not loaded"
        return
    entries = target_tensors(os.path.dirname(os.path.abspath(info.path))) if opts.store else None
    decoder = entries is None or holds_decoder(info, entries)
    if asked == ENGINE_ALONE:
        if not decoder:
            raise UsageError("--eval-engine vllm serves the whole target: its folder holds no decoder layers, only "
                             "what a store's reader needs", opts.target)
        if evaluating_rank():
            check_engine_available(opts.engine)
        run.eval_engine = ENGINE_ALONE
        return
    if not decoder:
        run.unevaluated = "--store: the target's folder holds no decoder layers, only what the store's reader needs"
        return
    too_large = None if entries is None else _too_large(entries, opts.target_dtype, run.device)
    if too_large is None:
        return
    if asked == REFERENCE or opts.target_quantization:
        run.unevaluated = too_large + (" (--target-quantization: vLLM would serve it in full precision)"
                                       if asked == AUTO else "")
        return
    try:
        if evaluating_rank():
            check_engine_available(opts.engine)
    except EngineMissing as missing:
        run.unevaluated = f"{too_large}, and {missing}"
        return
    run.eval_engine, run.eval_engine_why = ENGINE_ALONE, too_large


def evaluating_rank() -> bool:
    """Under torchrun only rank 0 evaluates (and so probes vLLM); a single process is rank 0."""
    return os.environ.get("RANK", "0") == "0"


def _too_large(entries: dict[str, HeaderEntry], dtype: str, device) -> str | None:
    """Why the target (its tensors' header entries) cannot be loaded here for the paired check (None: it can): its
    weights, in the evaluation's dtype, must take at most LOADABLE_SHARE of the device's free memory."""
    import math

    from eaglekit.target_model import resolve_dtype

    params = sum(math.prod(entry.shape) for entry in entries.values())
    needed = params * resolve_dtype(dtype, str(device)).itemsize
    free = free_memory(device)
    if free is not None and needed > LOADABLE_SHARE * free:
        return (f"--store: the target takes about {needed / 2**30:.1f} GiB in {dtype} and {device} has "
                f"{free / 2**30:.1f} GiB free")
    return None


def free_memory(device) -> int | None:
    """Bytes free on `device` now (CUDA: the driver's figure; CPU: MemAvailable), None where it cannot be told."""
    import torch

    if device.type == "cuda":
        return int(torch.cuda.mem_get_info(device)[0])
    try:
        with open("/proc/meminfo", encoding="utf-8") as fh:
            line = next((row for row in fh if row.startswith("MemAvailable:")), None)
    except OSError:
        return None
    return int(line.split()[1]) * 1024 if line else None


def _source_spec(source: str, info: TargetInfo) -> DraftSpec:
    spec = load_draft(source, target=info)
    if spec.facts.parallel_drafting:
        raise UsageError("a P-EAGLE draft (parallel drafting): finetune trains EAGLE-3's sequential training-time "
                         "test, not the mask-slot objective it was trained with, and would unlearn it", spec.path)
    if not spec.facts.vllm_layout:
        converted = f"{os.path.basename(os.path.abspath(source))}-vllm"  # in the current folder, not the source's
        keep = ["--no-fc-norm", "--no-norm-output"] if spec.eagle_version == "3" else []  # its function, as it is
        raise UsageError(f"finetune trains drafts in vLLM's layout; this one reads as {spec.family}: run "
                         f"`{shlex.join(['eaglekit', 'upgrade', source, converted, *keep])}` first and fine-tune "
                         f"{shlex.quote(converted)}", spec.path)
    if spec.aux.ids is None:
        raise CheckpointError("the draft records no aux layer ids, so the states to train on are unknown", spec.path)
    odd = sorted({r.dtype for r in spec.tensors.values() if r.dtype not in WRITABLE_DTYPES and r.dtype[0] == "F"})
    if odd:
        raise CheckpointError(f"{odd[0]} tensors cannot be fine-tuned (only F32 / BF16 / F16 drafts)", spec.path)
    return spec


def _refuse_clobber(spec: DraftSpec, destination: str, checkpoint_dir: str, opts: FinetuneOptions) -> None:
    """Every path finetune writes (the output, --plot, the checkpoint folder, the data cache) against everything
    it reads, before any work."""
    from eaglekit.capture.cache import default_cache_dir

    writes = [Role(OUTPUT, destination), Role("--plot", opts.plot or ""),
              Role("--checkpoint-dir" if opts.checkpoint_dir else "--checkpoint-dir (default OUT.checkpoint)",
                   checkpoint_dir, makes_parents=True)]
    if not opts.import_dir and not opts.store:  # captured data is cached; states read elsewhere are not
        writes.append(Role("--cache-dir" if opts.cache_dir else "--cache-dir (default)",
                           opts.cache_dir or default_cache_dir(), makes_parents=True))
    reads = [*read_roles("source", spec.path), *target_roles(opts.target),
             *read_roles("--import", opts.import_dir), *read_roles("--data", opts.data.data_file),
             *read_roles("--store", opts.store),
             *read_roles("--eval-prompts", opts.eval.prompts_file if opts.eval else None)]
    refuse_clobber(writes, reads)


def _check_evaluation(opts: FinetuneOptions, info: TargetInfo) -> None:
    """What the held-out evaluation after training would refuse, refused before it: its prompts and its decode
    against the target's context (its settings were checked with the options)."""
    from eaglekit.decode.setup import refuse_context_past_target

    assert opts.eval is not None
    held_out_prompts(opts.eval)
    refuse_context_past_target(opts.eval.decode_options(), info.max_position_embeddings, "--eval-context-tokens")
