"""Write real-shape drafters for benchmarks, streamed to disk in chunks (memory stays ~100 MB).

Default: an 8B-class EAGLE-3 drafter (H=4096, I=14336, V=128256, Vd=32000, bf16, ~0.85 GB) in SpecForge
layout (`midlayer.`, output-of-layer ids, d2t + t2d). `--kimi`: the Kimi K2.6 EAGLE-3.1 MLA draft at its
published shape (H=7168, MLA ranks 1536/512, V=Vd=163840, embed + head, fc_norm; 3.02 B params, ~6 GB).

    python bench/make_bench_drafter.py OUT_DIR [--shards 3] [--kimi]
"""

from __future__ import annotations

import argparse
import json
import os
import struct
import sys

import numpy as np

H, T, I, V, VD, HEADS, KV, HD, K = 4096, 4096, 14336, 128256, 32000, 32, 8, 128, 3


def tensor_table() -> list[tuple[str, str, tuple[int, ...]]]:
    p = "midlayer."
    return [
        ("fc.weight", "BF16", (H, K * T)),
        (p + "self_attn.q_proj.weight", "BF16", (HEADS * HD, 2 * H)),
        (p + "self_attn.k_proj.weight", "BF16", (KV * HD, 2 * H)),
        (p + "self_attn.v_proj.weight", "BF16", (KV * HD, 2 * H)),
        (p + "self_attn.o_proj.weight", "BF16", (H, HEADS * HD)),
        (p + "mlp.gate_proj.weight", "BF16", (I, H)),
        (p + "mlp.up_proj.weight", "BF16", (I, H)),
        (p + "mlp.down_proj.weight", "BF16", (H, I)),
        (p + "input_layernorm.weight", "BF16", (H,)),
        (p + "hidden_norm.weight", "BF16", (H,)),
        (p + "post_attention_layernorm.weight", "BF16", (H,)),
        ("norm.weight", "BF16", (H,)),
        ("lm_head.weight", "BF16", (VD, H)),
        ("d2t", "I64", (VD,)),
        ("t2d", "BOOL", (V,)),
    ]


CHUNK = 16 * 1024 * 1024  # elements generated at a time


def kimi_tensor_table() -> list[tuple[str, str, tuple[int, ...]]]:
    """Reference §3.5: the expected tensors of lightseekorg/kimi-k2.6-eagle3.1-mla."""
    h, inter, heads, qr, kr, dn, dr, dv, vocab = 7168, 18432, 64, 1536, 512, 128, 64, 128, 163840
    p = "layers.0."
    return [
        ("embed_tokens.weight", "BF16", (vocab, h)),
        ("fc.weight", "BF16", (h, 3 * h)),
        *[(f"fc_norm.{k}.weight", "BF16", (h,)) for k in range(3)],
        (p + "self_attn.q_a_proj.weight", "BF16", (qr, 2 * h)),
        (p + "self_attn.q_a_layernorm.weight", "BF16", (qr,)),
        (p + "self_attn.q_b_proj.weight", "BF16", (heads * (dn + dr), qr)),
        (p + "self_attn.kv_a_proj_with_mqa.weight", "BF16", (kr + dr, 2 * h)),
        (p + "self_attn.kv_a_layernorm.weight", "BF16", (kr,)),
        (p + "self_attn.kv_b_proj.weight", "BF16", (heads * (dn + dv), kr)),
        (p + "self_attn.o_proj.weight", "BF16", (h, heads * dv)),
        (p + "mlp.gate_proj.weight", "BF16", (inter, h)),
        (p + "mlp.up_proj.weight", "BF16", (inter, h)),
        (p + "mlp.down_proj.weight", "BF16", (h, inter)),
        (p + "input_layernorm.weight", "BF16", (h,)),
        (p + "hidden_norm.weight", "BF16", (h,)),
        (p + "post_attention_layernorm.weight", "BF16", (h,)),
        ("norm.weight", "BF16", (h,)),
        ("lm_head.weight", "BF16", (vocab, h)),
    ]


