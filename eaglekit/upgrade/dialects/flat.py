"""The flat Hugging Face config both vLLM and SGLang read: complete geometry from the canonical description.

Source keys the dialect does not rewrite are carried over as written (hidden_act, rope_parameters, sliding-window
keys, quantization_config, token ids); the engines read several of them, so the rules judge them before any upgrade
(a hidden_act vLLM's MLP does not build is EK328). Keys that belong to a producer's layout, or that the dialect
rewrites, are not carried.
"""

from __future__ import annotations

from typing import Any

from eaglekit.io.dtypes import FLOAT_NAMES, torch_name
from eaglekit.spec import DraftSpec
from eaglekit.upgrade.decide import Decisions
from eaglekit.upgrade.vocab import VocabPlan

# Keys that name a producer's layout (and would make the output read as that producer again), or that the
# dialects write themselves.
NOT_CARRIED = frozenset({
    "speculators_model_type", "speculators_version", "speculators_config", "transformer_layer_config", "auto_map",
    "_torchspec_version", "target_model_type", "modal_type", "use_aux_norm", "embed_requires_grad", "eaglekit",
    "_name_or_path", "index_topk", "num_aux_layers", "eagle_config", "eagle_aux_hidden_state_layer_ids",
    "num_aux_hidden_states", "fc_norm", "norm_output", "norm_before_fc", "norm_before_residual",
    "draft_vocab_size", "vocab_size", "target_hidden_size", "architectures", "model_type", "tie_word_embeddings",
    "num_hidden_layers", "hidden_size", "intermediate_size", "num_attention_heads", "num_key_value_heads",
    "head_dim", "rms_norm_eps", "rope_theta", "rope_scaling", "max_position_embeddings",
})
MLA_MODEL_TYPES = ("kimi_k2", "deepseek_v3", "deepseek_v2")


def source_layer_config(spec: DraftSpec) -> dict[str, Any]:
    """The source's decoder-level keys: top level, or transformer_layer_config (plus top level) for speculators."""
    cfg = dict(spec.config)
    layer = cfg.get("transformer_layer_config")
    if spec.config_layout == "speculators" and isinstance(layer, dict):
        cfg = {**{k: v for k, v in cfg.items() if k != "transformer_layer_config"}, **layer}
    return cfg


def carried_keys(spec: DraftSpec) -> dict[str, Any]:
    """The source's keys the output keeps: not the dialect's own, nor the key the producer wrote its aux ids under
    (the output writes them itself, in vLLM's convention)."""
    own_ids = spec.facts.aux_ids_key
    return {k: v for k, v in source_layer_config(spec).items() if k not in NOT_CARRIED and k != own_ids}


def model_type(spec: DraftSpec) -> str:
    if spec.attention == "mla":
        written = source_layer_config(spec).get("model_type")
        return written if written in MLA_MODEL_TYPES else "deepseek_v3"
    return "qwen3" if spec.attention == "qwen3" else "llama"


def geometry_keys(spec: DraftSpec, d: Decisions, vocab: VocabPlan) -> dict[str, Any]:
    """§10 items 2 and 3: the complete layer geometry and the vocabulary sizes, written explicitly."""
    g = spec.geometry
    out: dict[str, Any] = {
        "hidden_size": g.hidden_size,
        "intermediate_size": g.intermediate_size,
        "num_hidden_layers": g.num_layers,
        "num_attention_heads": g.num_heads,
        "num_key_value_heads": g.num_kv_heads,
    }
    if g.mla is None:
        out["head_dim"] = g.head_dim
    else:
        out.update(q_lora_rank=g.mla.q_lora_rank, kv_lora_rank=g.mla.kv_lora_rank,
                   qk_nope_head_dim=g.mla.qk_nope_head_dim, qk_rope_head_dim=g.mla.qk_rope_head_dim,
                   v_head_dim=g.mla.v_head_dim)
    out["rms_norm_eps"] = g.rms_norm_eps
    out["rope_theta"] = g.rope_theta
    if g.rope_scaling is not None:
        out["rope_scaling"] = g.rope_scaling
    max_pos = g.max_position_embeddings or (d.target.max_position_embeddings if d.target else None)
    if max_pos is not None:
        out["max_position_embeddings"] = max_pos
    out.update(vocab_size=vocab.vocab_size, draft_vocab_size=vocab.draft_vocab_size,
               target_hidden_size=d.target_hidden, tie_word_embeddings=False)
    return out


def dtype_keys(spec: DraftSpec, d: Decisions) -> dict[str, Any]:
    """torch_dtype (and transformers 5's dtype, if the source used it) naming the dtype the weights really have."""
    cfg = source_layer_config(spec)
    keys = [k for k in ("torch_dtype", "dtype") if k in cfg] or ["torch_dtype"]
    dtype = d.cast_to or spec.dtype
    name = torch_name(dtype) if dtype in FLOAT_NAMES else None
    if name is None:  # quantised weights: keep what the producer wrote
        return {k: cfg[k] for k in keys if k in cfg}
    return {k: name for k in keys}


def flag_keys(d: Decisions) -> dict[str, Any]:
    """§10 items 5 and 6: norm_before_residual explicit, the 3.1 flags top-level, norm_before_fc only when used."""
    out: dict[str, Any] = {"norm_before_residual": d.norm_before_residual, "fc_norm": d.fc_norm,
                           "norm_output": d.norm_output}
    if d.norm_before_fc:
        out["norm_before_fc"] = True
    return out


def flat_config(spec: DraftSpec, d: Decisions, vocab: VocabPlan, architecture: str) -> dict[str, Any]:
    cfg: dict[str, Any] = {"architectures": [architecture], "model_type": model_type(spec)}
    cfg.update(carried_keys(spec))
    cfg.update(geometry_keys(spec, d, vocab))
    cfg.update(dtype_keys(spec, d))
    cfg["num_aux_hidden_states"] = d.num_aux
    cfg.update(flag_keys(d))
    return cfg
