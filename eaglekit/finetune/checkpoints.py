"""Training checkpoints: step-N/ folders of trainable weights, AdamW moments, the held-out selection's best weights
(safetensors) and state.json (step, history, held-out scores), each published atomically through
eaglekit.io.publish. Runs may share a folder: a checkpoint carries its run's
fingerprint, and a run never takes, replaces or removes another's. Everything a resume reads is checked against
this run before anything is restored. Nothing is pickled.
"""

from __future__ import annotations

import json
import os
import re
import shutil
from dataclasses import asdict, dataclass, fields
from typing import Any, NamedTuple

import torch
from torch import nn

from eaglekit.errors import CheckpointError, UsageError, quoted
from eaglekit.io.jsonfile import finite, load_json_object

CHECKPOINT_FORMAT = "1"


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

    @property
    def rank(self) -> tuple[float, float]:
        """How steps are ordered: the selection score, and between equal scores the lower held-out loss (a decode
        τ ties often on few held-out rounds, where the loss still tells a trained step from the start)."""
        return self.selection_score, -self.loss


@dataclass
class HeldOut:
    """The held-out selection as of a checkpoint: every score so far and the weights of the best, so a resumed run
    keeps the step an uninterrupted one would (the source weights included, where no step beat them)."""

    scores: list[Validation]
    best: dict[str, torch.Tensor]


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
                    history: list[StepRecord], held_out: HeldOut | None = None) -> str:
    """step-N/ with trainable weights, AdamW moments, the held-out selection (its scores in state.json, the best
    weights in best.safetensors) and state.json, published atomically (the folder is made with its parents if
    missing); this run's older checkpoints are removed once it is in place."""
    from eaglekit.io.publish import Staged, publish
    from eaglekit.io.writer import save_tensors

    assert ck.directory is not None
    final = os.path.join(ck.directory, f"step-{step:07d}")
    if os.path.lexists(final) and final not in ck.own():
        raise CheckpointError("not a checkpoint of this run (another run's, or not eaglekit's), so it is not "
                              "replaced: choose another --checkpoint-dir", final)
    weights = {n: p.detach().to("cpu").contiguous() for n, p in params.items()}
    moments: dict[str, torch.Tensor] = {}
    for name, p in params.items():
        for key, value in optimizer.state.get(p, {}).items():
            moments[f"{name}::{key}"] = value.detach().reshape(value.shape).to("cpu").contiguous()
    state: dict[str, Any] = {"format": CHECKPOINT_FORMAT, "step": step, "fingerprint": ck.fingerprint,
                             "history": [asdict(r) for r in history]}
    if held_out is not None:
        state["held_out"] = [asdict(v) for v in held_out.scores]

    def write(stage: Staged) -> None:
        save_tensors(weights, os.path.join(stage.path, "weights.safetensors"))
        save_tensors(moments, os.path.join(stage.path, "optimizer.safetensors"))
        if held_out is not None:
            save_tensors({n: t.contiguous() for n, t in held_out.best.items()},
                         os.path.join(stage.path, BEST))
        with open(os.path.join(stage.path, "state.json"), "w", encoding="utf-8") as fh:
            json.dump(state, fh, indent=1)

    def read_back(stage: Staged) -> None:
        """What a resume reads first (the state, the tensor names) must be what was written."""
        read, keys = _state(stage.path), ("format", "step", "fingerprint")
        if {k: read.get(k) for k in keys} != {k: state[k] for k in keys} or \
                set(_tensor_names(os.path.join(stage.path, "weights.safetensors"))) != set(weights) or \
                set(_tensor_names(os.path.join(stage.path, "optimizer.safetensors"))) != set(moments) or \
                read.get("held_out") != state.get("held_out") or (held_out is not None and set(
                    _tensor_names(os.path.join(stage.path, BEST))) != set(held_out.best)):
            raise CheckpointError("the checkpoint does not read back as written, nothing was written", final)

    publish(final, write, read_back=read_back, folder=True, replace=True, what="the checkpoint", make_parents=True)
    for path in ck.own():
        if path != final:
            shutil.rmtree(path, ignore_errors=True)
    return final


BEST = "best.safetensors"
ADAM_STATE = ("step", "exp_avg", "exp_avg_sq")
"""What AdamW keeps per parameter once it has stepped it (none before): a checkpoint's moments hold exactly these."""


class Resumed(NamedTuple):
    step: int
    history: list[StepRecord]
    held_out: HeldOut | None  # None: the run had no held-out data, or the checkpoint predates held-out state


