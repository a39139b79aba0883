"""Safetensors dtype facts: element sizes, which are floats, and the numpy / torch names (neither imported here)."""

from __future__ import annotations

DTYPE_SIZES: dict[str, int] = {
    "BOOL": 1, "U8": 1, "I8": 1, "F8_E4M3": 1, "F8_E5M2": 1, "F8_E8M0": 1, "F4": 1,
    "I16": 2, "U16": 2, "F16": 2, "BF16": 2,
    "I32": 4, "U32": 4, "F32": 4,
    "I64": 8, "U64": 8, "F64": 8,
}
"""Bytes per element (F4 packs two elements per byte; its entry is the per-byte unit)."""

FLOAT_DTYPES = ("BF16", "F16", "F32", "F64", "F8_E4M3", "F8_E5M2")
"""Every floating-point dtype a draft's weights may hold."""


def element_count(shape) -> int:
    n = 1
    for d in shape:
        n *= d
    return n


def tensor_nbytes(dtype: str, shape) -> int:
    """Bytes a tensor of `dtype` and `shape` occupies in a safetensors file (F4: two values per byte)."""
    numel = element_count(shape)
    return (numel + 1) // 2 if dtype == "F4" else numel * DTYPE_SIZES[dtype]


NUMPY_DTYPES = {
    "BOOL": "?", "U8": "u1", "I8": "i1", "I16": "i2", "U16": "u2",
    "F16": "f2", "I32": "i4", "U32": "u4", "F32": "f4",
    "I64": "i8", "U64": "u8", "F64": "f8",
}
"""numpy type codes of the dtypes numpy reads natively."""

_TORCH_NAMES = {
    "BOOL": "bool", "U8": "uint8", "I8": "int8", "I16": "int16", "U16": "uint16", "F16": "float16",
    "BF16": "bfloat16", "I32": "int32", "U32": "uint32", "F32": "float32", "I64": "int64", "U64": "uint64",
    "F64": "float64", "F8_E4M3": "float8_e4m3fn", "F8_E5M2": "float8_e5m2",
}


FLOAT_NAMES = ("BF16", "F16", "F32", "F64")
"""The floats eaglekit casts between (the fp8 formats are copied, never cast)."""


def torch_name(name: str) -> str | None:
    """The torch / transformers name of a safetensors dtype ("BF16" -> "bfloat16"), None when it has none."""
    return _TORCH_NAMES.get(name)


def torch_dtype(name: str):
    import torch

    return getattr(torch, _TORCH_NAMES[name])


def torch_to_safetensors_dtype(dtype) -> str:
    for st, tn in _TORCH_NAMES.items():
        if str(dtype) == f"torch.{tn}":
            return st
    raise ValueError(f"unsupported torch dtype {dtype}")


def dtype_from_name(name: str) -> str:
    """'bf16' / 'bfloat16' / 'float16' ... -> safetensors name."""
    aliases = {"bf16": "BF16", "bfloat16": "BF16", "fp16": "F16", "float16": "F16", "half": "F16",
               "fp32": "F32", "float32": "F32", "float": "F32"}
    key = name.lower()
    if key not in aliases:
        raise ValueError(f"unknown dtype {name!r} (use bf16, fp16 or fp32)")
    return aliases[key]
