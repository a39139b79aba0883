"""Small readings of a draft's config shared by several rule modules."""

from __future__ import annotations

import re
from typing import Any

from eaglekit.spec import DraftSpec

DEDICATED = re.compile(r"^(fc_norm\.\d+\.weight|input_norm\.weight|d2t|t2d|lm_head\.weight|embed_tokens\.weight"
                       r"|fc\.bias|mask_hidden)$")
DOUBLE_INDEX = re.compile(r"^layers\.\d+\.\d+\.")


def layer_config(spec: DraftSpec) -> dict[str, Any]:
    """Where the decoder geometry lives: transformer_layer_config for the speculators layout, else the top level."""
    tlc = spec.config.get("transformer_layer_config")
    return tlc if spec.config_layout == "speculators" and isinstance(tlc, dict) else spec.config


def layer_key(spec: DraftSpec, key: str) -> str:
    return f"transformer_layer_config.{key}" if layer_config(spec) is not spec.config else key


def eagle_config(spec: DraftSpec) -> dict[str, Any]:
    ec = spec.config.get("eagle_config")
    return ec if isinstance(ec, dict) else {}


def written_int(cfg: dict[str, Any], key: str) -> int | None:
    v = cfg.get(key)
    return v if isinstance(v, int) and not isinstance(v, bool) else None


def id_list(value: Any) -> list[int] | None:
    if isinstance(value, list) and value and all(isinstance(i, int) and not isinstance(i, bool) for i in value):
        return value
    return None


def written_id_lists(spec: DraftSpec) -> list[tuple[str, list[int]]]:
    """Every aux-id list the config writes, with its key."""
    out = []
    top = id_list(spec.config.get("eagle_aux_hidden_state_layer_ids"))
    if top is not None:
        out.append(("eagle_aux_hidden_state_layer_ids", top))
    nested = id_list(eagle_config(spec).get("eagle_aux_hidden_state_layer_ids"))
    if nested is not None:
        out.append(("eagle_config.eagle_aux_hidden_state_layer_ids", nested))
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
