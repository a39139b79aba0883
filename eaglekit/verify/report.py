"""The verify report: what the CLI renders, `--save-report` writes and `push` puts in the model card.

Its JSON form is described by schemas/verify-report.schema.json.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from eaglekit import __version__
from eaglekit.decode.metrics import AcceptanceCounter, DriftStats
from eaglekit.decode.settings import Condition, DecodeSettings, plain_report, quantization_entry, sweep_document
from eaglekit.decode.speculative import Clock
from eaglekit.decode.stats import (
    Interval,
    by_category,
    intervals_dict,
    per_position_intervals,
    pooled_speed_ratio_interval,
    sample_marker,
    tau_interval,
)
from eaglekit.findings import Finding
from eaglekit.verify.acceptance_profile import speculation_profile
from eaglekit.verify.diagnose import Diagnosis

SWEEP_SHARED = ("eaglekit_version", "draft", "target", "eagle_version", "flags", "aux_layer_ids",
                "aux_layer_ids_source", "checks", "num_speculative_tokens", "max_new_tokens", "dtype", "device",
                "target_quantization", "sampling", "acceptance_settings",
                "min_acceptance", "tie_tolerance", "notes", "measured")
"""Verify report keys every condition of a sweep shares: written once, before the conditions."""


@dataclass
class PromptOutcome:
    name: str
    prompt_tokens: int
    generated_tokens: int
    acceptance_length: float
    identical: bool | None  # speculative output == target-only output, token for token (None: sampled, not comparable)
    divergence: dict[str, Any] | None = None  # first differing position and how close the target's top-2 were
    category: str | None = None
    conversation: str | None = None  # turns of one conversation share it
    counter: AcceptanceCounter | None = None  # this prompt's own rounds
    spec_s: float = 0.0  # this prompt's decode with the draft, timed right after ...
    target_s: float = 0.0  # ... the target's own decode of it (the two timed phases interleave prompt by prompt)
    target_tokens: int = 0


@dataclass
class VerifyReport:
    draft: str
    settings: DecodeSettings
    eagle_version: str
    flags: dict[str, bool]
    aux_layer_ids: list[int]
    aux_layer_ids_source: str
    chat_template: bool
    checks: list[Finding]  # the decode rules' findings (EK291..EK299): the compatibility of draft and target
    counter: AcceptanceCounter
    drift: DriftStats
    spec_clock: Clock
    target_only_s: float
    spec_tokens: int
    target_tokens: int
    outcomes: list[PromptOutcome]
    tie_tolerance: float
    diagnosis: Diagnosis | None = None
    min_acceptance: float | None = None
    notes: list[str] = field(default_factory=list)
    engine: dict[str, Any] | None = None  # --engine both: what vLLM measured (eaglekit.runtime.engine.EngineRun)
    engine_comparison: dict[str, Any] | None = None
    served: dict[str, Any] | None = None  # vLLM's reading of the files as they are (eaglekit.verify.run.served_section)
    measured: dict[str, Any] | None = None  # SHA-256 of the draft's files and the target's identity (push checks them)

    @property
    def sampled(self) -> bool:
        return not self.settings.sampling.greedy

    @property
    def exact(self) -> bool | None:
        return None if self.sampled else all(o.identical for o in self.outcomes)

    @property
    def lossless(self) -> bool | None:
        """Identical output, or a first divergence where the target's own top-2 logits were tied within tolerance.
        None when sampled: one draw per prompt cannot show that the output follows the target's distribution (the
        test suite checks that statistically)."""
        if self.sampled:
            return None
        return all(o.identical or (o.divergence or {}).get("numerical_tie", False) for o in self.outcomes)

    @property
    def acceptance_length(self) -> float:
        return self.counter.acceptance_length

    @property
    def tokens_per_s_spec(self) -> float:
        return self.spec_tokens / self.spec_clock.total_s if self.spec_clock.total_s else 0.0

    @property
    def tokens_per_s_target(self) -> float:
        return self.target_tokens / self.target_only_s if self.target_only_s else 0.0

    def speedup_interval(self) -> Interval | None:
        """How far the reference decode's speed ratio moves with the prompts drawn: a ratio whose interval holds 1
        says nothing about the draft's speed (batch 1, this machine; `eaglekit bench` measures serving)."""
        return pooled_speed_ratio_interval([(o.generated_tokens, o.spec_s) for o in self.outcomes],
                                           [(o.target_tokens, o.target_s) for o in self.outcomes])

    def _counters(self) -> tuple[list[AcceptanceCounter], list[str]]:
        counters = [o.counter or AcceptanceCounter(self.counter.k) for o in self.outcomes]
        return counters, [o.conversation or o.name for o in self.outcomes]

    def categories(self) -> dict[str, dict] | None:
        """Acceptance per category with its interval; None when no prompt has a category."""
        if all(o.category is None for o in self.outcomes):
            return None
        counters, groups = self._counters()
        return by_category(counters, [o.category for o in self.outcomes], groups, self.counter.k)

    def interval(self) -> Interval | None:
        counters, groups = self._counters()
        return tau_interval(counters, groups)

    def speculation_profile(self) -> dict:
        """This run as specdec_bench's speculation_profile.json (schema 1.0)."""
        run = self.settings
        return speculation_profile(
            self.counter, per_request=[o.acceptance_length for o in self.outcomes if o.counter and o.counter.drafts],
            draft=self.draft, target=run.target, eagle_version=self.eagle_version, per_category=self.categories(),
            conditions={"engine": "eaglekit reference decode", "dataset": run.prompts_name,
                        "prompts": len(self.outcomes), "context_tokens": run.context_tokens,
                        "max_new_tokens": run.max_new_tokens, "sampling": run.sampling.label, "concurrency": 1,
                        "dtype": run.dtype, "device": run.device})

    @property
    def passed(self) -> bool:
        return self.lossless is not False and (self.min_acceptance is None
                                               or self.acceptance_length >= self.min_acceptance)

    def to_dict(self) -> dict[str, Any]:
        c, run = self.counter, self.settings
        doc: dict[str, Any] = {
            "eaglekit_version": __version__,
            "draft": self.draft,
            "target": run.target,
            "passed": self.passed,
            "lossless": self.lossless,
            "exact_match": self.exact,
            "acceptance_length": c.acceptance_length,
            "per_position_acceptance": c.per_position,
            "per_position_acceptance_interval": intervals_dict(per_position_intervals(*self._counters())),
            "conditional_acceptance": c.conditional,
            "draft_acceptance_rate": c.draft_acceptance_rate,
            "num_speculative_tokens": c.k,
            "num_drafts": c.drafts,
            "num_draft_tokens": c.draft_tokens,
            "num_accepted_tokens": c.accepted,
            "acceptance_length_interval": interval.to_dict() if (interval := self.interval()) else None,
            **sample_marker(len(set(self._counters()[1]))),
            "categories": self.categories(),
            "min_acceptance": self.min_acceptance,
            "tokens_per_s_spec": self.tokens_per_s_spec,
            "tokens_per_s_target": self.tokens_per_s_target,
            "speedup": self.tokens_per_s_spec / self.tokens_per_s_target if self.tokens_per_s_target else None,
            "speedup_interval": speed.to_dict() if (speed := self.speedup_interval()) else None,
            "time_split": {
                "spec_total_s": self.spec_clock.total_s,
                "spec_draft_s": self.spec_clock.draft_s,
                "spec_target_s": self.spec_clock.target_s,
                "target_only_s": self.target_only_s,
            },
            "checks": [f.to_dict() for f in self.checks],
            "drift": self.drift.rows(),
            "eagle_version": self.eagle_version,
            "flags": self.flags,
            "aux_layer_ids": self.aux_layer_ids,
            "aux_layer_ids_source": self.aux_layer_ids_source,
            "prompts": {
                "name": run.prompts_name,
                "count": len(self.outcomes),
                "context_tokens": run.context_tokens,
                "chat_template": self.chat_template,
                "mean_prompt_tokens": (sum(o.prompt_tokens for o in self.outcomes) / len(self.outcomes)
                                       if self.outcomes else 0.0),
            },
            "max_new_tokens": run.max_new_tokens,
            "dtype": run.dtype,
            "device": run.device,
            **quantization_entry(run),
            "sampling": run.sampling.to_dict(),
            "acceptance_settings": run.acceptance_settings,
            "tie_tolerance": self.tie_tolerance,
            "per_prompt": [
                {
                    "name": o.name,
                    "prompt_tokens": o.prompt_tokens,
                    "generated_tokens": o.generated_tokens,
                    "acceptance_length": o.acceptance_length,
                    "identical": o.identical,
                    "divergence": o.divergence,
                    "category": o.category,
                    "conversation": o.conversation,
                    "num_drafts": o.counter.drafts if o.counter else None,
                    "per_position_acceptance": o.counter.per_position if o.counter else None,
                }
                for o in self.outcomes
            ],
            "notes": list(self.notes) + ([run.sampling.sample_note] if self.sampled else []),
            "served": self.served,
            "measured": self.measured,
        }
        if self.engine is not None:
            doc["engine"] = self.engine
            doc["engine_comparison"] = self.engine_comparison
        if self.diagnosis is not None:
            d = self.diagnosis
            doc["hypotheses"] = d.result_rows()
            doc["diagnosis"] = {"verdict": d.verdict, "best": d.best, "message": d.message, "fix": d.fix}
        return doc


@dataclass
class VerifySweep:
    """verify under several conditions (templates x contexts), one report each, decoded with one loaded target and
    drafter. A sweep of one chat-template condition writes exactly that condition's report."""

    reports: list[VerifyReport]

    @property
    def conditions(self) -> list[Condition]:
        return [r.settings.condition for r in self.reports]

    @property
    def lossless(self) -> bool | None:
        verdicts = [r.lossless for r in self.reports]
        return None if None in verdicts else all(verdicts)

    @property
    def passed(self) -> bool:
        return all(r.passed for r in self.reports)

    def to_dict(self) -> dict[str, Any]:
        docs = [r.to_dict() for r in self.reports]
        if plain_report(self.conditions):
            return docs[0]
        first = docs[0]
        header = {key: first[key] for key in ("eaglekit_version", "draft", "target")}
        header.update(passed=self.passed, lossless=self.lossless,
                      **{key: first[key] for key in SWEEP_SHARED if key in first})
        return sweep_document(header, [(c, {k: v for k, v in doc.items() if k not in SWEEP_SHARED})
                                       for c, doc in zip(self.conditions, docs)])
