"""GQA attention of a draft layer (Llama and Qwen3 flavours), the draft KV cache and the shared masking.

Everything here is out of place so autograd can train through it; the cache writes in place only
when no gradient is being recorded (inference), and otherwise grows by concatenation so that keys
of earlier unroll steps stay valid for backward.
"""

from __future__ import annotations

from collections.abc import Mapping
from functools import partial

import torch
import torch.nn.functional as F
from torch import nn

from eaglekit.drafter import kernels
from eaglekit.drafter.rope import Rope
from eaglekit.errors import UsageError


class DraftCache:
    """Keys/values (or MLA latents) of every draft layer for a batch, plus the positions they were written at.

    `length` is the number of cached key rows, shared by the batch. `truncate(n)` rolls back to the
    first n rows (after a rejection); later writes overwrite the dropped rows. Tensors are stored as
    [B, L, ...] with the sequence on dim 1.
    """

    def __init__(self, batch: int, capacity: int):
        if batch <= 0 or capacity < 0:
            raise UsageError(f"a draft cache needs batch > 0 and max_len >= 0, got batch={batch}, max_len={capacity}")
        self.batch = batch
        self.capacity = capacity
        self.length = 0
        self._tensors: dict[tuple[int, str], torch.Tensor] = {}

    def truncate(self, n: int) -> None:
        """Keep the first n cached rows."""
        if not 0 <= n <= self.length:
            raise UsageError(f"cannot truncate a draft cache of length {self.length} to {n}")
        self.length = n

    def copy(self, capacity: int | None = None) -> "DraftCache":
        """An independent cache holding this one's rows, room for `capacity` (default: this one's): two decodes
        that share a prompt continue from one pass over it."""
        twin = DraftCache(self.batch, self.capacity if capacity is None else capacity)
        twin.length = self.length
        for key, buf in self._tensors.items():
            rows = max(self.length, twin.capacity)
            twin._tensors[key] = buf.new_empty((buf.shape[0], rows, *buf.shape[2:]))
            twin._tensors[key][:, :self.length] = buf[:, :self.length]
        return twin

    def extend(self, layer: int, name: str, new: torch.Tensor) -> torch.Tensor:
        """Write `new` [B, S, ...] after the cached rows of (layer, name); return all rows [B, length + S, ...].

        The cache length itself advances in `advance`, once per forward, after every layer wrote.
        """
        if new.shape[0] != self.batch:
            raise UsageError(f"draft cache was made for batch {self.batch}, got a batch of {new.shape[0]}")
        past, key = self.length, (layer, name)
        end = past + new.shape[1]
        buf = self._tensors.get(key)
        if torch.is_grad_enabled() and (new.requires_grad or (buf is not None and buf.requires_grad)):
            full = new if buf is None or past == 0 else torch.cat([buf[:, :past], new], dim=1)
            self._tensors[key] = full
            return full
        # An inference-mode tensor cannot be written outside inference mode: move to a fresh buffer then.
        stale = buf is not None and buf.is_inference() and not torch.is_inference_mode_enabled()
        if buf is None or stale or buf.shape[1] < end or buf.dtype != new.dtype or buf.device != new.device:
            grown = new.new_empty((self.batch, max(end, self.capacity, 2 * buf.shape[1] if buf is not None else 0),
                                   *new.shape[2:]))
            if buf is not None and past:
                grown[:, :past] = buf[:, :past]
            buf = self._tensors[key] = grown
        buf[:, past:end] = new
        return buf[:, :end]

    def advance(self, rows: int) -> None:
        self.length += rows


def key_positions(cache: DraftCache | None, positions: torch.Tensor, windowed: bool) -> torch.Tensor | None:
    """Positions of every key the current queries see (cached rows, then the new rows) [B, L].

    Only sliding windows look at key positions; without one nothing is stored or returned.
    """
    if not windowed:
        return None
    if cache is None:
        return positions
    return cache.extend(-1, "positions", positions)


