"""Turn the plan's recipes into writer inputs: byte ranges for unchanged tensors, chunk streams for the rest."""

from __future__ import annotations

import os
from collections.abc import Iterator
from functools import partial

import numpy as np

from eaglekit.errors import CheckpointError
from eaglekit.io.tensors import load_tensor
from eaglekit.io.writer import READ_CHUNK, ByteRange, OutTensor, iter_file_chunks
from eaglekit.spec import DraftSpec, TensorRef
from eaglekit.upgrade.encode import CastRangeError, cast_stream, decode, encode
from eaglekit.upgrade.plan import TensorStep, UpgradePlan

ARRAY_ENCODINGS = {"I64": "<i8", "BOOL": "?"}


def _torch_bytes(spec: DraftSpec, name: str, cast_to: str | None = None) -> bytes:
    """A tensor from a pickle checkpoint, as raw little-endian bytes (optionally cast by torch)."""
    import torch

    from eaglekit.io.dtypes import torch_dtype

    tensor = load_tensor(spec, name)
    if cast_to is not None:
        tensor = tensor.to(torch_dtype(cast_to))
    return tensor.contiguous().view(torch.uint8).numpy().tobytes()


def _source_chunks(spec: DraftSpec, ref: TensorRef) -> Iterator[bytes]:
    if ref.data_start < 0:
        yield _torch_bytes(spec, ref.name)
    else:
        yield from iter_file_chunks(os.path.join(spec.path, ref.file), ref.data_start, ref.data_end)


def _read_whole(spec: DraftSpec, ref: TensorRef) -> np.ndarray:
    """A tensor's bytes in one buffer of exactly its size (no intermediate copies)."""
    if ref.data_start < 0:
        return np.frombuffer(_torch_bytes(spec, ref.name), dtype=np.uint8)
    path = os.path.join(spec.path, ref.file)
    buf = np.empty(ref.nbytes, dtype=np.uint8)
    view, got = buf.data, 0
    with open(path, "rb", buffering=0) as fh:
        fh.seek(ref.data_start)
        while got < ref.nbytes:
            n = fh.readinto(view[got:])
            if not n:
                raise CheckpointError(f"tensor {ref.source_name!r}: file truncated", path)
            got += n
    return buf


def _rows(spec: DraftSpec, ref: TensorRef, order: np.ndarray | None, cast_to: str | None,
          column_scale: np.ndarray | None = None) -> Iterator[bytes]:
    """Rows of a 2-D tensor in `order` (None: as they are), each times `column_scale` when given, a few MB at a
    time; the source tensor is read once and every value rounded once, into the output dtype."""
    table = _read_whole(spec, ref).reshape(ref.shape[0], -1)
    order = np.arange(table.shape[0]) if order is None else order
    step = max(1, READ_CHUNK // max(table.shape[1], 1))
    for start in range(0, len(order), step):
        block = table[order[start:start + step]].tobytes()
        try:
            if column_scale is not None:
                values = decode(block, ref.dtype).reshape(-1, ref.shape[1]) * column_scale[None, :]
                yield encode(values, cast_to or ref.dtype)
            else:
                yield encode(decode(block, ref.dtype), cast_to) if cast_to else block
        except CastRangeError as exc:
            raise CheckpointError(f"tensor {ref.source_name!r} {exc}", spec.path) from None


def _pickled(spec: DraftSpec, name: str, cast_to: str | None) -> list[bytes]:
    return [_torch_bytes(spec, name, cast_to)]


def _cast(spec: DraftSpec, ref: TensorRef, cast_to: str) -> Iterator[bytes]:
    try:
        yield from cast_stream(_source_chunks(spec, ref), ref.dtype, cast_to)
    except CastRangeError as exc:
        raise CheckpointError(f"tensor {ref.source_name!r} {exc}", spec.path) from None


def _constant(data: bytes) -> list[bytes]:
    return [data]


def _array_bytes(values: np.ndarray, dtype: str) -> bytes:
    if dtype in ARRAY_ENCODINGS:
        return np.ascontiguousarray(values, dtype=ARRAY_ENCODINGS[dtype]).tobytes()
    return encode(np.asarray(values, dtype=np.float32), dtype)


def out_tensor(spec: DraftSpec, plan: UpgradePlan, step: TensorStep, arrays: dict[str, np.ndarray],
               row_order: np.ndarray | None) -> OutTensor:
    recipe = plan.recipes[step.name]
    source: ByteRange | partial
    if recipe.kind == "array":
        assert recipe.array is not None, "an array recipe names the computed array"
        source = partial(_constant, _array_bytes(arrays[recipe.array], step.dtype))
        return OutTensor(step.name, step.dtype, step.shape, source)
    assert recipe.source is not None, "bytes, cast and rows recipes name their source tensor"
    ref = spec.tensors[recipe.source]
    if recipe.kind == "bytes" and ref.data_start >= 0:
        source = ByteRange(os.path.join(spec.path, ref.file), ref.data_start, ref.data_end)
    elif recipe.kind in ("bytes", "cast") and ref.data_start < 0:
        source = partial(_pickled, spec, ref.name, recipe.cast_to)
    elif recipe.kind == "cast":
        assert recipe.cast_to is not None, "a cast recipe names its output dtype"
        source = partial(_cast, spec, ref, recipe.cast_to)
    else:
        scale = arrays[recipe.column_scale].astype(np.float32) if recipe.column_scale else None
        source = partial(_rows, spec, ref, row_order, recipe.cast_to, scale)
    return OutTensor(step.name, step.dtype, step.shape, source)


def out_tensors(spec: DraftSpec, plan: UpgradePlan, arrays: dict[str, np.ndarray],
                row_order: np.ndarray | None) -> list[OutTensor]:
    return [out_tensor(spec, plan, step, arrays, row_order) for step in plan.written]
