"""What a decode ran under: the condition of each measurement (template, long context) and the settings every report
of a verify or compare run carries, with the layout both reports share for one condition or a sweep of several."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from eaglekit.decode.sampling import Sampling
from eaglekit.engines.vllm import acceptance_settings


@dataclass(frozen=True)
class Condition:
    """What the prompts were decoded under in one measurement of a sweep: their template and long context."""

    template: str = "chat"
    context_tokens: int = 0

    @property
    def label(self) -> str:
        return f"{self.template}, +{self.context_tokens} tokens of context" if self.context_tokens else self.template


@dataclass(frozen=True)
class DecodeSettings:
    """What a verify or compare run decoded under: both reports carry it and write it the same way."""

    target: str
    num_speculative_tokens: int
    max_new_tokens: int
    dtype: str
    device: str
    prompts_name: str
    context_tokens: int
    template: str = "chat"
    target_quantization: dict[str, Any] | None = None  # the served numerics the target computed with (None: full)
    sampling: Sampling = Sampling()  # greedy unless a temperature was given
    engine_settings: dict[str, Any] | None = None  # vLLM's speculative-config settings (None: the reference decode)

    @property
    def condition(self) -> Condition:
        return Condition(self.template, self.context_tokens)

    @property
    def acceptance_settings(self) -> dict[str, Any]:
        """The rule acceptance was counted under, in vLLM's terms (eaglekit.engines.vllm.acceptance_settings)."""
        sampled = not self.sampling.greedy
        if self.engine_settings is None:
            return acceptance_settings({}, sampled=sampled, source=REFERENCE_RULE)
        return acceptance_settings(self.engine_settings, sampled=sampled)


REFERENCE_RULE = ("eaglekit's reference decode: vLLM's default rule (standard rejection sampling of argmax drafts, "
                  "one-hot at temperature > 0; the draft's own lm_head; k fixed)")


def quantization_entry(run: DecodeSettings) -> dict[str, Any]:
    """The report's `target_quantization` key, written only for a quantized target: a full-precision report keeps
    the keys it always had."""
    return {"target_quantization": run.target_quantization} if run.target_quantization else {}


def plain_report(conditions: Sequence[Condition]) -> bool:
    """One condition under the chat template is written as a report without a `conditions` list."""
    return len(conditions) == 1 and conditions[0].template == "chat"


def sweep_document(header: dict[str, Any], conditions: list[tuple[Condition, dict[str, Any]]]) -> dict[str, Any]:
    """The JSON of a run over several conditions (or another template): what they share, then one entry per
    condition with its own measurement."""
    return {**header, "conditions": [{"template": c.template, "context_tokens": c.context_tokens, **doc}
                                     for c, doc in conditions]}
