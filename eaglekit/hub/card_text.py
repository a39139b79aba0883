"""How a model card writes what it quotes: Markdown-escaped text, numbers, code spans, and sources by their public
name. Every value a card takes from a file or a report goes through these, so none can rewrite the card."""

from __future__ import annotations

import os
from typing import Any

from eaglekit.config_view import REPO_ID
from eaglekit.redact import printable, public_path


def is_repo_id(value: Any) -> bool:
    """A Hub id (org/name), not a local path that happens to contain one slash."""
    return isinstance(value, str) and bool(REPO_ID.match(value)) and not os.path.exists(value)


MARKDOWN_SPECIALS = frozenset("\\`*_[]<>|&")


def text(value: Any) -> str:
    """A string read from a report or a config, as the card shows it: data, never Markdown. Control characters
    (a newline would start a section) are written as their escapes, Markdown and HTML characters escaped."""
    return "".join(f"\\{c}" if c in MARKDOWN_SPECIALS else c for c in printable(value))


def code(value: Any) -> str:
    """A name read from a file as inline code; as escaped text when it holds what a code span cannot."""
    name = str(value)
    if "`" in name or "|" in name or not name.isprintable():
        return text(name)
    return f"`{name}`"


def number(value: Any, digits: int = 2) -> str:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return text(value)
    return f"{value:,.{digits}f}" if isinstance(value, float) else f"{value:,}"


def public_source(source: Any) -> str | None:
    """A source as a public card may name it: a Hub id as is, a local folder by its name only."""
    if not isinstance(source, str) or not source:
        return None
    if is_repo_id(source):
        return f"[`{source}`](https://huggingface.co/{source})"
    return f"a local folder named {code(public_path(source))}"


def signed(value: Any) -> str:
    return f"{value:+.3f}" if isinstance(value, (int, float)) and not isinstance(value, bool) else text(value)
