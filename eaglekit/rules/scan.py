"""One streaming pass over every tensor's bytes, gathering what the deep rules need.

Float tensors are judged on their raw bit patterns, chunk by chunk, so no tensor is ever widened or held whole:
with `s` the signed and `u` the unsigned integer view of a chunk, sign bit S and E the smallest non-finite
magnitude pattern, a chunk holds a NaN/Inf iff max(s) >= E or max(u) >= S|E, and is all (+/-)zero iff
max(s) <= 0 and max(u) <= S. Memory stays at one chunk buffer; time is two integer reductions per element.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import numpy as np

from eaglekit.errors import CheckpointError
from eaglekit.io.dtypes import NUMPY_DTYPES
from eaglekit.io.tensors import read_array
from eaglekit.spec import DraftSpec, TensorRef

CHUNK_BYTES = 4 * 1024 * 1024  # fits L2/L3: measured fastest on the bench drafter (bench/bench_validate.py)
SMALL_TENSOR_BYTES = 64 * 1024 * 1024  # integer/bool tensors kept whole (d2t, t2d)


@dataclass(frozen=True)
class _Bits:
    unsigned: str
    signed: str
    sign: int
    nonfinite: int  # smallest magnitude bit pattern that is Inf or NaN
    one: int  # the bit pattern of 1.0


BITS = {
    "BF16": _Bits("<u2", "<i2", 0x8000, 0x7F80, 0x3F80),
    "F16": _Bits("<u2", "<i2", 0x8000, 0x7C00, 0x3C00),
    "F32": _Bits("<u4", "<i4", 0x8000_0000, 0x7F80_0000, 0x3F80_0000),
    "F64": _Bits("<u8", "<i8", 1 << 63, 0x7FF0_0000_0000_0000, 0x3FF0_0000_0000_0000),
    "F8_E4M3": _Bits("u1", "i1", 0x80, 0x7F, 0x38),
    "F8_E5M2": _Bits("u1", "i1", 0x80, 0x7C, 0x3C),
}


@dataclass
class TensorStats:
    name: str
    dtype: str
    shape: tuple[int, ...]
    error: str | None = None  # unreadable (truncated file, I/O error)
    skipped: str | None = None  # dtype not scanned
    nonfinite: bool = False
    all_zero: bool = False
    constant: bool = False
    all_one: bool = False
    zero_rows: int | None = None  # rows that are entirely zero (2-D tensors)
    values: np.ndarray | None = None  # integer and bool tensors, kept whole


class _FloatAccumulator:
    def __init__(self, bits: _Bits, rows: bool):
        self.bits = bits
        self.nonfinite = False
        self.nonzero = False
        self.first: int | None = None
        self.constant = True
        self.zero_rows = 0 if rows else None
        self.seen = 0  # elements so far: where the next chunk starts within its row
        self.row_nonzero = False  # of the row the last chunk left unfinished

    def add(self, u: np.ndarray, s: np.ndarray, row_len: int) -> None:
        b = self.bits
        max_s, max_u = int(s.max()), int(u.max())
        if max_s >= b.nonfinite or max_u >= (b.sign | b.nonfinite):
            self.nonfinite = True
        if max_s > 0 or max_u > b.sign:
            self.nonzero = True
        if self.first is None:
            self.first = int(u[0])
        if self.constant and (max_u != self.first or int(u.min()) != self.first):
            self.constant = False
        if self.zero_rows is not None:
            self.zero_rows += self._zero_rows_ended((s > 0) | (u > b.sign), row_len)
        self.seen += len(u)

    def _zero_rows_ended(self, nonzero: np.ndarray, row_len: int) -> int:
        """All-zero rows that end in this chunk. Rows may span chunks (a row longer than the buffer): the unfinished
        one is carried over."""
        ended = 0
        at, n = 0, len(nonzero)
        head = (-self.seen) % row_len
        if head:
            at = min(head, n)
            self.row_nonzero |= bool(nonzero[:at].any())
            if at == head:
                ended += int(not self.row_nonzero)
                self.row_nonzero = False
        full = (n - at) // row_len
        if full:
            block = nonzero[at : at + full * row_len].reshape(full, row_len)
            ended += int(np.count_nonzero(~block.any(axis=1)))
            at += full * row_len
        if at < n:
            self.row_nonzero = bool(nonzero[at:].any())
        return ended

    def finish(self, stats: TensorStats) -> None:
        stats.nonfinite = self.nonfinite
        stats.all_zero = not self.nonzero
        stats.constant = self.constant
        stats.all_one = self.constant and self.first == self.bits.one
        stats.zero_rows = self.zero_rows


def _scan_raw(fh, ref: TensorRef, buf: memoryview, stats: TensorStats) -> None:
    bits = BITS[ref.dtype]
    item = np.dtype(bits.unsigned).itemsize
    if ref.numel == 0:
        return
    rows = len(ref.shape) == 2
    row_len = ref.shape[1] if rows else 1
    align = row_len * item  # whole rows per chunk where a row fits the buffer; else rows span chunks
    step = len(buf) // align * align if align <= len(buf) else max(item, len(buf) // item * item)
    if step > len(buf):  # a buffer smaller than one element
        buf = memoryview(bytearray(step))
    acc = _FloatAccumulator(bits, rows)
    fh.seek(ref.data_start)
    remaining = ref.nbytes
    while remaining:
        want = min(step, remaining)
        got = fh.readinto(buf[:want])
        if got != want:
            raise CheckpointError(f"tensor {ref.source_name!r}: file truncated "
                                  f"({ref.nbytes - remaining + got} of {ref.nbytes} bytes)", ref.file)
        u = np.frombuffer(buf[:want], dtype=bits.unsigned)
        acc.add(u, u.view(bits.signed), row_len)
        remaining -= want
    acc.finish(stats)


def _scan_array(arr: np.ndarray, stats: TensorStats) -> None:
    """Tensors that came through torch (pickle checkpoints): judged as float32 bit patterns."""
    bits = BITS["F32"]
    flat = np.ascontiguousarray(arr, dtype=np.float32).reshape(-1)
    if flat.size == 0:
        return
    u = flat.view("<u4")
    acc = _FloatAccumulator(bits, rows=arr.ndim == 2)
    acc.add(u, u.view("<i4"), int(np.prod(arr.shape[1:])) if arr.ndim == 2 else flat.size)
    acc.finish(stats)


def scan_draft(spec: DraftSpec, chunk_bytes: int = CHUNK_BYTES) -> dict[str, TensorStats]:
    """Read every tensor once, in file order; failures become per-tensor errors, never exceptions."""
    out: dict[str, TensorStats] = {}
    buf = memoryview(bytearray(chunk_bytes))
    by_file: dict[str, list[TensorRef]] = {}
    for ref in spec.tensors.values():
        out[ref.name] = TensorStats(ref.name, ref.dtype, ref.shape)
        by_file.setdefault(ref.file, []).append(ref)
    for rel, refs in sorted(by_file.items()):
        refs.sort(key=lambda r: r.data_start)
        if refs[0].data_start < 0:
            for ref in refs:
                _scan_one_array(spec, ref, out[ref.name])
            continue
        try:
            with open(os.path.join(spec.path, rel), "rb") as fh:
                for ref in refs:
                    _scan_one_raw(spec, fh, ref, buf, out[ref.name])
        except OSError as exc:  # opening the file; per-tensor read errors are caught in _scan_one_raw
            for ref in refs:
                out[ref.name].error = out[ref.name].error or f"cannot read {rel}: {exc.strerror or exc}"
    return out


def _scan_one_raw(spec: DraftSpec, fh, ref: TensorRef, buf: memoryview, stats: TensorStats) -> None:
    try:
        if ref.dtype in BITS:
            _scan_raw(fh, ref, buf, stats)
        elif ref.dtype in NUMPY_DTYPES and ref.nbytes <= SMALL_TENSOR_BYTES:
            stats.values = read_array(spec, ref.name)
        else:
            stats.skipped = f"{ref.dtype} values are not checked"
    except (CheckpointError, OSError, ValueError) as exc:
        stats.error = str(exc)


def _scan_one_array(spec: DraftSpec, ref: TensorRef, stats: TensorStats) -> None:
    try:
        if ref.dtype in BITS:
            _scan_array(read_array(spec, ref.name, as_float32=True), stats)
        elif ref.dtype in NUMPY_DTYPES:
            stats.values = read_array(spec, ref.name)
        else:
            stats.skipped = f"{ref.dtype} values are not checked"
    except (CheckpointError, OSError, ValueError, RuntimeError) as exc:
        stats.error = str(exc)