def load_checkpoint(ck: Checkpoints, params: dict[str, nn.Parameter], optimizer: torch.optim.Optimizer, *,
                    steps: int, depth: int) -> Resumed:
    """Restore this run's newest checkpoint in place; its step, history and held-out selection. Another run's is
    never taken, and everything read is checked against this run (`steps` long, unrolled `depth` deep) before
    anything is restored (one CheckpointError naming the file otherwise): the step, history and held-out scores in
    state.json, every weight's name, dtype, shape and values (the best ones too), every AdamW moment's."""
    found = ck.own()
    if not found:
        raise UsageError("--resume: every checkpoint in the folder belongs to another run (different source "
                         "draft, data or training options); rerun with the same ones or choose another --checkpoint-dir"
                         if ck.checkpoints() else "--resume: no checkpoint to resume from", ck.directory)
    path = found[-1]
    state_path = os.path.join(path, "state.json")
    state = load_json_object(state_path, "checkpoint state")
    step = state.get("step")
    if type(step) is not int or not 0 <= step <= steps:
        raise CheckpointError(f"step {quoted(step)} is not a step of this run (0 to --steps {steps})",
                              state_path)
    history = _checked_history(state.get("history"), step, depth, state_path)
    shapes = {name: (p.dtype, tuple(p.shape)) for name, p in params.items()}
    weights = _checked_tensors(os.path.join(path, "weights.safetensors"), shapes)
    held_out = None
    if "held_out" in state:
        held_out = HeldOut(_checked_scores(state["held_out"], step, depth, state_path),
                           _checked_tensors(os.path.join(path, BEST), shapes))
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
    return Resumed(step, history, held_out)


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
SCORE_FIELDS = tuple(f.name for f in fields(Validation))


def _record_problem(r: Any, names: tuple[str, ...], numbers: tuple[str, ...], last: int, step: int,
                    depth: int) -> str | None:
    """What is wrong with one of state.json's records (a StepRecord or a Validation): other fields than `names`,
    a step not after `last` or past `step`, `numbers` not finite, not one accuracy in [0, 1] per depth."""
    if not isinstance(r, dict) or set(r) != set(names):
        return f"has other fields than {', '.join(names)}"
    if type(r["step"]) is not int or not last < r["step"] <= step:
        return f"step {quoted(r['step'])} does not follow {last} up to {step}"
    if not all(finite(r[k]) for k in numbers):
        return f"{', '.join(numbers[:-1])} and {numbers[-1]} must be finite numbers"
    if not isinstance(r["accuracy"], list) or len(r["accuracy"]) != depth or \
            not all(finite(a) and 0 <= a <= 1 for a in r["accuracy"]):
        return f"accuracy must list {depth} rates in [0, 1], one per depth"
    return None


def _checked_history(history: Any, step: int, depth: int, path: str) -> list[StepRecord]:
    """state.json's history: records of StepRecord's fields, at ascending steps up to `step`, finite numbers, one
    accuracy in [0, 1] per depth."""
    if not isinstance(history, list) or len(history) > step:
        raise CheckpointError(f"history must be a list of at most {step} records", path)
    records, last = [], 0
    for i, r in enumerate(history):
        if problem := _record_problem(r, HISTORY_FIELDS, ("loss", "lr", "tokens_per_s", "seconds"), last, step,
                                      depth):
            raise CheckpointError(f"history record {i} {problem}", path)
        last = r["step"]
        records.append(StepRecord(step=r["step"], loss=float(r["loss"]), accuracy=[float(a) for a in r["accuracy"]],
                                  lr=float(r["lr"]), tokens_per_s=float(r["tokens_per_s"]),
                                  seconds=float(r["seconds"])))
    return records


def _checked_scores(scores: Any, step: int, depth: int, path: str) -> list[Validation]:
    """state.json's held-out scores: records of Validation's fields at ascending steps from 0 up to `step`, finite
    numbers, one accuracy in [0, 1] per depth, a decode τ of at least 1 (or none) over a whole number of rounds."""
    if not isinstance(scores, list) or not scores or len(scores) > step + 1:
        raise CheckpointError(f"held_out must list 1 to {step + 1} scores", path)
    records, last = [], -1
    for i, v in enumerate(scores):
        problem = _record_problem(v, SCORE_FIELDS, ("loss", "score"), last, step, depth)
        if problem is None and v["decode_tau"] is not None and not (finite(v["decode_tau"]) and v["decode_tau"] >= 1):
            problem = "decode_tau must be a number of at least 1, or null"
        elif problem is None and (type(v["decode_rounds"]) is not int or v["decode_rounds"] < 0):
            problem = "decode_rounds must be a whole number"
        if problem:
            raise CheckpointError(f"held-out score {i} {problem}", path)
        last = v["step"]
        records.append(Validation(step=v["step"], loss=float(v["loss"]), accuracy=[float(a) for a in v["accuracy"]],
                                  score=float(v["score"]), decode_tau=None if v["decode_tau"] is None
                                  else float(v["decode_tau"]), decode_rounds=v["decode_rounds"]))
    return records
