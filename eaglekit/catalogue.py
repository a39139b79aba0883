"""The one table of EAGLE-3 draft tensors: every name eaglekit reads, checks, plans and writes is looked up here.

Each entry is keyed by its canonical name pattern (`layers.{i}.` for a decoder layer, `fc_norm.{k}.` for aux
state k) and says what shape the draft's geometry gives it, its dtype kind, when the draft's architecture holds it
and when it must, the rule that reports it when that is not the generic missing/unexpected one, and its llama.cpp
name. Readers map producer aliases onto these names, validate compares a draft against them, upgrade plans and
names its output with them, so a name validate accepts is one upgrade can write and read back.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import NamedTuple

from eaglekit.config_view import nested
from eaglekit.spec import DraftSpec, MlaGeometry

LAYER = re.compile(r"^layers\.(\d{1,9})\.")
FC_NORM = re.compile(r"^fc_norm\.(\d{1,6})\.weight$")
"""Canonical name of the EAGLE-3.1 norm of aux state k."""
DOUBLE_INDEX = re.compile(r"^layers\.\d+\.\d+\.")
"""layers.i.j.: the trace of a multi-layer draft pushed through speculators convert (EK108 reports it)."""
SINGLE_LAYER_PREFIX = "midlayer."
"""SGLang's (and older SpecForge exports') name for the one decoder layer of a single-layer Llama draft."""
ROTARY_BUFFER = re.compile(r"(^|\.)rotary_emb\.(inv_freq|cos_cached|sin_cached)$")
"""Rotary buffers some producers save: every engine recomputes them, so none loads them and upgrade drops them."""
WEIGHT_COMPANIONS = ("weight_scale", "weight_scale_2", "input_scale", "weight_zero_point", "input_zero_point",
                     "weight_g_idx")
"""Quantisation tensors that belong to the weight `<module>.weight` of the same module (ModelOpt,
compressed-tensors); rules/expected.py's quant_companion judges each."""
CACHE_SCALES = ("k_scale", "v_scale", "q_scale", "prob_scale")
"""Per-tensor attention-cache scales of `layers.{i}.self_attn`."""


class LegacyName(NamedTuple):
    canonical: str  # the prefix it is renamed to
    producer: str
    renamed_by: tuple[str, ...] = ()  # engines whose loader renames it themselves


LEGACY_NAMES: dict[str, LegacyName] = {
    "aux_norm_low.": LegacyName("fc_norm.0.", "older SGLang exports", renamed_by=("sglang",)),
    "aux_norm_mid.": LegacyName("fc_norm.1.", "older SGLang exports", renamed_by=("sglang",)),
    "aux_norm_high.": LegacyName("fc_norm.2.", "older SGLang exports", renamed_by=("sglang",)),
    "context_proj.": LegacyName("fc.", "the TorchSpec fork"),
    "context_norm.": LegacyName("hidden_norm.", "the TorchSpec fork"),
    "final_norm.": LegacyName("norm.", "the TorchSpec fork"),
}
"""Tensor names of earlier producers: eaglekit reads them under the canonical names and upgrade renames them."""


@dataclass(frozen=True)
class Dims:
    """The geometry the shape rules read; None where the draft does not fix a size."""

    H: int
    T: int
    K: int | None
    I: int | None
    heads: int | None
    kv_heads: int | None
    head_dim: int | None
    V: int | None
    Vd: int
    mla: MlaGeometry | None  # set only for an MLA draft whose MLA geometry is known

    @classmethod
    def of(cls, spec: DraftSpec) -> Dims:
        g = spec.geometry
        return cls(g.hidden_size, g.target_hidden, spec.num_aux_hidden_states,
                   g.intermediate_size or None, g.num_heads or None, g.num_kv_heads or None, g.head_dim or None,
                   spec.vocab.vocab_size, spec.vocab.draft_vocab_size, g.mla if spec.attention == "mla" else None)

    def fan_in(self, layer: int) -> int:
        """Layer 0 reads the embedding and the fc output side by side; later layers the hidden state alone."""
        return 2 * self.H if layer == 0 else self.H


def mul(*dims: int | None) -> int | None:
    out = 1
    for d in dims:
        if not d:
            return None
        out *= d
    return out


def add(*dims: int | None) -> int | None:
    known = [d for d in dims if d]
    return sum(known) if len(known) == len(dims) else None


Shape = tuple[int | None, ...]


def _always(spec: DraftSpec) -> bool:
    return True


