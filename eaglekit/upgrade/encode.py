"""Float encodings without torch: bfloat16 as bit patterns, runtime rounding, chunked dtype casts."""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np

from eaglekit.errors import UsageError
from eaglekit.io.dtypes import DTYPE_SIZES, FLOAT_NAMES

FLOAT_CASTABLE = FLOAT_NAMES
F16_MAX = 65504.0


class CastRangeError(ValueError):
    """A finite value the target dtype cannot hold (it would become infinity)."""
_NUMPY = {"F16": "<f2", "F32": "<f4", "F64": "<f8"}


def bf16_bits(x: np.ndarray) -> np.ndarray:
    """float32 -> bfloat16 bit patterns, round to nearest even (what torch's .to(bfloat16) does); NaN stays NaN."""
    bits = np.ascontiguousarray(x, dtype=np.float32).view(np.uint32)
    rounded = ((bits + np.uint32(0x7FFF) + ((bits >> np.uint32(16)) & np.uint32(1))) >> np.uint32(16)).astype(np.uint16)
    nan = np.isnan(x)
    if nan.any():
        rounded[nan] = ((bits[nan] >> np.uint32(16)) | np.uint32(0x40)).astype(np.uint16)
    return rounded


def decode(raw: bytes | memoryview, dtype: str) -> np.ndarray:
    """Bytes of a float tensor -> flat float32 array (exact for BF16/F16/F32)."""
    if dtype == "BF16":
        return (np.frombuffer(raw, dtype="<u2").astype(np.uint32) << np.uint32(16)).view(np.float32)
    if dtype in _NUMPY:
        return np.frombuffer(raw, dtype=_NUMPY[dtype]).astype(np.float32)
    raise UsageError(f"cannot convert {dtype} tensors (only {', '.join(FLOAT_CASTABLE)})")


def encode(values: np.ndarray, dtype: str) -> bytes:
    """float array -> bytes in `dtype` (round to nearest even)."""
    if dtype == "BF16":
        return bf16_bits(values).astype("<u2").tobytes()
    if dtype == "F16":
        finite = values[np.isfinite(values)]
        if finite.size and float(np.abs(finite).max()) > F16_MAX:
            raise CastRangeError(f"holds {float(np.abs(finite).max()):.4g}, beyond float16's ±{F16_MAX:g}: the cast "
                                 "would write infinity; keep bf16 or fp32")
    if dtype in _NUMPY:
        return np.ascontiguousarray(values, dtype=_NUMPY[dtype]).tobytes()
    raise UsageError(f"cannot write {dtype} tensors (only {', '.join(FLOAT_CASTABLE)})")


def round_to(values: np.ndarray, dtype: str) -> np.ndarray:
    """Round float32 values to what `dtype` can hold, returned as float32 (the runtime's cast)."""
    if dtype == "BF16":
        return (bf16_bits(values).astype(np.uint32) << np.uint32(16)).view(np.float32).reshape(values.shape)
    if dtype == "F16":
        return values.astype(np.float16).astype(np.float32)
    return values.astype(np.float32)


def is_exact_cast(src: str, dst: str) -> bool:
    """Whether every `src` value survives a cast to `dst` unchanged."""
    widening = {("BF16", "F32"), ("BF16", "F64"), ("F16", "F32"), ("F16", "F64"), ("F32", "F64")}
    return src == dst or (src, dst) in widening


def cast_stream(chunks: Iterator[bytes], src: str, dst: str) -> Iterator[bytes]:
    """Re-encode a stream of `src` bytes as `dst`; chunks may split elements, which are carried over."""
    size = DTYPE_SIZES[src]
    carry = b""
    for chunk in chunks:
        data = carry + chunk
        cut = len(data) - len(data) % size
        carry = data[cut:]
        if cut:
            yield encode(decode(memoryview(data)[:cut], src), dst)
    if carry:
        raise UsageError("tensor byte length is not a multiple of its element size")
