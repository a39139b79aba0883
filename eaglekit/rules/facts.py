"""Small readings of a draft's config shared by several rule modules."""

from __future__ import annotations

import re
from typing import Any

from eaglekit.config_view import as_ids, nested
from eaglekit.spec import DraftSpec


def layer_config(spec: DraftSpec) -> dict[str, Any]:
    """Where the decoder geometry lives: transformer_layer_config for the speculators layout, else the top level."""
    tlc = spec.config.get("transformer_layer_config")
    return tlc if spec.config_layout == "speculators" and isinstance(tlc, dict) else spec.config


def layer_key(spec: DraftSpec, key: str) -> str:
    return f"transformer_layer_config.{key}" if layer_config(spec) is not spec.config else key


def eagle_config(spec: DraftSpec) -> dict[str, Any]:
    return nested(spec.config, "eagle_config")


def written_id_lists(spec: DraftSpec) -> list[tuple[str, list[int]]]:
    """Every aux-id list the config writes, with its key (the producer's own top-level key included)."""
    out = []
    for key in dict.fromkeys(("eagle_aux_hidden_state_layer_ids", spec.facts.aux_ids_key)):
        top = as_ids(spec.config.get(key))
        if top is not None:
            out.append((key, list(top)))
    inner = as_ids(eagle_config(spec).get("eagle_aux_hidden_state_layer_ids"))
    if inner is not None:
        out.append(("eagle_config.eagle_aux_hidden_state_layer_ids", list(inner)))
    return out


def fmt_ids(ids) -> str:
    return "[" + ", ".join(str(i) for i in ids) + "]"


def names_in_source(spec: DraftSpec, predicate) -> list[str]:
    return sorted(ref.source_name for ref in spec.tensors.values() if predicate(ref.source_name))


def examples(names: list[str], n: int = 2) -> str:
    shown = ", ".join(names[:n])
    return f"{shown} (+{len(names) - n} more)" if len(names) > n else shown


def claims_31(spec: DraftSpec) -> bool:
    return bool(spec.flags.fc_norm or spec.flags.norm_output)


_NORM = re.compile(r"norm(\.\d+)?\.weight$")


def is_norm(name: str) -> bool:
    """RMSNorm weights: input_layernorm, hidden_norm, norm, q/k_norm, fc_norm.{k}, input_norm, ..."""
    return bool(_NORM.search(name))


def fc_k_disagreeing(spec: DraftSpec, engine_k: int) -> int | None:
    """fc's K when an engine's own K differs from it (None: they agree, or fc's K is unknown)."""
    K = spec.num_aux_hidden_states
    if K is None or not spec.facts.fc_in_features or engine_k == K:
        return None
    return K


def not_one_layer(spec: DraftSpec) -> int | None:
    """The draft's layer count when it is not the single layer most EAGLE-3 engines build."""
    n = spec.geometry.num_layers
    return n if n != 1 else None
