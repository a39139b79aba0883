"""Reference implementations in plain PyTorch: the numerics every fused kernel must reproduce.

These run on any device, support autograd (drafters are trained through them on CPU) and round
exactly where the Hugging Face / vLLM reference code rounds:

- RMSNorm: normalise in fp32, round to the input dtype, then multiply by the weight in the input
  dtype (HF `LlamaRMSNorm`, vLLM `RMSNorm.forward_native`).
- Fused add + RMSNorm: the sum is taken in fp32 and stored rounded to the input dtype; the norm is
  applied to that rounded sum (HF, vLLM's CUDA `fused_add_rms_norm`).
- SiLU-and-mul and RoPE: computed in fp32 and rounded once. HF eager rounds after every op in half
  precision; one rounding is the more accurate choice and is what a fused kernel naturally does, so
  results may differ from HF eager by 1 ulp of the half-precision dtype.
- float64 inputs are computed in float64 (everything else in fp32), so gradcheck can verify the backward.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from eaglekit.drafter.kernels.shapes import check_rope_shapes, check_same_shape, chunk_layout, half_width


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """RMSNorm over the last dimension; the result has x's dtype."""
    wide = _widen(x)
    rstd = torch.rsqrt(wide.pow(2).mean(-1, keepdim=True) + eps)
    return (wide * rstd).to(x.dtype) * weight.to(x.dtype)


def fused_add_rms_norm(
    x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """Return (rms_norm(s), s) with s = x + residual summed in fp32 and rounded to x's dtype."""
    wide = _widen(x)
    summed = (wide + _widen(residual, wide.dtype)).to(x.dtype)
    return rms_norm(summed, weight, eps), summed


def multi_rms_norm_cat(x: torch.Tensor, weights: torch.Tensor, eps: float) -> torch.Tensor:
    """Normalise each of the K T-wide chunks of x [..., K*T] with its own weights[k] (EAGLE-3.1 fc_norm)."""
    num_chunks, chunk_width = chunk_layout(x, weights)
    chunks = x.unflatten(-1, (num_chunks, chunk_width))
    return rms_norm(chunks, weights, eps).flatten(-2)


def dual_rms_norm_cat(
    a: torch.Tensor, b: torch.Tensor, weight_a: torch.Tensor, weight_b: torch.Tensor, eps: float
) -> torch.Tensor:
    """cat([rms_norm(a, weight_a), rms_norm(b, weight_b)], -1): the layer-0 [embed || hidden] input."""
    check_same_shape(a, b, "a and b")
    return torch.cat([rms_norm(a, weight_a, eps), rms_norm(b, weight_b, eps)], dim=-1)


def silu_and_mul(x: torch.Tensor) -> torch.Tensor:
    """silu(gate) * up for x = [..., gate | up], computed in fp32 and rounded once."""
    width = half_width(x)
    gate, up = x[..., :width], x[..., width:]
    return (F.silu(_widen(gate)) * _widen(up)).to(x.dtype)


def apply_rope(
    q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """NeoX-style rotary embedding on the first cos.shape[-1] dims of every head; the rest pass through.

    q [N, heads, hd], k [N, kv_heads, hd], cos/sin [N, rot] with rot even and rot <= hd.
    """
    check_rope_shapes(q, k, cos, sin)
    return _rotate(q, cos, sin), _rotate(k, cos, sin)


def _rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    rot = cos.shape[-1]
    wide = _widen(x)
    rotary, passthrough = wide[..., :rot], wide[..., rot:]
    first, second = rotary.chunk(2, dim=-1)
    rotated_half = torch.cat([-second, first], dim=-1)
    rotated = rotary * _widen(cos, wide.dtype).unsqueeze(-2) + rotated_half * _widen(sin, wide.dtype).unsqueeze(-2)
    return torch.cat([rotated, passthrough], dim=-1).to(x.dtype)


def _widen(x: torch.Tensor, dtype: torch.dtype | None = None) -> torch.Tensor:
    """x in the compute dtype: fp32, or float64 when x (or the requested dtype) is float64."""
    return x.to(dtype or torch.promote_types(x.dtype, torch.float32))
