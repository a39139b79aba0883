"""Training-step throughput of `eaglekit finetune` for an 8B-class drafter, against the FLOP bound.

    python bench/gpu_finetune_step.py                 # CUDA: H=4096, bf16 autocast, seq 2048, depth 3
    python bench/gpu_finetune_step.py --small --device cpu   # the same code path at toy size (a smoke run)

One step = the unrolled training-time test (eaglekit.finetune.objective.UnrolledObjective) forward and backward
plus AdamW, exactly what finetune runs per step. The bound counts matmul FLOPs only: 6 · (weights a row
touches) per row and depth for forward + backward, plus attention scores and values over each depth's keys;
the chip's dense bf16 peak is a parameter (989 TFLOP/s for an H100/H200 SXM). Figures are printed.
"""

from __future__ import annotations

import argparse
import os
import sys
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--device", default="cuda")
    p.add_argument("--seq", type=int, default=2048)
    p.add_argument("--depth", type=int, default=3)
    p.add_argument("--steps", type=int, default=10)
    p.add_argument("--peak-tflops", type=float, default=989.0, help="dense bf16 peak of the chip")
    p.add_argument("--small", action="store_true", help="toy geometry (CPU smoke run)")
    return p.parse_args(argv)


def main(argv=None) -> None:
    args = parse_args(argv)
    import torch

    from eaglekit.drafter.config import DrafterConfig
    from eaglekit.drafter.model import Drafter
    from eaglekit.finetune.objective import UnrolledObjective

    if args.small:
        geo = dict(hidden_size=64, target_hidden_size=64, intermediate_size=128, num_heads=4, num_kv_heads=2,
                   head_dim=16, vocab_size=512, draft_vocab_size=256)
        args.seq = min(args.seq, 128)
    else:  # Llama-3.1-8B's drafter shape (EAGLE-3 / 3.1, one layer, 32k draft vocabulary)
        geo = dict(hidden_size=4096, target_hidden_size=4096, intermediate_size=14336, num_heads=32, num_kv_heads=8,
                   head_dim=128, vocab_size=128256, draft_vocab_size=32000)
    config = DrafterConfig(num_layers=1, num_aux_hidden_states=3, fc_norm=True, norm_output=True,
                           rms_norm_eps=1e-5, rope_theta=500000.0, **geo)
    device = torch.device(args.device)
    torch.manual_seed(0)
    embed = torch.randn(config.vocab_size, config.hidden_size, device=device) * 0.02
    drafter = Drafter(config, device=device, embed_tokens=embed)
    with torch.no_grad():
        drafter.d2t.copy_(torch.arange(config.draft_vocab_size, device=device))
    objective = UnrolledObjective(drafter, args.depth, 0.8)
    params = [p for p in drafter.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=1e-4, betas=(0.9, 0.95))
    s, k = args.seq, args.depth
    ids = torch.randint(0, config.vocab_size, (1, s + k), device=device)
    labels = torch.randint(0, config.draft_vocab_size, (1, s + k), device=device)
    aux = torch.randn(1, s, 3 * config.target_hidden_size, device=device)
    counts = torch.full((k,), s, device=device)

    def step():
        with torch.autocast(device.type, dtype=torch.bfloat16):
            loss, _ = objective(ids, labels, aux, counts)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()

    def sync():
        if device.type == "cuda":
            torch.cuda.synchronize()

    for _ in range(2):
        step()
    sync()
    start = time.perf_counter()
    for _ in range(args.steps):
        step()
    sync()
    seconds = (time.perf_counter() - start) / args.steps

    h, t, i = config.hidden_size, config.target_hidden_size, config.intermediate_size
    q, kv = config.num_heads * config.head_dim, config.num_kv_heads * config.head_dim
    layer = 2 * h * q + 2 * h * kv + q * h + 3 * h * i  # qkv reads [embeds | hidden] (2H), o, gate/up/down
    per_row = layer + config.draft_vocab_size * h
    fc = 3 * t * h
    matmul = 6 * s * (fc + k * per_row)
    # depth j: s queries over the s prefix keys plus its j earlier steps' keys (dense: masked keys counted);
    # scores and values 4·q FLOPs per query-key pair forward, times 3 with the backward
    attention = sum(12 * s * (s + j * s) * q for j in range(k))
    flops = matmul + attention
    bound = flops / (args.peak_tflops * 1e12)
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
    print(f"# {name}, torch {torch.__version__}, H={h} I={i} Vd={config.draft_vocab_size} seq {s} depth {k}, "
          f"bf16 autocast, fp32 master weights, AdamW")
    print(f"trainable parameters: {sum(p.numel() for p in params) / 1e6:.1f} M")
    print(f"step: {seconds * 1e3:.1f} ms = {1 / seconds:.2f} steps/s, {s / seconds:.0f} tokens/s "
          f"({s * k / seconds:.0f} row-depths/s)")
    print(f"FLOP bound: {flops / 1e12:.2f} TFLOP per step -> {bound * 1e3:.1f} ms at {args.peak_tflops:.0f} "
          f"TFLOP/s; achieved {flops / seconds / 1e12:.0f} TFLOP/s ({bound / seconds:.0%} of peak)")
    if device.type == "cuda":
        print(f"peak memory: {torch.cuda.max_memory_allocated(device) / 2**30:.1f} GiB")


if __name__ == "__main__":
    main()
