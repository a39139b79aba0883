"""EAGLE-3 vs EAGLE-3.1, measured the way EAGLE-3.1 is benchmarked: per category, with intervals.

    python bench/bench_compare.py                                  # the 16 bundled coding prompts, short and +1024
    python bench/bench_compare.py --prompts speed-bench.jsonl --category coding --turns all

Both bundled SmolLM2 drafters are replayed on one captured target pass per prompt turn (`eaglekit compare`), so
their difference is measured on identical text; intervals are 95 % bootstrap intervals over conversations, the
difference's interval is paired. A prepared SPEED-Bench file (JSONL or parquet) gives one row per category.
Figures are printed, never asserted.
"""

from __future__ import annotations

import argparse
import os
import platform
import sys
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)

from eaglekit.decode.compare import compare  # noqa: E402
from eaglekit.decode.options import VerifyOptions  # noqa: E402
from examples.smollm2 import materialize_smollm2  # noqa: E402

DRAFTERS = (os.path.join(REPO, "examples", "drafters", "smollm2-135m-eagle3"),
            os.path.join(REPO, "examples", "drafters", "smollm2-135m-eagle3.1"))


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--target", help="SmolLM2 directory (default: .cache/smollm2, materialised if missing)")
    p.add_argument("--prompts", help="JSONL or SPEED-Bench file (default: the bundled coding prompts)")
    p.add_argument("--category", action="append", default=[], help="SPEED-Bench category (repeatable)")
    p.add_argument("--turns", default="first", choices=["first", "all"])
    p.add_argument("--limit", type=int)
    p.add_argument("-k", type=int, default=3)
    p.add_argument("--max-new-tokens", type=int, default=64)
    p.add_argument("--context-tokens", type=int, action="append", help="repeatable (default: 0 and 1024)")
    p.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    return p.parse_args(argv)


def cell(summary: dict) -> str:
    interval = summary["acceptance_length_interval"]
    span = f" [{interval['low']:.2f}, {interval['high']:.2f}]" if interval else ""
    return f"{summary['acceptance_length']:.3f}{span}"


def main(argv=None) -> None:
    args = parse_args(argv)
    import torch

    target = args.target or materialize_smollm2(os.path.join(REPO, ".cache", "smollm2"))
    contexts = args.context_tokens or [0, 1024]
    print(f"# {platform.processor() or platform.machine()}, {torch.get_num_threads()} torch threads, "
          f"torch {torch.__version__}, {args.dtype}, k={args.k}, {args.max_new_tokens} new tokens per turn")
    print("| context | category | prompts | τ EAGLE-3 [95 %] | τ EAGLE-3.1 [95 %] | 3.1 − 3 [paired 95 %] | verdict |")
    print("|---|---|---|---|---|---|---|")
    for context in contexts:
        options = VerifyOptions(num_speculative_tokens=args.k, max_new_tokens=args.max_new_tokens,
                                prompts_file=args.prompts, limit=args.limit, categories=tuple(args.category),
                                turns=args.turns, context_tokens=context, device="cpu", dtype=args.dtype)
        start = time.perf_counter()
        report = compare(*DRAFTERS, target, options)
        seconds = time.perf_counter() - start
        for name, row in report.rows().items():
            diff = row["b_minus_a"]
            interval = diff["interval"]
            span = f" [{interval['low']:+.3f}, {interval['high']:+.3f}]" if interval else ""
            print(f"| {context} | {name} | {row['a']['prompts']} | {cell(row['a'])} | {cell(row['b'])} | "
                  f"{diff['acceptance_length_difference']:+.3f}{span} | {diff['verdict']} |", flush=True)
        print(f"<!-- context {context}: {seconds:.0f} s for {len(report.names)} prompt turns -->", flush=True)


if __name__ == "__main__":
    main()
