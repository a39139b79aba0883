"""Rotary position tables as vLLM builds them for a draft: default, linear, llama3, YaRN, DeepSeek YaRN.

Tables are returned in the NeoX layout that `kernels.apply_rope` takes: [N, rot] with the rot/2
frequencies repeated once (cos(p * f_0..f_{rot/2-1}) twice). DeepSeek/MLA drafts use the interleaved
(GPT-J) pairing; `mla.py` turns that into the NeoX pairing by permuting the rope dims of q and k
identically, which leaves every q.k product unchanged.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import torch
from torch import nn

from eaglekit.errors import CheckpointError

SUPPORTED_KINDS = ("default", "linear", "llama3", "yarn", "deepseek_yarn")


def yarn_mscale(factor: float, mscale: float = 1.0) -> float:
    """YaRN magnitude correction 0.1 * mscale * ln(factor) + 1 (1 for factor <= 1)."""
    if factor <= 1:
        return 1.0
    return 0.1 * mscale * math.log(factor) + 1.0


def rope_kind(scaling: Mapping[str, Any] | None, *, mla: bool) -> str:
    """The table vLLM builds: MLA drafts turn any rope_scaling into deepseek_yarn (deepseek_eagle3.py)."""
    if not scaling:
        return "default"
    kind = scaling.get("rope_type", scaling.get("type")) or "default"
    if mla:
        return "default" if kind == "default" else "deepseek_yarn"
    if kind == "mrope" or (kind == "default" and "mrope_section" in scaling):
        # M-RoPE with text-only positions (all sections equal) is the default rotation.
        return "default"
    return kind


class Rope(nn.Module):
    """cos/sin for positions, plus the softmax-scale multiplier DeepSeek YaRN asks for.

    `magnitude` multiplies cos and sin (YaRN attention factor); `softmax_scale` multiplies the
    attention's 1/sqrt(d) (DeepSeek's mscale_all_dim correction, 1.0 elsewhere).
    """

    def __init__(self, rot_dim: int, theta: float, scaling: Mapping[str, Any] | None, *, mla: bool = False,
                 source: str | None = None):
        super().__init__()
        if rot_dim <= 0 or rot_dim % 2:
            raise CheckpointError(f"rotary dimension {rot_dim} must be positive and even", source)
        self.kind = rope_kind(scaling, mla=mla)
        self.rot_dim = rot_dim
        params = dict(scaling or {})
        base = 1.0 / (theta ** (torch.arange(0, rot_dim, 2, dtype=torch.float32) / rot_dim))
        self.magnitude = 1.0
        self.softmax_scale = 1.0
        if self.kind == "default":
            inv_freq = base
        elif self.kind == "linear":
            inv_freq = base / float(_need(params, "factor", source))
        elif self.kind == "llama3":
            inv_freq = _llama3(base, params, source)
        elif self.kind in ("yarn", "deepseek_yarn"):
            inv_freq = self._yarn(base, theta, params, source)
        else:
            raise CheckpointError(
                f"RoPE scaling {self.kind!r} is not supported by the reference drafter "
                f"(supported: {', '.join(SUPPORTED_KINDS)})", source)
        # Plain fp32 attributes, not buffers: Module.to(dtype) must never round the frequencies.
        self.inv_freq = inv_freq
        self._doubled = torch.cat([inv_freq, inv_freq])  # NeoX layout: each frequency drives two dims

    def _yarn(self, base: torch.Tensor, theta: float, params: dict, source: str | None) -> torch.Tensor:
        factor = float(_need(params, "factor", source))
        original = float(_need(params, "original_max_position_embeddings", source))
        beta_fast = float(params.get("beta_fast") or 32)
        beta_slow = float(params.get("beta_slow") or 1)
        deepseek = self.kind == "deepseek_yarn"
        truncate = True if deepseek else bool(params.get("truncate", True))
        low, high = _correction_range(beta_fast, beta_slow, self.rot_dim, theta, original, truncate)
        if low == high:
            high += 0.001
        ramp = ((torch.arange(self.rot_dim // 2, dtype=torch.float32) - low) / (high - low)).clamp(0, 1)
        extrapolation = 1 - ramp
        if deepseek:
            extrapolation = extrapolation * float(params.get("extrapolation_factor", 1))
            mscale_all_dim = float(params.get("mscale_all_dim") or 0)
            self.magnitude = (yarn_mscale(factor, float(params.get("mscale", 1)))
                              / yarn_mscale(factor, mscale_all_dim) * float(params.get("attn_factor", 1)))
            self.softmax_scale = yarn_mscale(factor, mscale_all_dim) ** 2
        elif params.get("attention_factor") is not None:
            self.magnitude = float(params["attention_factor"])
        elif params.get("mscale") and params.get("mscale_all_dim"):
            self.magnitude = (yarn_mscale(factor, float(params["mscale"]))
                              / yarn_mscale(factor, float(params["mscale_all_dim"])))
        else:
            self.magnitude = yarn_mscale(factor) * float(params.get("attn_factor", 1))
        return (base / factor) * (1 - extrapolation) + base * extrapolation

    def cos_sin(self, positions: torch.Tensor, dtype: torch.dtype | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """cos and sin [N, rot] for flat positions [N], in fp32 unless `dtype` asks for the rounded table."""
        if self._doubled.device != positions.device:
            self._doubled = self._doubled.to(positions.device)
        angles = positions.reshape(-1, 1).float() * self._doubled
        cos, sin = angles.cos(), angles.sin()
        if self.magnitude != 1.0:
            cos, sin = cos * self.magnitude, sin * self.magnitude
        if dtype is not None:
            cos, sin = cos.to(dtype), sin.to(dtype)
        return cos, sin


def _need(params: dict, key: str, source: str | None) -> Any:
    if params.get(key) is None:
        kind = params.get("rope_type", params.get("type"))
        raise CheckpointError(f"rope_scaling of type {kind!r} lacks {key!r}", source)
    return params[key]


def _llama3(base: torch.Tensor, params: dict, source: str | None) -> torch.Tensor:
    factor = float(_need(params, "factor", source))
    low_ff = float(_need(params, "low_freq_factor", source))
    high_ff = float(_need(params, "high_freq_factor", source))
    original = float(_need(params, "original_max_position_embeddings", source))
    wavelen = 2 * math.pi / base
    smooth = (original / wavelen - low_ff) / (high_ff - low_ff) if low_ff != high_ff else torch.zeros_like(base)
    blended = (1 - smooth) * base / factor + smooth * base
    low_band = torch.where(wavelen > original / low_ff, base / factor, blended)
    return torch.where(wavelen < original / high_ff, base, low_band)


def _correction_range(beta_fast: float, beta_slow: float, dim: int, theta: float, original: float,
                      truncate: bool) -> tuple[float, float]:
    def dim_for(rotations: float) -> float:
        return dim * math.log(original / (rotations * 2 * math.pi)) / (2 * math.log(theta))

    low, high = dim_for(beta_fast), dim_for(beta_slow)
    if truncate:
        low, high = math.floor(low), math.ceil(high)
    return max(low, 0), min(high, dim - 1)
