"""EAGLE-3's training-time test as a training loop: AdamW on the unrolled objective (finetune.objective), held-out
selection of the kept step, checkpoints (finetune.checkpoints), data parallel (finetune.distributed).

Data parallel runs under `torchrun` with `torch.distributed` (gloo on CPU, NCCL on CUDA) and
DistributedDataParallel: every rank draws the same global batch and takes its share of the sequences; each
depth's loss is normalised by the global count of labelled rows, so N processes step exactly as one process
would on the whole batch.
"""

from __future__ import annotations

import contextlib
import math
import random
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

import torch
from torch import nn

from eaglekit.decode.sampling import SEED_RANGE, SEED_RANGE_TEXT
from eaglekit.drafter.model import Drafter
from eaglekit.errors import CheckpointError, TrainingInterrupted, UsageError
from eaglekit.finetune.batches import (
    IGNORE,
    batch_groups,
    draft_label_map,
    idle_batch,
    label_counts,
    make_batch,
    soft_batch,
)
from eaglekit.finetune.checkpoints import (
    Checkpoints,
    HeldOut,
    StepRecord,
    Validation,
    load_checkpoint,
    save_checkpoint,
)
from eaglekit.finetune.distributed import Ranks, all_reduce, owned_sequences, reading_per_rank
from eaglekit.finetune.objective import UnrolledObjective, validate
from eaglekit.progress import Progress, quiet

FREEZE_GROUPS: dict[str, tuple[str, ...]] = {
    "fc": ("fc.",),
    "fc_norm": ("fc_norm.",),
    "input_norm": ("input_norm.",),
    "layers": ("layers.",),
    "head": ("lm_head.", "norm."),
    "embed": ("embed_tokens.",),
}
"""--freeze groups by canonical tensor-name prefix. A borrowed target embedding or head is never trained."""
PRECISIONS = ("auto", "bf16", "fp32")


def resolve_precision(precision: str, device: str | torch.device) -> str:
    """"auto" is bf16 where the device computes it natively (a CUDA GPU with bf16, a CPU with AVX512-BF16 or AMX)
    and fp32 elsewhere: a CPU without them emulates bf16, about 3x slower than fp32 and less exact."""
    if precision != "auto":
        return precision
    kind = torch.device(device).type
    if kind == "cuda":
        return "bf16" if torch.cuda.is_bf16_supported() else "fp32"
    if kind == "cpu" and (torch.cpu._is_avx512_bf16_supported() or torch.cpu._is_amx_tile_supported()):
        return "bf16"
    return "fp32"


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
    precision: str = "auto"  # bf16: autocast, fp32 master weights; fp32: everything fp32; auto: resolve_precision
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
        if not SEED_RANGE[0] <= self.seed <= SEED_RANGE[1]:
            raise UsageError(f"--seed {self.seed}: {SEED_RANGE_TEXT}")
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

    def scored_at(self, done: int) -> bool:
        """Whether held-out selection scores the weights after `done` steps (the start and the end always)."""
        return done % self.selection_interval == 0 or done == self.steps

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


