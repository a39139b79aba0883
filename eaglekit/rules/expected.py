"""The exact tensor set a draft's geometry and flags call for (reference §3.1, §3.4, §10 items 8-12).

vLLM's eagle3 loaders never report a missing tensor (P5), so this set is what every check compares against;
`upgrade` uses the same function to plan its output.
"""

from __future__ import annotations

from dataclasses import dataclass

from eaglekit.spec import DraftSpec

ROTARY_BUFFERS = ("rotary_emb.inv_freq", "rotary_emb.cos_cached", "rotary_emb.sin_cached")
WEIGHT_COMPANIONS = ("weight_scale", "weight_scale_2", "input_scale", "weight_zero_point", "input_zero_point",
                     "weight_g_idx")
"""Quantisation tensors that belong to the weight `<module>.weight` of the same module (ModelOpt,
compressed-tensors)."""
CACHE_SCALES = ("k_scale", "v_scale", "q_scale", "prob_scale")
"""Per-tensor attention-cache scales of `layers.{i}.self_attn`."""
ROW_INDEXED = ("weight_scale", "weight_zero_point")  # may hold one entry (or block) per weight row
COLUMN_INDEXED = ("weight_g_idx",)  # one entry per input column: a row transform leaves it as it is
ROW_TRANSFORMED = ("lm_head.weight",)  # the weights whose rows upgrade may move (sorting a frequency-ordered d2t)
QUANTISED_WEIGHT_DTYPES = ("I8", "U8", "F4")  # int8 and packed 4-bit weights, beside their scales
SCALED_WEIGHT_DTYPES = QUANTISED_WEIGHT_DTYPES + ("F8_E4M3", "F8_E5M2")  # stored values that mean nothing unscaled
SCALED_METHODS = ("compressed-tensors", "compressed_tensors", "modelopt", "modelopt_fp4", "modelopt_mxfp8",
                  "modelopt_mixed")
"""quant_methods whose linear layers each create a `weight_scale` parameter (besides every method naming fp8)."""
SCALE_DTYPES = ("BF16", "F16", "F32", "F64", "F8_E4M3", "F8_E5M2", "F8_E8M0")
INDEX_DTYPES = ("I8", "U8", "I32", "U32", "I64")  # zero points and group indices


@dataclass(frozen=True)
class TensorExpectation:
    """One tensor the draft should (or may) hold. A None dimension is not fixed by the config."""

    name: str
    shape: tuple[int | None, ...]
    kind: str  # "float" | "int64" | "bool"
    required: bool
    why: str


def _mul(*dims: int | None) -> int | None:
    out = 1
    for d in dims:
        if not d:
            return None
        out *= d
    return out


def _add(*dims: int | None) -> int | None:
    return None if any(not d for d in dims) else sum(dims)  # type: ignore[arg-type]


