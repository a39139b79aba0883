"""Write real tiny draft checkpoints in every published layout, from one recipe.

Configs follow the published ones for each producer (reference §8); values are random but deterministic, and
norm weights are near 1 (not exactly 1) so that healthy fixtures look trained.
"""

from __future__ import annotations

import json
import os
import struct
from dataclasses import dataclass, field, replace

import numpy as np

LAYOUTS = (
    "eagle", "sglang", "specforge", "specforge-hf", "speculators", "speculators-train", "modelopt",
    "modelopt-megatron", "modelopt-vllm", "torchspec", "torchspec-vllm", "angelslim", "kimi", "vllm",
)


@dataclass
class Recipe:
    hidden: int = 64  # H
    target_hidden: int | None = None  # T (None: = H)
    intermediate: int = 96
    heads: int = 4
    kv_heads: int = 2
    head_dim: int = 16
    layers: int = 1
    k: int = 3
    vocab: int = 256  # V
    draft_vocab: int | None = 128  # Vd (None: = V)
    target_layers: int = 12  # L of the target these ids refer to
    aux_ids: tuple[int, ...] = (2, 6, 9)  # vLLM convention (input of layer i)
    attention: str = "llama"  # llama | qwen3 | mla
    fc_norm: bool = False
    norm_output: bool = False
    norm_before_fc: bool = False
    norm_before_residual: bool | None = False
    embed: bool = False
    lm_head: bool = True
    dtype: str = "BF16"
    frequency_ordered: bool = False
    seed: int = 0
    extra_config: dict = field(default_factory=dict)
    # MLA dims
    q_lora_rank: int | None = 32
    kv_lora_rank: int = 24
    qk_nope_head_dim: int = 8
    qk_rope_head_dim: int = 8
    v_head_dim: int = 12

    @property
    def T(self) -> int:
        return self.target_hidden or self.hidden

    @property
    def Vd(self) -> int:
        return self.draft_vocab or self.vocab


# ---------------------------------------------------------------- safetensors bytes


def to_bf16_bits(x: np.ndarray) -> np.ndarray:
    """float32 -> bfloat16 bit patterns, round to nearest even."""
    bits = np.ascontiguousarray(x, dtype=np.float32).view(np.uint32)
    rounded = bits + 0x7FFF + ((bits >> 16) & 1)
    return (rounded >> 16).astype(np.uint16)


def encode(arr: np.ndarray, dtype: str) -> bytes:
    if dtype == "BF16":
        return to_bf16_bits(arr).tobytes()
    np_dtype = {"F16": "<f2", "F32": "<f4", "I64": "<i8", "BOOL": "?", "I32": "<i4"}[dtype]
    return np.ascontiguousarray(arr, dtype=np_dtype).tobytes()


def write_safetensors(path: str, tensors: dict[str, tuple[str, tuple[int, ...], bytes]],
                      metadata: dict | None = None) -> None:
    header: dict = {}
    if metadata:
        header["__metadata__"] = metadata
    offset = 0
    for name, (dtype, shape, data) in tensors.items():
        header[name] = {"dtype": dtype, "shape": list(shape), "data_offsets": [offset, offset + len(data)]}
        offset += len(data)
    raw = json.dumps(header, separators=(",", ":")).encode()
    raw += b" " * (-len(raw) % 8)
    with open(path, "wb") as fh:
        fh.write(struct.pack("<Q", len(raw)))
        fh.write(raw)
        for _, _, data in tensors.values():
            fh.write(data)


# ---------------------------------------------------------------- canonical tensors


