"""Multi-head latent attention (DeepSeek-V2/V3, Kimi K2 drafts) as vLLM's DeepseekV2MLAAttention computes it.

The cache holds what vLLM's MLA cache holds: the normalised latent c_kv [kv_lora_rank] and the
rotated shared rope key k_pe [qk_rope_head_dim] per token. Keys and values are re-expanded from the
latent through kv_b_proj for every step (the plain form; vLLM absorbs kv_b_proj into q and o for
decode, which is the same function).

RoPE pairing: DeepSeek rotates interleaved pairs (x[2i], x[2i+1]). The kernels rotate NeoX halves,
so q_pe and k_pe are first permuted to [evens | odds]; both sides get the same permutation, so every
q.k product, and hence the attention, is exactly that of the interleaved rotation.
"""

from __future__ import annotations

import torch
from torch import nn

from eaglekit.drafter import kernels
from eaglekit.drafter.attention import DraftCache, RmsNormWeight, attend, attention_mask, linear
from eaglekit.drafter.rope import Rope
from eaglekit.spec import MlaGeometry


class MlaAttention(nn.Module):
    """q (LoRA or plain), latent kv with decoupled rope key, YaRN-corrected softmax scale."""

    def __init__(self, *, layer: int, in_features: int, hidden: int, heads: int, mla: MlaGeometry, rope: Rope,
                 window: int | None, eps: float):
        super().__init__()
        self.layer, self.heads, self.window, self.eps = layer, heads, window, eps
        self.nope, self.rope_dim, self.v_dim = mla.qk_nope_head_dim, mla.qk_rope_head_dim, mla.v_head_dim
        self.kv_rank, self.q_rank = mla.kv_lora_rank, mla.q_lora_rank
        qk_dim = self.nope + self.rope_dim
        if self.q_rank:
            self.q_a_proj = linear(in_features, self.q_rank)
            self.q_a_layernorm = RmsNormWeight(self.q_rank)
            self.q_b_proj = linear(self.q_rank, heads * qk_dim)
        else:
            self.q_proj = linear(in_features, heads * qk_dim)
        self.kv_a_proj_with_mqa = linear(in_features, self.kv_rank + self.rope_dim)
        self.kv_a_layernorm = RmsNormWeight(self.kv_rank)
        self.kv_b_proj = linear(self.kv_rank, heads * (self.nope + self.v_dim))
        self.o_proj = linear(heads * self.v_dim, hidden)
        self.rotary = rope
        self.scale = qk_dim ** -0.5 * rope.softmax_scale
        order = torch.cat([torch.arange(0, self.rope_dim, 2), torch.arange(1, self.rope_dim, 2)])
        self.register_buffer("interleaved_to_halves", order, persistent=False)

    def forward(self, x: torch.Tensor, positions: torch.Tensor, key_pos: torch.Tensor | None, cache: DraftCache | None,
                attn_bias: torch.Tensor | None, want_sink: bool) -> tuple[torch.Tensor, torch.Tensor | None]:
        batch, s, _ = x.shape
        q_nope, q_pe, latent, k_pe = self._project(x, positions)
        past = cache.length if cache is not None else 0
        if cache is not None:
            latent, k_pe = cache.extend(self.layer, "latent", latent), cache.extend(self.layer, "k_pe", k_pe)
        total = latent.shape[1]
        kv = self.kv_b_proj(latent).reshape(batch, total, self.heads, self.nope + self.v_dim)
        k_nope, v = kv[..., : self.nope], kv[..., self.nope:]
        k = torch.cat([k_nope, k_pe.unsqueeze(2).expand(batch, total, self.heads, self.rope_dim)], dim=-1)
        q = torch.cat([q_nope, q_pe], dim=-1).reshape(batch, s, self.heads, -1)
        mask = attention_mask(positions, key_pos, past, self.window, attn_bias, q.dtype)
        out, sink = attend(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), mask, self.scale, want_sink)
        return self.o_proj(out), sink

    def extend_cache(self, x: torch.Tensor, positions: torch.Tensor, cache: DraftCache) -> None:
        """forward's latent and rope key of these rows into `cache`, without attending."""
        _, _, latent, k_pe = self._project(x, positions)
        cache.extend(self.layer, "latent", latent)
        cache.extend(self.layer, "k_pe", k_pe)

    def _project(self, x: torch.Tensor, positions: torch.Tensor) -> tuple[torch.Tensor, ...]:
        """(q_nope, q_pe [N, heads, ...], latent [B, S, rank], k_pe [B, S, rope]) of rows x [B, S, in]."""
        batch, s, _ = x.shape
        n = batch * s
        flat = x.reshape(n, -1)
        if self.q_rank:
            q_latent = kernels.rms_norm(self.q_a_proj(flat), self.q_a_layernorm.weight, self.eps)
            q = self.q_b_proj(q_latent)
        else:
            q = self.q_proj(flat)
        q = q.reshape(n, self.heads, self.nope + self.rope_dim)
        q_nope, q_pe = q[..., : self.nope], q[..., self.nope:]
        latent, k_pe = self.kv_a_proj_with_mqa(flat).split([self.kv_rank, self.rope_dim], dim=-1)
        latent = kernels.rms_norm(latent, self.kv_a_layernorm.weight, self.eps)
        cos, sin = self.rotary.cos_sin(positions)
        q_pe, k_pe = kernels.apply_rope(q_pe.index_select(-1, self.interleaved_to_halves),
                                        k_pe.index_select(-1, self.interleaved_to_halves).reshape(n, 1, -1),
                                        cos, sin)
        return q_nope, q_pe, latent.reshape(batch, s, self.kv_rank), k_pe.reshape(batch, s, self.rope_dim)
