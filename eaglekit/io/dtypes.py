"""Mapping between safetensors dtype names, numpy and torch (torch imported only when asked)."""

from __future__ import annotations

import numpy as np

NUMPY_DTYPES = {
    "BOOL": np.bool_, "U8": np.uint8, "I8": np.int8, "I16": np.int16, "U16": np.uint16,
    "F16": np.float16, "I32": np.int32, "U32": np.uint32, "F32": np.float32,
    "I64": np.int64, "U64": np.uint64, "F64": np.float64,
}

_TORCH_NAMES = {
    "BOOL": "bool", "U8": "uint8", "I8": "int8", "I16": "int16", "U16": "uint16", "F16": "float16",
    "BF16": "bfloat16", "I32": "int32", "U32": "uint32", "F32": "float32", "I64": "int64", "U64": "uint64",
    "F64": "float64", "F8_E4M3": "float8_e4m3fn", "F8_E5M2": "float8_e5m2",
}


FLOAT_NAMES = ("BF16", "F16", "F32", "F64")


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
