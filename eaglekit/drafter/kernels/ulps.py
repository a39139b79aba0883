"""Distance between floating-point tensors in units in the last place, for comparing kernel paths."""

from __future__ import annotations

import torch

_SAME_WIDTH_INT = {torch.float32: torch.int32, torch.float16: torch.int16, torch.bfloat16: torch.int16}


def ulp_distance(actual: torch.Tensor, expected: torch.Tensor) -> torch.Tensor:
    """Elementwise count of representable values between actual and expected (int64, on CPU).

    Bit patterns are mapped from sign-magnitude to a monotonic integer line, so the distance is exact
    across zero and exponent boundaries; +0 and -0 are 0 apart.
    """
    if actual.dtype != expected.dtype or actual.dtype not in _SAME_WIDTH_INT:
        raise ValueError(f"need two fp32/fp16/bf16 tensors of one dtype, got {actual.dtype} and {expected.dtype}")
    return (_monotonic_bits(actual) - _monotonic_bits(expected)).abs()


def _monotonic_bits(t: torch.Tensor) -> torch.Tensor:
    int_dtype = _SAME_WIDTH_INT[t.dtype]
    bits = t.detach().cpu().contiguous().view(int_dtype).to(torch.int64)
    sign_bit = 1 << (torch.iinfo(int_dtype).bits - 1)
    return torch.where(bits < 0, -(bits + sign_bit), bits)