def canonical_tensors(r: Recipe) -> dict[str, np.ndarray]:
    """Canonical-name float32/int64/bool arrays for a recipe (the draft's true contents)."""
    rng = np.random.default_rng(r.seed)
    H, T, I, nH, nKV, hd = r.hidden, r.T, r.intermediate, r.heads, r.kv_heads, r.head_dim

    def w(*shape):
        return (rng.standard_normal(shape) * 0.05).astype(np.float32)

    def norm(n):
        return (1.0 + rng.standard_normal(n) * 0.05).astype(np.float32)

    t: dict[str, np.ndarray] = {"fc.weight": w(H, r.k * T)}
    if r.fc_norm:
        for i in range(r.k):
            t[f"fc_norm.{i}.weight"] = norm(T)
    if r.norm_before_fc:
        t["input_norm.weight"] = norm(r.k * T)
    for layer in range(r.layers):
        p = f"layers.{layer}."
        fan_in = 2 * H if layer == 0 else H
        if r.attention == "mla":
            qk_head = r.qk_nope_head_dim + r.qk_rope_head_dim
            if r.q_lora_rank:
                t[p + "self_attn.q_a_proj.weight"] = w(r.q_lora_rank, fan_in)
                t[p + "self_attn.q_a_layernorm.weight"] = norm(r.q_lora_rank)
                t[p + "self_attn.q_b_proj.weight"] = w(nH * qk_head, r.q_lora_rank)
            else:
                t[p + "self_attn.q_proj.weight"] = w(nH * qk_head, fan_in)
            t[p + "self_attn.kv_a_proj_with_mqa.weight"] = w(r.kv_lora_rank + r.qk_rope_head_dim, fan_in)
            t[p + "self_attn.kv_a_layernorm.weight"] = norm(r.kv_lora_rank)
            t[p + "self_attn.kv_b_proj.weight"] = w(nH * (r.qk_nope_head_dim + r.v_head_dim), r.kv_lora_rank)
            t[p + "self_attn.o_proj.weight"] = w(H, nH * r.v_head_dim)
        else:
            t[p + "self_attn.q_proj.weight"] = w(nH * hd, fan_in)
            t[p + "self_attn.k_proj.weight"] = w(nKV * hd, fan_in)
            t[p + "self_attn.v_proj.weight"] = w(nKV * hd, fan_in)
            t[p + "self_attn.o_proj.weight"] = w(H, nH * hd)
            if r.attention == "qwen3":
                t[p + "self_attn.q_norm.weight"] = norm(hd)
                t[p + "self_attn.k_norm.weight"] = norm(hd)
        t[p + "mlp.gate_proj.weight"] = w(I, H)
        t[p + "mlp.up_proj.weight"] = w(I, H)
        t[p + "mlp.down_proj.weight"] = w(H, I)
        t[p + "input_layernorm.weight"] = norm(H)
        if layer == 0:
            t[p + "hidden_norm.weight"] = norm(H)
        t[p + "post_attention_layernorm.weight"] = norm(H)
    t["norm.weight"] = norm(H)
    if r.lm_head:
        t["lm_head.weight"] = w(r.Vd, H)
    if r.embed:
        t["embed_tokens.weight"] = w(r.vocab, H)
    if r.Vd < r.vocab:
        ids = np.sort(rng.choice(r.vocab, size=r.Vd, replace=False))
        if r.frequency_ordered:
            ids = rng.permutation(ids)
        t["d2t"] = (ids - np.arange(r.Vd)).astype(np.int64)
        t2d = np.zeros(r.vocab, dtype=bool)
        t2d[ids] = True
        t["t2d"] = t2d
    return t


def _dtype_of(name: str, r: Recipe) -> str:
    return {"d2t": "I64", "t2d": "BOOL"}.get(name, r.dtype)


# ---------------------------------------------------------------- configs per layout


def _llama_config(r: Recipe, arch: str, *, rope_theta: bool = True) -> dict:
    cfg = {
        "architectures": [arch],
        "model_type": "qwen3" if r.attention == "qwen3" else "llama",
        "hidden_size": r.hidden,
        "intermediate_size": r.intermediate,
        "num_attention_heads": r.heads,
        "num_key_value_heads": r.kv_heads,
        "head_dim": r.head_dim,
        "num_hidden_layers": r.layers,
        "rms_norm_eps": 1e-5,
        "max_position_embeddings": 2048,
        "vocab_size": r.vocab,
        "draft_vocab_size": r.Vd,
        "hidden_act": "silu",
        "tie_word_embeddings": False,
        "torch_dtype": {"BF16": "bfloat16", "F16": "float16", "F32": "float32"}[r.dtype],
    }
    if rope_theta:
        cfg["rope_theta"] = 10000.0
    if r.target_hidden:
        cfg["target_hidden_size"] = r.target_hidden
    if r.fc_norm:
        cfg["fc_norm"] = True
    if r.norm_output:
        cfg["norm_output"] = True
    if r.norm_before_fc:
        cfg["norm_before_fc"] = True
    return cfg


def _output_ids(r: Recipe) -> list[int]:
    return [i - 1 for i in r.aux_ids]


