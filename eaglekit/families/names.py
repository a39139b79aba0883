"""Canonical tensor names: no `model.` prefix, `layers.{i}.`, current names for legacy ones (eaglekit.catalogue)."""

from __future__ import annotations

import re

from eaglekit.catalogue import DOUBLE_INDEX, FC_NORM, LAYER, LEGACY_NAMES, SINGLE_LAYER_PREFIX, layer_index

_MIDLAYER_MULTI = re.compile(r"^midlayer\.(\d{1,9})\.")
__all__ = ["FC_NORM", "LEGACY_NAMES", "canonical_name", "layer_index", "legacy_pattern", "name_forms"]


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
        elif n.startswith(SINGLE_LAYER_PREFIX):
            forms.add(SINGLE_LAYER_PREFIX)
        if DOUBLE_INDEX.match(n):
            forms.add("layers.0.0.")
        elif LAYER.match(n):
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
    elif name.startswith(SINGLE_LAYER_PREFIX):
        name = "layers.0." + name[len(SINGLE_LAYER_PREFIX) :]
    for old, (new, *_) in LEGACY_NAMES.items():
        if name.startswith(old):
            name = new + name[len(old) :]
        elif old in name:
            name = name.replace("." + old, "." + new)
    return name
