"""The reference drafter: the function vLLM serves for an EAGLE-3 / EAGLE-3.1 draft, for every flag.

One step (reference §9.2): optional `combine` of K target states (input_norm, fc_norm, fc), then
layer 0 over cat(input_layernorm(embed), hidden_norm(g)) with residual g (or hidden_norm(g) with
norm_before_residual), standard pre-norm layers after it, a final fused add-norm, logits from the
post-norm state scattered into the target vocabulary through d2t, and feedback = pre-norm sum
(EAGLE-3) or post-norm state (norm_output, EAGLE-3.1).

Norms, SiLU-and-mul and RoPE go through `eaglekit.drafter.kernels` (Triton on CUDA, torch elsewhere
and whenever autograd records); projections are plain matmuls. Parameters keep their canonical
names in `state_dict()`, so a trained drafter saves as a checkpoint directly.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from functools import cached_property
from typing import cast

import torch
import torch.nn.functional as F
from torch import nn

from eaglekit.drafter import kernels
from eaglekit.drafter.attention import DraftCache, FusedLinear, GqaAttention, RmsNormWeight, key_positions, linear
from eaglekit.drafter.config import DrafterConfig
from eaglekit.drafter.mla import MlaAttention
from eaglekit.drafter.rope import Rope
from eaglekit.errors import CheckpointError, UsageError
from eaglekit.spec import DraftSpec

__all__ = ["DraftCache", "DraftOutput", "Drafter"]

# Names a checkpoint may carry that the step never reads (vLLM skips or ignores them too).
UNUSED_NAMES = ("t2d", "mask_hidden")
# Stored dtypes the drafter reads as values; anything else (FP8, NVFP4 and their scales) needs dequantising.
PLAIN_DTYPES = ("BF16", "F16", "F32", "F64", "I64", "BOOL")


@dataclass(frozen=True)
class DraftOutput:
    """One step's results. `logits` (target-vocabulary wide) is built on first access: training and
    greedy drafting need only `draft_logits`, and [B, S, V] is the largest tensor of the step."""

    draft_logits: torch.Tensor  # [B, S, Vd]
    feedback: torch.Tensor  # [B, S, H]: what the next step receives as its hidden state
    sink_attention: torch.Tensor | None  # [B, S]: layer-0 softmax mass on key row 0, mean over heads
    to_target_vocab: Callable[[torch.Tensor], torch.Tensor] = field(repr=False, compare=False)

    @cached_property
    def logits(self) -> torch.Tensor:
        """[B, S, V]: draft logits at columns arange(Vd) + d2t, -inf elsewhere (== draft_logits when Vd == V)."""
        return self.to_target_vocab(self.draft_logits)


class GatedMlp(nn.Module):
    """down(silu(gate(x)) * up(x)), with gate|up as one GEMM (canonical names gate_proj / up_proj)."""

    def __init__(self, hidden: int, intermediate: int):
        super().__init__()
        self.gate_up_proj = FusedLinear(self, "gate_up_proj", hidden,
                                        {"gate_proj": intermediate, "up_proj": intermediate}, bias=False)
        self.down_proj = linear(intermediate, hidden)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(kernels.silu_and_mul(self.gate_up_proj(x)))


class DecoderLayer(nn.Module):
    """Layer 0 attends over [input_layernorm(embed) | hidden_norm(g)] (fan-in 2H); later layers are plain pre-norm."""

    def __init__(self, config: DrafterConfig, index: int, rope: Rope):
        super().__init__()
        h = config.hidden_size
        fan_in = 2 * h if index == 0 else h
        window = config.sliding_windows[index] if config.sliding_windows else None
        self.index, self.eps, self.norm_before_residual = index, config.rms_norm_eps, config.norm_before_residual
        if config.attention == "mla":
            assert config.mla is not None, "Drafter._build rejects an MLA draft without MLA dimensions"
            self.self_attn: GqaAttention | MlaAttention = MlaAttention(
                layer=index, in_features=fan_in, hidden=h, heads=config.num_heads, mla=config.mla, rope=rope,
                window=window, eps=self.eps)
        else:
            self.self_attn = GqaAttention(
                layer=index, in_features=fan_in, hidden=h, heads=config.num_heads, kv_heads=config.num_kv_heads,
                head_dim=config.head_dim, qk_norm=config.attention == "qwen3", bias=config.attention_bias,
                o_bias=config.attention_bias and config.attention == "llama", rope=rope, window=window, eps=self.eps)
        self.mlp = GatedMlp(h, config.intermediate_size)
        self.input_layernorm = RmsNormWeight(h)
        self.hidden_norm = RmsNormWeight(h) if index == 0 else None
        self.post_attention_layernorm = RmsNormWeight(h)

    def forward(self, x: torch.Tensor, residual: torch.Tensor | None, embeds: torch.Tensor, positions: torch.Tensor,
                key_pos: torch.Tensor | None, cache: DraftCache | None, attn_bias: torch.Tensor | None,
                want_sink: bool) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
        """x, residual, embeds: [N, H] rows; returns (mlp_out, residual, sink)."""
        batch, s = positions.shape
        attn_in, residual = self._attention_input(x, residual, embeds)
        attn_out, sink = self.self_attn(attn_in.reshape(batch, s, -1), positions, key_pos, cache, attn_bias, want_sink)
        x, residual = kernels.fused_add_rms_norm(attn_out.reshape(-1, x.shape[-1]), residual,
                                                 self.post_attention_layernorm.weight, self.eps)
        return self.mlp(x), residual, sink

    def extend_cache(self, x: torch.Tensor, residual: torch.Tensor | None, embeds: torch.Tensor,
                     positions: torch.Tensor, cache: DraftCache) -> None:
        """forward's keys and values of these rows into `cache`, from the same products, and nothing else."""
        batch, s = positions.shape
        attn_in, _ = self._attention_input(x, residual, embeds)
        self.self_attn.extend_cache(attn_in.reshape(batch, s, -1), positions, cache)

    def _attention_input(self, x: torch.Tensor, residual: torch.Tensor | None,
                         embeds: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        if self.hidden_norm is not None:
            attn_in = kernels.dual_rms_norm_cat(embeds, x, self.input_layernorm.weight, self.hidden_norm.weight,
                                                self.eps)
            return attn_in, attn_in[:, x.shape[-1]:] if self.norm_before_residual else x
        assert residual is not None, "every layer after the first receives the running residual"
        return kernels.fused_add_rms_norm(x, residual, self.input_layernorm.weight, self.eps)


class Drafter(nn.Module):
    """An EAGLE-3 / 3.1 draft computing what vLLM 0.33 computes for it (llama/qwen3/deepseek_eagle3.py).

    `embed_tokens` / `lm_head` given to the constructor are the target's tensors, borrowed (not
    trained, not saved); otherwise the drafter owns its own. `initialize=False` leaves the matrices
    uninitialised (they are about to be loaded); norms start at 1, biases and d2t at 0 either way.
    """

    target_embed_tokens: torch.Tensor | None
    target_lm_head: torch.Tensor | None
    d2t: torch.Tensor | None
    draft_ids: torch.Tensor

    def __init__(self, config: DrafterConfig, *, device: torch.device | str = "cpu", dtype: torch.dtype = torch.float32,
                 embed_tokens: torch.Tensor | None = None, lm_head: torch.Tensor | None = None,
                 initialize: bool = True):
        super().__init__()
        self.config = config
        with torch.device(device):
            self._build(config, borrow_embed=embed_tokens is not None, borrow_head=lm_head is not None)
        self.to(dtype=dtype)
        if initialize:
            self.reset_parameters()
        h = config.hidden_size
        self.register_buffer("target_embed_tokens", _borrowed(embed_tokens, (config.vocab_size, h), "embed_tokens",
                                                              config, device, dtype), persistent=False)
        self.register_buffer("target_lm_head", _borrowed(lm_head, (config.draft_vocab_size, h), "lm_head", config,
                                                         device, dtype), persistent=False)

    # ------------------------------------------------------------------ construction

    def _build(self, c: DrafterConfig, *, borrow_embed: bool, borrow_head: bool) -> None:
        h, t, k = c.hidden_size, c.target_hidden_size, c.num_aux_hidden_states
        if c.attention == "mla":
            if c.mla is None:
                raise CheckpointError("MLA draft without MLA dimensions in its config", c.source)
            rope = Rope(c.mla.qk_rope_head_dim, c.rope_theta, c.rope_scaling, mla=True, source=c.source)
        else:
            rope = Rope(c.head_dim, c.rope_theta, c.rope_scaling, source=c.source)
        self.fc = linear(k * t, h) if c.use_aux_hidden_state else None
        self.input_norm = RmsNormWeight(k * t) if c.norm_before_fc else None
        self.fc_norm = nn.ModuleList(RmsNormWeight(t) for _ in range(k)) if c.fc_norm else None
        self.layers = nn.ModuleList(DecoderLayer(c, i, rope) for i in range(c.num_layers))
        self.norm = RmsNormWeight(h)
        self.embed_tokens = None if borrow_embed else nn.utils.skip_init(
            nn.Embedding, c.vocab_size, h, device=torch.get_default_device())
        self.lm_head = None if borrow_head else linear(h, c.draft_vocab_size)
        if c.draft_vocab_size < c.vocab_size:
            self.register_buffer("d2t", torch.zeros(c.draft_vocab_size, dtype=torch.long))
            self.register_buffer("draft_ids", torch.arange(c.draft_vocab_size), persistent=False)
        else:
            self.d2t = None

    @classmethod
    def from_spec(cls, spec: DraftSpec, *, device: torch.device | str = "cpu", dtype: torch.dtype = torch.float32,
                  embed_tokens: torch.Tensor | None = None, lm_head: torch.Tensor | None = None,
                  overrides: Mapping[str, bool] | None = None) -> Drafter:
        """Load a draft checkpoint (any family) through its canonical description.

        `embed_tokens` [V, H] / `lm_head` [V, H] are the target's, used only when the draft ships none
        (a draft's own tensors win, as in vLLM). `overrides` flips fc_norm / norm_output /
        norm_before_fc / norm_before_residual; a flag turned on without tensors gets unit weights.
        """
        from eaglekit.io.tensors import load_tensor

        vocab = embed_tokens.shape[0] if embed_tokens is not None else None
        config = DrafterConfig.from_spec(spec, overrides, vocab_size=vocab)
        own_embed, own_head = spec.has_embed_tokens, spec.has_lm_head
        if not own_embed and embed_tokens is None:
            raise UsageError(f"{spec.path}: the draft has no embed_tokens.weight; "
                             "pass the target's embedding (embed_tokens=)")
        if not own_head and lm_head is None:
            raise UsageError(f"{spec.path}: the draft has no lm_head.weight; pass the target's head (lm_head=)")
        if not own_head and config.draft_vocab_size != config.vocab_size:
            raise CheckpointError(f"draft vocabulary {config.draft_vocab_size} < {config.vocab_size} needs the "
                                  "draft's own lm_head.weight; the target's head cannot be shared", spec.path)
        quantised = sorted(n for n, ref in spec.tensors.items() if ref.dtype not in PLAIN_DTYPES)
        if quantised:
            raise CheckpointError(f"quantised tensors ({quantised[0]} is {spec.tensors[quantised[0]].dtype}) are not "
                                  "supported by the reference drafter; use a bf16/fp16/fp32 export", spec.path)
        drafter = cls(config, device=device, dtype=dtype, embed_tokens=None if own_embed else embed_tokens,
                      lm_head=None if own_head else lm_head, initialize=False)
        drafter._fill(lambda name: load_tensor(spec, name) if name in spec.tensors else None)
        return drafter

    @classmethod
    def from_state_dict(cls, config: DrafterConfig | DraftSpec, state_dict: Mapping[str, torch.Tensor], *,
                        device: torch.device | str = "cpu", dtype: torch.dtype = torch.float32,
                        embed_tokens: torch.Tensor | None = None, lm_head: torch.Tensor | None = None) -> Drafter:
        """Build from in-memory tensors under canonical names (training, tests).

        The drafter owns `embed_tokens` / `lm_head` exactly when `state_dict` holds them; otherwise the
        target's tensors must be given. Names the step never reads (t2d, mask_hidden, d2t when
        Vd == V, hidden_norm of layers >= 1) are ignored; any other unknown name is an error.
        """
        if isinstance(config, DraftSpec):
            vocab = embed_tokens.shape[0] if embed_tokens is not None else None
            config = DrafterConfig.from_spec(config, vocab_size=vocab)
        own_embed, own_head = "embed_tokens.weight" in state_dict, "lm_head.weight" in state_dict
        for own, given, name in ((own_embed, embed_tokens, "embed_tokens"), (own_head, lm_head, "lm_head")):
            if not own and given is None:
                raise UsageError(f"state_dict has no {name}.weight and no target {name} was given")
        drafter = cls(config, device=device, dtype=dtype, embed_tokens=None if own_embed else embed_tokens,
                      lm_head=None if own_head else lm_head, initialize=False)
        slots = drafter.state_dict(keep_vars=True)
        unknown = sorted(n for n in state_dict if n not in slots and not _unused(n))
        if unknown:
            raise UsageError(f"state_dict has names the drafter does not have: {', '.join(unknown[:6])}")
        drafter._fill(state_dict.get)
        return drafter

    def _fill(self, fetch) -> None:
        """Copy every canonical tensor from `fetch(name)`; absent 1-D tensors keep vLLM's defaults (ones / zeros)."""
        missing = []
        with torch.no_grad():
            for name, slot in self.state_dict(keep_vars=True).items():
                value = fetch(name)
                if value is None:
                    if slot.dim() >= 2:
                        missing.append(name)
                    continue
                if tuple(value.shape) != tuple(slot.shape):
                    raise CheckpointError(f"tensor {name} has shape {list(value.shape)}, the config implies "
                                          f"{list(slot.shape)}", self.config.source)
                slot.copy_(value)
        if missing:
            more = f" and {len(missing) - 6} more" if len(missing) > 6 else ""
            raise CheckpointError(f"draft lacks tensor(s) {', '.join(missing[:6])}{more}", self.config.source)

    def canonical_names(self, parameter: str) -> list[str]:
        """The checkpoint tensors a parameter holds: a fused q|k|v or gate|up parameter is several (state_dict's
        names), any other is itself."""
        path, _, suffix = parameter.rpartition(".")
        module = self.get_submodule(path) if path else self
        if not isinstance(module, FusedLinear):
            return [parameter]
        parent = path[: -len(module.name)]
        return [f"{parent}{part}.{suffix}" for part in module.parts]

    def reset_parameters(self, std: float = 0.02) -> None:
        """Fresh weights: matrices ~ N(0, std), norms 1, biases 0 (HF's Llama initialisation)."""
        with torch.no_grad():
            for module in self.modules():
                if isinstance(module, (nn.Linear, FusedLinear, nn.Embedding)):
                    module.weight.normal_(0.0, std)
                    bias = getattr(module, "bias", None)
                    if bias is not None:
                        bias.zero_()
                elif isinstance(module, RmsNormWeight):
                    module.weight.fill_(1.0)

    def new_cache(self, batch: int, max_len: int) -> DraftCache:
        """An empty KV cache for `batch` sequences, preallocated for `max_len` rows (it grows if needed)."""
        return DraftCache(batch, max_len)

    # ------------------------------------------------------------------ the step

    @property
    def embedding_weight(self) -> torch.Tensor:
        if self.embed_tokens is not None:
            return self.embed_tokens.weight
        assert self.target_embed_tokens is not None, "a drafter without its own embedding borrows the target's"
        return self.target_embed_tokens

    @property
    def head_weight(self) -> torch.Tensor:
        if self.lm_head is not None:
            return self.lm_head.weight
        assert self.target_lm_head is not None, "a drafter without its own lm_head borrows the target's"
        return self.target_lm_head

    def combine(self, aux: Sequence[torch.Tensor] | torch.Tensor) -> torch.Tensor:
        """First step only: K target states (ascending aux-id order) -> g [B, S, H].

        `aux` is a list of K tensors [B, S, T] or their concatenation [B, S, K*T]. Applies
        input_norm over the whole concatenation (norm_before_fc), then fc_norm per T-wide chunk
        (chunk k <-> k-th smallest aux id), then fc.
        """
        c = self.config
        width = c.num_aux_hidden_states * c.target_hidden_size
        if isinstance(aux, torch.Tensor):
            joined = aux
        else:
            if len(aux) != c.num_aux_hidden_states:
                raise UsageError(f"combine got {len(aux)} aux states, the draft takes K={c.num_aux_hidden_states}")
            joined = torch.cat(list(aux), dim=-1)
        dtype = self.norm.weight.dtype
        if self.fc is None:
            if joined.shape[-1] != c.hidden_size:
                raise UsageError(f"this draft takes the target state as is (width {c.hidden_size}), "
                                 f"got {joined.shape[-1]}")
            return joined.to(dtype)
        if joined.shape[-1] != width:
            raise UsageError(f"aux states have total width {joined.shape[-1]}, the draft expects "
                             f"K*T = {c.num_aux_hidden_states}*{c.target_hidden_size} = {width}")
        lead = joined.shape[:-1]
        rows = joined.reshape(-1, width).to(dtype)
        if self.input_norm is not None:
            rows = kernels.rms_norm(rows, self.input_norm.weight, c.rms_norm_eps)
        if self.fc_norm is not None:
            weights: list[torch.Tensor] = [cast(RmsNormWeight, norm).weight for norm in self.fc_norm]
            rows = kernels.multi_rms_norm_cat(rows, torch.stack(weights), c.rms_norm_eps)
        return self.fc(rows).reshape(*lead, c.hidden_size)

    def extend_cache(self, input_ids: torch.Tensor, hidden: torch.Tensor, positions: torch.Tensor,
                     cache: DraftCache) -> None:
        """forward's rows into `cache` and nothing a draft step reads: the last layer's attention, its MLP and the
        head are skipped. A long prompt's pieces before its last need only their keys and values, which come from
        the same products as in forward, so the cache holds forward's bits; over 7k rows this is most of the pass."""
        embeds, x, key_pos = self._inputs(input_ids, hidden, positions, cache)
        residual = None
        *earlier, last = self.layers
        for layer in earlier:
            x, residual, _ = layer(x, residual, embeds, positions, key_pos, cache, None, False)
        cast(DecoderLayer, last).extend_cache(x, residual, embeds, positions, cache)
        cache.advance(input_ids.shape[1])

    def _inputs(self, input_ids: torch.Tensor, hidden: torch.Tensor, positions: torch.Tensor,
                cache: DraftCache | None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
        """(token embeddings, hidden rows, key positions) of a step's rows, as every layer reads them; rows of the
        wrong shape are refused in one line."""
        c = self.config
        if input_ids.dim() != 2 or positions.shape != input_ids.shape or hidden.shape[:2] != input_ids.shape:
            raise UsageError(f"a draft step takes input_ids [B, S], hidden [B, S, H], positions [B, S]; got "
                             f"{tuple(input_ids.shape)}, {tuple(hidden.shape)}, {tuple(positions.shape)}")
        if hidden.shape[-1] != c.hidden_size:
            raise UsageError(f"hidden has width {hidden.shape[-1]}, the draft's hidden size is {c.hidden_size}")
        dtype = self.norm.weight.dtype
        embeds = F.embedding(input_ids.reshape(-1), self.embedding_weight).to(dtype)
        key_pos = key_positions(cache, positions, windowed=any(c.sliding_windows or ()))
        return embeds, hidden.reshape(-1, c.hidden_size).to(dtype), key_pos

    def forward(self, input_ids: torch.Tensor, hidden: torch.Tensor, positions: torch.Tensor,
                cache: DraftCache | None = None, *, attn_bias: torch.Tensor | None = None,
                return_sink_attention: bool = False, last_row_only: bool = False) -> DraftOutput:
        """One draft step over aligned rows: token ids [B, S], hidden [B, S, H], positions [B, S].

        The caller pairs the hidden state of position i with the token of position i+1 (§9.2).
        `cache` holds the keys/values of earlier rows (prompt, earlier steps, earlier unroll steps of
        training-time test; positions may repeat); the new rows are appended to it. By default row i
        of this call sees every cached row and the new rows up to itself (and only keys within the
        sliding window, by position, where the config has one). `attn_bias` [B, 1, S, cache.length + S]
        (additive, -inf = masked) replaces that mask entirely when given. Differentiable: no in-place
        updates of tensors autograd needs. `last_row_only` returns the logits and feedback of each sequence's last
        row alone: chain drafting reads nothing else, and over a long prompt the head's [S, Vd] product is the
        largest of the pass.
        """
        c = self.config
        embeds, x, key_pos = self._inputs(input_ids, hidden, positions, cache)
        batch, s = input_ids.shape
        residual, sink = None, None
        for layer in self.layers:
            x, residual, layer_sink = layer(x, residual, embeds, positions, key_pos, cache, attn_bias,
                                            return_sink_attention and layer.index == 0)
            sink = layer_sink if layer.index == 0 else sink
        if cache is not None:
            cache.advance(s)
        assert residual is not None, "a drafter has at least one layer"
        if last_row_only:
            x, residual = (t.view(batch, s, -1)[:, -1].contiguous() for t in (x, residual))
            s = 1
        normed, prenorm = kernels.fused_add_rms_norm(x, residual, self.norm.weight, c.rms_norm_eps)
        draft_logits = F.linear(normed, self.head_weight)
        if c.logit_scale != 1.0:
            draft_logits = draft_logits * c.logit_scale
        feedback = normed if c.norm_output else prenorm
        return DraftOutput(
            draft_logits=draft_logits.reshape(batch, s, -1),
            feedback=feedback.reshape(batch, s, c.hidden_size),
            sink_attention=sink,
            to_target_vocab=self.to_target_vocab,
        )

    def target_token_ids(self) -> torch.Tensor:
        """[Vd]: the target-vocabulary id of each draft-vocabulary column, arange(Vd) + d2t (identity when Vd == V)."""
        if self.d2t is None:
            return torch.arange(self.config.draft_vocab_size, device=self.norm.weight.device)
        return self.draft_ids + self.d2t

    def to_target_vocab(self, draft_logits: torch.Tensor) -> torch.Tensor:
        """Scatter [..., Vd] into -inf-filled [..., V] at columns arange(Vd) + d2t (vLLM compute_logits)."""
        if self.d2t is None:
            return draft_logits
        full = draft_logits.new_full((*draft_logits.shape[:-1], self.config.vocab_size), float("-inf"))
        # In place into the fresh tensor (autograd allows it): the out-of-place form would copy [..., V] once more.
        return full.index_copy_(-1, self.target_token_ids(), draft_logits)


def _unused(name: str) -> bool:
    if name in UNUSED_NAMES or name == "d2t":
        return True
    return name.startswith("layers.") and name.endswith(".hidden_norm.weight") and not name.startswith("layers.0.")


def _borrowed(tensor: torch.Tensor | None, shape: tuple[int, int], name: str, config: DrafterConfig,
              device: torch.device | str, dtype: torch.dtype) -> torch.Tensor | None:
    """The target's embed_tokens / lm_head, checked against the draft's geometry and moved to its device."""
    if tensor is None:
        return None
    if tuple(tensor.shape) != shape:
        raise UsageError(f"target {name} has shape {list(tensor.shape)}, the draft needs {list(shape)} "
                         f"(V={config.vocab_size}, H={config.hidden_size})")
    return tensor.detach().to(device=device, dtype=dtype)