@dataclass
class _Loop:
    """What every step works with: the trainable parameters, AdamW, the objective (DDP-wrapped under torchrun),
    the draft-vocabulary label map and the numerics; built once, in the order the random state expects."""

    drafter: Drafter
    data: Any
    opts: TrainOptions
    ranks: Ranks
    params: dict[str, nn.Parameter]
    optimizer: torch.optim.Optimizer
    objective: nn.Module
    to_draft: torch.Tensor
    coverage: float
    autocast: Any

    @property
    def device(self) -> torch.device:
        return self.drafter.norm.weight.device

    @classmethod
    def start(cls, drafter: Drafter, data, opts: TrainOptions, ranks: Ranks, lr_scales: dict[str, float]) -> _Loop:
        """Refuses data whose labels all lie outside the draft vocabulary: nothing could be learnt from it."""
        device = drafter.norm.weight.device
        params = trainable_parameters(drafter, opts.freeze)
        groups: dict[float, list[nn.Parameter]] = {}
        for name, p in params.items():
            groups.setdefault(float(lr_scales.get(name, 1.0)), []).append(p)
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
        bf16 = resolve_precision(opts.precision, device) == "bf16"
        autocast = torch.autocast(device.type, dtype=torch.bfloat16) if bf16 else contextlib.nullcontext()
        return cls(drafter, data, opts, ranks, params, optimizer, objective, to_draft, coverage, autocast)

    def batches(self, rng: random.Random) -> Iterator[list[int]]:
        """The global batches, in an order drawn from `rng` (rows streamed from disk: among resident shards)."""
        window_of = getattr(self.data.aux, "window_of", None)
        windows = window_of(self.data.offsets[:-1], self.ranks.world).tolist() if window_of is not None else None
        return batch_groups(self.data.offsets, self.opts.batch_tokens, rng, windows)

    def step(self, step: int, group: list[int], owned: set[int] | None, window: _Window) -> tuple[dict, int]:
        """One AdamW step on the global batch `group`, of which this rank computes its share; the loss and counts
        are summed over the ranks. Returns the live figures (for a progress bar) and the rows of the batch."""
        opts, data, ranks, device = self.opts, self.data, self.ranks, self.device
        t0 = time.perf_counter()
        share = group[ranks.rank :: ranks.world] if owned is None else [i for i in group if i in owned]
        ids, labels, aux, width = (make_batch(data, share, opts.depth, self.to_draft) if share
                                   else idle_batch(opts.depth, data.aux.shape[1]))
        soft = None
        if data.soft_ids is not None and share:
            soft = tuple(t.to(device) for t in soft_batch(data, share, self.to_draft, labels))
        rows = sum(int(data.offsets[i + 1] - data.offsets[i]) for i in group)
        counts = all_reduce(label_counts(labels, opts.depth, width).to(device), ranks)
        for g in self.optimizer.param_groups:
            g["lr"] = opts.lr * opts.lr_factor(step) * g["lr_scale"]
        with self.autocast:
            loss, correct = self.objective(ids.to(device), labels.to(device), aux.to(device), counts, soft)
        self.optimizer.zero_grad(set_to_none=True)
        (loss * ranks.world).backward()  # DDP averages gradients over ranks; the loss is already global
        torch.nn.utils.clip_grad_norm_(list(self.params.values()), opts.max_grad_norm)
        self.optimizer.step()
        stats = all_reduce(torch.cat([correct.double(), loss.detach().double()[None]]), ranks)
        seconds = time.perf_counter() - t0
        step_loss, hits, n = float(stats[-1]), stats[:-1].cpu(), counts.double().cpu()
        window.add(step_loss, hits, n, rows, seconds)
        return {"loss": step_loss, "accuracy": float(hits[0] / n[0].clamp_min(1)), "tokens_per_s": rows / seconds}, rows


class _Selection:
    """The held-out scores along the run and the weights of the best one, so training that does not help the
    held-out drafts ends with the weights it started from."""

    def __init__(self, loop: _Loop, validation, select_k: int):
        self.loop, self.validation, self.select_k = loop, validation, select_k
        self.scores: list[Validation] = []
        self.best: dict[str, torch.Tensor] | None = None
        self.mine = owned_sequences(validation, loop.ranks) if validation is not None else None  # rows this rank reads

    def score(self, at: int) -> None:
        """Score the drafter as it is at step `at`; keep its weights if no earlier step scored higher."""
        if self.validation is None:
            return
        from eaglekit.finetune.replay import replay_tau

        loop, opts, mine = self.loop, self.loop.opts, self.mine
        pool = (lambda sums: all_reduce(sums.to(loop.device), loop.ranks).cpu()) if mine is not None else None
        loss, accuracy = validate(loop.drafter, self.validation, opts.depth, opts.depth_decay, opts.batch_tokens,
                                  loop.to_draft, loop.autocast, sequences=mine, pool=pool)
        replayed = replay_tau(loop.drafter, self.validation, self.select_k, opts.batch_tokens, loop.to_draft,
                              sequences=mine, pool=pool)
        self.scores.append(Validation.of(at, loss, accuracy, replayed))
        if self.best is None or self.scores[-1].rank > max(v.rank for v in self.scores[:-1]):
            self.best = {n: p.detach().to("cpu", copy=True) for n, p in loop.params.items()}

    def held_out(self) -> HeldOut | None:
        """What a checkpoint keeps of the selection (None without held-out data)."""
        return None if self.best is None else HeldOut(list(self.scores), self.best)

    def begin(self, kept: HeldOut | None, at: int) -> None:
        """Score the start of this run, step `at`. A resumed run first takes up the selection its checkpoint kept and
        scores `at` only where an uninterrupted run would have and the checkpoint lacks it (without held-out state:
        always, so the resumed weights are a candidate)."""
        if kept is not None and self.validation is not None:
            self.scores, self.best = list(kept.scores), kept.best
            if not self.loop.opts.scored_at(at) or any(v.step == at for v in self.scores):
                return
        self.score(at)

    def keep_best(self) -> tuple[int | None, str | None]:
        """Put the best-scoring weights back; (their step, what chose them), or (None, None) without held-out data."""
        if self.best is None:
            return None, None
        selected = max(self.scores, key=lambda v: (v.rank, -v.step)).step
        by = "teacher-forced chain score" if self.scores[0].decode_tau is None else f"decode τ (k={self.select_k})"
        with torch.no_grad():
            for name, p in self.loop.params.items():
                p.copy_(self.best[name].to(p.device))
        return selected, by


