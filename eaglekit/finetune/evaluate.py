"""Held-out acceptance of a trained draft against its source: prompts never trained on, both drafts replayed on
one target pass per prompt (compare), the difference with a paired bootstrap interval.

Greedy speculative decoding is lossless by construction (and verify proves it on the same loop), so only the
speculative pass runs here: τ and the per-position rates come from vLLM's counter definitions
(eaglekit.verify.metrics), for a short-prompt setting and a long-context one.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from eaglekit.verify.prompts import Prompt

if TYPE_CHECKING:
    from eaglekit.verify.options import VerifyOptions


@dataclass(frozen=True)
class EvalOptions:
    prompts_file: str | None = None  # default: verify's bundled coding prompts (not in the training prompts)
    limit: int = 8
    max_new_tokens: int = 64
    k: int = 3
    context_tokens: tuple[int, ...] = (0, 1024)  # one setting per entry; 0 = the prompts as they are

    def check(self) -> None:
        """Refuse, before any work, settings the evaluation after training would refuse."""
        from eaglekit.errors import UsageError

        if self.limit < 1 or self.max_new_tokens < 1 or self.k < 1:
            raise UsageError("--eval-limit, --eval-max-new-tokens and -k must be at least 1")
        contexts = tuple(self.context_tokens)
        if not contexts or any(c < 0 for c in contexts) or len(set(contexts)) != len(contexts):
            raise UsageError(f"--eval-context-tokens {','.join(map(str, contexts))!r}: expected distinct "
                             "non-negative integers such as 0,1024")

    def decode_options(self, device: str = "auto", dtype: str = "auto") -> VerifyOptions:
        """The compare run this evaluation is: its prompts, k, new tokens and context settings, on `device` in `dtype`
        (the target's)."""
        from eaglekit.verify.options import VerifyOptions

        return VerifyOptions(num_speculative_tokens=self.k, max_new_tokens=self.max_new_tokens,
                             prompts_file=self.prompts_file, limit=self.limit,
                             context_tokens=tuple(self.context_tokens), device=device, dtype=dtype)


@dataclass(frozen=True)
class Paired:
    """One context setting: the source (before) and the output (after) on the same prompts, and after − before."""

    context_tokens: int
    before: dict[str, Any]  # context_tokens, prompts, acceptance_length, per_position_acceptance, drafts
    after: dict[str, Any]
    difference: float
    interval: dict[str, Any] | None  # 95 % paired bootstrap over prompts
    verdict: str  # "better" | "worse" | "not resolved" | "too few prompts"

    @classmethod
    def of(cls, context_tokens: int, row: dict[str, Any], prompts: int) -> Paired:
        """From a compare row (a = the source, b = the output)."""
        def side(s: dict[str, Any]) -> dict[str, Any]:
            return {"context_tokens": context_tokens, "prompts": prompts,
                    "acceptance_length": round(s["acceptance_length"], 4),
                    "per_position_acceptance": [round(r, 4) for r in s["per_position_acceptance"]],
                    "drafts": s["num_drafts"]}

        diff = row["b_minus_a"]
        verdict = {"B better": "better", "A better": "worse"}.get(diff["verdict"], diff["verdict"])
        return cls(context_tokens, side(row["a"]), side(row["b"]), diff["acceptance_length_difference"],
                   diff["interval"], verdict)

    def describe(self) -> str:
        where = f"+{self.context_tokens} tokens of context" if self.context_tokens else "prompts as they are"
        span = (f" [{self.interval['low']:+.3f}, {self.interval['high']:+.3f}]" if self.interval else "")
        return f"τ {self.difference:+.3f}{span} with {where}"

    def to_dict(self) -> dict[str, Any]:
        return {"context_tokens": self.context_tokens, "acceptance_length_difference": round(self.difference, 4),
                "interval": self.interval, "verdict": self.verdict}


def resolved_worse(paired: Sequence[Paired]) -> str | None:
    """The settings where the output is resolved worse than its source (the whole interval below 0), or None."""
    worse = [p.describe() for p in paired if p.verdict == "worse"]
    return "; ".join(worse) or None


def held_out_prompts(opts: EvalOptions) -> tuple[str, tuple[Prompt, ...]]:
    """The prompts the evaluation decodes (the compare run's own selection), for the report to name."""
    from eaglekit.verify.setup import select_prompts

    prompts = select_prompts(opts.decode_options())
    return prompts.name, prompts.prompts