def _mla_config(r: Recipe) -> dict:
    return {
        "architectures": ["Eagle3DeepseekV2ForCausalLM"],
        "model_type": "kimi_k2",
        "hidden_size": r.hidden,
        "intermediate_size": r.intermediate,
        "num_hidden_layers": r.layers,
        "num_attention_heads": r.heads,
        "num_key_value_heads": r.heads,
        "q_lora_rank": r.q_lora_rank,
        "kv_lora_rank": r.kv_lora_rank,
        "qk_nope_head_dim": r.qk_nope_head_dim,
        "qk_rope_head_dim": r.qk_rope_head_dim,
        "v_head_dim": r.v_head_dim,
        "vocab_size": r.vocab,
        "draft_vocab_size": r.Vd,
        "rms_norm_eps": 1e-5,
        "rope_theta": 50000.0,
        "rope_scaling": {"type": "yarn", "factor": 4.0, "beta_fast": 32, "beta_slow": 1, "mscale": 1.0,
                         "mscale_all_dim": 1.0, "original_max_position_embeddings": 512},
        "max_position_embeddings": 2048,
        "tie_word_embeddings": False,
        "torch_dtype": "bfloat16",
        "eagle_config": {"eagle_aux_hidden_state_layer_ids": list(r.aux_ids), "use_aux_hidden_state": True},
        **({"fc_norm": True} if r.fc_norm else {}),
        **({"norm_output": True} if r.norm_output else {}),
    }


def _speculators_config(r: Recipe, arch: str, version: str, ids: list[int] | None) -> dict:
    layer = _llama_config(r, arch)
    for key in ("architectures", "draft_vocab_size", "target_hidden_size", "fc_norm", "norm_output", "norm_before_fc",
                "torch_dtype"):
        layer.pop(key, None)
    layer["architectures"] = ["Qwen3ForCausalLM" if r.attention == "qwen3" else "LlamaForCausalLM"]
    cfg = {
        "architectures": [arch],
        "speculators_model_type": "eagle3",
        "speculators_version": version,
        "speculators_config": {
            "algorithm": "eagle3",
            "default_proposal_method": "greedy",
            "proposal_methods": [{"proposal_type": "greedy", "speculative_tokens": 3}],
            "verifier": {"name_or_path": "org/target-model", "architectures": ["LlamaForCausalLM"]},
        },
        "transformer_layer_config": layer,
        "draft_vocab_size": r.Vd,
        "target_hidden_size": r.target_hidden,
        "eagle_aux_hidden_state_layer_ids": ids,
        "norm_before_fc": r.norm_before_fc,
        "fc_norm": r.fc_norm,
        "norm_output": r.norm_output,
        "torch_dtype": "bfloat16",
    }
    if r.norm_before_residual is not None:
        cfg["norm_before_residual"] = r.norm_before_residual
    return cfg


MASK_TOKEN_ID = 3  # the mask-slot token of the P-EAGLE layouts


def _peagle_files(r: Recipe, t: dict[str, np.ndarray]) -> tuple[dict, dict[str, np.ndarray]]:
    """speculators 0.9.0's P-EAGLE checkpoint (models/peagle/config.py PEagleSpeculatorConfig, models/peagle/core.py
    PEagleDraftModel, as save_pretrained writes it): the eagle3 fields plus mask_token_id and
    embed_requires_grad, architectures the model class, the trained embedding, and mask_hidden [1, 1, K·T]."""
    cfg = _speculators_config(r, "PEagleDraftModel", "0.9.0", list(r.aux_ids))
    cfg["speculators_model_type"] = "peagle"
    cfg["speculators_config"]["algorithm"] = "peagle"
    cfg["speculators_config"]["proposal_methods"][0]["speculative_tokens"] = 8
    cfg.update(mask_token_id=MASK_TOKEN_ID, embed_requires_grad=True, auto_map={"": "config.PEagleSpeculatorConfig"})
    rng = np.random.default_rng(r.seed + 1)
    t = dict(t)
    t.setdefault("embed_tokens.weight", (rng.standard_normal((r.vocab, r.hidden)) * 0.05).astype(np.float32))
    t["mask_hidden"] = (rng.standard_normal((1, 1, r.k * r.T)) * 0.05).astype(np.float32)
    return cfg, t


