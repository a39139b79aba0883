"""What the caller asks of a verify; one object shared by the CLI, compare, finetune's evaluation and the API."""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

from eaglekit.decode.prefix import PREFILL_CHUNK, check_chunk
from eaglekit.decode.prompts import check_template
from eaglekit.decode.sampling import DEFAULT_SEED, Sampling
from eaglekit.decode.settings import Condition
from eaglekit.engines import VLLM_RUNNERS
from eaglekit.errors import UsageError
from eaglekit.io.outputs import Role
from eaglekit.quantization import scheme
from eaglekit.rules import checked_engines
from eaglekit.runner import ENGINE_ALONE, REFERENCE, RUNNERS
from eaglekit.runtime.engine import EngineOptions
from eaglekit.target_model import check_device

BOTH = "both"
ENGINES = (*RUNNERS, BOTH)
"""What verify runs: eaglekit's reference decode, the vLLM engine alone, or both and compares them."""


@dataclass(frozen=True)
class VerifyOptions:
    num_speculative_tokens: int = 3
    max_new_tokens: int = 64
    prompts_file: str | None = None
    limit: int | None = None  # first N prompts only
    context_tokens: int | tuple[int, ...] = 0  # several values: a sweep, one condition per value and template
    device: str = "auto"  # CUDA when present
    dtype: str = "auto"  # float32 on CPU, bfloat16 on CUDA
    aux_layer_ids: tuple[int, ...] | None = None  # override, vLLM convention
    diagnose: bool = False
    min_acceptance: float | None = None
    warmup: bool = True
    engine: str = "reference"  # reference (eaglekit's decode), vllm (the engine alone) or both, compared
    engine_options: EngineOptions = EngineOptions()
    as_eaglekit_reads: bool = False  # skip the second decode of the files as vLLM reads them
    engine_version: str | None = None  # the vLLM version whose reading is mirrored (default: the latest modelled)
    vllm_runner: str | None = None  # v1 | v2 (default: that version's default runner for the target)
    categories: tuple[str, ...] = ()  # only prompts of these categories (SPEED-Bench's, or a JSONL "category")
    turns: str = "first"  # SPEED-Bench conversations: the first user turn, or every turn after the target's answers
    template: str | tuple[str, ...] = "chat"  # how prompts reach the target (prompts.TEMPLATES); several: a sweep
    outputs: tuple[Role, ...] = ()  # what the caller writes from the result (--save-report, --plot, ...)
    target_quantization: str | None = None  # the target computes with these served numerics (quantization.SCHEMES)
    temperature: float = 0.0  # 0: greedy; above: sampled as vLLM's rejection sampler samples (decode/sampling.py)
    top_p: float = 1.0
    seed: int = DEFAULT_SEED  # the sampled decode's generator
    prefill_chunk: int | None = PREFILL_CHUNK  # prompt rows per target/drafter forward (None: one forward, no reuse)

    @property
    def sampling(self) -> Sampling:
        return Sampling(self.temperature, self.top_p, self.seed)

    @property
    def conditions(self) -> tuple[Condition, ...]:
        """Every template with every context length, in the order given (templates outer)."""
        contexts = (self.context_tokens,) if isinstance(self.context_tokens, int) else tuple(self.context_tokens)
        templates = (self.template,) if isinstance(self.template, str) else tuple(self.template)
        return tuple(Condition(template, context) for template in templates for context in contexts)

    @property
    def engine_only(self) -> bool:
        """The engine alone decodes (no reference decode to draw or compare)."""
        return self.engine == ENGINE_ALONE

    @property
    def condition(self) -> Condition:
        """The one condition these options decode under (narrowed by `at`; a sweep has several)."""
        only, *more = self.conditions
        if more:
            raise UsageError("one decode measures one condition: give one --context-tokens value and one --template")
        return only

    def at(self, condition: Condition) -> "VerifyOptions":
        """These options for one condition of the sweep."""
        return dataclasses.replace(self, context_tokens=condition.context_tokens, template=condition.template)

    def check(self) -> None:
        if self.engine not in ENGINES:
            raise UsageError(f"--engine {self.engine!r}: use one of {', '.join(ENGINES)}")
        scheme(self.target_quantization)
        check_device(self.device)
        self.sampling.check()
        if not self.sampling.greedy and self.engine != REFERENCE:
            raise UsageError(f"--temperature {self.temperature:g} with --engine {self.engine}: the engine's counters "
                             "are compared with the reference draft for draft only greedily; `eaglekit bench "
                             "--temperature` measures vLLM's acceptance when it samples")
        if self.target_quantization and self.engine != REFERENCE:
            raise UsageError(f"--target-quantization {self.target_quantization} with --engine {self.engine}: the "
                             "engine would serve the target in full precision (vLLM's CPU build has no FP8 kernel, and "
                             "its online INT8 and NVFP4 quantize MoE experts only); measure the quantized target with "
                             "--engine reference")
        given = self.engine_options.speculative_settings
        if given and self.engine == REFERENCE:
            raise UsageError(f"--engine-arg {next(iter(given))} sets vLLM's speculative config, which --engine "
                             "reference does not run: give --engine vllm (the reference decode counts acceptance "
                             "under vLLM's default rule)")
        self._check_engine_alone()
        check_chunk(self.prefill_chunk)
        if self.num_speculative_tokens < 1:
            raise UsageError("--num-speculative-tokens must be at least 1")
        if self.max_new_tokens < 1:
            raise UsageError("--max-new-tokens must be at least 1")
        if self.limit is not None and self.limit < 1:
            raise UsageError("--limit must be at least 1")
        if self.min_acceptance is not None and not math.isfinite(self.min_acceptance):
            raise UsageError(f"--min-acceptance {self.min_acceptance}: expected a finite number (an acceptance "
                             "length, at least 1)")
        conditions = self.conditions
        if not conditions:
            raise UsageError("--context-tokens and --template need at least one value each")
        if any(c.context_tokens < 0 for c in conditions):
            raise UsageError("--context-tokens must not be negative")
        for c in conditions:
            check_template(c.template)
        if len(set(conditions)) != len(conditions):
            raise UsageError("--context-tokens and --template: each value once")
        if self.vllm_runner is not None and self.vllm_runner not in VLLM_RUNNERS:
            raise UsageError(f"--vllm-runner {self.vllm_runner!r}: use one of {', '.join(VLLM_RUNNERS)}")
        if self.engine_version is not None:
            checked_engines("vllm", self.engine_version)
        self._check_served_reading()

    def _check_served_reading(self) -> None:
        """--vllm-runner picks the runner whose reading of the files is decoded beside eaglekit's (the report's
        served section): refused where that decode does not run, rather than silently ignored."""
        if self.vllm_runner is None or self.engine_only:
            return
        skipped = next((why for why, given in (
            ("--as-eaglekit-reads (which skips that decode)", self.as_eaglekit_reads),
            ("--aux-layer-ids (the decode then reads the ids given, not the files)", self.aux_layer_ids is not None),
            ("several --context-tokens or --template values (that decode runs for one condition)",
             len(self.conditions) > 1)) if given), None)
        if skipped:
            raise UsageError(f"--vllm-runner with {skipped}: it picks the vLLM runner whose reading of the files is "
                             "decoded beside eaglekit's; drop one of them")

    def _check_engine_alone(self) -> None:
        """With --engine vllm only vLLM decodes: a setting of the reference decode would be silently ignored, and
        vLLM measures first turns only."""
        if not self.engine_only:
            return
        reference_only = [flag for flag, value in (("--diagnose", self.diagnose),
                                                    ("--aux-layer-ids", self.aux_layer_ids is not None),
                                                    ("--as-eaglekit-reads", self.as_eaglekit_reads),
                                                    ("--min-acceptance", self.min_acceptance is not None)) if value]
        if reference_only:
            raise UsageError(f"{reference_only[0]} with --engine vllm: it applies to the reference decode, which "
                             "--engine vllm does not run; give --engine both, or drop it")
        mirrored = [flag for flag, value in (("--engine-version", self.engine_version),
                                             ("--vllm-runner", self.vllm_runner)) if value is not None]
        if mirrored:
            raise UsageError(f"{mirrored[0]} with --engine vllm: it names the vLLM whose reading of the files the "
                             "reference decode mirrors; --engine vllm runs the installed vLLM, which reads them "
                             "itself; give --engine both, or drop it")
        if self.device != "auto":
            raise UsageError(f"--device {self.device} with --engine vllm: it places the target the reference decode "
                             "loads; vLLM runs on its own platform's devices (--tensor-parallel-size), in --dtype; "
                             "drop --device")
        if self.turns == "all":
            raise UsageError("--turns all with --engine vllm: each later turn follows the target's answer to the one "
                             "before, which only the reference decodes; give --turns first")