def _required(spec: DraftSpec, index: int) -> bool:
    return True


def _mla(spec: DraftSpec) -> bool:
    return Dims.of(spec).mla is not None


def _mla_q_lora(spec: DraftSpec) -> bool:
    mla = Dims.of(spec).mla
    return mla is not None and bool(mla.q_lora_rank)


def _gqa(spec: DraftSpec) -> bool:
    return not _mla(spec)


def _vocab_known(spec: DraftSpec) -> bool:
    return spec.vocab.vocab_size is not None


def _reduced_vocab(spec: DraftSpec) -> bool:
    return spec.vocab.vocab_size is None or spec.vocab.draft_vocab_size < spec.vocab.vocab_size


def _uses_fc(spec: DraftSpec) -> bool:
    ec = nested(spec.config, "eagle_config")
    return not (spec.attention == "llama" and ec.get("use_aux_hidden_state", True) is False)


def _qk(m: MlaGeometry) -> int | None:
    return add(m.qk_nope_head_dim, m.qk_rope_head_dim)


@dataclass(frozen=True)
class Entry:
    """One tensor of an EAGLE-3 draft, under its canonical name pattern."""

    pattern: str
    shape: Callable[[Dims, int], Shape]  # (geometry, layer or aux index) -> expected shape
    why: str  # what the tensor is for: said when it is missing or misshapen
    holds: Callable[[DraftSpec], bool] = _always  # whether the draft's architecture has it at all
    required: Callable[[DraftSpec, int], bool] = _required  # whether it must be present (else optional)
    kind: str = "float"  # "float" | "int64" | "bool"
    gguf: str | None = None  # llama.cpp's name ({i}: the layer); None: llama.cpp has no such tensor
    gguf_drop: str | None = None  # why a GGUF leaves it out although the draft holds it
    reported_by: str | None = None  # the rule that reports it missing or unexpected instead of EK103/EK104
    carried: bool = True  # False: a tensor of another draft kind that no EAGLE-3 output has a place for
    dropped: str | None = None  # why upgrade leaves it out of every output (no engine's EAGLE-3 draft uses it)
    kept_when: Callable[[DraftSpec], bool] | None = None  # the drafts whose outputs keep it although it is `dropped`
    why_mla: str | None = None  # `why` in an MLA draft, where the same name has another shape

    def reason(self, spec: DraftSpec) -> str:
        return self.why_mla if self.why_mla and _mla(spec) else self.why

    def name(self, index: int) -> str:
        return self.pattern.format(i=index, k=index)


def _layer(suffix: str, shape: Callable[[Dims, int], Shape], why: str, holds=_always, required=_required,
           gguf: str | None = None, why_mla: str | None = None) -> Entry:
    return Entry(f"layers.{{i}}.{suffix}", shape, why, holds, required,
                 gguf=f"blk.{{i}}.{gguf}" if gguf else None, why_mla=why_mla)


def _attn(suffix: str, shape, why: str, holds, gguf: str | None = None, why_mla: str | None = None) -> Entry:
    return _layer(f"self_attn.{suffix}", shape, why, holds, gguf=gguf, why_mla=why_mla)


def _q_rows(g: Dims) -> int | None:
    return mul(g.heads, _qk(g.mla)) if g.mla else mul(g.heads, g.head_dim)


def _o_cols(g: Dims) -> int | None:
    return mul(g.heads, g.mla.v_head_dim) if g.mla else mul(g.heads, g.head_dim)


def _bias(spec: DraftSpec) -> bool:
    return _gqa(spec) and spec.geometry.attention_bias


def _qwen3(spec: DraftSpec) -> bool:
    return _gqa(spec) and spec.attention == "qwen3"


