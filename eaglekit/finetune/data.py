"""Self-distillation data: token sequences, the target's greedy token at every position, and its aux states.

capture/ produces them: `finetune --target` captures through it into a store in the cache (eaglekit.capture.cache:
named by the target, the aux ids and the data plan, so a rerun reads it back and an interrupted one resumes) and
reads that store back in memory; `--store` streams a store written by `eaglekit capture`; `--import` reads vLLM's
extract_hidden_states files. The labels are the target's greedy tokens, from the store's id-L states.
"""

from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass
from typing import Any

from eaglekit.capture.sequence import LabelledStates
from eaglekit.progress import Progress
from eaglekit.target import TargetInfo


@dataclass
class TrainingData(LabelledStates):
    """Labelled rows as training reads them, with where they are cached (the store), whether that cache already
    held them, and how long reading or capturing them took."""

    cache_path: str | None = None
    reused: bool = False
    seconds: float = 0.0

    @classmethod
    def of(cls, states: LabelledStates, **extra: Any) -> TrainingData:
        return cls(**{f.name: getattr(states, f.name) for f in dataclasses.fields(LabelledStates)}, **extra)

    def to_dict(self) -> dict[str, Any]:
        return {"source": self.source, "sequences": self.sequences, "positions": self.positions,
                "sha256": self.digest, "cache": self.cache_path, "reused": self.reused,
                "seconds": round(self.seconds, 3), "notes": list(self.notes)}


def split_validation(data: TrainingData, fraction: float) -> tuple[TrainingData, TrainingData | None]:
    """(training part, held-out part): every round(1/fraction)-th whole sequence is held out for selecting the
    checkpoint, so it is never trained on. None when there are too few sequences to spare one."""
    import torch

    if fraction <= 0 or data.sequences < 2:
        return data, None
    every = max(2, round(1 / fraction))
    picked = [i for i in range(data.sequences) if i % every == every - 1] or [data.sequences - 1]
    held = set(picked)
    rest = [i for i in range(data.sequences) if i not in held]

    def subset(indices: list[int], part: str) -> TrainingData:
        offsets = data.offsets.tolist()
        rows = torch.cat([torch.arange(offsets[i], offsets[i + 1]) for i in indices])
        lengths = torch.tensor([offsets[i + 1] - offsets[i] for i in indices])
        soft = {} if data.soft_ids is None else {"soft_ids": data.soft_ids[rows], "soft_probs": data.soft_probs[rows]}
        return dataclasses.replace(data, tokens=data.tokens[rows], labels=data.labels[rows], aux=data.aux[rows],
                                   offsets=torch.cat([torch.zeros(1, dtype=torch.long), lengths.cumsum(0)]),
                                   source=f"{data.source} ({part})", **soft)

    return subset(rest, "training part"), subset(picked, "held-out part")


def captured_data(info: TargetInfo, aux_ids: tuple[int, ...], opts, device: str, *,
                  progress: Progress | None = None) -> TrainingData:
    """The data `opts` (eaglekit.finetune.options.FinetuneOptions) plans, captured on `device` by the reference
    backend into a store in the cache (or read back from it), every row in memory as the training loop reads it."""
    from eaglekit.capture.cache import captured
    from eaglekit.capture.reader import read_training_store
    from eaglekit.capture.run import CaptureOptions

    started = time.perf_counter()
    capture = CaptureOptions(target=opts.target, data=opts.data, aux_ids=aux_ids, device=device,
                             dtype=opts.target_dtype, target_quantization=opts.target_quantization)
    with captured(capture, opts.cache_dir, progress=progress) as done:
        rows = read_training_store(done.store, info, aux_ids, device=device, quantization=opts.target_quantization)
        rows = dataclasses.replace(rows, aux=rows.aux.in_memory(), source=done.report.data,
                                   notes=list(done.plan_notes))
    return TrainingData.of(rows, cache_path=done.store if done.cached else None, reused=done.reused,
                           seconds=time.perf_counter() - started)


def imported_data(directory: str, aux_ids: tuple[int, ...], captured_ids: tuple[int, ...] | None) -> TrainingData:
    """vLLM extract_hidden_states files read as training data (labels: the files' own next tokens)."""
    from eaglekit.capture.vllm_files import read_labelled_files

    started = time.perf_counter()
    rows = read_labelled_files(directory, aux_ids, captured_ids=captured_ids)
    return TrainingData.of(rows, seconds=time.perf_counter() - started)
