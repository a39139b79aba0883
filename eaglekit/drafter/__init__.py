"""The draft model at run time: modules, fused kernels and the step loop.

Importing this package does not import torch; the model names load on first access.
"""

from __future__ import annotations

import importlib
from typing import Any

_LAZY = {
    "Drafter": "eaglekit.drafter.model",
    "DrafterConfig": "eaglekit.drafter.config",
    "DraftOutput": "eaglekit.drafter.model",
    "DraftCache": "eaglekit.drafter.attention",
}

__all__ = sorted(_LAZY)


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