# DeepSpec Eagle3 (deepseek-ai/DeepSpec afdfa7c9382a3341a3e6f17756dd816da79f132c): deepspec/modeling/eagle3/qwen3/
# config.py `build_draft_config` deep-copies the target's Qwen3Config (transformers 5: `dtype`, `rope_parameters`) and
# adds the keys below; qwen3/modeling.py `Qwen3Eagle3Model` has q_norm/k_norm and, in every layer, a 2·H attention
# input and a hidden_norm; trainer/ckpt_manager.py saves that state dict as it is (full-vocabulary lm_head, no d2t).
DEEPSPEC = {"k": 5, "aux_ids": (2, 4, 6, 8, 10), "attention": "qwen3", "draft_vocab": None, "embed": True}


def _deepspec_files(r: Recipe) -> tuple[dict, dict[str, np.ndarray]]:
    t = canonical_tensors(r)
    for name in ("d2t", "t2d"):
        t.pop(name, None)
    rng = np.random.default_rng(r.seed + 1)
    for layer in range(1, r.layers):  # every DeepSpec layer concatenates the embeddings with its normed input
        p = f"layers.{layer}."
        for proj, rows in (("q", r.heads), ("k", r.kv_heads), ("v", r.kv_heads)):
            t[p + f"self_attn.{proj}_proj.weight"] = (rng.standard_normal((rows * r.head_dim, 2 * r.hidden))
                                                      * 0.05).astype(np.float32)
        t[p + "hidden_norm.weight"] = (1.0 + rng.standard_normal(r.hidden) * 0.05).astype(np.float32)
    cfg = {
        "architectures": ["Qwen3Eagle3Model"], "attention_bias": False, "attention_dropout": 0.0,
        "bos_token_id": 151643, "draft_num_hidden_layers": r.layers,
        "dtype": {"BF16": "bfloat16", "F16": "float16", "F32": "float32"}[r.dtype], "eos_token_id": 151645,
        "head_dim": r.head_dim, "hidden_act": "silu", "hidden_size": r.hidden, "initializer_range": 0.02,
        "intermediate_size": r.intermediate, "layer_types": ["full_attention"] * r.layers,
        "max_position_embeddings": 2048, "max_window_layers": r.target_layers, "model_type": "qwen3",
        "num_attention_heads": r.heads, "num_hidden_layers": r.layers, "num_key_value_heads": r.kv_heads,
        "num_target_layers": r.target_layers, "pad_token_id": None, "rms_norm_eps": 1e-06,
        "rope_parameters": {"rope_theta": 1000000.0, "rope_type": "default"}, "sliding_window": None,
        "step_loss_decay": 0.8, "target_layer_ids": _output_ids(r), "target_model_name_or_path": "Qwen/Qwen3-8B",
        "tie_word_embeddings": False, "transformers_version": "5.10.2", "ttt_length": 7, "use_cache": True,
        "use_sliding_window": False, "vocab_size": r.vocab,
    }
    return cfg, t


def _rename(names: dict[str, np.ndarray], style: str) -> dict[str, np.ndarray]:
    out = {}
    for name, arr in names.items():
        if name.startswith("layers."):
            idx, rest = name[len("layers."):].split(".", 1)
            if style == "midlayer":
                name = "midlayer." + rest
            elif style == "midlayer-multi":
                name = f"midlayer.{idx}.{rest}"
        out[name] = arr
    return out


def layout_files(layout: str, r: Recipe) -> tuple[dict, dict[str, np.ndarray], dict]:
    """(config, source-named arrays, safetensors metadata) for one published layout."""
    if layout == "peagle":
        return (*_peagle_files(r, canonical_tensors(r)), {"format": "pt"})
    if layout == "deepspec":  # not in LAYOUTS: its recipe is DEEPSPEC (K=5, Qwen3, full vocabulary), not the default
        return (*_deepspec_files(r), {"format": "pt"})
    return _eagle3_layout_files(layout, r)