def train(drafter: Drafter, data, opts: TrainOptions, *, ranks: Ranks = Ranks(),
          checkpoints: Checkpoints = Checkpoints(None), resume: bool = False,
          on_step: Callable[[int, StepRecord | None, dict[str, float]], None] | None = None,
          progress: Progress | None = None, lr_scales: dict[str, float] | None = None, validation=None,
          select_k: int = 3) -> TrainResult:
    """Train `drafter` in place on `data` (eaglekit.finetune.data.TrainingData); returns the loss history.

    With `validation` (held-out TrainingData) the drafter is scored on it before training and every
    `opts.selection_interval` steps, and ends with the weights of the best score (a chain-`select_k` decode
    replayed on its greedy text, eaglekit.finetune.replay; the teacher-forced chain score where it has none):
    training that does not help the held-out drafts returns the weights it started from.

    `on_step(done, record_or_None, live)` is called after every step; `live` holds the step's loss, first-depth
    accuracy and tokens/s (for a progress bar), `record` is set every `log_every` steps and at the end;
    `progress` hears of the held-out scoring and of each step.
    `lr_scales` multiplies the learning rate of the named tensors (a warm start's rescaled ones)."""
    opts.check()
    torch.manual_seed(opts.seed)
    rng = random.Random(opts.seed)
    loop = _Loop.start(drafter, data, opts, ranks, lr_scales or {})
    owned = owned_sequences(data, ranks)
    stream = loop.batches(rng)
    history: list[StepRecord] = []
    start, resumed_from, kept = 0, None, None
    if resume:
        start, history, kept = load_checkpoint(checkpoints, loop.params, loop.optimizer, steps=opts.steps,
                                               depth=opts.depth)
        resumed_from = start
        for _ in range(start):  # the batch order of the steps already done
            next(stream)
    began = time.perf_counter()
    window = _Window(opts.depth)
    done, positions = start, 0
    selection = _Selection(loop, validation, select_k)
    progress = quiet(progress)
    if validation is not None:
        progress.stage("scoring the held-out sequences before training")
    selection.begin(kept, start)
    progress.stage("training", opts.steps - start, "steps")
    try:
        for step in range(start, opts.steps):
            live, rows = loop.step(step, next(stream), owned, window)
            done, positions = step + 1, positions + rows
            record = None
            if done % opts.log_every == 0 or done == opts.steps:
                record = window.record(done, opts.lr * opts.lr_factor(step), time.perf_counter() - began)
                history.append(record)
                window = _Window(opts.depth)
            if opts.scored_at(done):
                selection.score(done)
            if ranks.main and checkpoints.directory and checkpoints.every and done % checkpoints.every == 0 \
                    and done < opts.steps:
                save_checkpoint(checkpoints, done, loop.params, loop.optimizer, history, selection.held_out())
            progress.advance()
            if on_step is not None:
                on_step(done, record, live)
    except KeyboardInterrupt:
        raise _interrupted(loop, checkpoints, done, start, history, selection.held_out()) from None
    selected, selected_by = selection.keep_best()
    trained = [c for name in loop.params for c in loop.drafter.canonical_names(name)]
    return TrainResult(history=history, steps=done, resumed_from=resumed_from, trained=trained,
                       world_size=ranks.world, seconds=time.perf_counter() - began, positions_seen=positions,
                       label_coverage=loop.coverage, validation=selection.scores, selected_step=selected,
                       selected_by=selected_by, reading=reading_per_rank(data, ranks))


def _interrupted(loop: _Loop, checkpoints: Checkpoints, done: int, start: int, history: list[StepRecord],
                 held_out: HeldOut | None) -> TrainingInterrupted:
    """Ctrl-C or SIGTERM mid-run: the main rank saves what it has (if it got past where it started) so the same
    command with --resume continues; the one line says which."""
    steps = loop.opts.steps
    if loop.ranks.main and checkpoints.directory and done > start:
        path = save_checkpoint(checkpoints, done, loop.params, loop.optimizer, history, held_out)
        return TrainingInterrupted(f"interrupted after step {done}/{steps}; checkpoint saved; rerun the same "
                                   "command with --resume to continue", path)
    return TrainingInterrupted(f"interrupted after step {done}/{steps}; nothing was saved")