def tensor_expectations(spec: DraftSpec) -> list[TensorExpectation]:
    """Every tensor the geometry and flags call for, required or optional, with its expected shape."""
    g = spec.geometry
    H = g.hidden_size
    T = g.target_hidden_size or H
    K = spec.num_aux_hidden_states
    I = g.intermediate_size or None
    nH, nKV, hd = g.num_heads or None, g.num_kv_heads or None, g.head_dim or None
    V, Vd = spec.vocab.vocab_size, spec.vocab.draft_vocab_size
    out: list[TensorExpectation] = []

    def need(name, shape, why, kind="float", required=True):
        out.append(TensorExpectation(name, tuple(shape), kind, required, why))

    ec = spec.config.get("eagle_config") if isinstance(spec.config.get("eagle_config"), dict) else {}
    no_fc = spec.attention == "llama" and ec.get("use_aux_hidden_state", True) is False
    if not no_fc:
        need("fc.weight", (H, _mul(K, T)), "projects the K·T concatenation of target states")
    if spec.flags.fc_norm:
        for k in range(K or 0):
            need(f"fc_norm.{k}.weight", (T,), "fc_norm: true (one RMSNorm per aux state)")
    if spec.flags.norm_before_fc:
        need("input_norm.weight", (_mul(K, T),), "norm_before_fc: true")

    for i in range(max(g.num_layers, 1)):
        p = f"layers.{i}."
        fan = 2 * H if i == 0 else H
        if spec.attention == "mla" and g.mla is not None:
            m = g.mla
            qk = _add(m.qk_nope_head_dim, m.qk_rope_head_dim)
            if m.q_lora_rank:
                need(p + "self_attn.q_a_proj.weight", (m.q_lora_rank, fan), "MLA with q_lora_rank")
                need(p + "self_attn.q_a_layernorm.weight", (m.q_lora_rank,), "MLA with q_lora_rank")
                need(p + "self_attn.q_b_proj.weight", (_mul(nH, qk), m.q_lora_rank), "MLA with q_lora_rank")
            else:
                need(p + "self_attn.q_proj.weight", (_mul(nH, qk), fan), "MLA without q_lora_rank")
            need(p + "self_attn.kv_a_proj_with_mqa.weight", (_add(m.kv_lora_rank, m.qk_rope_head_dim), fan), "MLA")
            need(p + "self_attn.kv_a_layernorm.weight", (m.kv_lora_rank or None,), "MLA")
            need(p + "self_attn.kv_b_proj.weight", (_mul(nH, _add(m.qk_nope_head_dim, m.v_head_dim)),
                                                    m.kv_lora_rank or None), "MLA")
            need(p + "self_attn.o_proj.weight", (H, _mul(nH, m.v_head_dim)), "MLA")
        else:
            need(p + "self_attn.q_proj.weight", (_mul(nH, hd), fan), "attention")
            need(p + "self_attn.k_proj.weight", (_mul(nKV, hd), fan), "attention")
            need(p + "self_attn.v_proj.weight", (_mul(nKV, hd), fan), "attention")
            need(p + "self_attn.o_proj.weight", (H, _mul(nH, hd)), "attention")
            if g.attention_bias:
                need(p + "self_attn.q_proj.bias", (_mul(nH, hd),), "attention_bias: true")
                need(p + "self_attn.k_proj.bias", (_mul(nKV, hd),), "attention_bias: true")
                need(p + "self_attn.v_proj.bias", (_mul(nKV, hd),), "attention_bias: true")
            if spec.attention == "qwen3":
                need(p + "self_attn.q_norm.weight", (hd,), "Qwen3 per-head norm")
                need(p + "self_attn.k_norm.weight", (hd,), "Qwen3 per-head norm")
        need(p + "mlp.gate_proj.weight", (I, H), "MLP")
        need(p + "mlp.up_proj.weight", (I, H), "MLP")
        need(p + "mlp.down_proj.weight", (H, I), "MLP")
        need(p + "input_layernorm.weight", (H,), "layer input norm (the token embedding's in layer 0)")
        need(p + "hidden_norm.weight", (H,), "layer 0 normalises the incoming hidden state",
             required=i == 0)
        need(p + "post_attention_layernorm.weight", (H,), "post-attention norm")
    need("norm.weight", (H,), "final norm before lm_head")

    vocab_known = V is not None
    need("lm_head.weight", (Vd, H), "draft head: the target's can stand in only when Vd == V",
         required=vocab_known and Vd != V)
    need("embed_tokens.weight", (V, H), "the target's embedding is shared only when T == H", required=T != H)
    if not vocab_known or Vd < V:
        need("d2t", (Vd,), "draft -> target id offsets, needed when Vd < V", kind="int64", required=vocab_known)
        need("t2d", (V,), "target -> draft membership mask, optional", kind="bool", required=False)
    return out


def expected_tensors(spec: DraftSpec) -> dict[str, tuple[int | None, ...]]:
    """The vLLM-ready name -> shape set for this draft: every required tensor plus the optional ones it holds."""
    return {e.name: e.shape for e in tensor_expectations(spec) if e.required or e.name in spec.tensors}


def tolerated_extra(spec: DraftSpec, name: str) -> bool:
    """Names vLLM's loader drops by itself, and the quantisation tensors of a draft that declares its quantisation
    (their own problems are EK158's)."""
    return name.endswith(ROTARY_BUFFERS) or quant_companion(spec, name) is not None


