"""The evaluation files a push uploads beside the weights, under `eval/`: the verify and bench reports the card
quotes, and the plots eaglekit drew of them, so a reader can check the card's figures against their source.

A report is uploaded as `public_report` makes it (no secret, no local path beyond a folder's name), never as the
file on disk; a plot is uploaded without its text chunks (a PNG can carry a path or a comment in its metadata).
"""

from __future__ import annotations

import json
import os
import re
import struct
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from eaglekit.errors import CheckpointError, UsageError, quoted
from eaglekit.redact import public_report

EVAL_FOLDER = "eval"
REPORT_NAMES = {"verify": "verify-report.json", "bench": "bench-report.json"}
PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
MAX_PLOT_BYTES = 20 << 20  # a plot eaglekit draws is a few hundred KB
PLOT_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*\.png$")
TEXT_CHUNKS = frozenset({b"tEXt", b"zTXt", b"iTXt", b"tIME", b"eXIf"})


@dataclass(frozen=True)
class Attachment:
    """One evaluation file: where it goes in the repository, what it is (`report` or `plot`), its bytes, and the
    command that made it (for the card's words)."""

    path: str
    kind: str
    data: bytes
    made_by: str


def report_attachment(command: str, doc: Mapping[str, Any]) -> Attachment:
    """A verify or bench report as the repository holds it: redacted, under a name of its own."""
    data = (json.dumps(public_report(doc), indent=2, allow_nan=False) + "\n").encode()
    return Attachment(f"{EVAL_FOLDER}/{REPORT_NAMES[command]}", "report", data, f"eaglekit {command}")


def plot_attachment(path: str) -> Attachment:
    """A PNG as the repository holds it: under its own file name in eval/, its text chunks removed."""
    name = os.path.basename(path)
    if not PLOT_NAME.match(name):
        raise UsageError(f"--plot {quoted(name)}: a plot's file name must end in .png and hold only letters, digits, "
                         "'.', '_' and '-' (it becomes its name in the repository)")
    if os.path.getsize(path) > MAX_PLOT_BYTES:
        raise CheckpointError(f"larger than {MAX_PLOT_BYTES >> 20} MiB: not a plot eaglekit drew", path)
    with open(path, "rb") as fh:
        data = fh.read(MAX_PLOT_BYTES + 1)
    return Attachment(f"{EVAL_FOLDER}/{name}", "plot", without_text_chunks(data, path), "eaglekit")


def without_text_chunks(data: bytes, path: str) -> bytes:
    """The PNG `data` without its text, time and Exif chunks; the image chunks are kept byte for byte."""
    if not data.startswith(PNG_SIGNATURE):
        raise CheckpointError("not a PNG file (eaglekit's plots are PNG)", path)
    kept, at = [PNG_SIGNATURE], len(PNG_SIGNATURE)
    while at < len(data):
        if at + 12 > len(data):
            raise CheckpointError("a truncated PNG file", path)
        (length,) = struct.unpack(">I", data[at:at + 4])
        kind = data[at + 4:at + 8]
        end = at + 12 + length
        if end > len(data):
            raise CheckpointError("a truncated PNG file", path)
        if kind not in TEXT_CHUNKS:
            kept.append(data[at:end])
        at = end
        if kind == b"IEND":
            break
    else:
        raise CheckpointError("a PNG file without its end chunk", path)
    return b"".join(kept)


def evaluation_files(verify: Mapping[str, Any] | None, bench: Mapping[str, Any] | None,
                     plots: Sequence[str]) -> list[Attachment]:
    """What a push uploads under eval/: the reports its card quotes, then the plots; two plots of one name are
    refused (the second would replace the first)."""
    files = [report_attachment(command, doc) for command, doc in (("verify", verify), ("bench", bench)) if doc]
    for plot in plots:
        attachment = plot_attachment(plot)
        if any(f.path == attachment.path for f in files):
            raise UsageError(f"two --plot files are named {quoted(os.path.basename(plot))}: rename one")
        files.append(attachment)
    return files
