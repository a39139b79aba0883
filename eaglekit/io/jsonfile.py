"""Read a JSON object from disk with one-line errors that name the file."""

from __future__ import annotations

import json

from eaglekit.errors import CheckpointError


def load_json_object(path: str, what: str = "JSON") -> dict:
    """The parsed object; unreadable, malformed or non-object files raise one CheckpointError line."""
    try:
        with open(path, encoding="utf-8") as fh:
            doc = json.load(fh)
    except OSError as exc:
        raise CheckpointError(f"cannot read {what}: {exc.strerror or exc}", path) from None
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise CheckpointError(f"{what} is not valid JSON ({exc})".splitlines()[0], path) from None
    if not isinstance(doc, dict):
        raise CheckpointError(f"{what} must be a JSON object", path)
    return doc
