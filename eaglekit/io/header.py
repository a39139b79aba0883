"""Parse and check a safetensors header without reading tensor bytes."""

from __future__ import annotations

import os
import struct
from dataclasses import dataclass

from eaglekit.errors import CheckpointError, quoted
from eaglekit.io.dtypes import DTYPE_SIZES, tensor_nbytes
from eaglekit.io.jsonfile import open_regular, parse_json

# The safetensors library refuses headers above 100 MB; a real draft header is a few KB.
MAX_HEADER_BYTES = 100 * 1024 * 1024


@dataclass(frozen=True)
class HeaderEntry:
    """One tensor as a safetensors header declares it: dtype, shape and its byte range in the file."""

    name: str
    dtype: str
    shape: tuple[int, ...]
    start: int  # absolute offset in the file
    end: int


@dataclass(frozen=True)
class SafetensorsHeader:
    """A safetensors file's checked header: its metadata and every tensor entry."""

    path: str
    header_size: int
    file_size: int
    metadata: dict[str, str]
    entries: dict[str, HeaderEntry]

    @property
    def data_start(self) -> int:
        return 8 + self.header_size


def parse_header_bytes(raw: bytes, file_size: int, path: str, max_tensors: int | None = None) -> SafetensorsHeader:
    """Check a header given its first bytes (8-byte length + JSON) and the file size; more than `max_tensors`
    entries are refused before any is checked."""
    if file_size < 8 or len(raw) < 8:
        raise CheckpointError("truncated safetensors file: shorter than the 8-byte header length", path)
    (n,) = struct.unpack("<Q", raw[:8])
    if n > MAX_HEADER_BYTES:
        raise CheckpointError(f"safetensors header length {n} exceeds the {MAX_HEADER_BYTES}-byte bound", path)
    if 8 + n > file_size:
        raise CheckpointError(f"safetensors header length {n} runs past the end of the file ({file_size} bytes)", path)
    if len(raw) < 8 + n:
        raise CheckpointError("truncated safetensors header", path)
    doc = parse_json(raw[8 : 8 + n], path, "safetensors header", unique_keys=True)
    if not isinstance(doc, dict):
        raise CheckpointError("safetensors header is not a JSON object", path)

    metadata = doc.pop("__metadata__", {})
    if not isinstance(metadata, dict) or not all(isinstance(k, str) and isinstance(v, str)
                                                 for k, v in metadata.items()):
        raise CheckpointError("safetensors __metadata__ must map strings to strings", path)

    if max_tensors is not None and len(doc) > max_tensors:
        raise CheckpointError(f"safetensors header lists {len(doc):,} tensors, more than the {max_tensors:,} a "
                              "draft checkpoint may hold", path)
    data_start = 8 + n
    data_len = file_size - data_start
    entries: dict[str, HeaderEntry] = {}
    for name, info in doc.items():
        if not isinstance(info, dict):
            raise CheckpointError(f"tensor {quoted(name)}: header entry is not an object", path)
        dtype, shape, offsets = info.get("dtype"), info.get("shape"), info.get("data_offsets")
        if not isinstance(dtype, str) or dtype not in DTYPE_SIZES:
            raise CheckpointError(f"tensor {quoted(name)}: unknown dtype {quoted(dtype)}", path)
        if not isinstance(shape, list) or not all(type(d) is int and d >= 0 for d in shape):
            raise CheckpointError(f"tensor {quoted(name)}: shape must be a list of non-negative integers", path)
        if (
            not isinstance(offsets, list)
            or len(offsets) != 2
            or not all(type(o) is int and o >= 0 for o in offsets)
            or offsets[0] > offsets[1]
        ):
            raise CheckpointError(f"tensor {quoted(name)}: data_offsets must be [begin, end] with 0 <= begin <= end",
                                  path)
        begin, end = offsets
        expected = tensor_nbytes(dtype, tuple(shape))
        if end - begin != expected:
            raise CheckpointError(
                f"tensor {quoted(name)}: {dtype}{quoted(shape)} needs {expected} bytes but data_offsets span "
                f"{end - begin}", path)
        if end > data_len:
            raise CheckpointError(
                f"tensor {quoted(name)}: data_offsets end {end} beyond the data section ({data_len} bytes; file "
                "truncated?)",
                path,
            )
        entries[name] = HeaderEntry(name, dtype, tuple(shape), data_start + begin, data_start + end)

    # safetensors' own rule (so vLLM's and transformers'): the tensors tile the data section exactly
    previous: HeaderEntry | None = None
    at = data_start
    for entry in sorted(entries.values(), key=lambda e: (e.start, e.end)):
        if previous is not None and entry.start < previous.end:
            raise CheckpointError(f"tensors {quoted(previous.name)} and {quoted(entry.name)} overlap in the data "
                                  "section", path)
        if entry.start != at:
            raise CheckpointError(f"{entry.start - at} unused bytes before tensor {quoted(entry.name)} in the data "
                                  "section; safetensors refuses such a file", path)
        previous, at = entry, entry.end
    if at != file_size:
        raise CheckpointError(f"{file_size - at} bytes after the last tensor; safetensors refuses such a file", path)
    return SafetensorsHeader(path, n, file_size, metadata, entries)


def read_header(path: str, max_tensors: int | None = None) -> SafetensorsHeader:
    """Read only the header of a safetensors file (at most 8 + header-length bytes)."""
    with open_regular(path, "safetensors file") as fh:
        size = os.fstat(fh.fileno()).st_size
        try:
            head = fh.read(8)
            if len(head) < 8:
                raise CheckpointError("truncated safetensors file: shorter than the 8-byte header length", path)
            (n,) = struct.unpack("<Q", head)
            body = fh.read(n) if n <= MAX_HEADER_BYTES and 8 + n <= size else b""
        except OSError as exc:
            raise CheckpointError(f"cannot read: {exc.strerror or exc}", path) from None
    return parse_header_bytes(head + body, size, path, max_tensors)
