"""Typed reads of raw config values: the one place that decides what a written value means, or that it is wrong.

The canonical DraftSpec holds what eaglekit derived; engines read the raw JSON (a key in the wrong place, an id list
that only one runner honours), so the layout readers, engine modelling and the rules share these accessors. A value
of the wrong type or range is never read as "not written" or replaced by a default without a trace: `config_problems`
names every such value, validate reports each (EK157) and upgrade refuses the draft.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

REPO_ID = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+\Z")  # \Z: `$` would also match before a final newline
"""A Hugging Face repo id, `org/name`."""

MAX_CONFIG_INT = 2**31 - 1  # every engine stores sizes and ids in int32 or smaller
POSITIVE_INT_KEYS = ("hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
                     "num_key_value_heads", "head_dim", "vocab_size", "draft_vocab_size", "target_hidden_size",
                     "num_aux_hidden_states", "max_position_embeddings")
POSITIVE_NUMBER_KEYS = ("rms_norm_eps", "rope_theta")
BOOL_KEYS = ("fc_norm", "norm_output", "norm_before_fc", "norm_before_residual", "tie_word_embeddings",
             "attention_bias", "use_aux_hidden_state", "use_aux_norm")
ID_LIST_KEYS = ("eagle_aux_hidden_state_layer_ids",)
OBJECT_KEYS = ("eagle_config", "rope_scaling", "rope_parameters", "quantization_config")
DTYPE_KEYS = ("torch_dtype", "dtype")  # transformers 5 writes dtype
TORCH_DTYPE_NAMES = frozenset({
    "float32", "float", "float64", "double", "float16", "half", "bfloat16", "float8_e4m3fn", "float8_e5m2",
    "float8_e4m3fnuz", "float8_e5m2fnuz", "float8_e8m0fnu", "int8", "uint8", "int16", "short", "int32", "int",
    "int64", "long", "uint16", "uint32", "uint64", "bool", "complex64", "complex128", "auto",
})
"""The names transformers' config loading resolves (getattr(torch, name); "auto" defers to the weights)."""
TYPED_KEYS = POSITIVE_INT_KEYS + POSITIVE_NUMBER_KEYS + BOOL_KEYS + ID_LIST_KEYS + OBJECT_KEYS + DTYPE_KEYS
NESTED_PLACES = ("eagle_config", "text_config", "rope_parameters")  # objects engines read typed keys from


@dataclass(frozen=True)
class ConfigProblem:
    """A written config value that cannot mean what its key needs."""

    key: str  # dotted: eagle_config.norm_before_fc, transformer_layer_config.head_dim
    message: str


def as_int(value: Any) -> int | None:
    """An integer config value; bools and anything else are None (JSON true is not 1)."""
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def as_layer_id(value: Any) -> int | None:
    """A layer id: a non-negative integer. An integral float counts as that integer, because every engine only
    tests membership (vLLM's `layer_id in self.aux_hidden_state_layers`, SGLang's and tokenspeed's likewise), where
    2.0 == 2; a fraction, a bool or a negative number names no layer."""
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    value = as_int(value)
    return value if value is not None and 0 <= value <= MAX_CONFIG_INT else None


def as_ids(value: Any) -> tuple[int, ...] | None:
    """A non-empty list of layer ids, as integers, else None."""
    if not isinstance(value, list) or not value:
        return None
    ids = [as_layer_id(i) for i in value]
    known = tuple(i for i in ids if i is not None)
    return known if len(known) == len(ids) else None


def int_at(cfg: dict[str, Any], key: str, default: int | None = None) -> int | None:
    value = as_int(cfg.get(key))
    return default if value is None else value


def number_at(cfg: dict[str, Any], key: str, default: float) -> float:
    """A positive finite number; `default` when the key is absent or null. A wrong value reads as NaN, never as a
    plausible number: `config_problems` reports it, and anything computed from it shows it was unreadable."""
    value = cfg.get(key)
    if value is None:
        return default
    return float(value) if value_problem(key, value) is None else math.nan


def flag_at(cfg: dict[str, Any], key: str) -> bool | None:
    """A boolean switch as written; None when absent, or not a JSON boolean ("true" is reported, not read)."""
    value = cfg.get(key)
    return value if isinstance(value, bool) else None


def nested(cfg: Mapping[str, Any], key: str) -> dict[str, Any]:
    """A sub-object such as eagle_config; {} when absent or not an object."""
    value = cfg.get(key)
    return value if isinstance(value, dict) else {}


def value_problem(key: str, value: Any) -> str | None:
    """Why a written value cannot mean what `key` needs; None when it is fine (null counts as not written)."""
    if value is None:
        return None
    if key in POSITIVE_INT_KEYS:
        if as_int(value) is None:
            return f"must be an integer, not {type(value).__name__}"
        return None if 1 <= value <= MAX_CONFIG_INT else f"must lie in 1..{MAX_CONFIG_INT}"
    if key in POSITIVE_NUMBER_KEYS:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            return f"must be a number, not {type(value).__name__}"
        return None if 0 < value < math.inf else "must be a finite positive number"
    if key in BOOL_KEYS:
        return None if isinstance(value, bool) else f"must be true or false, not {type(value).__name__}"
    if key in ID_LIST_KEYS:
        return id_list_problem(value)
    if key in OBJECT_KEYS and not isinstance(value, dict):
        return f"must be an object, not {type(value).__name__}"
    if key in DTYPE_KEYS and not (isinstance(value, str) and value in TORCH_DTYPE_NAMES):
        return "must name a torch dtype (bfloat16, float16, float32, ...): transformers' config loading raises"
    return None


def id_list_problem(value: Any) -> str | None:
    """Why a written aux-id list is not one (None: it is)."""
    if not isinstance(value, list) or not value:
        return "must be a non-empty list of layer ids"
    if as_ids(value) is None:
        return "must hold only non-negative integer layer ids (an integral float such as 2.0 counts as 2)"
    return None


def config_problems(cfg: dict[str, Any], layer_cfg: dict[str, Any] | None = None, *,
                    empty_ids_allowed: bool = False, own_id_key: str | None = None) -> tuple[ConfigProblem, ...]:
    """Every typed key written with a wrong value: at the top level, in the nested objects engines read, and in
    the speculators transformer_layer_config (`layer_cfg`, when it is not the top level). `empty_ids_allowed`: the
    producer writes an empty id list for "my default ids", which engines read as not written. `own_id_key`: a
    top-level key under which the producer writes its aux ids instead (checked as an id list too)."""
    places: list[tuple[str, dict[str, Any]]] = [("", cfg)] + [(f"{p}.", nested(cfg, p)) for p in NESTED_PLACES]
    if layer_cfg is not None and layer_cfg is not cfg:
        places.append(("transformer_layer_config.", layer_cfg))
    found = []
    for prefix, place in places:
        for key in TYPED_KEYS:
            if empty_ids_allowed and key in ID_LIST_KEYS and place.get(key) == []:
                continue
            if key in place and (why := value_problem(key, place[key])):
                found.append(ConfigProblem(prefix + key, f"{prefix}{key} = {_shown(place[key])} {why}"))
    if own_id_key and own_id_key not in TYPED_KEYS and own_id_key in cfg and (why := id_list_problem(cfg[own_id_key])):
        found.append(ConfigProblem(own_id_key, f"{own_id_key} = {_shown(cfg[own_id_key])} {why}"))
    return tuple(found)


def _shown(value: Any) -> str:
    shown = repr(value)
    return shown if len(shown) <= 40 else shown[:37] + "..."
