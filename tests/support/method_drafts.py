"""Tiny real checkpoints of the non-EAGLE-3 methods eaglekit recognises, written with the producers' own config keys
and tensor names (each builder names the files they were read from); tensor values are random BF16 bytes.

Each builder returns (config, tensors) and `write_method_draft` writes them as a checkpoint folder.
"""

from __future__ import annotations

import json
import os

import numpy as np

from tests.support.factory import encode, write_safetensors

H, I, HEADS, KV, HEAD_DIM, V = 64, 96, 4, 2, 16, 256  # noqa: E741
TARGET_LAYERS = 12
DFLASH_IDS = [1, 4, 7, 10]  # dflash_config.target_layer_ids: output of layer i (vLLM adds 1)
SPECULATORS_IDS = [2, 5, 8, 11]  # aux_hidden_state_layer_ids: hidden_states indices (vLLM maps them to i - 1)
MASK_TOKEN = 250
SPECULATORS_CONFIG = {
    "algorithm": None, "default_proposal_method": "greedy",
    "proposal_methods": [{"proposal_type": "greedy", "speculative_tokens": 7}],
    "verifier": {"name_or_path": "Qwen/Qwen3-8B", "architectures": ["Qwen3ForCausalLM"]},
}


def _qwen3_layer(prefix: str) -> dict[str, tuple[int, ...]]:
    """One Qwen3 decoder layer (the DFlash backbone's, z-lab/dflash model/dflash.py)."""
    q, kv = HEADS * HEAD_DIM, KV * HEAD_DIM
    return {
        f"{prefix}input_layernorm.weight": (H,), f"{prefix}post_attention_layernorm.weight": (H,),
        f"{prefix}self_attn.q_proj.weight": (q, H), f"{prefix}self_attn.k_proj.weight": (kv, H),
        f"{prefix}self_attn.v_proj.weight": (kv, H), f"{prefix}self_attn.o_proj.weight": (H, q),
        f"{prefix}self_attn.q_norm.weight": (HEAD_DIM,), f"{prefix}self_attn.k_norm.weight": (HEAD_DIM,),
        f"{prefix}mlp.gate_proj.weight": (I, H), f"{prefix}mlp.up_proj.weight": (I, H),
        f"{prefix}mlp.down_proj.weight": (H, I),
    }


def _qwen3_config(layers: int) -> dict:
    return {"hidden_size": H, "intermediate_size": I, "num_attention_heads": HEADS, "num_key_value_heads": KV,
            "head_dim": HEAD_DIM, "hidden_act": "silu", "rms_norm_eps": 1e-6, "vocab_size": V,
            "max_position_embeddings": 4096, "num_hidden_layers": layers, "rope_theta": 1000000,
            "attention_bias": False, "tie_word_embeddings": False, "dtype": "bfloat16"}


def _backbone(layers: int, k: int) -> dict[str, tuple[int, ...]]:
    """fc over k target states, hidden_norm, the decoder layers, norm: DFlashDraftModel's tensors."""
    shapes = {"fc.weight": (H, k * H), "hidden_norm.weight": (H,), "norm.weight": (H,)}
    for i in range(layers):
        shapes.update(_qwen3_layer(f"layers.{i}."))
    return shapes


def dflash_flat() -> tuple[dict, dict]:
    """z-lab DFlash: the z-lab/Qwen3-4B-DFlash-b16 config keys (block_size, dflash_config, num_target_layers)."""
    cfg = {"architectures": ["DFlashDraftModel"], "auto_map": {"AutoModel": "dflash.DFlashDraftModel"},
           "model_type": "qwen3", "block_size": 16, "num_target_layers": TARGET_LAYERS,
           "dflash_config": {"mask_token_id": MASK_TOKEN, "target_layer_ids": DFLASH_IDS},
           "layer_types": ["full_attention"] * 2, **_qwen3_config(2)}
    return cfg, _backbone(2, len(DFLASH_IDS))


def _speculators(kind: str, architecture: str, layers: int, **keys) -> dict:
    """A speculators 0.9 config: speculators/models/<kind>/config.py over SpeculatorModelConfig."""
    return {"architectures": [architecture], "speculators_model_type": kind, "speculators_version": "0.9.0",
            "speculators_config": {**SPECULATORS_CONFIG, "algorithm": kind},
            "transformer_layer_config": {"model_type": "qwen3", **_qwen3_config(layers)},
            "draft_vocab_size": V, "target_hidden_size": None, **keys}


def _block_keys(block: int) -> dict:
    return {"block_size": block, "aux_hidden_state_layer_ids": SPECULATORS_IDS, "mask_token_id": MASK_TOKEN}


def dflash_speculators() -> tuple[dict, dict]:
    """speculators `dflash` (models/dflash/config.py, core.py: fc, hidden_norm, layers, norm; lm_head/d2t/t2d when
    the draft vocabulary is pruned)."""
    cfg = _speculators("dflash", "DFlashSpeculator", 2, sliding_window_non_causal=False, sample_from_anchor=False,
                       **_block_keys(8))
    return cfg, _backbone(2, len(SPECULATORS_IDS))


