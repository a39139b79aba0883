"""GGUF files through gguf-py: a target's metadata read back, a draft written one tensor at a time.

gguf-py (the `gguf` package, extra `eaglekit[gguf]`) memory-maps a file it reads; anything it raises on a damaged
or hostile file becomes one CheckpointError naming the file. The writer holds one tensor in memory at a time.
"""

from __future__ import annotations

import errno
import os
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

import numpy as np

from eaglekit.errors import CheckpointError

MAX_GGUF_FIELDS = 1_000_000


def gguf_module():
    """gguf-py; a missing install reaches the CLI as ModuleNotFoundError, which names the `gguf` extra."""
    import gguf

    return gguf


@dataclass(frozen=True)
class GgufField:
    key: str
    value: Any  # str, int, float, bool, or a list of those
    vtype: Any  # gguf.GGUFValueType
    sub_type: Any = None  # element type of an array


@dataclass(frozen=True)
class GgufContents:
    path: str
    fields: dict[str, GgufField]
    tensors: dict[str, tuple[int, ...]]  # name -> numpy-order shape
    tensor_types: dict[str, str]  # name -> GGML type name (F32, BF16, I64, Q4_1, ...)

    def value(self, key: str, default: Any = None) -> Any:
        field = self.fields.get(key)
        return default if field is None else field.value


def read_gguf(path: str, *, tensor_data: Callable[[str], bool] | None = None) -> tuple[GgufContents, dict]:
    """The file's fields and tensor table; the arrays of the tensors `tensor_data` selects, as numpy views.
    Metadata alone is cached per file version: a target's tokenizer takes gguf-py seconds to parse."""
    if not os.path.isfile(path):
        raise CheckpointError("no such file", path)
    if tensor_data is None:
        st = os.stat(path)
        return _metadata(os.path.abspath(path), st.st_size, st.st_mtime_ns), {}
    return _read(path, tensor_data)


@lru_cache(maxsize=4)
def _metadata(path: str, size: int, mtime_ns: int) -> GgufContents:
    return _read(path, None)[0]


def _read(path: str, tensor_data: Callable[[str], bool] | None) -> tuple[GgufContents, dict]:
    gguf = gguf_module()
    try:
        reader = gguf.GGUFReader(path, "r")
        if len(reader.fields) > MAX_GGUF_FIELDS:
            raise CheckpointError(f"{len(reader.fields)} metadata fields: not a model file", path)
        fields = {}
        for key, field in reader.fields.items():
            if key.startswith("GGUF."):
                continue
            sub = field.types[-1] if field.types and field.types[0] == gguf.GGUFValueType.ARRAY else None
            fields[key] = GgufField(key, field.contents(), field.types[0] if field.types else None, sub)
        shapes, types, arrays = {}, {}, {}
        for t in reader.tensors:
            shapes[t.name] = tuple(int(d) for d in reversed(t.shape.tolist()))
            types[t.name] = t.tensor_type.name
            if tensor_data is not None and tensor_data(t.name):
                arrays[t.name] = np.asarray(t.data)
    except CheckpointError:
        raise
    except (ValueError, OSError, KeyError, IndexError, TypeError, UnicodeDecodeError, OverflowError,
            MemoryError) as exc:
        detail = str(exc).splitlines()[0][:200] if str(exc) else type(exc).__name__
        raise CheckpointError(f"not a readable GGUF file: {detail}", path) from None
    return GgufContents(path, fields, shapes, types), arrays


@dataclass(frozen=True)
class GgufTensor:
    """One tensor to write: its GGUF name, numpy-order shape, GGML type and a function giving its array."""

    name: str
    shape: tuple[int, ...]
    ggml_type: str  # F32 | F16 | BF16 | I64
    make: Callable[[], np.ndarray]

    @property
    def numpy_dtype(self) -> np.dtype:
        return np.dtype({"F32": np.float32, "F16": np.float16, "BF16": np.uint16, "I64": np.int64}[self.ggml_type])

    @property
    def nbytes(self) -> int:
        return int(np.prod(self.shape, dtype=np.int64)) * self.numpy_dtype.itemsize


def write_gguf(path: str, arch: str, fields: Iterable[GgufField], tensors: list[GgufTensor],
               progress: Callable[[int], None] | None = None) -> None:
    """Write a GGUF file: header, metadata, tensor table, then each tensor as `make()` produces it."""
    gguf = gguf_module()
    writer = gguf.GGUFWriter(path, arch=arch)
    for f in fields:
        writer.add_key_value(f.key, f.value, f.vtype, f.sub_type)
    for t in tensors:
        raw = getattr(gguf.GGMLQuantizationType, t.ggml_type) if t.ggml_type == "BF16" else None
        writer.add_tensor_info(t.name, t.shape, t.numpy_dtype, t.nbytes, raw_dtype=raw)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_ti_data_to_file()
    header = writer.fout[0] if isinstance(writer.fout, list) else writer.fout
    expected = header.tell()
    if tensors:  # the data section starts aligned; each tensor is padded to the alignment
        expected = writer.ggml_pad(expected, writer.data_alignment) + sum(
            writer.ggml_pad(t.nbytes, writer.data_alignment) for t in tensors)
    for t in tensors:
        array = np.ascontiguousarray(t.make(), dtype=t.numpy_dtype)
        if array.shape != t.shape:
            raise ValueError(f"{t.name}: made {array.shape}, announced {t.shape}")
        writer.write_tensor_data(array)
        if progress:
            progress(array.nbytes)
    writer.close()
    written = os.path.getsize(path)
    if written != expected:  # numpy's tofile can stop short at a file size limit without raising
        raise OSError(errno.EFBIG, f"wrote {written} of {expected} bytes: the disk is full or the file too large")