def attention_mask(query_pos: torch.Tensor, key_pos: torch.Tensor | None, past: int, window: int | None,
                   attn_bias: torch.Tensor | None, dtype: torch.dtype) -> torch.Tensor | None:
    """Additive mask [B, 1, S, L]: key j is visible to new row i iff j <= past + i (and within the window).

    `attn_bias`, when given, replaces this mask entirely. None means "everything visible".
    """
    s = query_pos.shape[1]
    total = past + s
    if attn_bias is not None:
        if attn_bias.dim() != 4 or attn_bias.shape[-2:] != (s, total):
            raise UsageError(f"attn_bias must be [B, 1, {s}, {total}] (queries x cached+new keys), "
                             f"got {tuple(attn_bias.shape)}")
        return attn_bias.to(dtype)
    if s == 1 and window is None:
        return None
    rows = torch.arange(s, device=query_pos.device).unsqueeze(1) + past
    cols = torch.arange(total, device=query_pos.device).unsqueeze(0)
    visible = (cols <= rows).unsqueeze(0)
    if window is not None:
        assert key_pos is not None, "a sliding window is applied by key position"
        visible = visible & (query_pos.unsqueeze(2) - key_pos.unsqueeze(1) < window)
    zero = torch.zeros((), dtype=dtype, device=query_pos.device)
    return torch.where(visible, zero, torch.full((), float("-inf"), dtype=dtype, device=query_pos.device)).unsqueeze(1)


def attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None, scale: float,
           want_sink: bool) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Softmax attention. q [B, nH, S, d], k [B, nKV, L, d], v [B, nKV, L, dv] -> ([B, S, nH*dv], sink [B, S] | None).

    sink is the softmax mass on key row 0, averaged over heads (the "attention sink" of the cache).
    """
    batch, heads, s, _ = q.shape
    if not want_sink:
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=scale, enable_gqa=heads != k.shape[1])
        return out.transpose(1, 2).reshape(batch, s, -1), None
    group = heads // k.shape[1]
    k, v = k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1)
    scores = (q.float() @ k.float().transpose(-1, -2)) * scale
    if mask is not None:
        scores = scores + mask.float()
    probs = scores.softmax(dim=-1)
    out = (probs.to(v.dtype) @ v).transpose(1, 2).reshape(batch, s, -1)
    return out, probs[..., 0].mean(dim=1)


def linear(in_features: int, out_features: int, bias: bool = False) -> nn.Linear:
    """An uninitialised Linear on the current default device (weights are loaded or reset afterwards)."""
    layer = nn.utils.skip_init(nn.Linear, in_features, out_features, bias=bias, device=torch.get_default_device())
    if layer.bias is not None:
        nn.init.zeros_(layer.bias)
    return layer


class FusedLinear(nn.Module):
    """One GEMM over row-stacked weights that checkpoints keep as separate tensors (q|k|v, gate|up).

    The fused parameter lives at `<parent>.<name>.weight`; `state_dict` and `load_state_dict` use the
    canonical names `<parent>.<part>.weight` (and `.bias`) instead. The split rows are copies (so
    safetensors can save them), or views of the parameter with `keep_vars=True`. The parent module
    must be passed in: loading filters keys by module prefix, so only the parent sees the part names.
    """

    def __init__(self, parent: nn.Module, name: str, in_features: int, parts: Mapping[str, int], bias: bool):
        super().__init__()
        self.name = name
        self.parts = dict(parts)
        rows = sum(self.parts.values())
        self.weight = nn.Parameter(torch.empty(rows, in_features))
        self.bias = nn.Parameter(torch.zeros(rows)) if bias else None
        self.register_state_dict_post_hook(_split_fused)
        parent.register_load_state_dict_pre_hook(partial(_merge_fused, self))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.linear(x, self.weight, self.bias)

    def split(self, y: torch.Tensor) -> list[torch.Tensor]:
        return list(y.split(list(self.parts.values()), dim=-1))


def _split_fused(module: FusedLinear, state: dict, prefix: str, _meta) -> None:
    parent = prefix[: -len(module.name) - 1]
    for suffix in ("weight", "bias"):
        fused = state.pop(prefix + suffix, None)
        if fused is None:
            continue
        for part, piece in zip(module.parts, fused.split(list(module.parts.values()), dim=0)):
            # keep_vars=True hands out Parameters: give views into them, so a copy into one fills the fused rows.
            state[f"{parent}{part}.{suffix}"] = piece if isinstance(fused, nn.Parameter) else piece.clone()


def _merge_fused(module: FusedLinear, _parent: nn.Module, state: dict, prefix: str, *_args) -> None:
    for suffix in ("weight", "bias"):
        names = [f"{prefix}{part}.{suffix}" for part in module.parts]
        if all(n in state for n in names):
            state[f"{prefix}{module.name}.{suffix}"] = torch.cat([state.pop(n) for n in names], dim=0)


class RmsNormWeight(nn.Module):
    """An RMSNorm's weight under the canonical `<name>.weight`; the norm itself runs in `kernels`."""

    def __init__(self, width: int):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(width))