def _eagle3_layout_files(layout: str, r: Recipe) -> tuple[dict, dict[str, np.ndarray], dict]:
    """The EAGLE-3 layouts of `layout_files`."""
    t = canonical_tensors(r)
    meta = {"format": "pt"}
    if layout == "eagle":
        cfg = _llama_config(r, "LlamaForCausalLM", rope_theta=False)
        cfg["torch_dtype"] = "float16"
        return cfg, _rename(t, "midlayer"), meta
    if layout == "sglang":
        cfg = _llama_config(r, "LlamaForCausalLMEagle3", rope_theta=False)
        return cfg, _rename(t, "midlayer"), meta
    if layout in ("specforge", "specforge-hf"):
        cfg = _llama_config(r, "LlamaForCausalLMEagle3")
        cfg["rope_scaling"] = None
        cfg["eagle_config"] = {"eagle_aux_hidden_state_layer_ids": _output_ids(r), "use_aux_hidden_state": True}
        return cfg, _rename(t, "midlayer"), meta
    if layout in ("speculators", "speculators-train"):
        arch = "Eagle3DraftModel" if layout == "speculators-train" else "Eagle3Speculator"
        cfg = _speculators_config(r, arch, "0.9.0", list(r.aux_ids))
        return cfg, t, meta
    if layout == "modelopt-vllm":
        cfg = _speculators_config(r, "Eagle3Speculator", "0.1.0.dev14", None)
        cfg["norm_before_residual"] = True
        t.pop("t2d", None)
        return cfg, t, meta
    if layout == "modelopt":
        cfg = _llama_config(r, "LlamaForCausalLMEagle3")
        cfg.update({"bos_token_id": 128000, "eos_token_id": 128001, "pad_token_id": None, "mlp_bias": False,
                    "pretraining_tp": 1})
        cfg["eagle_config"] = {
            "eagle_aux_hidden_state_layer_ids": _output_ids(r), "use_aux_hidden_state": True,
            "use_input_layernorm_in_first_layer": True, "use_last_layernorm": True, "use_mtp_layernorm": False,
            "next_layer_regular": True, "parallel_draft_step": 1,
        }
        t.pop("t2d", None)
        return cfg, t, meta
    if layout == "modelopt-megatron":
        cfg = _llama_config(r, "LlamaForCausalLMEagle3Deep" if r.layers > 1 else "LlamaForCausalLMEagle3")
        cfg.update({"bos_token_id": None, "eos_token_id": None, "pad_token_id": None})
        cfg["eagle_config"] = {"eagle_aux_hidden_state_layer_ids": _output_ids(r), "use_aux_hidden_state": True}
        for i in range(1, r.layers):
            t[f"layers.{i}.hidden_norm.weight"] = t.pop(f"layers.{i}.input_layernorm.weight")
        t.pop("t2d", None)
        return cfg, _rename(t, "midlayer-multi"), meta
    if layout in ("torchspec", "torchspec-vllm"):
        if r.attention == "mla":
            cfg = _mla_config(r)
            written = list(r.aux_ids) if layout == "torchspec-vllm" else _output_ids(r)
        else:
            cfg = _llama_config(r, "LlamaForCausalLMEagle3")
            written = _output_ids(r)
        cfg["eagle_config"] = {"eagle_aux_hidden_state_layer_ids": written, "use_aux_hidden_state": True}
        cfg["_torchspec_version"] = "0.3.0"
        meta["torchspec_version"] = "0.3.0"
        style = "layers" if layout == "torchspec-vllm" else "midlayer"
        return cfg, _rename(t, style), meta
    if layout == "angelslim":
        cfg = _llama_config(r, "Eagle3LlamaForCausalLM")
        cfg["target_model_type"] = "qwen3"
        return cfg, _rename(t, "midlayer"), meta
    if layout == "kimi":
        return _mla_config(r), t, meta
    if layout == "vllm":
        if r.attention == "mla":
            cfg = _mla_config(r)
        else:
            arch = "Eagle3Qwen3ForCausalLM" if r.attention == "qwen3" else "LlamaForCausalLMEagle3"
            cfg = _llama_config(r, arch)
        cfg["target_hidden_size"] = r.T
        cfg["num_aux_hidden_states"] = r.k
        cfg["eagle_aux_hidden_state_layer_ids"] = list(r.aux_ids)
        cfg["eagle_config"] = {"eagle_aux_hidden_state_layer_ids": list(r.aux_ids), "use_aux_hidden_state": True}
        cfg["norm_before_residual"] = bool(r.norm_before_residual)
        cfg["fc_norm"] = r.fc_norm
        cfg["norm_output"] = r.norm_output
        if r.Vd == r.vocab:
            t.pop("d2t", None)
            t.pop("t2d", None)
        return cfg, t, meta
    raise ValueError(f"unknown layout {layout!r}")


