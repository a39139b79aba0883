"""Typed reads of raw config values, for the few places that must see a config as an engine does.

The canonical DraftSpec holds what eaglekit derived; engines read the raw JSON (a key in the wrong place, an id list
that only one runner honours), so engine modelling, the rules and the readers share these accessors.
"""

from __future__ import annotations

import re
from typing import Any

REPO_ID = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+$")
"""A Hugging Face repo id, `org/name`."""


def as_int(value: Any) -> int | None:
    """An integer config value; bools and anything else are None (JSON true is not 1)."""
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def as_ids(value: Any) -> tuple[int, ...] | None:
    """A non-empty list of integers (layer ids), else None."""
    if isinstance(value, list) and value and all(as_int(i) is not None for i in value):
        return tuple(value)
    return None


def int_at(cfg: dict[str, Any], key: str, default: int | None = None) -> int | None:
    value = as_int(cfg.get(key))
    return default if value is None else value


def nested(cfg: dict[str, Any], key: str) -> dict[str, Any]:
    """A sub-object such as eagle_config; {} when absent or not an object."""
    value = cfg.get(key)
    return value if isinstance(value, dict) else {}
