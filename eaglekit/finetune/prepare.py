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

    @property
    def reads_states(self) -> bool:
        """States read from elsewhere (--hidden-states, --store): the target's decoder is never loaded, so there
        is no capture and no held-out evaluation."""
        return bool(self.opts.data.hidden_states or self.opts.store)


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
    return run


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