def kimi_config() -> dict:
    return {
        "architectures": ["Eagle3DeepseekV2ForCausalLM"], "model_type": "kimi_k2", "hidden_size": 7168,
        "intermediate_size": 18432, "num_hidden_layers": 1, "num_attention_heads": 64, "num_key_value_heads": 64,
        "q_lora_rank": 1536, "kv_lora_rank": 512, "qk_nope_head_dim": 128, "qk_rope_head_dim": 64,
        "v_head_dim": 128, "vocab_size": 163840, "draft_vocab_size": 163840, "rms_norm_eps": 1e-5,
        "rope_theta": 50000.0,
        "rope_scaling": {"type": "yarn", "factor": 64.0, "beta_fast": 1.0, "beta_slow": 1.0, "mscale": 1.0,
                         "mscale_all_dim": 1.0, "original_max_position_embeddings": 4096},
        "max_position_embeddings": 262144, "tie_word_embeddings": False, "torch_dtype": "bfloat16",
        "fc_norm": True, "norm_output": True, "_torchspec_version": "0.3.0",
        "eagle_config": {"eagle_aux_hidden_state_layer_ids": [2, 30, 58], "use_aux_hidden_state": True},
    }


def _write_values(fh, name: str, dtype: str, shape: tuple[int, ...], rng: np.random.Generator, ids) -> None:
    if name == "d2t":
        fh.write((ids - np.arange(VD)).astype("<i8").tobytes())
        return
    if name == "t2d":
        mask = np.zeros(V, dtype=bool)
        mask[ids] = True
        fh.write(mask.tobytes())
        return
    n = int(np.prod(shape))
    for start in range(0, n, CHUNK):
        count = min(CHUNK, n - start)
        if len(shape) == 1:
            values = 1.0 + rng.standard_normal(count, dtype=np.float32) * 0.05
        else:
            values = rng.standard_normal(count, dtype=np.float32) * 0.02
        bits = values.view(np.uint32)
        fh.write(((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16).astype("<u2").tobytes())


def _nbytes(dtype: str, shape: tuple[int, ...]) -> int:
    return int(np.prod(shape)) * {"BF16": 2, "I64": 8, "BOOL": 1}[dtype]


def _write_file(path: str, entries: list[tuple[str, str, tuple[int, ...]]], rng, ids) -> None:
    header, offset = {"__metadata__": {"format": "pt"}}, 0
    for name, dtype, shape in entries:
        size = _nbytes(dtype, shape)
        header[name] = {"dtype": dtype, "shape": list(shape), "data_offsets": [offset, offset + size]}
        offset += size
    raw = json.dumps(header, separators=(",", ":")).encode()
    raw += b" " * (-len(raw) % 8)
    with open(path, "wb") as fh:
        fh.write(struct.pack("<Q", len(raw)) + raw)
        for name, dtype, shape in entries:
            _write_values(fh, name, dtype, shape, rng, ids)


def write_bench_drafter(out: str, shards: int = 1, seed: int = 0, kimi: bool = False) -> str:
    os.makedirs(out, exist_ok=True)
    rng = np.random.default_rng(seed)
    ids = np.sort(rng.choice(V, size=VD, replace=False))
    config = kimi_config() if kimi else {
        "architectures": ["LlamaForCausalLMEagle3"], "model_type": "llama", "hidden_size": H,
        "intermediate_size": I, "num_attention_heads": HEADS, "num_key_value_heads": KV, "head_dim": HD,
        "num_hidden_layers": 1, "rms_norm_eps": 1e-5, "rope_theta": 500000.0, "max_position_embeddings": 131072,
        "vocab_size": V, "draft_vocab_size": VD, "tie_word_embeddings": False, "torch_dtype": "bfloat16",
        "eagle_config": {"eagle_aux_hidden_state_layer_ids": [1, 15, 28], "use_aux_hidden_state": True},
    }
    with open(os.path.join(out, "config.json"), "w") as fh:
        json.dump(config, fh, indent=2)
    table = kimi_tensor_table() if kimi else tensor_table()
    if shards == 1:
        _write_file(os.path.join(out, "model.safetensors"), table, rng, ids)
        return out
    weight_map = {}
    for s in range(shards):
        name = f"model-{s + 1:05d}-of-{shards:05d}.safetensors"
        part = table[s::shards]
        _write_file(os.path.join(out, name), part, rng, ids)
        weight_map.update({t[0]: name for t in part})
    total = sum(_nbytes(d, sh) for _, d, sh in table)
    with open(os.path.join(out, "model.safetensors.index.json"), "w") as fh:
        json.dump({"metadata": {"total_size": total}, "weight_map": weight_map}, fh, indent=2)
    return out


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out")
    parser.add_argument("--shards", type=int, default=1)
    parser.add_argument("--kimi", action="store_true", help="the 3 B-parameter Kimi K2.6 EAGLE-3.1 MLA draft")
    args = parser.parse_args(argv)
    write_bench_drafter(args.out, args.shards, kimi=args.kimi)
    print(args.out, file=sys.stderr)


if __name__ == "__main__":
    main()
