"""Acceptance counters with vLLM's definitions (vllm/v1/spec_decode/metrics.py), and drift statistics.

τ (mean acceptance length) = 1 + accepted / drafts, bonus token included; the per-position rate at
draft position i is unconditional: rounds whose first i+1 drafts were all accepted, over all rounds.
So the rates never increase with i and τ = 1 + Σ rates. Over several prompts the counters are summed before
dividing (`merge`): τ is pooled over every round, not a mean of per-prompt τ, as vLLM pools its counters.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class AcceptanceCounter:
    """Counts of one or more speculative decodes with chains of k drafts."""

    k: int
    drafts: int = 0  # verify rounds
    accepted: int = 0
    accepted_at: list[int] = field(default_factory=list)  # per draft position

    def __post_init__(self) -> None:
        if not self.accepted_at:
            self.accepted_at = [0] * self.k

    def record(self, accepted: int) -> None:
        """One round in which the first `accepted` of k drafts matched the target."""
        if not 0 <= accepted <= self.k:
            raise ValueError(f"accepted {accepted} is outside [0, {self.k}]")
        self.drafts += 1
        self.accepted += accepted
        for i in range(accepted):
            self.accepted_at[i] += 1

    @classmethod
    def from_histogram(cls, histogram: list[int]) -> "AcceptanceCounter":
        """Counters from rounds per accepted-draft count j = 0..k (vLLM's per-request acceptance_histogram)."""
        k = len(histogram) - 1
        return cls(k, drafts=sum(histogram), accepted=sum(j * n for j, n in enumerate(histogram)),
                   accepted_at=[sum(histogram[i + 1:]) for i in range(k)])

    def merge(self, other: "AcceptanceCounter") -> None:
        if other.k != self.k:
            raise ValueError(f"cannot merge counters for k={other.k} and k={self.k}")
        self.drafts += other.drafts
        self.accepted += other.accepted
        self.accepted_at = [a + b for a, b in zip(self.accepted_at, other.accepted_at)]

    @property
    def draft_tokens(self) -> int:
        return self.drafts * self.k

    @property
    def acceptance_length(self) -> float:
        return 1.0 + self.accepted / self.drafts if self.drafts else 1.0

    @property
    def per_position(self) -> list[float]:
        return [a / self.drafts if self.drafts else 0.0 for a in self.accepted_at]

    @property
    def conditional(self) -> list[float]:
        """P(draft i accepted | drafts before it accepted): rate_i / rate_{i-1}."""
        out, previous = [], 1.0
        for rate in self.per_position:
            out.append(rate / previous if previous else 0.0)
            previous = rate
        return out

    @property
    def draft_acceptance_rate(self) -> float:
        return self.accepted / self.draft_tokens if self.drafts else 0.0


@dataclass
class DriftStats:
    """Per draft depth (1..k): mean RMS of the hidden state fed into that step and mean attention on position 0."""

    k: int
    rms_sum: list[float] = field(default_factory=list)
    rms_count: list[int] = field(default_factory=list)
    sink_sum: list[float] = field(default_factory=list)
    sink_count: list[int] = field(default_factory=list)

    def __post_init__(self) -> None:
        for name in ("rms_sum", "rms_count", "sink_sum", "sink_count"):
            if not getattr(self, name):
                setattr(self, name, [0] * self.k)

    def record(self, depth: int, hidden_rms: float, sink: float | None) -> None:
        """`depth` counts from 1: the first draft of a round."""
        i = depth - 1
        self.rms_sum[i] += hidden_rms
        self.rms_count[i] += 1
        if sink is not None:
            self.sink_sum[i] += sink
            self.sink_count[i] += 1

    def merge(self, other: "DriftStats") -> None:
        for name in ("rms_sum", "rms_count", "sink_sum", "sink_count"):
            setattr(self, name, [a + b for a, b in zip(getattr(self, name), getattr(other, name))])

    def rows(self) -> list[dict]:
        return [
            {
                "depth": i + 1,
                "hidden_rms": self.rms_sum[i] / self.rms_count[i] if self.rms_count[i] else None,
                "sink_attention": self.sink_sum[i] / self.sink_count[i] if self.sink_count[i] else None,
                "samples": self.rms_count[i],
            }
            for i in range(self.k)
        ]
