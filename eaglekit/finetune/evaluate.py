"""Held-out acceptance of a trained draft against its source: prompts never trained on, under every template and
context setting it will be served with, both drafts replayed on one target pass per prompt (compare), the
difference per condition and pooled over all of them, with paired bootstrap intervals over prompts.

Greedy speculative decoding is lossless by construction (and verify proves it on the same loop), so only the
speculative pass runs here: τ and the per-position rates come from vLLM's counter definitions
(eaglekit.decode.metrics).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from eaglekit.decode.prompts import Prompt
from eaglekit.runner import RUNNERS

if TYPE_CHECKING:
    from eaglekit.decode.compare import CompareSweep
    from eaglekit.decode.options import VerifyOptions
    from eaglekit.decode.settings import Condition
    from eaglekit.runtime.engine import EngineOptions


DEFAULT_TEMPLATES = ("chat", "system", "raw")
DEFAULT_CONTEXTS = (0, 1024)
REFERENCE_DECODE = "eaglekit's reference decode (the target loaded here)"
AUTO = "auto"
EVAL_ENGINES = (AUTO, *RUNNERS)
"""Who decodes the paired check: eaglekit's reference (the target loaded here), vLLM (its per-request counters, any
target size), or auto: the reference where the target loads here, vLLM where it is too large for this device."""


@dataclass(frozen=True)
class EvalOptions:
    """The held-out evaluation that decides whether finetune writes its result: the prompts, every template and
    context setting the draft will be served under, the k it will be served with."""

    prompts_file: str | None = None  # default: verify's bundled coding prompts (not in the training prompts)
    limit: int | None = 16  # first N prompts (the bundled set has 16)
    max_new_tokens: int = 64
    k: int = 3
    context_tokens: tuple[int, ...] = DEFAULT_CONTEXTS  # one setting per entry; 0 = the prompts as they are
    templates: tuple[str, ...] = DEFAULT_TEMPLATES  # verify's --template conditions
    engine: str = AUTO  # EVAL_ENGINES

    def check(self) -> None:
        """Refuse, before any work, settings the evaluation after training would refuse."""
        from eaglekit.errors import UsageError

        if self.engine not in EVAL_ENGINES:
            raise UsageError(f"--eval-engine {self.engine!r}: use one of {', '.join(EVAL_ENGINES)}")
        if (self.limit is not None and self.limit < 1) or self.max_new_tokens < 1 or self.k < 1:
            raise UsageError("--eval-limit, --eval-max-new-tokens and -k must be at least 1")
        contexts = tuple(self.context_tokens)
        if not contexts or any(c < 0 for c in contexts) or len(set(contexts)) != len(contexts):
            raise UsageError(f"--eval-context-tokens {','.join(map(str, contexts))!r}: expected distinct "
                             "non-negative integers such as 0,1024")

    def prompt_count(self) -> int:
        """How many prompts the evaluation will pair: the file's (or the bundled set's), capped by --eval-limit."""
        from eaglekit.decode.prompts import bundled_prompts, read_prompts

        prompts = read_prompts(self.prompts_file) if self.prompts_file else bundled_prompts()
        count = len(prompts.prompts)
        return count if self.limit is None else min(count, self.limit)

    def check_resolvable(self) -> None:
        """Refuse, before any work, an evaluation that can never resolve a gain: below MIN_SAMPLES prompts no
        interval is estimated, so nothing would be written after the whole run."""
        from eaglekit.decode.stats import MIN_SAMPLES, too_few
        from eaglekit.errors import UsageError

        count = self.prompt_count()
        if too_few(count):
            given = f"--eval-prompts {self.prompts_file} has {count}" if self.prompts_file and (
                self.limit is None or count < self.limit) else f"--eval-limit {count}"
            raise UsageError(f"{given} held-out prompts: an interval needs {MIN_SAMPLES}, so no gain could be "
                             f"resolved and nothing would be written; give --eval-limit {MIN_SAMPLES} or more, or "
                             "--keep-unresolved to write the result without a resolved gain")

    def decode_options(self, device: str = "auto", dtype: str = "auto",
                       engine: EngineOptions | None = None) -> VerifyOptions:
        """The compare run this evaluation is: its prompts, k, new tokens, templates and context settings, on
        `device` in `dtype` (the target's); `engine`: how vLLM runs when it decodes."""
        from eaglekit.decode.options import VerifyOptions
        from eaglekit.runtime.engine import EngineOptions

        return VerifyOptions(num_speculative_tokens=self.k, max_new_tokens=self.max_new_tokens,
                             prompts_file=self.prompts_file, limit=self.limit,
                             context_tokens=tuple(self.context_tokens), template=tuple(self.templates),
                             device=device, dtype=dtype, engine_options=engine or EngineOptions())

    def describe(self, name: str, prompts: int) -> str:
        contexts = "/".join(f"+{c}" for c in self.context_tokens)
        return (f"{name} ({prompts} prompts × {'/'.join(self.templates)} × {contexts} tokens of context, "
                f"k={self.k}, {self.max_new_tokens} new tokens)")


@dataclass(frozen=True)
class Paired:
    """One condition (template and context): the source (before) and the output (after) on the same prompts, and
    after − before."""

    template: str
    context_tokens: int
    before: dict[str, Any]  # template, context_tokens, prompts, acceptance_length, per_position_acceptance, drafts
    after: dict[str, Any]
    difference: float
    interval: dict[str, Any] | None  # 95 % paired bootstrap over prompts
    verdict: str  # "better" | "worse" | "not resolved" | "too few prompts"
    samples: int  # the conversations the interval resamples (none below MIN_SAMPLES)

    @classmethod
    def of(cls, condition: Condition, row: dict[str, Any], prompts: int) -> Paired:
        """From a compare row (a = the source, b = the output)."""
        def side(s: dict[str, Any]) -> dict[str, Any]:
            return {"template": condition.template, "context_tokens": condition.context_tokens, "prompts": prompts,
                    "acceptance_length": round(s["acceptance_length"], 4),
                    "per_position_acceptance": [round(r, 4) for r in s["per_position_acceptance"]],
                    "drafts": s["num_drafts"]}

        diff = row["b_minus_a"]
        return cls(condition.template, condition.context_tokens, side(row["a"]), side(row["b"]),
                   diff["acceptance_length_difference"], diff["interval"], _verdict(diff["verdict"]), diff["samples"])

    def describe(self) -> str:
        where = f"{self.template}, +{self.context_tokens} tokens of context" if self.context_tokens \
            else self.template
        return f"{where}: τ {self.difference:+.3f}{_span(self.interval, self.samples)}"

    def to_dict(self) -> dict[str, Any]:
        from eaglekit.decode.stats import sample_marker

        return {"template": self.template, "context_tokens": self.context_tokens,
                "acceptance_length_difference": round(self.difference, 4), "interval": self.interval,
                "verdict": self.verdict, **sample_marker(self.samples)}


def _span(interval: dict[str, Any] | None, samples: int) -> str:
    """The interval as printed after a difference, or why there is none."""
    from eaglekit.decode.stats import too_few, too_few_text

    if too_few(samples):
        return f", {too_few_text(samples)}"
    return f" [{interval['low']:+.3f}, {interval['high']:+.3f}]" if interval else ""


def _verdict(compare_verdict: str) -> str:
    return {"B better": "better", "A better": "worse"}.get(compare_verdict, compare_verdict)


@dataclass(frozen=True)
class Gain:
    """After − before over every condition at once, paired by prompt: a prompt's rounds under every template and
    context are pooled and resampled together, so the interval is over prompts, the unit that varies."""

    before: float  # pooled τ of the source
    after: float
    difference: float
    interval: dict[str, Any] | None
    verdict: str
    prompts: int
    conditions: int

    @property
    def too_few(self) -> bool:
        """Below MIN_SAMPLES prompts no interval is estimated, so no gain can be resolved."""
        from eaglekit.decode.stats import too_few

        return too_few(self.prompts)

    @property
    def resolvable(self) -> float | None:
        """The smallest difference this evaluation resolves: the 95 % interval's half-width (≈ 1.96 bootstrap
        standard errors), since a difference resolves when its interval clears 0."""
        return None if self.interval is None else (self.interval["high"] - self.interval["low"]) / 2

    def describe(self) -> str:
        from eaglekit.decode.stats import MIN_SAMPLES

        figures = (f"held-out τ {self.before:.3f} → {self.after:.3f}, paired {self.difference:+.3f}"
                   + ("" if self.too_few else _span(self.interval, self.prompts))
                   + f" over {self.prompts} prompts × {self.conditions} conditions")
        if self.too_few:
            return (f"{figures}: the evaluation had too few prompts to resolve a gain ({self.prompts}, an interval "
                    f"needs {MIN_SAMPLES}); give --eval-limit {MIN_SAMPLES} or more (an --eval-prompts file needs "
                    f"at least {MIN_SAMPLES} prompts)")
        power = f", resolves ±{self.resolvable:.3f}" if self.resolvable is not None else ""
        return figures + power

    def to_dict(self) -> dict[str, Any]:
        from eaglekit.decode.stats import sample_marker

        resolvable = self.resolvable
        return {"before": round(self.before, 4), "after": round(self.after, 4),
                "acceptance_length_difference": round(self.difference, 4), "interval": self.interval,
                "resolvable": None if resolvable is None else round(resolvable, 4), "verdict": self.verdict,
                "prompts": self.prompts, "conditions": self.conditions, **sample_marker(self.prompts)}


def pooled_gain(sweep: CompareSweep) -> Gain:
    """The sweep's conditions pooled per prompt: τ before and after and the paired difference with its interval."""
    from eaglekit.decode.stats import paired_difference, pooled

    k = sweep.reports[0].settings.num_speculative_tokens
    a = [c for r in sweep.reports for c in r.a.counters]
    b = [c for r in sweep.reports for c in r.b.counters]
    groups = [g for r in sweep.reports for g in r.conversations]
    point, interval = paired_difference(a, b, groups)
    if interval is None:
        verdict = "too few prompts"
    else:
        verdict = "better" if interval.low > 0 else "worse" if interval.high < 0 else "not resolved"
    return Gain(pooled(a, k).acceptance_length, pooled(b, k).acceptance_length, point,
                interval.to_dict() if interval else None, verdict, len(set(groups)), len(sweep.reports))


@dataclass(frozen=True)
class Evaluation:
    """The whole held-out evaluation: each condition paired, and all of them pooled."""

    paired: list[Paired]
    gain: Gain
    measured_by: str = REFERENCE_DECODE

    @classmethod
    def of(cls, sweep: CompareSweep, measured_by: str = REFERENCE_DECODE) -> Evaluation:
        return cls([Paired.of(r.settings.condition, r.rows()["all"], len(r.names)) for r in sweep.reports],
                   pooled_gain(sweep), measured_by)

    @property
    def worse(self) -> str | None:
        """The conditions where the output is resolved worse than its source, or None."""
        return "; ".join(p.describe() for p in self.paired if p.verdict == "worse") or None

    @property
    def gained(self) -> bool:
        """The keep rule: a resolved gain over all conditions pooled (interval low > 0), and no condition resolved
        worse."""
        return self.gain.verdict == "better" and self.worse is None

    def describe(self) -> str:
        worse = f"; resolved worse with {self.worse}" if self.worse else ""
        return self.gain.describe() + worse


def held_out_prompts(opts: EvalOptions) -> tuple[str, tuple[Prompt, ...]]:
    """The prompts the evaluation decodes (the compare run's own selection), for the report to name."""
    from eaglekit.decode.setup import select_prompts

    prompts = select_prompts(opts.decode_options())
    return prompts.name, prompts.prompts
