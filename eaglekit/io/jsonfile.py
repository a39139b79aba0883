"""The one way eaglekit reads an input file or its JSON: regular files only, bounded size, bounded numbers.

A FIFO or device where a file is expected would block or never end, so files are opened non-blocking and
anything but a regular file is refused. JSON numbers longer than MAX_INT_DIGITS digits and nesting deeper
than the parser's recursion limit become one-line errors naming the file, never a traceback.
"""

from __future__ import annotations

import json
import math
import os
import stat
from typing import Any

from eaglekit.errors import CheckpointError, quoted

MAX_JSON_BYTES = 64 * 1024 * 1024  # configs and indexes are KB; a prompts file a few MB
MAX_INT_DIGITS = 40  # far above any shape, id or size a checkpoint holds (2^64 has 20 digits)


class _JsonRefused(ValueError):
    pass


def within(path: str, folder: str) -> bool:
    """Whether `path` is `folder` or lies below it (as written: no symlink is followed)."""
    return path == folder or path.startswith(folder.rstrip(os.sep) + os.sep)


def check_inside(path: str, allowed_root: str | None, display: str) -> None:
    """Refuse a path that leaves `allowed_root`, as written or through a symlink; the message says which. With no
    root (a folder the user named: its links are the user's own, such as weights linked from shared storage) a
    link may point anywhere, but must reach a regular file or a folder (not a device, a FIFO or nothing)."""
    if allowed_root is None:
        resolved = os.path.realpath(path)
        if os.path.islink(path) and not (os.path.isfile(resolved) or os.path.isdir(resolved)):
            kind = "nothing" if not os.path.lexists(resolved) else "a FIFO, socket or device"
            raise CheckpointError(f"symlink points to {kind}, not a regular file or folder ({resolved})", display)
        return
    if not within(os.path.normpath(os.path.abspath(path)), os.path.normpath(os.path.abspath(allowed_root))):
        raise CheckpointError("lies outside the checkpoint directory; refusing to read it", display)
    if not within(os.path.realpath(path), os.path.realpath(allowed_root)):
        raise CheckpointError("symlink points outside the checkpoint directory; refusing to follow it", display)


def symlink_root(directory: str) -> str | None:
    """Where a model folder's symlinks may point: inside a Hugging Face cache snapshot (a repository fetched from
    the Hub, its files linking into blobs/), the whole repo folder and nowhere else; a folder the user named
    anywhere (None)."""
    parent = os.path.dirname(os.path.abspath(directory))
    return os.path.dirname(parent) if os.path.basename(parent) == "snapshots" else None


def open_regular(path: str, what: str = "file"):
    """A binary file object for `path`, refused (one line) unless it is a regular file."""
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_CLOEXEC", 0))
    except OSError as exc:
        raise CheckpointError(f"cannot read {what}: {exc.strerror or exc}", path) from None
    try:
        mode = os.fstat(fd).st_mode
    except OSError as exc:
        os.close(fd)
        raise CheckpointError(f"cannot read {what}: {exc.strerror or exc}", path) from None
    if not stat.S_ISREG(mode):
        os.close(fd)
        kind = "a folder" if stat.S_ISDIR(mode) else "a FIFO, socket or device"
        raise CheckpointError(f"{what} is {kind}, not a regular file", path)
    return os.fdopen(fd, "rb")


def read_bounded(path: str, what: str = "file", limit: int = MAX_JSON_BYTES) -> bytes:
    """The whole file, at most `limit` bytes; a larger one is refused before it is read."""
    with open_regular(path, what) as fh:
        size = os.fstat(fh.fileno()).st_size
        if size > limit:
            raise CheckpointError(f"{what} is {size} bytes; more than the {limit}-byte bound", path)
        try:
            data = fh.read(limit + 1)
        except OSError as exc:
            raise CheckpointError(f"cannot read {what}: {exc.strerror or exc}", path) from None
    if len(data) > limit:
        raise CheckpointError(f"{what} grew past the {limit}-byte bound while being read", path)
    return data


def _int(text: str) -> int:
    if len(text) > MAX_INT_DIGITS + 1:
        raise _JsonRefused(f"an integer of {len(text.lstrip('-'))} digits")
    return int(text)


def _unique(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in pairs:
        if key in out:
            raise _JsonRefused(f"duplicate key {quoted(key)}")
        out[key] = value
    return out


def parse_json(data: bytes | str, where: str, what: str = "JSON", *, unique_keys: bool = False) -> Any:
    """Parsed JSON; invalid text, oversized integers, duplicate keys (when asked) or runaway nesting: one line.
    NaN and ±Infinity parse as floats: the typed config checks report them."""
    try:
        text = data.decode("utf-8") if isinstance(data, bytes) else data
        return json.loads(text, parse_int=_int, object_pairs_hook=_unique if unique_keys else None)
    except UnicodeDecodeError:
        raise CheckpointError(f"{what} is not UTF-8 text", where) from None
    except _JsonRefused as exc:
        raise CheckpointError(f"{what} holds {exc}; refused", where) from None
    except json.JSONDecodeError as exc:
        raise CheckpointError(f"{what} is not valid JSON ({exc.msg} at line {exc.lineno} column {exc.colno})",
                              where) from None
    except RecursionError:
        raise CheckpointError(f"{what} is nested too deeply to be a real file", where) from None


def load_json_object(path: str, what: str = "JSON") -> dict:
    """The parsed object of a JSON file; unreadable, malformed or non-object files raise one CheckpointError line."""
    doc = parse_json(read_bounded(path, what), path, what)
    if not isinstance(doc, dict):
        raise CheckpointError(f"{what} must be a JSON object", path)
    return doc


def finite(value: Any) -> bool:
    """A real number that JSON output can carry (no bool, NaN or infinity)."""
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
