"""Speculative decoding speed and acceptance on CPU: the bundled SmolLM2 drafters against SmolLM2-135M-Instruct.

    python bench/bench_verify.py                          # EAGLE-3 drafter, k=3: tokens/s spec vs target alone
    python bench/bench_verify.py --table                  # EAGLE-3 vs 3.1, k=3 and 6, short and long context
    python bench/bench_verify.py --dtype bfloat16 --limit 4

Both paths run in the same process on the same prompts, interleaved prompt by prompt (target alone, then
with the draft), each with its KV cache; the ratio of their tokens/s is the speedup. Figures are printed,
never asserted: on a shared machine they move with the load, so run it more than once.
"""

from __future__ import annotations

import argparse
import os
import platform
import sys
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)

from eaglekit import VerifyOptions, verify_draft  # noqa: E402
from examples.smollm2 import materialize_smollm2  # noqa: E402

DRAFTERS = {
    "EAGLE-3": os.path.join(REPO, "examples", "drafters", "smollm2-135m-eagle3"),
    "EAGLE-3.1": os.path.join(REPO, "examples", "drafters", "smollm2-135m-eagle3.1"),
}


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--target", help="SmolLM2 directory (default: .cache/smollm2, materialised if missing)")
    p.add_argument("--drafter", action="append", choices=sorted(DRAFTERS), help="default: EAGLE-3 (all with --table)")
    p.add_argument("-k", type=int, action="append", help="speculative tokens (repeatable; default 3, --table: 3 and 6)")
    p.add_argument("--context-tokens", type=int, action="append",
                   help="long-context sizes (repeatable; default 0, --table: 0 and 1024)")
    p.add_argument("--limit", type=int, default=8, help="prompts of the bundled set")
    p.add_argument("--max-new-tokens", type=int, default=96)
    p.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    p.add_argument("--table", action="store_true", help="the README comparison table (markdown)")
    return p.parse_args(argv)


def main(argv=None) -> None:
    args = parse_args(argv)
    import torch

    target = args.target or materialize_smollm2(os.path.join(REPO, ".cache", "smollm2"))
    drafters = args.drafter or (sorted(DRAFTERS) if args.table else ["EAGLE-3"])
    ks = args.k or ([3, 6] if args.table else [3])
    contexts = args.context_tokens or ([0, 1024] if args.table else [0])
    print(f"# {platform.processor() or platform.machine()}, {torch.get_num_threads()} torch threads, "
          f"torch {torch.__version__}, {args.dtype}, {args.limit} prompts x {args.max_new_tokens} new tokens")
    header = "| drafter | k | context | τ | per position | spec tok/s | target tok/s | speedup | lossless | time |"
    print(header)
    print("|" + "---|" * (header.count("|") - 1))
    for name in drafters:
        for context in contexts:
            for k in ks:
                start = time.perf_counter()
                report = verify_draft(DRAFTERS[name], target, VerifyOptions(
                    num_speculative_tokens=k, max_new_tokens=args.max_new_tokens, limit=args.limit,
                    context_tokens=context, dtype=args.dtype))
                d = report.to_dict()
                rates = " ".join(f"{r:.2f}" for r in d["per_position_acceptance"])
                print(f"| {name} | {k} | {context} | {d['acceptance_length']:.2f} | {rates} | "
                      f"{d['tokens_per_s_spec']:.1f} | {d['tokens_per_s_target']:.1f} | {d['speedup']:.2f}× | "
                      f"{'yes' if d['lossless'] else 'NO'} | {time.perf_counter() - start:.0f} s |", flush=True)


if __name__ == "__main__":
    main()