def _dflash2_tensors(layers: int, k: int, rank: int, kernel: int, group: int) -> dict[str, tuple[int, ...]]:
    """z-lab/dflash tests/fixtures/dflash2-safetensors-header.json names, at this size."""
    shapes = _backbone(layers, k)
    shapes.update({"candidate_selector.hidden_projection.weight": (rank, H),
                   "candidate_selector.predecessor_codebook": (V, rank),
                   "candidate_selector.successor_codebook": (V, rank)})
    for i in range(layers):
        for conv in ("attention_conv", "mlp_conv"):
            shapes[f"layers.{i}.{conv}.base_kernel"] = (2, kernel, H)
            shapes[f"layers.{i}.{conv}.kernel_projection.weight"] = (H // group * kernel, H)
    return shapes


def dflash2_flat() -> tuple[dict, dict]:
    """z-lab DFlash2: tests/fixtures/dflash2-config.json (block and selector keys inside dflash_config)."""
    cfg = {"architectures": ["DFlash2DraftModel"], "model_type": "qwen3", "is_causal": False,
           "num_target_layers": TARGET_LAYERS, "sliding_window": 2048, "use_sliding_window": True,
           "layer_types": ["sliding_attention"] * 2,
           "dflash_config": {"block_size": 16, "conv_group_size": 16, "conv_kernel_size": 2,
                             "mask_token_id": MASK_TOKEN, "selector_rank": 8, "selector_top_k": 4,
                             "target_layer_ids": DFLASH_IDS},
           **_qwen3_config(2)}
    return cfg, _dflash2_tensors(2, len(DFLASH_IDS), 8, 2, 16)


def dflash2_speculators() -> tuple[dict, dict]:
    """speculators `dflash2` (models/dflash2/config.py: conv and selector keys at the top level)."""
    cfg = _speculators("dflash2", "DFlash2DraftModel", 2, conv_kernel_size=2, conv_group_size=16, selector_rank=8,
                       selector_top_k=4, sliding_window_non_causal=True, **_block_keys(16))
    return cfg, _dflash2_tensors(2, len(SPECULATORS_IDS), 8, 2, 16)


def _dspark_heads(rank: int) -> dict[str, tuple[int, ...]]:
    """speculators models/dspark/model_definitions.py: MarkovHead (markov_w1 embedding, markov_w2 linear) and the
    confidence head's proj; vLLM 0.33.0 qwen3_dspark.py loads the same names."""
    return {"markov_head.markov_w1.weight": (V, rank), "markov_head.markov_w2.weight": (V, rank),
            "confidence_head.proj.weight": (1, H + rank), "confidence_head.proj.bias": (1,)}


def dspark_speculators() -> tuple[dict, dict]:
    """speculators `dspark` (models/dspark/config.py)."""
    cfg = _speculators("dspark", "DSparkSpeculator", 2, markov_rank=8, markov_head_type="vanilla",
                       enable_confidence_head=True, confidence_head_with_markov=True, sample_from_anchor=True,
                       **_block_keys(7))
    return cfg, {**_backbone(2, len(SPECULATORS_IDS)), **_dspark_heads(8)}


def dspark_flat() -> tuple[dict, dict]:
    """The flat form vLLM 0.33.0 loads as Qwen3DSparkModel: what algos.update_dspark writes (target_layer_ids =
    aux - 1, mask_token_id, markov_rank, block_size) and qwen3_dspark.py reads."""
    cfg = {"architectures": ["Qwen3DSparkModel"], "model_type": "qwen3", "target_layer_ids": DFLASH_IDS,
           "mask_token_id": MASK_TOKEN, "markov_rank": 8, "block_size": 7, "enable_confidence_head": True,
           "confidence_head_with_markov": True, "dspark_bonus_anchor": False, **_qwen3_config(2)}
    return cfg, {**_backbone(2, len(DFLASH_IDS)), **_dspark_heads(8)}


def xpress_flat() -> tuple[dict, dict]:
    """vLLM 0.33.0 qwen3_xpress.py: Qwen3XPressModel with xpress_* keys and xpress_head.* tensors (mix.L raw)."""
    cfg = {"architectures": ["Qwen3XPressModel"], "model_type": "qwen3", "xpress_block_size": 16, "xpress_rank": 8,
           "xpress_mlp_hidden": 16, "xpress_topc": 64, "block_size": 16,
           "dflash_config": {"mask_token_id": MASK_TOKEN, "target_layer_ids": DFLASH_IDS}, **_qwen3_config(2)}
    shapes = _backbone(2, len(DFLASH_IDS))
    shapes.update({"xpress_head.mix.L": (8, 16, 16), "xpress_head.token_embed.weight": (V, 8),
                   "xpress_head.readout.weight": (V, 8)})
    return cfg, shapes


def xpress_speculators() -> tuple[dict, dict]:
    """speculators `xpress` (models/xpress/config.py, model_definitions.py: the refiner head's tensors)."""
    cfg = _speculators("xpress", "XPressSpeculator", 2, xpress_rank=8, xpress_mlp_ratio=2, num_jacobi_passes=6,
                       **_block_keys(16))
    shapes = _backbone(2, len(SPECULATORS_IDS))
    shapes.update({"refiner_head.token_embed.weight": (V, 8), "refiner_head.down_h.weight": (8, H),
                   "refiner_head.down_g.weight": (8, H), "refiner_head.in_proj.weight": (8, 24),
                   "refiner_head.mix_l": (8, 16, 16), "refiner_head.readout.weight": (V, 8)})
    return cfg, shapes


def _causal_lm(layers: int, prefix: str = "model.") -> dict[str, tuple[int, ...]]:
    shapes = {f"{prefix}embed_tokens.weight": (V, H), f"{prefix}norm.weight": (H,), "lm_head.weight": (V, H)}
    for i in range(layers):
        shapes.update(_qwen3_layer(f"{prefix}layers.{i}."))
    return shapes


def mtp_deepseek_target() -> tuple[dict, dict]:
    """A DeepSeek-V3-style target with its MTP layer L (DeepSeek-V3 README_WEIGHTS.md: num_nextn_predict_layers,
    model.layers.{L}.enorm/hnorm/eh_proj/shared_head; vLLM 0.33.0 deepseek_mtp.py loads those names)."""
    layers = 2
    cfg = {"architectures": ["DeepseekV3ForCausalLM"], "model_type": "deepseek_v3", "num_nextn_predict_layers": 1,
           **_qwen3_config(layers)}
    shapes = _causal_lm(layers)
    shapes.update(_qwen3_layer(f"model.layers.{layers}."))
    shapes.update({f"model.layers.{layers}.enorm.weight": (H,), f"model.layers.{layers}.hnorm.weight": (H,),
                   f"model.layers.{layers}.eh_proj.weight": (H, 2 * H),
                   f"model.layers.{layers}.shared_head.norm.weight": (H,)})
    return cfg, shapes


def mtp_qwen3_next_target() -> tuple[dict, dict]:
    """A Qwen3-Next-style target: mtp.* beside the model (vLLM 0.33.0 qwen3_next_mtp.py: mtp.fc,
    mtp.pre_fc_norm_embedding, mtp.pre_fc_norm_hidden, mtp.layers.{i}, mtp.norm)."""
    cfg = {"architectures": ["Qwen3NextForCausalLM"], "model_type": "qwen3_next", "num_nextn_predict_layers": 1,
           **_qwen3_config(2)}
    shapes = _causal_lm(2)
    shapes.update({"mtp.fc.weight": (H, 2 * H), "mtp.pre_fc_norm_embedding.weight": (H,),
                   "mtp.pre_fc_norm_hidden.weight": (H,), "mtp.norm.weight": (H,), **_qwen3_layer("mtp.layers.0.")})
    return cfg, shapes


def mtp_speculators() -> tuple[dict, dict]:
    """speculators `mtp` (models/mtp/config.py, model_definitions.py: mtp_layers.0 hidden_layernorm,
    token_layernorm, input_proj, final_layernorm and the decoder layer; embed_tokens, lm_head)."""
    cfg = _speculators("mtp", "MTPDraftModel", 1, num_nextn_predict_layers=1)
    shapes = {"embed_tokens.weight": (V, H), "lm_head.weight": (V, H), "mtp_layers.0.hidden_layernorm.weight": (H,),
              "mtp_layers.0.token_layernorm.weight": (H,), "mtp_layers.0.input_proj.weight": (H, 2 * H),
              "mtp_layers.0.final_layernorm.weight": (H,), **_qwen3_layer("mtp_layers.0.")}
    return cfg, shapes


def pard() -> tuple[dict, dict]:
    """AMD PARD: the base model's config plus pard_token and spd_type (AMD-AGI/PARD pard/pard_train.py)."""
    cfg = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "pard_token": MASK_TOKEN, "spd_type": "pard",
           **_qwen3_config(2)}
    shapes = {k: v for k, v in _causal_lm(2).items() if "_norm." not in k}
    return cfg, shapes


BUILDERS = {
    "dflash-flat": dflash_flat, "dflash-speculators": dflash_speculators, "dflash2-flat": dflash2_flat,
    "dflash2-speculators": dflash2_speculators, "dspark-flat": dspark_flat, "dspark-speculators": dspark_speculators,
    "xpress-flat": xpress_flat, "xpress-speculators": xpress_speculators, "mtp-deepseek": mtp_deepseek_target,
    "mtp-qwen3-next": mtp_qwen3_next_target, "mtp-speculators": mtp_speculators, "pard": pard,
}


def write_method_draft(path: str, kind: str, seed: int = 0) -> str:
    """The checkpoint of `kind` (a BUILDERS key) at `path`: config.json and one model.safetensors of real bytes."""
    cfg, shapes = BUILDERS[kind]()
    rng = np.random.default_rng(seed)
    os.makedirs(path, exist_ok=True)
    with open(os.path.join(path, "config.json"), "w") as fh:
        json.dump(cfg, fh, indent=2)
    tensors = {name: ("BF16", shape, encode(rng.normal(0, 0.02, shape).astype(np.float32), "BF16"))
               for name, shape in shapes.items()}
    write_safetensors(os.path.join(path, "model.safetensors"), tensors)
    return path
