"""Canonical tensor names: no `model.` prefix, `layers.{i}.`, current names for legacy ones."""

from __future__ import annotations

import re
from typing import NamedTuple

_MIDLAYER_MULTI = re.compile(r"^midlayer\.(\d{1,9})\.")
_LAYER_INDEX = re.compile(r"^layers\.(\d{1,9})\.")
FC_NORM = re.compile(r"^fc_norm\.(\d{1,6})\.weight$")
"""Canonical name of the EAGLE-3.1 norm of aux state k."""


class LegacyName(NamedTuple):
    canonical: str  # the prefix it is renamed to
    producer: str
    renamed_by: tuple[str, ...] = ()  # engines whose loader renames it themselves


LEGACY_NAMES: dict[str, LegacyName] = {
    "aux_norm_low.": LegacyName("fc_norm.0.", "older SGLang exports", renamed_by=("sglang",)),
    "aux_norm_mid.": LegacyName("fc_norm.1.", "older SGLang exports", renamed_by=("sglang",)),
    "aux_norm_high.": LegacyName("fc_norm.2.", "older SGLang exports", renamed_by=("sglang",)),
    "context_proj.": LegacyName("fc.", "the TorchSpec fork"),
    "context_norm.": LegacyName("hidden_norm.", "the TorchSpec fork"),
    "final_norm.": LegacyName("norm.", "the TorchSpec fork"),
}
"""Tensor names of earlier producers: eaglekit reads them under the canonical names and upgrade renames them."""


def legacy_pattern(engine: str) -> re.Pattern[str]:
    """The legacy names `engine` does not rename itself (its loader then skips them as unknown)."""
    prefixes = [old[:-1] for old, legacy in LEGACY_NAMES.items() if engine not in legacy.renamed_by]
    return re.compile(r"(^|\.)(" + "|".join(map(re.escape, prefixes)) + r")\.")


def name_forms(names: list[str]) -> set[str]:
    """The prefix forms a checkpoint uses (P2, P29, P30): reported by inspect, checked by validate."""
    forms: set[str] = set()
    for n in names:
        if n.startswith("model."):
            forms.add("model.")
            n = n[len("model.") :]
        if n.startswith("draft_model."):
            forms.add("draft_model.")
        if _MIDLAYER_MULTI.match(n):
            forms.add("midlayer.{i}.")
        elif n.startswith("midlayer."):
            forms.add("midlayer.")
        if re.match(r"^layers\.\d+\.\d+\.", n):
            forms.add("layers.0.0.")
        elif _LAYER_INDEX.match(n):
            forms.add("layers.{i}.")
        if any(n.startswith(k) or f".{k}" in n for k in LEGACY_NAMES):
            forms.add("legacy")
    return forms


def canonical_name(name: str) -> str:
    if name.startswith("model."):
        name = name[len("model.") :]
    m = _MIDLAYER_MULTI.match(name)
    if m:
        name = f"layers.{m.group(1)}." + name[m.end() :]
    elif name.startswith("midlayer."):
        name = "layers.0." + name[len("midlayer.") :]
    for old, (new, *_) in LEGACY_NAMES.items():
        if name.startswith(old):
            name = new + name[len(old) :]
        elif old in name:
            name = name.replace("." + old, "." + new)
    return name


def layer_index(name: str) -> int | None:
    m = _LAYER_INDEX.match(name)
    return int(m.group(1)) if m else None