def make_draft(
    path: str,
    layout: str = "vllm",
    recipe: Recipe | None = None,
    *,
    shards: int = 1,
    config_patch: dict | None = None,
    drop: tuple[str, ...] = (),
    add: dict[str, np.ndarray] | None = None,
    **recipe_overrides,
) -> str:
    """Write a draft of `layout` into `path` and return it. `drop`/`add` work on source names."""
    r = replace(recipe or Recipe(), **recipe_overrides)
    cfg, tensors, meta = layout_files(layout, r)
    cfg.update(r.extra_config)
    if config_patch:
        for key, value in config_patch.items():
            if value is None:
                cfg.pop(key, None)
            else:
                cfg[key] = value
    for name in drop:
        tensors.pop(name)
    tensors.update(add or {})
    os.makedirs(path, exist_ok=True)
    with open(os.path.join(path, "config.json"), "w") as fh:
        json.dump(cfg, fh, indent=2)
    canonical_dtype = {"d2t": "I64", "t2d": "BOOL"}
    encoded = {}
    for name, arr in tensors.items():
        dtype = canonical_dtype.get(name, "I64" if arr.dtype == np.int64 else "BOOL" if arr.dtype == bool else r.dtype)
        encoded[name] = (dtype, tuple(arr.shape), encode(arr, dtype))
    names = list(encoded)
    if shards == 1:
        write_safetensors(os.path.join(path, "model.safetensors"), encoded, meta)
    else:
        weight_map = {}
        for s in range(shards):
            fname = f"model-{s + 1:05d}-of-{shards:05d}.safetensors"
            part = {n: encoded[n] for n in names[s::shards]}
            write_safetensors(os.path.join(path, fname), part, meta)
            weight_map.update({n: fname for n in part})
        total = sum(len(v[2]) for v in encoded.values())
        with open(os.path.join(path, "model.safetensors.index.json"), "w") as fh:
            json.dump({"metadata": {"total_size": total}, "weight_map": weight_map}, fh, indent=2)
    return path


def make_target_config(path: str, *, layers: int = 12, hidden: int = 64, vocab: int = 256, tied: bool = True) -> str:
    """A target model's config.json only (what validate/inspect --target read)."""
    os.makedirs(path, exist_ok=True)
    cfg = {
        "architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": hidden,
        "num_hidden_layers": layers, "vocab_size": vocab, "num_attention_heads": 4, "num_key_value_heads": 2,
        "intermediate_size": 128, "tie_word_embeddings": tied, "rms_norm_eps": 1e-5,
    }
    with open(os.path.join(path, "config.json"), "w") as fh:
        json.dump(cfg, fh, indent=2)
    return path


# ---------------------------------------------------------------- editing a written draft in place


def edit_config(path: str, edit) -> str:
    """Apply `edit(config_dict)` to a written draft's or target's config.json (nested keys included)."""
    cfg_path = os.path.join(path, "config.json")
    with open(cfg_path) as fh:
        cfg = json.load(fh)
    edit(cfg)
    with open(cfg_path, "w") as fh:
        json.dump(cfg, fh, indent=2)
    return path


def rewrite_tensors(path: str, edit, filename: str = "model.safetensors") -> str:
    """Rewrite one safetensors file through `edit(tensors)`, where tensors maps name -> (dtype, shape, raw bytes).

    Lets a test write what `make_draft` cannot: renamed tensors, odd dtypes (I32 d2t, F4), exact bytes.
    """
    file = os.path.join(path, filename)
    with open(file, "rb") as fh:
        (n,) = struct.unpack("<Q", fh.read(8))
        header = json.loads(fh.read(n))
        data = fh.read()
    meta = header.pop("__metadata__", None)
    tensors = {name: (info["dtype"], tuple(info["shape"]), data[info["data_offsets"][0]:info["data_offsets"][1]])
               for name, info in header.items()}
    tensors = edit(tensors) or tensors
    write_safetensors(file, tensors, meta)
    return path


def pickle_checkpoint(path: str, config_from: str, state: dict) -> str:
    """A folder with `config_from`'s config.json and `state` (name -> torch tensor) as pytorch_model.bin."""
    import torch

    os.makedirs(path, exist_ok=True)
    with open(os.path.join(config_from, "config.json")) as src, open(os.path.join(path, "config.json"), "w") as dst:
        dst.write(src.read())
    torch.save(state, os.path.join(path, "pytorch_model.bin"))
    return path
