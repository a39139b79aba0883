"""End-to-end smoke test of `verify` on a device, with nothing to download: an oracle draft must reach τ = k + 1.

    python bench/gpu_smoke.py                        # CUDA, the fused Triton kernels, bf16; EAGLE-3 and 3.1
    python bench/gpu_smoke.py --device cpu --kernels torch --hidden 64 --vocab 128   # the same check on CPU

The target is a random-weight Llama built from a config, with every attention and MLP output projection zeroed
and every token embedded as the same vector u: its residual stream is u at every layer, and its lm_head row c is
u scaled up, so its greedy continuation is token c forever, with a wide margin. The draft (vLLM layout, written
here) passes aux state 0 through `fc` unchanged, also has zeroed output projections, and shares the target's
lm_head, so every state it computes or feeds back is u, or u normalised (EAGLE-3.1's fc_norm and norm_output),
and it drafts c every time. Every draft must therefore be accepted: τ = k + 1 exactly and per-position
acceptance 1.0, while the whole path runs for real (target adapter and aux capture, the drafter's kernels,
KV-cache rollback, the verify loop). Exit 1 on any other outcome; figures are printed as JSON.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--device", default="cuda")
    p.add_argument("--kernels", default="triton", choices=["triton", "torch"], help="drafter kernel backend")
    p.add_argument("--dtype", help="default: bfloat16 on CUDA, float32 on CPU")
    p.add_argument("--hidden", type=int, default=1024)
    p.add_argument("--layers", type=int, default=8)
    p.add_argument("--vocab", type=int, default=4096)
    p.add_argument("-k", type=int, default=3)
    p.add_argument("--max-new-tokens", type=int, default=64)
    p.add_argument("--prompts", type=int, default=4)
    p.add_argument("--work", help="folder for the target and drafts (default: a temporary one)")
    return p.parse_args(argv)


TOKEN = 7  # the target's greedy token, forever


def build_target(path: str, hidden: int, layers: int, vocab: int) -> None:
    import torch
    import transformers
    from tokenizers import Tokenizer, models, pre_tokenizers

    torch.manual_seed(0)
    heads = max(1, hidden // 64)
    config = transformers.LlamaConfig(hidden_size=hidden, intermediate_size=2 * hidden, num_hidden_layers=layers,
                                      num_attention_heads=heads, num_key_value_heads=heads, vocab_size=vocab,
                                      max_position_embeddings=4096, tie_word_embeddings=False, rms_norm_eps=1e-5,
                                      bos_token_id=0, eos_token_id=vocab - 1)
    model = transformers.LlamaForCausalLM(config)
    u = torch.randn(hidden)
    with torch.no_grad():
        for layer in model.model.layers:
            layer.self_attn.o_proj.weight.zero_()
            layer.mlp.down_proj.weight.zero_()
        model.model.embed_tokens.weight.copy_(u.expand(vocab, hidden))
        model.lm_head.weight.normal_(0.0, 0.02)
        model.lm_head.weight[TOKEN] = u * 4
    model.save_pretrained(path)
    words = {f"w{i}": i for i in range(vocab)}
    tok = Tokenizer(models.WordLevel(vocab=words, unk_token="w1"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    fast = transformers.PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="w1", bos_token="w0",
                                                eos_token=f"w{vocab - 1}")
    fast.save_pretrained(path)


def build_draft(path: str, target: str, eagle31: bool) -> None:
    import torch
    from safetensors.torch import save_file

    with open(os.path.join(target, "config.json"), encoding="utf-8") as fh:
        t = json.load(fh)
    H, L, V = t["hidden_size"], t["num_hidden_layers"], t["vocab_size"]
    heads = t["num_attention_heads"]
    head_dim = H // heads
    ids = [2, L // 2, L - 3]
    g = torch.Generator().manual_seed(1)

    def w(*shape):
        return torch.randn(*shape, generator=g) * 0.02

    fc = torch.zeros(H, 3 * H)
    fc[:, :H] = torch.eye(H)  # aux state 0 unchanged: u
    tensors = {
        "fc.weight": fc,
        "layers.0.self_attn.q_proj.weight": w(heads * head_dim, 2 * H),
        "layers.0.self_attn.k_proj.weight": w(heads * head_dim, 2 * H),
        "layers.0.self_attn.v_proj.weight": w(heads * head_dim, 2 * H),
        "layers.0.self_attn.o_proj.weight": torch.zeros(H, heads * head_dim),
        "layers.0.mlp.gate_proj.weight": w(2 * H, H),
        "layers.0.mlp.up_proj.weight": w(2 * H, H),
        "layers.0.mlp.down_proj.weight": torch.zeros(H, 2 * H),
        "layers.0.input_layernorm.weight": torch.ones(H),
        "layers.0.hidden_norm.weight": torch.ones(H),
        "layers.0.post_attention_layernorm.weight": torch.ones(H),
        "norm.weight": torch.ones(H),
    }
    if eagle31:
        tensors.update({f"fc_norm.{k}.weight": torch.ones(H) for k in range(3)})
    config = {"architectures": ["LlamaForCausalLMEagle3"], "model_type": "llama", "hidden_act": "silu",
              "hidden_size": H, "intermediate_size": 2 * H, "num_hidden_layers": 1, "num_attention_heads": heads,
              "num_key_value_heads": heads, "head_dim": head_dim, "rms_norm_eps": 1e-5, "rope_theta": 10000.0,
              "max_position_embeddings": 4096, "vocab_size": V, "draft_vocab_size": V, "target_hidden_size": H,
              "tie_word_embeddings": False, "num_aux_hidden_states": 3, "norm_before_residual": False,
              "fc_norm": eagle31, "norm_output": eagle31, "eagle_aux_hidden_state_layer_ids": ids,
              "eagle_config": {"eagle_aux_hidden_state_layer_ids": ids, "use_aux_hidden_state": True},
              "torch_dtype": "bfloat16"}
    os.makedirs(path, exist_ok=True)
    save_file({k: v.to(torch.bfloat16).contiguous() for k, v in tensors.items()},
              os.path.join(path, "model.safetensors"), metadata={"format": "pt"})
    with open(os.path.join(path, "config.json"), "w", encoding="utf-8") as fh:
        json.dump(config, fh, indent=2)


def main(argv=None) -> int:
    args = parse_args(argv)
    os.environ["EAGLEKIT_KERNELS"] = args.kernels  # before any kernel import
    import torch

    from eaglekit import VerifyOptions, verify_draft

    work = args.work or tempfile.mkdtemp(prefix="eaglekit-smoke-")
    target = os.path.join(work, "target")
    build_target(target, args.hidden, args.layers, args.vocab)
    prompts = os.path.join(work, "prompts.jsonl")
    with open(prompts, "w", encoding="utf-8") as fh:
        for i in range(args.prompts):
            fh.write(json.dumps({"name": f"p{i}", "text": " ".join(f"w{(i * 13 + j) % 100 + 1}"
                                                                    for j in range(8 + 4 * i))}) + "\n")
    dtype = args.dtype or ("float32" if args.device == "cpu" else "bfloat16")
    results, ok = [], True
    for eagle31 in (False, True):
        draft = os.path.join(work, "draft-3.1" if eagle31 else "draft-3")
        build_draft(draft, target, eagle31)
        start = time.perf_counter()
        report = verify_draft(draft, target, VerifyOptions(num_speculative_tokens=args.k,
                                                           max_new_tokens=args.max_new_tokens, prompts_file=prompts,
                                                           device=args.device, dtype=dtype, as_eaglekit_reads=True))
        seconds = time.perf_counter() - start
        c = report.counter
        exact = report.lossless and c.accepted == c.drafts * args.k and c.drafts > 0
        ok = ok and exact
        results.append({"draft": f"EAGLE-{'3.1' if eagle31 else '3'}", "passed": exact, "lossless": report.lossless,
                        "acceptance_length": c.acceptance_length, "expected": args.k + 1,
                        "per_position_acceptance": c.per_position, "drafts": c.drafts,
                        "tokens_per_s_spec": round(report.tokens_per_s_spec, 1),
                        "tokens_per_s_target": round(report.tokens_per_s_target, 1), "seconds": round(seconds, 2)})
    print(json.dumps({"device": args.device, "gpu": torch.cuda.get_device_name() if args.device.startswith("cuda")
                      else None, "kernels": args.kernels, "dtype": dtype, "hidden": args.hidden,
                      "layers": args.layers, "vocab": args.vocab, "k": args.k, "results": results}, indent=2))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
