"""What `finetune` refuses before any work, and the run it prepares: the source draft and the target's config
read, every written path checked against everything read, the evaluation's settings, the checkpoint folder and the
plot path; a refusal after capture or training would cost the whole run.
"""

from __future__ import annotations

import os
import shlex
from dataclasses import dataclass, field
from typing import Any

from eaglekit.errors import CheckpointError, UsageError
from eaglekit.families import load_draft
from eaglekit.finetune.evaluate import held_out_prompts
from eaglekit.finetune.options import FinetuneOptions
from eaglekit.io.outputs import OUTPUT, Role, read_roles, refuse_clobber, target_roles
from eaglekit.spec import DraftSpec
from eaglekit.target import TargetInfo, read_target

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

    @property
    def reads_states(self) -> bool:
        """States read from elsewhere (--hidden-states, --store): training never loads the target's decoder."""
        return bool(self.opts.data.hidden_states or self.opts.store)

    @property
    def evaluates(self) -> bool:
        """Whether the output is measured against its source before it is written: always, unless --no-eval, or
        states read from elsewhere without a target that can be loaded here for the paired check."""
        return self.opts.eval is not None and self.unevaluated is None


LOADABLE_SHARE = 0.8  # of free memory, the most a target loaded for the held-out check may take


def prepare(source: str, destination: str, opts: FinetuneOptions) -> Run:
    """Read the source and the target's config and refuse, before any work, what the run would refuse at its end
    (the evaluation's settings, every written path, the checkpoint folder, the plot); then join the ranks."""
    import torch

    from eaglekit.finetune.checkpoints import Checkpoints
    from eaglekit.finetune.distributed import init_distributed
    from eaglekit.io.publish import check_destination
    from eaglekit.plotting import check_plot_path
    from eaglekit.target_model import resolve_device

    info = read_target(opts.target, decoder=not opts.store)  # a store needs only the target's head tensors
    spec = _source_spec(source, info)
    _check_evaluation(opts, info)
    checkpoint_dir = opts.checkpoint_dir or os.path.abspath(destination) + ".checkpoint"
    _refuse_clobber(spec, destination, checkpoint_dir, opts)
    check_destination(destination, replace=opts.force)
    Checkpoints(checkpoint_dir).check()
    remove_checkpoint_dir = not opts.checkpoint_dir and Checkpoints(checkpoint_dir).made_by_eaglekit()
    if opts.plot:
        check_plot_path(opts.plot)
    run = Run(source, destination, opts, info, spec, checkpoint_dir, remove_checkpoint_dir)
    run.device = torch.device(resolve_device(opts.device))
    run.ranks = init_distributed(run.device)
    if run.ranks.world > 1 and run.device.type == "cuda":
        run.device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", run.ranks.rank)))
    if opts.eval is not None and run.reads_states:
        run.unevaluated = ("--hidden-states: the target is not loaded" if opts.data.hidden_states
                           else _unloadable(info, opts.target_dtype, run.device))
    return run


def _unloadable(info: TargetInfo, dtype: str, device) -> str | None:
    """Why the held-out paired check of a --store run cannot load the target here (None: it can). The check decodes
    with the whole target, so its folder must hold the decoder and its weights must fit in the device's free
    memory; training from the store needs neither."""
    import math
    import re

    from eaglekit.target import target_tensors
    from eaglekit.target_model import resolve_dtype

    entries = target_tensors(os.path.dirname(os.path.abspath(info.path)))
    layers = {int(m.group(1)) for m in map(re.compile(r"(?:^|\.)layers\.(\d+)\.").search, entries) if m}
    if not set(range(info.num_layers)) <= layers:
        return "--store: the target's folder holds no decoder layers, only what the store's reader needs"
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
    if not spec.facts.vllm_layout:
        converted = f"{source.rstrip('/')}-vllm"
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
