"""The eaglekit checkout's own files (scripts/, examples/), as a printed command names them: they exist only when
eaglekit runs from its sources, not from an installed wheel. Imports nothing of eaglekit (doctor and the engine
runner both name its set-up scripts)."""

from __future__ import annotations

import os

CHECKOUT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def checkout_script(*parts: str) -> str | None:
    """A file of the eaglekit checkout as a command can name it from the working directory; None when eaglekit is
    installed without its checkout."""
    path = os.path.join(CHECKOUT, *parts)
    if not os.path.exists(path):
        return None
    relative = os.path.relpath(path)
    return relative if not relative.startswith("..") else path
