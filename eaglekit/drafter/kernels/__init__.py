"""Fused drafter kernels: one entry point per operation, dispatched per call to Triton or plain torch.

The Triton kernels are forward-only, so a call that autograd has to differentiate always takes the
torch path. Importing this package never imports triton; `triton_ops` is loaded on first use.
"""

from __future__ import annotations

import importlib
import importlib.util
import os
from functools import cache
from types import ModuleType

import torch

from eaglekit.drafter.kernels import torch_ops
from eaglekit.errors import UsageError

BACKEND_ENV = "EAGLEKIT_KERNELS"
BACKENDS = ("torch", "triton")

__all__ = [
    "BACKEND_ENV",
    "apply_rope",
    "backend",
    "dual_rms_norm_cat",
    "fused_add_rms_norm",
    "multi_rms_norm_cat",
    "rms_norm",
    "silu_and_mul",
]


def backend(device: torch.device | str | None = None) -> str:
    """"torch" or "triton" for tensors on `device` (default: CUDA if available).

    EAGLEKIT_KERNELS=torch|triton overrides the choice; otherwise Triton serves CUDA tensors when it
    is installed, and torch serves everything else.
    """
    forced = os.environ.get(BACKEND_ENV, "").strip().lower()
    if forced:
        if forced not in BACKENDS:
            raise UsageError(f"{BACKEND_ENV}={forced!r} is not one of {', '.join(BACKENDS)}")
        if forced == "triton" and not _triton_installed():
            raise UsageError(f"{BACKEND_ENV}=triton but triton is not installed (pip install 'eaglekit[triton]')")
        return forced
    on_cuda = torch.cuda.is_available() if device is None else torch.device(device).type == "cuda"
    return "triton" if on_cuda and _triton_installed() else "torch"


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """RMSNorm over the last dim: round(x * rstd) to x.dtype, then times weight in x.dtype."""
    return _ops_for(x, weight).rms_norm(x, weight, eps)


def fused_add_rms_norm(
    x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """(rms_norm(s), s) with s = x + residual summed in fp32, stored in x.dtype; inputs are not modified."""
    return _ops_for(x, residual, weight).fused_add_rms_norm(x, residual, weight, eps)


def multi_rms_norm_cat(x: torch.Tensor, weights: torch.Tensor, eps: float) -> torch.Tensor:
    """EAGLE-3.1 fc_norm: x [N, K*T], chunk k normalised with weights[k] ([K, T]) into the same slice."""
    return _ops_for(x, weights).multi_rms_norm_cat(x, weights, eps)


def dual_rms_norm_cat(
    a: torch.Tensor, b: torch.Tensor, weight_a: torch.Tensor, weight_b: torch.Tensor, eps: float
) -> torch.Tensor:
    """Layer-0 input: cat([rms_norm(a, weight_a), rms_norm(b, weight_b)], -1), [N, H] x 2 -> [N, 2H]."""
    return _ops_for(a, b, weight_a, weight_b).dual_rms_norm_cat(a, b, weight_a, weight_b, eps)


def silu_and_mul(x: torch.Tensor) -> torch.Tensor:
    """silu(x[..., :I]) * x[..., I:] computed in fp32 and rounded once to x.dtype."""
    return _ops_for(x).silu_and_mul(x)


def apply_rope(
    q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """NeoX rotary embedding on the first cos.shape[-1] dims of each head of q [N, nH, hd] and k [N, nKV, hd]."""
    return _ops_for(q, k, cos, sin).apply_rope(q, k, cos, sin)


def _ops_for(x: torch.Tensor, *others: torch.Tensor) -> ModuleType:
    if backend(x.device) == "triton" and not _needs_grad(x, *others):
        return importlib.import_module(f"{__name__}.triton_ops")
    return torch_ops


def _needs_grad(*tensors: torch.Tensor) -> bool:
    return torch.is_grad_enabled() and any(t.requires_grad for t in tensors)


@cache
def _triton_installed() -> bool:
    return importlib.util.find_spec("triton") is not None
