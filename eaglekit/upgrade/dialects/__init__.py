"""Engine dialects: each writes a config (and names tensors) out of the canonical description, never reads one.

A dialect module provides NAME, ENGINE (what `eaglekit validate --engine` checks it against),
`read_family(spec, decisions)` (the family that reads its output back), `config(spec, decisions, vocab)` and
`tensor_name(canonical, spec)`.
"""

from __future__ import annotations

import importlib
from types import ModuleType

from eaglekit.errors import UsageError

NAMES = ("vllm", "sglang", "speculators", "trtllm")  # gguf: eaglekit.upgrade.gguf, a file of its own


def get_dialect(name: str) -> ModuleType:
    if name not in NAMES:
        raise UsageError(f"unknown output dialect {name!r}; known: {', '.join(NAMES)}")
    return importlib.import_module(f"{__name__}.{name}")