HEAD = (
    Entry("fc.weight", lambda g, i: (g.H, mul(g.K, g.T)), "projects the K·T concatenation of target states",
          holds=_uses_fc, gguf="fc.weight"),
    Entry("fc_norm.{k}.weight", lambda g, k: (g.T,), "fc_norm: true (one RMSNorm per aux state)",
          holds=lambda spec: bool(spec.flags.fc_norm), reported_by="EK110"),
    Entry("input_norm.weight", lambda g, i: (mul(g.K, g.T),), "norm_before_fc: true",
          holds=lambda spec: bool(spec.flags.norm_before_fc), gguf="enc.output_norm.weight", reported_by="EK112"),
)
LAYERS = (
    _attn("q_a_proj.weight", lambda g, i: (g.mla.q_lora_rank, g.fan_in(i)), "MLA with q_lora_rank", _mla_q_lora),
    _attn("q_a_layernorm.weight", lambda g, i: (g.mla.q_lora_rank,), "MLA with q_lora_rank", _mla_q_lora),
    _attn("q_b_proj.weight", lambda g, i: (_q_rows(g), g.mla.q_lora_rank), "MLA with q_lora_rank", _mla_q_lora),
    _attn("q_proj.weight", lambda g, i: (_q_rows(g), g.fan_in(i)), "attention",
          lambda spec: not _mla_q_lora(spec), "attn_q.weight", why_mla="MLA without q_lora_rank"),
    _attn("k_proj.weight", lambda g, i: (mul(g.kv_heads, g.head_dim), g.fan_in(i)), "attention", _gqa,
          "attn_k.weight"),
    _attn("v_proj.weight", lambda g, i: (mul(g.kv_heads, g.head_dim), g.fan_in(i)), "attention", _gqa,
          "attn_v.weight"),
    _attn("kv_a_proj_with_mqa.weight", lambda g, i: (add(g.mla.kv_lora_rank, g.mla.qk_rope_head_dim), g.fan_in(i)),
          "MLA", _mla),
    _attn("kv_a_layernorm.weight", lambda g, i: (g.mla.kv_lora_rank or None,), "MLA", _mla),
    _attn("kv_b_proj.weight", lambda g, i: (mul(g.heads, add(g.mla.qk_nope_head_dim, g.mla.v_head_dim)),
                                            g.mla.kv_lora_rank or None), "MLA", _mla),
    _attn("o_proj.weight", lambda g, i: (g.H, _o_cols(g)), "attention", _always, "attn_output.weight",
          why_mla="MLA"),
    _attn("q_proj.bias", lambda g, i: (mul(g.heads, g.head_dim),), "attention_bias: true", _bias),
    _attn("k_proj.bias", lambda g, i: (mul(g.kv_heads, g.head_dim),), "attention_bias: true", _bias),
    _attn("v_proj.bias", lambda g, i: (mul(g.kv_heads, g.head_dim),), "attention_bias: true", _bias),
    _attn("q_norm.weight", lambda g, i: (g.head_dim,), "Qwen3 per-head norm", _qwen3),
    _attn("k_norm.weight", lambda g, i: (g.head_dim,), "Qwen3 per-head norm", _qwen3),
    _layer("mlp.gate_proj.weight", lambda g, i: (g.I, g.H), "MLP", gguf="ffn_gate.weight"),
    _layer("mlp.up_proj.weight", lambda g, i: (g.I, g.H), "MLP", gguf="ffn_up.weight"),
    _layer("mlp.down_proj.weight", lambda g, i: (g.H, g.I), "MLP", gguf="ffn_down.weight"),
    _layer("input_layernorm.weight", lambda g, i: (g.H,), "layer input norm (the token embedding's in layer 0)",
           gguf="attn_norm.weight"),
    _layer("hidden_norm.weight", lambda g, i: (g.H,), "layer 0 normalises the incoming hidden state",
           required=lambda spec, i: i == 0, gguf="attn_norm_2.weight"),
    _layer("post_attention_layernorm.weight", lambda g, i: (g.H,), "post-attention norm", gguf="ffn_norm.weight"),
)
TAIL = (
    Entry("norm.weight", lambda g, i: (g.H,), "final norm before lm_head", gguf="output_norm.weight"),
    Entry("lm_head.weight", lambda g, i: (g.Vd, g.H), "draft head: the target's can stand in only when Vd == V",
          required=lambda spec, i: _vocab_known(spec) and spec.vocab.draft_vocab_size != spec.vocab.vocab_size,
          gguf="output.weight", reported_by="EK132"),
    Entry("embed_tokens.weight", lambda g, i: (g.V, g.H), "the target's embedding is shared only when T == H",
          required=lambda spec, i: Dims.of(spec).T != spec.geometry.hidden_size, gguf="token_embd.weight",
          reported_by="EK124"),
    Entry("d2t", lambda g, i: (g.Vd,), "draft -> target id offsets, needed when Vd < V", holds=_reduced_vocab,
          required=lambda spec, i: _vocab_known(spec), kind="int64", gguf="d2t", reported_by="EK130"),
    Entry("t2d", lambda g, i: (g.V,), "target -> draft membership mask, optional", holds=_reduced_vocab,
          required=lambda spec, i: False, kind="bool", gguf_drop="llama.cpp scatters the draft logits with d2t alone",
          reported_by="EK136"),
)
FOREIGN = (
    Entry("fc.bias", lambda g, i: (g.H,), "the fc bias of EAGLE-1 drafts", holds=lambda spec: False,
          reported_by="EK314", carried=False),
    Entry("mask_hidden", lambda g, i: (None, None), "the mask of parallel drafting (P-EAGLE)",
          holds=lambda spec: False, reported_by="EK320",
          dropped="parallel-drafting mask: EAGLE-3 drafting never reads it (vLLM's Llama class skips it)",
          kept_when=lambda spec: spec.facts.parallel_drafting),
)
ENTRIES: dict[str, Entry] = {e.pattern: e for e in (*HEAD, *LAYERS, *TAIL, *FOREIGN)}


