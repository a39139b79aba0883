"""What `finetune` is asked: its options, checked against each other before anything is read (a refusal after
capture or training would cost the whole run), and as the report and the provenance record them.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from eaglekit.capture.plan import DataOptions
from eaglekit.errors import UsageError
from eaglekit.finetune.evaluate import EvalOptions
from eaglekit.runner import ENGINE_ALONE
from eaglekit.runtime.engine import EngineOptions
from eaglekit.target_model import check_device


@dataclass(frozen=True)
class FinetuneOptions:
    target: str
    data: DataOptions = DataOptions()
    import_dir: str | None = None  # states captured elsewhere (vLLM extract_hidden_states files)
    captured_ids: tuple[int, ...] | None = None  # the layer ids vLLM captured into those files (default: the draft's)
    cache_dir: str | None = None  # where captured states are stored (default: eaglekit.capture.cache's)
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
    engine: EngineOptions = EngineOptions()  # how vLLM runs when it decodes the paired check (eval.engine)

    def check(self) -> None:
        """The options against each other, before anything is read or torch is imported; the training options
        (which need torch) are checked by `checked_options`."""
        self.data.check()
        check_device(self.device)
        if self.eval is not None:
            self.eval.check()
            if not self.keep_unresolved:
                self.eval.check_resolvable()
        if not 0 <= self.validation_fraction < 1:
            raise UsageError("--validation-fraction must lie in [0, 1) (0: keep the last step, no selection)")
        if self.captured_ids is not None and not self.import_dir:
            raise UsageError("--captured-ids names the layers vLLM captured into --import: give --import too, or drop "
                             "--captured-ids")
        if self.import_dir and self.data != DataOptions():
            raise UsageError("--import brings its own sequences: it cannot be combined with --data, --generate, "
                             "--context-tokens, --code-tokens or --templates")
        if self.store and (self.data != DataOptions() or self.import_dir):
            raise UsageError("--store brings its own sequences: it cannot be combined with --data, --generate, "
                             "--context-tokens, --code-tokens, --templates or --import")
        self._check_read_states()
        if self.soft_targets and not self.store:
            raise UsageError("--soft-targets needs --store: the teacher's probabilities are computed from a store's "
                             "id-L states (eaglekit capture)")
        if self.eval is not None and self.eval.engine == ENGINE_ALONE and self.target_quantization:
            raise UsageError(f"--eval-engine vllm with --target-quantization {self.target_quantization}: vLLM would "
                             "serve the target in full precision; measure the quantized target with --eval-engine "
                             "reference")
        if self.eval is not None and self.eval.engine == ENGINE_ALONE and self.import_dir:
            raise UsageError("--eval-engine vllm with --import: import the states into a store (eaglekit capture "
                             "--import) and fine-tune with --store")
        if self.soft_targets < 0:
            raise UsageError("--soft-targets must not be negative (0: the target's greedy tokens as labels)")
        if self.checkpoint_every < 0:
            raise UsageError("--checkpoint-every must not be negative (0: only on Ctrl-C or SIGTERM)")
        if self.from_scratch and self.warm_start != "auto":
            raise UsageError(f"--warm-start {self.warm_start} with --from-scratch: it re-initialises every trained "
                             "weight, so there is no warm start to set up or skip; drop --warm-start")

    def _check_read_states(self) -> None:
        """States read from elsewhere (--store, --import) are never captured here: the capture cache is not used,
        and --import's files hold the numerics vLLM served them with."""
        read = "--store" if self.store else "--import" if self.import_dir else None
        if read and self.cache_dir:
            raise UsageError(f"--cache-dir with {read}: it is where finetune keeps the states it captures, and "
                             f"{read} trains on states captured already; drop --cache-dir")
        if self.import_dir and self.target_quantization:
            raise UsageError(f"--target-quantization {self.target_quantization} with --import: its files hold the "
                             "states as vLLM served the target, and the evaluation does not run; drop "
                             "--target-quantization")


def checked_options(opts: FinetuneOptions) -> FinetuneOptions:
    """The options with the training defaults filled in, refused in one line before anything is read when they
    contradict each other: a refusal after capture or training would cost the whole run."""
    opts.check()
    from eaglekit.finetune.train import TrainOptions, resolve_precision

    train_opts = opts.train or TrainOptions()
    train_opts.check()
    train_opts = dataclasses.replace(train_opts, precision=resolve_precision(train_opts.precision, opts.device))
    if train_opts.depth > opts.data.max_length:
        raise UsageError(f"--depth {train_opts.depth} exceeds --max-length {opts.data.max_length}: deeper steps "
                         "would have no labels")
    if train_opts.select_every is not None and opts.validation_fraction == 0:
        raise UsageError("--select-every with --validation-fraction 0: it scores the held-out sequences, and 0 holds "
                         "none out (the last step is kept); drop one of them")
    if opts.plot and train_opts.steps == 0:
        raise UsageError("--plot with --steps 0: it draws the training's loss and accuracy by step, and --steps 0 "
                         "trains none; drop one of them")
    return dataclasses.replace(opts, train=train_opts)


def options_dict(opts: FinetuneOptions) -> dict[str, Any]:
    from dataclasses import asdict

    def plain(v):
        return list(v) if isinstance(v, tuple) else v

    return {
        "data": {**{k: plain(v) for k, v in asdict(opts.data).items()}, "import": opts.import_dir,
                 "captured_ids": plain(opts.captured_ids), "cache_dir": opts.cache_dir},
        "train": {k: plain(v) for k, v in asdict(opts.train).items()},
        "eval": {k: plain(v) for k, v in asdict(opts.eval).items()} if opts.eval else None,
        "device": opts.device, "target_dtype": opts.target_dtype, "target_quantization": opts.target_quantization,
        "warm_start": opts.warm_start,
        "checkpoint_every": opts.checkpoint_every,
        "resume": opts.resume, "validation_fraction": opts.validation_fraction, "from_scratch": opts.from_scratch,
        "keep_unresolved": opts.keep_unresolved, "store": opts.store, "max_resident_shards": opts.max_resident_shards,
        "soft_targets": opts.soft_targets,
    }
