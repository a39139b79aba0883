"""docs/architecture.md names files as the places to read and to change: each one it names exists, so a move or a
rename that leaves the map behind fails here rather than in a reader's search."""

from __future__ import annotations

import re
from pathlib import Path

from tests.support import REPO

DOCUMENT = REPO / "docs" / "architecture.md"
NAMED_FILE = re.compile(r"`([\w./-]+\.(?:py|json|sh))(?:::[\w.]+)?`")
"""A backticked file name (`rules/registry.py`, `io/publish.py::publish`); a placeholder (`families/<layout>.py`)
is not one."""


def named_files(text: str) -> list[str]:
    return sorted(set(NAMED_FILE.findall(text)))


def missing_files(text: str, root: Path) -> list[str]:
    """The named files found neither under eaglekit/ nor at the root of the checkout."""
    return [name for name in named_files(text)
            if not (root / "eaglekit" / name).is_file() and not (root / name).is_file()]


def test_every_file_the_architecture_names_exists():
    text = DOCUMENT.read_text(encoding="utf-8")
    assert len(named_files(text)) >= 40
    assert missing_files(text, REPO) == []


def test_a_file_that_does_not_exist_is_caught():
    text = DOCUMENT.read_text(encoding="utf-8") + "\n- `capture/no_such_backend.py::capture_with_it`\n"
    assert "capture/no_such_backend.py" in missing_files(text, REPO)
