"""Drafts of other speculative methods (block drafters, MTP heads, parallel draft models): eaglekit recognises each
by name and says which vLLM method serves it, but never reads one as an EAGLE-3 draft.

Their tensors can look EAGLE-like (a DFlash draft has `fc`, `hidden_norm` and `layers.{i}.` like an EAGLE-3 one), so
reading one as EAGLE-3 would report a valid draft that no EAGLE-3 engine can serve. Each method is one family in
eaglekit/families/ that turns a checkpoint into this description; a converter for a method would start from it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

Form = Literal["speculators", "flat", "target checkpoint"]
Kind = Literal["block drafter", "multi-token prediction head", "parallel draft model"]


@dataclass(frozen=True)
class VllmServing:
    """How vLLM serves this checkpoint: the method of its --speculative-config, the release that method appeared
    in, what else the config must say, and where vLLM differs from what the checkpoint claims (`problem`)."""

    method: str
    since: str
    version: str  # the release these facts were read from
    settings: dict[str, Any] = field(default_factory=dict)
    problem: str | None = None  # why this release cannot serve the files as they are

    def speculative_config(self) -> dict[str, Any]:
        return {"method": self.method, **self.settings}


@dataclass(frozen=True)
class TargetLayers:
    """The target layers a draft reads, as written and as the hidden_states index vLLM captures."""

    written: tuple[int, ...]
    key: str  # where the config writes them, e.g. "dflash_config.target_layer_ids"
    captured: tuple[int, ...]  # vLLM's convention (input of layer i = hidden_states[i])


@dataclass(frozen=True)
class OtherDraft:
    """What a non-EAGLE-3 draft is, read from its config and tensor names only."""

    family: str  # the registered family, e.g. "dflash"
    method: str  # its name, e.g. "DFlash"
    kind: Kind
    form: Form
    producer: str
    architectures: tuple[str, ...]
    model_type: str | None
    vllm: VllmServing
    block_size: int | None = None  # tokens drafted per forward pass (block drafters)
    num_layers: int | None = None  # draft decoder layers, or MTP layers
    target_layers: TargetLayers | None = None
    num_target_layers: int | None = None
    mask_token_id: int | None = None
    method_config: dict[str, Any] = field(default_factory=dict)  # the method's own config values
    num_tensors: int = 0
    notes: tuple[str, ...] = ()

    def summary(self) -> str:
        """One line: what it is, and which vLLM method serves it."""
        since = f" (method since vLLM {self.vllm.since})"
        settings = "".join(f", {k}={_json_value(v)}" for k, v in self.vllm.settings.items())
        return (f"{_article(self.method)} {self.method} {self.kind} ({self.producer}), not an EAGLE-3 draft: vLLM "
                f"serves it with method '{self.vllm.method}'{settings}{since}")

    def to_dict(self) -> dict[str, Any]:
        layers = self.target_layers
        return {
            "summary": self.summary(),
            "family": self.family,
            "method": self.method,
            "kind": self.kind,
            "form": self.form,
            "producer": self.producer,
            "architectures": list(self.architectures),
            "model_type": self.model_type,
            "vllm": {"method": self.vllm.method, "since": self.vllm.since, "version": self.vllm.version,
                     "speculative_config": self.vllm.speculative_config(), "problem": self.vllm.problem},
            "block_size": self.block_size,
            "num_layers": self.num_layers,
            "target_layer_ids": None if layers is None else list(layers.written),
            "target_layer_ids_key": None if layers is None else layers.key,
            "target_layer_ids_captured": None if layers is None else list(layers.captured),
            "num_target_layers": self.num_target_layers,
            "mask_token_id": self.mask_token_id,
            "method_config": dict(self.method_config),
            "num_tensors": self.num_tensors,
            "notes": list(self.notes),
        }


def validation_report(path: str, draft: OtherDraft, strict: bool) -> dict[str, Any]:
    """validate's report on a draft of another method: not ok, and no rule ran (every rule judges an EAGLE-3
    draft), so no finding either; `speculative_method` says what it is and which vLLM method serves it."""
    return {"path": path, "ok": False, "strict": strict, "errors": 0, "warnings": 0, "infos": 0, "groups": [],
            "engines": [], "findings": [], "fix": None, "conflicts": [], "speculative_method": draft.to_dict()}


def _article(word: str) -> str:
    return "an" if word[:1].upper() in "AEIOU" or word.startswith(("MTP", "XP")) else "a"


def _json_value(value: Any) -> str:
    return str(value).lower() if isinstance(value, bool) else str(value)
