"""Canonical tensor names: no `model.` prefix, `layers.{i}.`, current names for legacy ones."""

from __future__ import annotations

import re

_MIDLAYER_MULTI = re.compile(r"^midlayer\.(\d{1,9})\.")
_LAYER_INDEX = re.compile(r"^layers\.(\d{1,9})\.")
FC_NORM = re.compile(r"^fc_norm\.(\d{1,6})\.weight$")
"""Canonical name of the EAGLE-3.1 norm of aux state k."""
_LEGACY = {
    "aux_norm_low.": "fc_norm.0.",
    "aux_norm_mid.": "fc_norm.1.",
    "aux_norm_high.": "fc_norm.2.",
    "context_proj.": "fc.",
    "context_norm.": "hidden_norm.",
    "final_norm.": "norm.",
}


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
        if any(n.startswith(k) or f".{k}" in n for k in _LEGACY):
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
    for old, new in _LEGACY.items():
        if name.startswith(old):
            name = new + name[len(old) :]
        elif old in name:
            name = name.replace("." + old, "." + new)
    return name


def layer_index(name: str) -> int | None:
    m = _LAYER_INDEX.match(name)
    return int(m.group(1)) if m else None
