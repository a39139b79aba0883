"""EAGLE-3's training-time test as a training loop: unrolled objective, AdamW, checkpoints, data parallel.

Each batch is unrolled `depth` steps (eaglekit.drafter.unroll): step 0 reads the target's states, step j the
drafter's own fed-back state of step j-1 at the same row, so the drafter learns the function it runs at
inference, including EAGLE-3.1's norm_output recurrence. The loss of depth j is the cross-entropy against the
target's greedy token over the draft vocabulary, weighted `depth_decay**j`.

Data parallel runs under `torchrun` with `torch.distributed` (gloo on CPU, NCCL on CUDA) and
DistributedDataParallel: every rank draws the same global batch and takes its share of the sequences; each
depth's loss is normalised by the global count of labelled rows, so N processes step exactly as one process
would on the whole batch. Checkpoints are safetensors plus JSON (nothing is pickled).
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import random
import re
import shutil
import tempfile
import time
from collections.abc import Callable, Collection, Sequence
from dataclasses import asdict, dataclass, field, fields
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from eaglekit.drafter.model import Drafter
from eaglekit.drafter.unroll import unrolled_steps
from eaglekit.errors import CheckpointError, TrainingInterrupted, UsageError, quoted
from eaglekit.finetune.batches import (
    IGNORE,
    batch_groups,
    draft_label_map,
    idle_batch,
    label_counts,
    make_batch,
    soft_batch,
)
from eaglekit.io.jsonfile import finite, load_json_object

CHECKPOINT_FORMAT = "1"
FREEZE_GROUPS: dict[str, tuple[str, ...]] = {
    "fc": ("fc.",),
    "fc_norm": ("fc_norm.",),
    "input_norm": ("input_norm.",),
    "layers": ("layers.",),
    "head": ("lm_head.", "norm."),
    "embed": ("embed_tokens.",),
}
"""--freeze groups by canonical tensor-name prefix. A borrowed target embedding or head is never trained."""
PRECISIONS = ("bf16", "fp32")


@dataclass(frozen=True)
class TrainOptions:
    steps: int = 100
    batch_tokens: int = 2048
    depth: int = 4  # unrolled draft steps per batch (training-time test length)
    lr: float = 2e-4  # a trained draft fine-tuned: larger rates undo what its source learned
    warmup_steps: int | None = None  # default: steps // 20 (at least 1)
    min_lr_ratio: float = 0.1  # the cosine ends at lr * this
    depth_decay: float = 0.8  # loss weight of depth j
    weight_decay: float = 0.0
    betas: tuple[float, float] = (0.9, 0.95)
    max_grad_norm: float = 1.0
    freeze: tuple[str, ...] = ("embed",)  # a draft's own embedding stays as the target's copy, as EAGLE trains it
    precision: str = "bf16"  # bf16: autocast compute, fp32 master weights; fp32: everything fp32
    seed: int = 0
    log_every: int = 10
    select_every: int | None = None  # validation every N steps (default: steps // 10); the best state is kept

    def check(self) -> None:
        if self.steps < 0:
            raise UsageError("--steps must not be negative (0: only the warm start)")
        positive = {"batch_tokens": self.batch_tokens, "depth": self.depth, "log_every": self.log_every}
        for name, value in positive.items():
            if value < 1:
                raise UsageError(f"--{name.replace('_', '-')} must be at least 1")
        if not self.lr > 0 or not math.isfinite(self.lr):
            raise UsageError("--lr must be a positive number")
        if not 0 < self.depth_decay <= 1:  # NaN fails too
            raise UsageError(f"--depth-decay {self.depth_decay}: expected a number in (0, 1] (depth j's loss weight "
                             "is decay^j)")
        if self.depth_decay ** (self.depth - 1) < torch.finfo(torch.float32).tiny:
            raise UsageError(f"--depth-decay {self.depth_decay} with --depth {self.depth}: the deepest step's loss "
                             f"weight decay^{self.depth - 1} vanishes in float32; raise --depth-decay")
        if not -(2**63) <= self.seed < 2**64:
            raise UsageError(f"--seed {self.seed}: torch takes seeds from -2^63 to 2^64 - 1")
        if self.precision not in PRECISIONS:
            raise UsageError(f"--precision {self.precision!r}: use one of {', '.join(PRECISIONS)}")
        unknown = sorted(set(self.freeze) - set(FREEZE_GROUPS))
        if unknown:
            raise UsageError(f"--freeze {','.join(unknown)}: unknown group; known: {', '.join(FREEZE_GROUPS)}")
        if self.select_every is not None and self.select_every < 1:
            raise UsageError("--select-every must be at least 1")
        if self.warmup_steps is not None and not 0 <= self.warmup_steps <= self.steps:
            raise UsageError("--warmup-steps must lie between 0 and --steps")

    @property
    def selection_interval(self) -> int:
        return max(1, self.steps // 10) if self.select_every is None else self.select_every

    @property
    def warmup(self) -> int:
        return max(1, self.steps // 20) if self.warmup_steps is None else max(1, self.warmup_steps)

    def lr_factor(self, step: int) -> float:
        """Linear warm-up, then a cosine from 1 down to min_lr_ratio over the remaining steps."""
        if step < self.warmup:
            return (step + 1) / self.warmup
        progress = (step - self.warmup) / max(1, self.steps - self.warmup)
        return self.min_lr_ratio + (1 - self.min_lr_ratio) * 0.5 * (1 + math.cos(math.pi * progress))


@dataclass
class StepRecord:
    step: int  # steps done
    loss: float
    accuracy: list[float]  # teacher-forced top-1 per depth, over the last `log_every` steps
    lr: float
    tokens_per_s: float
    seconds: float


@dataclass(frozen=True)
class Validation:
    """The held-out part of the data, scored at one step."""

    step: int
    loss: float
    accuracy: list[float]  # teacher-forced top-1 per depth
    score: float  # expected accepted length of a chain drafted with these accuracies: 1 + Σ_j Π_{i≤j} acc_i
    decode_tau: float | None = None  # chain decode τ replayed on the held-out greedy text (finetune.replay)
    decode_rounds: int = 0

    @classmethod
    def of(cls, step: int, loss: float, accuracy: list[float], replay=None) -> Validation:
        chain, score = 1.0, 1.0
        for a in accuracy:
            chain *= a
            score += chain
        if replay is None:
            return cls(step, loss, accuracy, score)
        return cls(step, loss, accuracy, score, replay.acceptance_length, replay.rounds)

    @property
    def selection_score(self) -> float:
        """What the kept step is chosen by: the replayed decode τ where the held-out data has greedy text to
        replay, else the teacher-forced chain score."""
        return self.score if self.decode_tau is None else self.decode_tau


@dataclass
class TrainResult:
    history: list[StepRecord]
    steps: int
    resumed_from: int | None
    trained: list[str]  # canonical names of the tensors that were trained
    world_size: int
    seconds: float
    positions_seen: int = 0
    label_coverage: float = 1.0  # share of the target's greedy tokens inside the draft vocabulary
    validation: list[Validation] = field(default_factory=list)
    selected_step: int | None = None  # the step whose weights were kept (the best held-out score)
    selected_by: str | None = None  # "decode τ (k=K)" or "teacher-forced chain score"
    reading: dict[str, list] | None = None  # from a store: the shards each rank read, and its peak RSS

    def to_dict(self) -> dict[str, Any]:
        return {"steps": self.steps, "resumed_from": self.resumed_from, "trained_tensors": list(self.trained),
                "world_size": self.world_size, "seconds": round(self.seconds, 3),
                "positions_seen": self.positions_seen, "label_coverage": round(self.label_coverage, 4),
                "history": [asdict(r) for r in self.history],
                "validation": [asdict(v) for v in self.validation], "selected_step": self.selected_step,
                "selected_by": self.selected_by, "reading": self.reading}


class UnrolledObjective(nn.Module):
    """One forward = the whole unrolled training-time test of a batch (so DDP sees one forward per backward)."""

    def __init__(self, drafter: Drafter, depth: int, depth_decay: float):
        super().__init__()
        self.drafter = drafter
        self.depth = depth
        self.depth_decay = depth_decay

    def forward(self, ids: torch.Tensor, labels: torch.Tensor, aux: torch.Tensor, counts: torch.Tensor,
                soft: tuple[torch.Tensor, torch.Tensor] | None = None):
        """loss (each depth's CE summed over rows / `counts[j]`, weighted) and correct top-1 counts per depth.
        With `soft` (batches.soft_batch) the CE is against the teacher's top-k distribution, not its greedy token."""
        width = aux.shape[1]
        vd = self.drafter.config.draft_vocab_size
        loss = aux.new_zeros((), dtype=torch.float32)
        correct = []
        steps = unrolled_steps(self.drafter, ids[:, 1:], self.drafter.combine(aux), self.depth)
        for j, out in enumerate(steps):
            target = labels[:, 1 + j : 1 + j + width].reshape(-1)
            logits = out.draft_logits.float().reshape(-1, vd)
            if soft is None:
                ce = F.cross_entropy(logits, target, ignore_index=IGNORE, reduction="sum")
            else:
                top, probs = (t[:, 1 + j : 1 + j + width].reshape(-1, t.shape[-1]) for t in soft)
                ce = -(probs * F.log_softmax(logits, dim=-1).gather(1, top.clamp_min(0))).sum()
            loss = loss + ce / counts[j].clamp_min(1) * self.depth_decay**j
            correct.append(((logits.argmax(-1) == target) & (target != IGNORE)).sum())
        return loss, torch.stack(correct)


def validate(drafter: Drafter, data, depth: int, depth_decay: float, batch_tokens: int, to_draft: torch.Tensor,
             autocast, *, sequences: Collection[int] | None = None, pool=None) -> tuple[float, list[float]]:
    """(loss, top-1 per depth) on every held-out sequence, teacher forced, without gradients; the same on every
    rank, so the ranks keep the same weights: each scores the whole held-out part, or only `sequences` (those in
    the shards it owns) with `pool` summing the counts over the ranks."""
    device = drafter.norm.weight.device
    objective = UnrolledObjective(drafter, depth, depth_decay)
    loss, hits, labelled = 0.0, torch.zeros(depth, dtype=torch.float64), torch.zeros(depth, dtype=torch.float64)
    lengths = (data.offsets[1:] - data.offsets[:-1]).tolist()
    window_of = getattr(data.aux, "window_of", None)  # streamed rows: a batch never spans two windows of shards
    windows = window_of(data.offsets[:-1]).tolist() if window_of is not None else [0] * len(lengths)
    scored = range(len(lengths)) if sequences is None else sequences
    order = sorted(scored, key=lambda i: (windows[i], lengths[i]))
    batches: list[list[int]] = []
    batch: list[int] = []
    rows = 0
    for i in order:
        if batch and (rows + lengths[i] > batch_tokens or windows[i] != windows[batch[-1]]):
            batches.append(batch)
            batch, rows = [], 0
        batch, rows = batch + [i], rows + lengths[i]
    batches.append(batch)
    was_training = drafter.training
    drafter.eval()
    with torch.no_grad(), autocast:
        for seqs in filter(None, batches):
            ids, labels, aux, width = make_batch(data, seqs, depth, to_draft)
            counts = label_counts(labels, depth, width).to(device)
            batch_loss, correct = objective(ids.to(device), labels.to(device), aux.to(device), counts)
            share = float(counts[0]) / max(1.0, float(sum(lengths)))
            loss += float(batch_loss) * share
            hits += correct.double().cpu()
            labelled += counts.double().cpu()
    drafter.train(was_training)
    if pool is not None:
        summed = pool(torch.cat([torch.tensor([loss], dtype=torch.float64), hits, labelled]))
        loss, hits, labelled = float(summed[0]), summed[1 : 1 + depth], summed[1 + depth :]
    return loss, [float(v) for v in hits / labelled.clamp_min(1)]


# ------------------------------------------------------------------ distributed


@dataclass(frozen=True)
class Ranks:
    rank: int = 0
    world: int = 1

    @property
    def main(self) -> bool:
        return self.rank == 0


def init_distributed(device: torch.device) -> Ranks:
    """Join the process group torchrun describes (WORLD_SIZE > 1); a single process otherwise."""
    import torch.distributed as dist

    if int(os.environ.get("WORLD_SIZE", "1")) <= 1:
        return Ranks()
    if not dist.is_initialized():
        dist.init_process_group("nccl" if device.type == "cuda" else "gloo")
    return Ranks(dist.get_rank(), dist.get_world_size())


def owned_sequences(data, ranks: Ranks) -> set[int] | None:
    """The sequences this rank reads when the data streams from a store under torchrun: those in the shards it
    owns (shard index modulo the world size), so no shard is read by two ranks; None where every rank holds every
    row in memory."""
    shard_of = getattr(data.aux, "shard_of", None)
    if ranks.world == 1 or shard_of is None:
        return None
    owners = (shard_of(data.offsets[:-1]) % ranks.world).tolist()
    return {i for i, owner in enumerate(owners) if owner == ranks.rank}


def reading_per_rank(data, ranks: Ranks) -> dict[str, list] | None:
    """Which shards each rank read and its peak RSS (MB): the measure that the ranks split a store's reading."""
    import resource

    read = getattr(data.aux, "read", None)
    if read is None:
        return None
    mine = {"shards": sorted(read), "peak_rss_mb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1)}
    every = [mine]
    if ranks.world > 1:
        import torch.distributed as dist

        every = [{} for _ in range(ranks.world)]
        dist.all_gather_object(every, mine)
    return {"shards_read": [r["shards"] for r in every], "peak_rss_mb": [r["peak_rss_mb"] for r in every]}


def _all_reduce(tensor: torch.Tensor, ranks: Ranks) -> torch.Tensor:
    if ranks.world > 1:
        import torch.distributed as dist

        dist.all_reduce(tensor)
    return tensor


def barrier(ranks: Ranks) -> None:
    if ranks.world > 1:
        import torch.distributed as dist

        dist.barrier()


# ------------------------------------------------------------------ checkpoints


@dataclass(frozen=True)
class Checkpoints:
    directory: str | None
    every: int = 0  # 0: only on Ctrl-C
    fingerprint: str = ""  # source, data and options: a checkpoint of another run is refused

    def check(self) -> None:
        """Refuse, before any work, a folder that cannot hold checkpoints or holds a step-N that is not one (it
        would be taken for one, and eaglekit removes only its own)."""
        if not self.directory or not os.path.lexists(self.directory):
            return
        if not os.path.isdir(self.directory):
            raise UsageError("the checkpoint folder is a file", self.directory)
        for name in os.listdir(self.directory):
            path = os.path.join(self.directory, name)
            if STEP_NAME.fullmatch(name) and not is_checkpoint(path):
                raise UsageError(f"the checkpoint folder holds {name}, which is not an eaglekit checkpoint: choose "
                                 "another --checkpoint-dir", self.directory)

    def checkpoints(self) -> list[str]:
        """eaglekit's own checkpoints in the folder, oldest step first."""
        if not self.directory or not os.path.isdir(self.directory):
            return []
        found = [os.path.join(self.directory, n) for n in os.listdir(self.directory) if STEP_NAME.fullmatch(n)]
        return sorted((p for p in found if is_checkpoint(p)), key=lambda p: int(os.path.basename(p)[5:]))

    def made_by_eaglekit(self) -> bool:
        """Whether the folder is absent (this run makes it) or holds nothing but eaglekit checkpoints (an
        interrupted run of eaglekit made it)."""
        if not self.directory or not os.path.lexists(self.directory):
            return True
        entries = os.listdir(self.directory) if os.path.isdir(self.directory) else []
        return bool(entries) and len(self.checkpoints()) == len(entries)

    def own(self) -> list[str]:
        """This run's checkpoints (state.json carries its fingerprint), oldest step first: runs may share a folder,
        and one never takes or removes another's."""
        return [p for p in self.checkpoints() if _state(p).get("fingerprint") == self.fingerprint]

    def remove(self, *, folder: bool) -> None:
        """Remove this run's checkpoints in the folder, then the folder itself when `folder` and it is left empty:
        nothing else in it (another run's checkpoints included) is ever touched."""
        for path in self.own():
            shutil.rmtree(path, ignore_errors=True)
        if folder and self.directory and os.path.isdir(self.directory) and not os.listdir(self.directory):
            os.rmdir(self.directory)


STEP_NAME = re.compile(r"step-[0-9]{1,12}")


def is_checkpoint(path: str) -> bool:
    """A real folder named step-N whose state.json says it is an eaglekit finetune checkpoint."""
    if not STEP_NAME.fullmatch(os.path.basename(path)) or os.path.islink(path) or not os.path.isdir(path):
        return False
    return _state(path).get("format") == CHECKPOINT_FORMAT


def _state(path: str) -> dict[str, Any]:
    """A checkpoint's state.json, {} when it is unreadable."""
    try:
        return load_json_object(os.path.join(path, "state.json"), "checkpoint state")
    except CheckpointError:
        return {}


def save_checkpoint(ck: Checkpoints, step: int, params: dict[str, nn.Parameter], optimizer: torch.optim.Optimizer,
                    history: list[StepRecord]) -> str:
    """step-N/ with trainable weights, AdamW moments and state.json; written aside, renamed, older ones removed."""
    from eaglekit.io.writer import save_tensors, writing

    assert ck.directory is not None
    final = os.path.join(ck.directory, f"step-{step:07d}")
    if os.path.lexists(final) and final not in ck.own():
        raise CheckpointError("not a checkpoint of this run (another run's, or not eaglekit's), so it is not "
                              "replaced: choose another --checkpoint-dir", final)
    with writing("the checkpoint", final, folder=ck.directory):
        tmp = tempfile.mkdtemp(prefix=f"{os.path.basename(final)}.partial-", dir=ck.directory)
        try:
            moments: dict[str, torch.Tensor] = {}
            for name, p in params.items():
                for key, value in optimizer.state.get(p, {}).items():
                    moments[f"{name}::{key}"] = value.detach().reshape(value.shape).to("cpu").contiguous()
            save_tensors({n: p.detach().to("cpu").contiguous() for n, p in params.items()},
                         os.path.join(tmp, "weights.safetensors"))
            save_tensors(moments, os.path.join(tmp, "optimizer.safetensors"))
            with open(os.path.join(tmp, "state.json"), "w", encoding="utf-8") as fh:
                json.dump({"format": CHECKPOINT_FORMAT, "step": step, "fingerprint": ck.fingerprint,
                           "history": [asdict(r) for r in history]}, fh, indent=1)
            if os.path.lexists(final):
                shutil.rmtree(final)
            os.rename(tmp, final)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
    for path in ck.own():
        if path != final:
            shutil.rmtree(path, ignore_errors=True)
    return final


ADAM_STATE = ("step", "exp_avg", "exp_avg_sq")
"""What AdamW keeps per parameter once it has stepped it (none before): a checkpoint's moments hold exactly these."""


def load_checkpoint(ck: Checkpoints, params: dict[str, nn.Parameter], optimizer: torch.optim.Optimizer,
                    opts: TrainOptions) -> tuple[int, list[StepRecord]]:
    """Restore this run's newest checkpoint in place; (step, history). Another run's is never taken, and everything
    read is checked against this run before anything is restored (one CheckpointError naming the file otherwise):
    the step and history in state.json, every weight's name, dtype, shape and values, every AdamW moment's."""
    found = ck.own()
    if not found:
        raise UsageError("--resume: every checkpoint in the folder belongs to another run (different source "
                         "draft, data or training options); rerun with the same ones or choose another --checkpoint-dir"
                         if ck.checkpoints() else "--resume: no checkpoint to resume from", ck.directory)
    path = found[-1]
    state_path = os.path.join(path, "state.json")
    state = load_json_object(state_path, "checkpoint state")
    step = state.get("step")
    if type(step) is not int or not 0 <= step <= opts.steps:
        raise CheckpointError(f"step {quoted(step)} is not a step of this run (0 to --steps {opts.steps})",
                              state_path)
    history = _checked_history(state.get("history"), step, opts.depth, state_path)
    weights = _checked_tensors(os.path.join(path, "weights.safetensors"),
                               {name: (p.dtype, tuple(p.shape)) for name, p in params.items()})
    moments_path = os.path.join(path, "optimizer.safetensors")
    expected: dict[str, tuple[torch.dtype, tuple[int, ...]]] = {}
    trained = {name.split("::", 1)[0] for name in _tensor_names(moments_path)}
    for name, p in params.items():
        if name in trained:  # a parameter AdamW never stepped has no state
            expected |= {f"{name}::step": (torch.float32, ()), f"{name}::exp_avg": (p.dtype, tuple(p.shape)),
                         f"{name}::exp_avg_sq": (p.dtype, tuple(p.shape))}
    moments = _checked_tensors(moments_path, expected)
    for key, value in moments.items():
        if key.endswith("::exp_avg_sq") and bool((value < 0).any()):
            raise CheckpointError(f"{key} has negative values (a second moment cannot)", moments_path)
        if key.endswith("::step") and not (0 <= float(value) <= step and float(value).is_integer()):
            raise CheckpointError(f"{key} is {float(value)}, not a step count up to {step}", moments_path)
    with torch.no_grad():
        for name, p in params.items():
            p.copy_(weights[name])
            if name in trained:
                optimizer.state[p] = {key: moments[f"{name}::{key}"].to(p.device) for key in ADAM_STATE}
    return step, history


def _tensor_names(path: str) -> list[str]:
    from eaglekit.io.header import read_header

    return list(read_header(path).entries)


def _checked_tensors(path: str, expected: dict[str, tuple[torch.dtype, tuple[int, ...]]]) -> dict[str, torch.Tensor]:
    """The tensors of a checkpoint file, each with exactly the name, dtype and shape `expected` gives and finite
    values: the header is checked before any tensor is read, so a tampered file costs no memory."""
    from safetensors import SafetensorError
    from safetensors.torch import load_file

    from eaglekit.io.dtypes import torch_to_safetensors_dtype
    from eaglekit.io.header import read_header

    entries = read_header(path).entries
    unknown, missing = sorted(set(entries) - set(expected)), sorted(set(expected) - set(entries))
    if unknown or missing:
        what = f"holds {quoted(unknown[0])}, which this run does not train" if unknown else \
            f"lacks {quoted(missing[0])}"
        raise CheckpointError(what, path)
    for name, entry in entries.items():
        dtype, shape = expected[name]
        if entry.dtype != torch_to_safetensors_dtype(dtype) or tuple(entry.shape) != shape:
            raise CheckpointError(f"{name} is {entry.dtype}{list(entry.shape)}, this run trains it as "
                                  f"{torch_to_safetensors_dtype(dtype)}{list(shape)}", path)
    try:
        tensors = load_file(path)
    except (OSError, ValueError, SafetensorError) as exc:
        raise CheckpointError(f"unreadable checkpoint ({exc})".splitlines()[0], path) from None
    for name, value in tensors.items():
        if not bool(torch.isfinite(value).all()):
            raise CheckpointError(f"{name} has values that are not finite", path)
    return tensors


HISTORY_FIELDS = tuple(f.name for f in fields(StepRecord))


def _checked_history(history: Any, step: int, depth: int, path: str) -> list[StepRecord]:
    """state.json's history: records of StepRecord's fields, at ascending steps up to `step`, finite numbers, one
    accuracy in [0, 1] per depth."""
    if not isinstance(history, list) or len(history) > step:
        raise CheckpointError(f"history must be a list of at most {step} records", path)
    records, last = [], 0
    for i, r in enumerate(history):
        problem = None
        if not isinstance(r, dict) or set(r) != set(HISTORY_FIELDS):
            problem = f"has other fields than {', '.join(HISTORY_FIELDS)}"
        elif type(r["step"]) is not int or not last < r["step"] <= step:
            problem = f"step {quoted(r['step'])} does not follow {last} up to {step}"
        elif not all(finite(r[k]) for k in ("loss", "lr", "tokens_per_s", "seconds")):
            problem = "loss, lr, tokens_per_s and seconds must be finite numbers"
        elif not isinstance(r["accuracy"], list) or len(r["accuracy"]) != depth or \
                not all(finite(a) and 0 <= a <= 1 for a in r["accuracy"]):
            problem = f"accuracy must list {depth} rates in [0, 1], one per depth"
        if problem:
            raise CheckpointError(f"history record {i} {problem}", path)
        last = r["step"]
        records.append(StepRecord(step=r["step"], loss=float(r["loss"]), accuracy=[float(a) for a in r["accuracy"]],
                                  lr=float(r["lr"]), tokens_per_s=float(r["tokens_per_s"]),
                                  seconds=float(r["seconds"])))
    return records


# ------------------------------------------------------------------ the loop


class _Window:
    """Running means over the steps since the last history record."""

    def __init__(self, depth: int):
        self.hits = torch.zeros(depth, dtype=torch.float64)
        self.labelled = torch.zeros(depth, dtype=torch.float64)
        self.loss, self.rows, self.seconds, self.steps = 0.0, 0, 0.0, 0

    def add(self, loss: float, hits: torch.Tensor, labelled: torch.Tensor, rows: int, seconds: float) -> None:
        self.hits += hits
        self.labelled += labelled
        self.loss, self.rows = self.loss + loss, self.rows + rows
        self.seconds, self.steps = self.seconds + seconds, self.steps + 1

    def record(self, step: int, lr: float, elapsed: float) -> StepRecord:
        return StepRecord(step=step, loss=self.loss / self.steps,
                          accuracy=[float(v) for v in self.hits / self.labelled.clamp_min(1)], lr=lr,
                          tokens_per_s=self.rows / self.seconds, seconds=elapsed)


def trainable_parameters(drafter: Drafter, freeze: Sequence[str]) -> dict[str, nn.Parameter]:
    """Parameters left trainable after --freeze (the others get requires_grad=False)."""
    prefixes = tuple(p for group in freeze for p in FREEZE_GROUPS[group])
    params = {}
    for name, p in drafter.named_parameters():
        p.requires_grad_(not name.startswith(prefixes))
        if p.requires_grad:
            params[name] = p
    if not params:
        raise UsageError(f"--freeze {','.join(freeze)} leaves nothing to train")
    return params


def train(drafter: Drafter, data, opts: TrainOptions, *, ranks: Ranks = Ranks(),
          checkpoints: Checkpoints = Checkpoints(None), resume: bool = False,
          on_step: Callable[[int, StepRecord | None, dict[str, float]], None] | None = None,
          lr_scales: dict[str, float] | None = None, validation=None, select_k: int = 3) -> TrainResult:
    """Train `drafter` in place on `data` (eaglekit.finetune.data.TrainingData); returns the loss history.

    With `validation` (held-out TrainingData) the drafter is scored on it before training and every
    `opts.selection_interval` steps, and ends with the weights of the best score (a chain-`select_k` decode
    replayed on its greedy text, eaglekit.finetune.replay; the teacher-forced chain score where it has none):
    training that does not help the held-out drafts returns the weights it started from.

    `on_step(done, record_or_None, live)` is called after every step; `live` holds the step's loss, first-depth
    accuracy and tokens/s (for a progress bar), `record` is set every `log_every` steps and at the end.
    `lr_scales` multiplies the learning rate of the named tensors (a warm start's rescaled ones)."""
    opts.check()
    torch.manual_seed(opts.seed)
    rng = random.Random(opts.seed)
    device = drafter.norm.weight.device
    params = trainable_parameters(drafter, opts.freeze)
    scales = lr_scales or {}
    groups: dict[float, list[nn.Parameter]] = {}
    for name, p in params.items():
        groups.setdefault(float(scales.get(name, 1.0)), []).append(p)
    optimizer = torch.optim.AdamW([{"params": ps, "lr_scale": s} for s, ps in groups.items()], lr=opts.lr,
                                  weight_decay=opts.weight_decay, betas=opts.betas)
    objective: nn.Module = UnrolledObjective(drafter, opts.depth, opts.depth_decay)
    if ranks.world > 1:
        from torch.nn.parallel import DistributedDataParallel

        objective = DistributedDataParallel(objective, broadcast_buffers=False,
                                            device_ids=[device.index] if device.type == "cuda" else None)
    to_draft = draft_label_map(drafter)
    labelled = data.labels[data.labels >= 0]
    coverage = float((to_draft[labelled] != IGNORE).double().mean()) if labelled.numel() else 0.0
    if coverage == 0:
        raise CheckpointError("none of the target's greedy tokens in the data is in the draft vocabulary: this "
                              "draft was not made for this target (or its d2t is wrong)", drafter.config.source)
    owned = owned_sequences(data, ranks)
    window_of = getattr(data.aux, "window_of", None)  # rows streamed from disk: batches stay among resident shards
    stream = batch_groups(data.offsets, opts.batch_tokens, rng,
                          window_of(data.offsets[:-1], ranks.world).tolist() if window_of is not None else None)
    history: list[StepRecord] = []
    start, resumed_from = 0, None
    if resume:
        start, history = load_checkpoint(checkpoints, params, optimizer, opts)
        resumed_from = start
        for _ in range(start):  # the batch order of the steps already done
            next(stream)
    autocast = (torch.autocast(device.type, dtype=torch.bfloat16) if opts.precision == "bf16"
                else contextlib.nullcontext())
    began = time.perf_counter()
    window = _Window(opts.depth)
    done, positions = start, 0
    scores: list[Validation] = []
    best: dict[str, torch.Tensor] | None = None

    mine = owned_sequences(validation, ranks) if validation is not None else None  # held-out rows this rank reads
    pool = (lambda sums: _all_reduce(sums.to(device), ranks).cpu()) if mine is not None else None

    def score(at: int) -> None:
        nonlocal best
        if validation is None:
            return
        from eaglekit.finetune.replay import replay_tau

        loss, accuracy = validate(drafter, validation, opts.depth, opts.depth_decay, opts.batch_tokens, to_draft,
                                  autocast, sequences=mine, pool=pool)
        replayed = replay_tau(drafter, validation, select_k, opts.batch_tokens, to_draft, sequences=mine, pool=pool)
        scores.append(Validation.of(at, loss, accuracy, replayed))
        if best is None or scores[-1].selection_score > max(v.selection_score for v in scores[:-1]):
            best = {n: p.detach().to("cpu", copy=True) for n, p in params.items()}

    score(start)
    try:
        for step in range(start, opts.steps):
            t0 = time.perf_counter()
            group = next(stream)
            share = group[ranks.rank :: ranks.world] if owned is None else [i for i in group if i in owned]
            ids, labels, aux, width = (make_batch(data, share, opts.depth, to_draft) if share
                                       else idle_batch(opts.depth, data.aux.shape[1]))
            soft = None
            if data.soft_ids is not None and share:
                soft = tuple(t.to(device) for t in soft_batch(data, share, to_draft, labels))
            rows = sum(int(data.offsets[i + 1] - data.offsets[i]) for i in group)
            counts = _all_reduce(label_counts(labels, opts.depth, width).to(device), ranks)
            for g in optimizer.param_groups:
                g["lr"] = opts.lr * opts.lr_factor(step) * g["lr_scale"]
            with autocast:
                loss, correct = objective(ids.to(device), labels.to(device), aux.to(device), counts, soft)
            optimizer.zero_grad(set_to_none=True)
            (loss * ranks.world).backward()  # DDP averages gradients over ranks; the loss is already global
            torch.nn.utils.clip_grad_norm_(list(params.values()), opts.max_grad_norm)
            optimizer.step()
            stats = _all_reduce(torch.cat([correct.double(), loss.detach().double()[None]]), ranks)
            done, positions = step + 1, positions + rows
            seconds = time.perf_counter() - t0
            step_loss, hits, n = float(stats[-1]), stats[:-1].cpu(), counts.double().cpu()
            window.add(step_loss, hits, n, rows, seconds)
            live = {"loss": step_loss, "accuracy": float(hits[0] / n[0].clamp_min(1)), "tokens_per_s": rows / seconds}
            record = None
            if done % opts.log_every == 0 or done == opts.steps:
                record = window.record(done, opts.lr * opts.lr_factor(step), time.perf_counter() - began)
                history.append(record)
                window = _Window(opts.depth)
            if ranks.main and checkpoints.directory and checkpoints.every and done % checkpoints.every == 0 \
                    and done < opts.steps:
                save_checkpoint(checkpoints, done, params, optimizer, history)
            if done % opts.selection_interval == 0 or done == opts.steps:
                score(done)
            if on_step is not None:
                on_step(done, record, live)
    except KeyboardInterrupt:
        if ranks.main and checkpoints.directory and done > start:
            path = save_checkpoint(checkpoints, done, params, optimizer, history)
            raise TrainingInterrupted(f"interrupted after step {done}/{opts.steps}; checkpoint saved; rerun the "
                                      "same command with --resume to continue", path) from None
        raise TrainingInterrupted(f"interrupted after step {done}/{opts.steps}; nothing was saved") from None
    selected, selected_by = None, None
    if best is not None:
        selected = max(scores, key=lambda v: (v.selection_score, -v.step)).step
        selected_by = "teacher-forced chain score" if scores[0].decode_tau is None else f"decode τ (k={select_k})"
        with torch.no_grad():
            for name, p in params.items():
                p.copy_(best[name].to(p.device))
    return TrainResult(history=history, steps=done, resumed_from=resumed_from, trained=list(params),
                       world_size=ranks.world, seconds=time.perf_counter() - began, positions_seen=positions,
                       label_coverage=coverage, validation=scores, selected_step=selected, selected_by=selected_by,
                       reading=reading_per_rank(data, ranks))
