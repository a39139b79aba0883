"""Argument checks shared by the torch and Triton paths, so both reject the same inputs the same way."""

from __future__ import annotations

import torch


def check_last_dim(x: torch.Tensor, expected: int, name: str, what: str) -> None:
    if x.shape[-1] != expected:
        raise ValueError(f"{name} has last dimension {x.shape[-1]}, expected {expected} ({what})")


def check_same_shape(a: torch.Tensor, b: torch.Tensor, names: str) -> None:
    if a.shape != b.shape:
        raise ValueError(f"{names} must have the same shape, got {tuple(a.shape)} and {tuple(b.shape)}")


def chunk_layout(x: torch.Tensor, weights: torch.Tensor) -> tuple[int, int]:
    """(K, T) for x [..., K*T] normalised chunk by chunk with weights [K, T]."""
    if weights.dim() != 2:
        raise ValueError(f"weights must be [K, T], got {tuple(weights.shape)}")
    num_chunks, chunk_width = weights.shape
    check_last_dim(x, num_chunks * chunk_width, "x", f"K*T = {num_chunks}*{chunk_width} from weights")
    return num_chunks, chunk_width


def half_width(x: torch.Tensor) -> int:
    """I for a packed [..., 2*I] gate|up tensor."""
    width = x.shape[-1]
    if width % 2:
        raise ValueError(f"silu_and_mul needs an even last dimension [..., 2*I], got {width}")
    return width // 2


def check_rope_shapes(q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> int:
    """Validate q [N, heads, hd], k [N, kv_heads, hd], cos/sin [N, rot]; return rot."""
    if q.dim() != 3 or k.dim() != 3:
        raise ValueError(f"q and k must be [N, heads, head_dim], got {tuple(q.shape)} and {tuple(k.shape)}")
    tokens, _, head_dim = q.shape
    if k.shape[0] != tokens or k.shape[2] != head_dim:
        raise ValueError(f"k {tuple(k.shape)} does not match q {tuple(q.shape)} in tokens or head_dim")
    if cos.shape != sin.shape or cos.dim() != 2 or cos.shape[0] != tokens:
        raise ValueError(f"cos and sin must both be [N={tokens}, rot], got {tuple(cos.shape)} and {tuple(sin.shape)}")
    rot = cos.shape[1]
    if rot % 2 or not 0 < rot <= head_dim:
        raise ValueError(f"rotary width {rot} must be even and in (0, head_dim={head_dim}]")
    return rot