class GqaAttention(nn.Module):
    """Grouped-query attention with RoPE; Qwen3 adds per-head q/k RMSNorm before RoPE.

    q/k/v are one fused GEMM (`qkv_proj`, canonical names q_proj/k_proj/v_proj), fan-in 2H in layer 0.
    """

    def __init__(self, *, layer: int, in_features: int, hidden: int, heads: int, kv_heads: int, head_dim: int,
                 qk_norm: bool, bias: bool, o_bias: bool, rope: Rope, window: int | None, eps: float):
        super().__init__()
        if heads % kv_heads:
            raise UsageError(f"num_attention_heads {heads} is not a multiple of num_key_value_heads {kv_heads}")
        self.layer, self.heads, self.kv_heads, self.head_dim = layer, heads, kv_heads, head_dim
        self.window, self.eps = window, eps
        self.qkv_proj = FusedLinear(self, "qkv_proj", in_features, {
            "q_proj": heads * head_dim, "k_proj": kv_heads * head_dim, "v_proj": kv_heads * head_dim}, bias)
        self.o_proj = linear(heads * head_dim, hidden, bias=o_bias)
        self.q_norm = RmsNormWeight(head_dim) if qk_norm else None
        self.k_norm = RmsNormWeight(head_dim) if qk_norm else None
        self.rotary = rope
        self.scale = head_dim ** -0.5

    def forward(self, x: torch.Tensor, positions: torch.Tensor, key_pos: torch.Tensor | None, cache: DraftCache | None,
                attn_bias: torch.Tensor | None, want_sink: bool) -> tuple[torch.Tensor, torch.Tensor | None]:
        batch, s, _ = x.shape
        q, k, v = self._project(x, positions)
        past = cache.length if cache is not None else 0
        if cache is not None:
            k, v = cache.extend(self.layer, "k", k), cache.extend(self.layer, "v", v)
        mask = attention_mask(positions, key_pos, past, self.window, attn_bias, q.dtype)
        out, sink = attend(q.reshape(batch, s, self.heads, self.head_dim).transpose(1, 2), k.transpose(1, 2),
                           v.transpose(1, 2), mask, self.scale, want_sink)
        return self.o_proj(out), sink

    def extend_cache(self, x: torch.Tensor, positions: torch.Tensor, cache: DraftCache) -> None:
        """forward's keys and values of these rows into `cache`, without attending."""
        _, k, v = self._project(x, positions)
        cache.extend(self.layer, "k", k)
        cache.extend(self.layer, "v", v)

    def _project(self, x: torch.Tensor, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """q [N, heads, d] and k, v [B, S, kv_heads, d] of rows x [B, S, in], rotated to their positions."""
        batch, s, _ = x.shape
        n = batch * s
        q, k, v = self.qkv_proj.split(self.qkv_proj(x.reshape(n, -1)))
        q, k = q.reshape(n, self.heads, self.head_dim), k.reshape(n, self.kv_heads, self.head_dim)
        if self.q_norm is not None and self.k_norm is not None:
            q = kernels.rms_norm(q.reshape(-1, self.head_dim), self.q_norm.weight, self.eps).reshape(q.shape)
            k = kernels.rms_norm(k.reshape(-1, self.head_dim), self.k_norm.weight, self.eps).reshape(k.shape)
        cos, sin = self.rotary.cos_sin(positions, dtype=q.dtype)
        q, k = kernels.apply_rope(q, k, cos, sin)
        return q, k.reshape(batch, s, self.kv_heads, self.head_dim), v.reshape(batch, s, self.kv_heads, self.head_dim)