@dataclass(frozen=True)
class QuantCompanion:
    """A quantisation tensor beside a weight: how a transform of that weight's rows must treat it."""

    name: str
    weight: str | None  # the weight it belongs to (None: an attention-cache scale, or none found)
    follows_rows: bool  # one entry (or block row) per weight row: it moves with them; otherwise copied as is
    problem: str | None  # why no conversion can carry it faithfully (None: it can)


def _companion_dtypes(suffix: str) -> tuple[str, ...]:
    if suffix in COLUMN_INDEXED:
        return INDEX_DTYPES
    return INDEX_DTYPES + SCALE_DTYPES if "zero_point" in suffix else SCALE_DTYPES


def quant_companion(spec: DraftSpec, name: str) -> QuantCompanion | None:
    """The quantisation tensor `name` is, in a draft with a quantization_config; None for any other tensor.
    Each is either carried completely by upgrade, or has a `problem` that validate reports and upgrade refuses."""
    module, _, suffix = name.rpartition(".")
    if not isinstance(spec.config.get("quantization_config"), dict) or suffix not in WEIGHT_COMPANIONS + CACHE_SCALES:
        return None
    ref = spec.tensors[name]
    shape = list(ref.shape)
    if suffix in CACHE_SCALES:
        fine = module.endswith(".self_attn") and ref.numel == 1 and ref.dtype in SCALE_DTYPES
        return QuantCompanion(name, None, False, None if fine else
                              f"{name} {ref.dtype} {shape} is not one floating-point scale of an attention module")
    weight = f"{module}.weight"
    base = spec.tensors.get(weight)
    if base is None:
        return QuantCompanion(name, None, False, f"{name} belongs to no weight: there is no {weight}")
    if ref.dtype not in _companion_dtypes(suffix):
        return QuantCompanion(name, weight, False, f"{name} is {ref.dtype}, not a {suffix} dtype "
                                                   f"({', '.join(_companion_dtypes(suffix))})")
    if suffix in ROW_INDEXED and ref.numel > 1 and base.shape and shape and shape[0] == base.shape[0]:
        return QuantCompanion(name, weight, True, None)
    row_free = ref.numel == 1 or (suffix in COLUMN_INDEXED and len(base.shape) == 2 and shape == [base.shape[1]])
    if row_free or weight not in ROW_TRANSFORMED:
        return QuantCompanion(name, weight, False, None)  # one value, per column, or of a weight only ever copied
    return QuantCompanion(name, weight, False, f"{name} {shape} is neither one value nor one entry per row of {weight} "
                                               f"{list(base.shape)}, so it cannot follow those rows when the "
                                               "vocabulary map is sorted")


def needs_weight_scale(spec: DraftSpec) -> bool:
    """Whether the draft's quant_method scales each quantised weight by its own `weight_scale`. vLLM's fp8 method
    (any quant_method naming fp8 reads as an fp8-serialised checkpoint) registers `weight_scale` for every linear
    layer, initialised to float32's lowest value until the checkpoint's tensor is loaded; compressed-tensors and
    ModelOpt schemes register one likewise."""
    qcfg = spec.config.get("quantization_config")
    method = qcfg.get("quant_method") if isinstance(qcfg, dict) else None
    return isinstance(method, str) and ("fp8" in method.lower() or method.lower() in SCALED_METHODS)


def unscaled_weights(spec: DraftSpec) -> list[str]:
    """Quantised weights (fp8, int8, packed 4-bit) with no `weight_scale` beside them, in a draft whose
    quant_method needs one: the engine multiplies by a scale nothing loaded."""
    if not needs_weight_scale(spec):
        return []
    return [name for name, ref in sorted(spec.tensors.items())
            if name.endswith(".weight") and ref.dtype in SCALED_WEIGHT_DTYPES
            and f"{name.removesuffix('.weight')}.weight_scale" not in spec.tensors]


def quant_companions(spec: DraftSpec) -> list[QuantCompanion]:
    return [c for name in sorted(spec.tensors) if (c := quant_companion(spec, name)) is not None]


def shape_matches(actual: tuple[int, ...], expected: tuple[int | None, ...]) -> bool:
    return len(actual) == len(expected) and all(e is None or a == e for a, e in zip(actual, expected))


def format_shape(shape: tuple[int | None, ...]) -> str:
    return "[" + ", ".join("?" if d is None else str(d) for d in shape) + "]"
