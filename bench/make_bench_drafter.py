"""Write an 8B-class EAGLE-3 drafter at real shape (H=4096, I=14336, V=128256, Vd=32000, bf16, ~0.85 GB).

Tensors are streamed to disk one at a time (peak memory ~ the largest tensor), in SpecForge layout
(`midlayer.`, output-of-layer ids, d2t + t2d) so every eaglekit command has a real-shape input.

    python bench/make_bench_drafter.py OUT_DIR [--shards 3]
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


def _values(name: str, dtype: str, shape: tuple[int, ...], rng: np.random.Generator, ids: np.ndarray) -> bytes:
    if name == "d2t":
        return (ids - np.arange(VD)).astype("<i8").tobytes()
    if name == "t2d":
        mask = np.zeros(V, dtype=bool)
        mask[ids] = True
        return mask.tobytes()
    n = int(np.prod(shape))
    if len(shape) == 1:
        values = 1.0 + rng.standard_normal(n, dtype=np.float32) * 0.05
    else:
        values = rng.standard_normal(n, dtype=np.float32) * 0.02
    bits = values.view(np.uint32)
    return ((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16).astype("<u2").tobytes()


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
            fh.write(_values(name, dtype, shape, rng, ids))


def write_bench_drafter(out: str, shards: int = 1, seed: int = 0) -> str:
    os.makedirs(out, exist_ok=True)
    rng = np.random.default_rng(seed)
    ids = np.sort(rng.choice(V, size=VD, replace=False))
    config = {
        "architectures": ["LlamaForCausalLMEagle3"], "model_type": "llama", "hidden_size": H,
        "intermediate_size": I, "num_attention_heads": HEADS, "num_key_value_heads": KV, "head_dim": HD,
        "num_hidden_layers": 1, "rms_norm_eps": 1e-5, "rope_theta": 500000.0, "max_position_embeddings": 131072,
        "vocab_size": V, "draft_vocab_size": VD, "tie_word_embeddings": False, "torch_dtype": "bfloat16",
        "eagle_config": {"eagle_aux_hidden_state_layer_ids": [1, 15, 28], "use_aux_hidden_state": True},
    }
    with open(os.path.join(out, "config.json"), "w") as fh:
        json.dump(config, fh, indent=2)
    table = tensor_table()
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
    args = parser.parse_args(argv)
    write_bench_drafter(args.out, args.shards)
    print(args.out, file=sys.stderr)


if __name__ == "__main__":
    main()