def lookup(canonical: str) -> tuple[Entry, int] | None:
    """The entry a canonical name instantiates, with its layer or aux index (0 for the others)."""
    if m := LAYER.match(canonical):
        entry = ENTRIES.get("layers.{i}." + canonical[m.end():])
        return (entry, int(m.group(1))) if entry else None
    if m := FC_NORM.match(canonical):
        return ENTRIES["fc_norm.{k}.weight"], int(m.group(1))
    entry = ENTRIES.get(canonical)
    return (entry, 0) if entry else None


def layer_index(name: str) -> int | None:
    m = LAYER.match(name)
    return int(m.group(1)) if m else None


def carried(canonical: str) -> bool:
    """A name some EAGLE-3 output has a place for (a quantisation companion is judged by quant_companion)."""
    found = lookup(canonical)
    return found is not None and found[0].carried


def reported_elsewhere(canonical: str) -> bool:
    """Names a dedicated rule reports missing or unexpected, so the generic EK103 / EK104 stay silent."""
    found = lookup(canonical)
    return found is not None and found[0].reported_by is not None


def is_rotary_buffer(name: str) -> bool:
    return bool(ROTARY_BUFFER.search(name))


def dropped(canonical: str, spec: DraftSpec | None = None) -> str | None:
    """Why upgrade leaves this tensor out of every output (None: it is written), `spec`'s own where given."""
    if is_rotary_buffer(canonical):
        return "rotary buffer: recomputed by every engine"
    found = lookup(canonical)
    if found is None:
        return None
    entry = found[0]
    if spec is not None and entry.kept_when is not None and entry.kept_when(spec):
        return None
    return entry.dropped


@dataclass(frozen=True)
class TensorExpectation:
    """One tensor the draft's architecture holds. A None dimension is not fixed by the config."""

    name: str
    shape: Shape
    kind: str
    required: bool
    why: str


def tensor_expectations(spec: DraftSpec) -> list[TensorExpectation]:
    """Every tensor the geometry and flags call for, required or optional, in the catalogue's order."""
    g = Dims.of(spec)

    def at(e: Entry, n: int) -> TensorExpectation:
        return TensorExpectation(e.name(n), e.shape(g, n), e.kind, e.required(spec, n), e.reason(spec))

    def single(group: tuple[Entry, ...]) -> list[TensorExpectation]:
        return [at(e, n) for e in group if e.holds(spec) for n in (range(g.K or 0) if "{k}" in e.pattern else [0])]

    layers = [at(e, i) for i in range(max(spec.geometry.num_layers, 1)) for e in LAYERS if e.holds(spec)]
    return [*single(HEAD), *layers, *single(TAIL)]


def _as_is(canonical: str, spec: DraftSpec) -> str | None:
    return canonical


def _sglang(canonical: str, spec: DraftSpec) -> str | None:
    if spec.attention != "mla" and spec.geometry.num_layers == 1 and canonical.startswith("layers.0."):
        return SINGLE_LAYER_PREFIX + canonical[len("layers.0."):]
    return canonical


def gguf_name(canonical: str, spec: DraftSpec | None = None) -> str | None:
    found = lookup(canonical)
    if found is None:
        return None
    entry, index = found
    return None if entry.gguf is None else entry.gguf.format(i=index)


OUTPUT_NAMES: dict[str, Callable[[str, DraftSpec], str | None]] = {
    "vllm": _as_is, "speculators": _as_is, "trtllm": _as_is, "sglang": _sglang, "gguf": gguf_name,
}
"""Each output dialect's name for a canonical tensor (None: the dialect has no place for it)."""


def output_name(canonical: str, dialect: str, spec: DraftSpec) -> str | None:
    return OUTPUT_NAMES[dialect](canonical, spec)
