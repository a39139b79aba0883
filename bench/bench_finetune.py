"""EAGLE-3 → EAGLE-3.1 with eaglekit: the bundled EAGLE-3 SmolLM2 drafter, its default upgrade, that upgrade
fine-tuned, and the EAGLE-3.1 drafter trained from scratch, all measured on held-out prompts.

    python bench/bench_finetune.py                    # 100 steps (20 % of the bundled drafters' 500), k=3
    python bench/bench_finetune.py --steps 50 --limit 4

Training data: what the bundled drafters were trained on, rebuilt by finetune's own data path: the bundled
training prompts (eaglekit/data/prompts/train.jsonl) with the target's own greedy answers (--generate 128),
standard-library source as long context on every fifth, and 96 k tokens of plain standard-library source;
captured once and cached.
Evaluation: verify's 16 bundled coding prompts (never trained on), short and with 1024 tokens of context from
standard-library modules the training context never uses, each drafter replayed beside the EAGLE-3 source on one
target pass per prompt (`eaglekit compare`): τ with vLLM's counter definitions and the paired difference with a
95 % bootstrap interval, so a gain of 0.05 can be told from prompt noise. Figures are printed, never asserted.
"""

from __future__ import annotations

import argparse
import os
import platform
import sys
import tempfile
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)

from eaglekit.decode.stats import too_few_text  # noqa: E402  (stdlib only: importing it loads no model code)

BUNDLED = {
    "EAGLE-3": os.path.join(REPO, "examples", "drafters", "smollm2-135m-eagle3"),
    "EAGLE-3.1 from scratch": os.path.join(REPO, "examples", "drafters", "smollm2-135m-eagle3.1"),
}
FROM_SCRATCH_STEPS = 500  # examples/train_tiny_drafter.py's budget for both bundled drafters


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--target", help="SmolLM2 directory (default: .cache/smollm2, materialised if missing)")
    p.add_argument("--steps", type=int, default=100)
    p.add_argument("--lr", type=float, default=2e-4)
    p.add_argument("--data-limit", type=int, help="training prompts (default: all 535)")
    p.add_argument("--generate", type=int, default=128)
    p.add_argument("--code-tokens", type=int, default=96000)
    p.add_argument("--limit", type=int, default=16, help="held-out prompts (of the 16 bundled coding prompts)")
    p.add_argument("--max-new-tokens", type=int, default=64)
    p.add_argument("--context-tokens", type=int, default=1024)
    p.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"], help="target dtype for evaluation")
    p.add_argument("--no-control", action="store_true", help="skip the EAGLE-3 source fine-tuned the same way")
    p.add_argument("--work", help="folder for the drafts written on the way (default: a temporary one)")
    p.add_argument("--cache-dir", help="captured-data cache (default: finetune's, ~/.cache/eaglekit/finetune)")
    return p.parse_args(argv)


def main(argv=None) -> None:
    args = parse_args(argv)
    import torch

    from eaglekit.capture.plan import DataOptions
    from eaglekit.decode.compare import compare
    from eaglekit.decode.options import VerifyOptions
    from eaglekit.finetune.options import FinetuneOptions
    from eaglekit.finetune.run import finetune
    from eaglekit.finetune.train import TrainOptions
    from eaglekit.upgrade import UpgradeOptions, upgrade
    from examples.smollm2 import materialize_smollm2

    target_dir = args.target or materialize_smollm2(os.path.join(REPO, ".cache", "smollm2"))
    work = args.work or tempfile.mkdtemp(prefix="bench-finetune-")
    os.makedirs(work, exist_ok=True)
    print(f"# {platform.processor() or platform.machine()}, {torch.get_num_threads()} torch threads, "
          f"torch {torch.__version__}; drafts in {work}")

    def write(name, source, **flags):
        path = os.path.join(work, name)
        t = time.perf_counter()
        upgrade(source, path, UpgradeOptions(target=target_dir, force=True, **flags))
        return path, time.perf_counter() - t

    drafts = {"EAGLE-3": write("eagle3", BUNDLED["EAGLE-3"], fc_norm=False, norm_output=False)[0]}
    drafts["upgraded (no finetune)"], upgrade_s = write("upgraded", BUNDLED["EAGLE-3"])
    data = DataOptions(limit=args.data_limit, generate=args.generate, context_tokens=384, context_every=5,
                       code_tokens=args.code_tokens)
    t = time.perf_counter()
    report = finetune(drafts["upgraded (no finetune)"], os.path.join(work, "tuned"), FinetuneOptions(
        target=target_dir, cache_dir=args.cache_dir, eval=None, force=True, data=data,
        train=TrainOptions(steps=args.steps, lr=args.lr)))
    finetune_s = time.perf_counter() - t
    finetune(drafts["upgraded (no finetune)"], os.path.join(work, "warm"), FinetuneOptions(
        target=target_dir, cache_dir=args.cache_dir, eval=None, force=True, data=data,
        train=TrainOptions(steps=0)))
    drafts["upgraded + warm start only (--steps 0)"] = os.path.join(work, "warm")
    drafts["upgraded + finetune"] = os.path.join(work, "tuned")
    if not args.no_control:  # the same training on the EAGLE-3 source: what the extra steps give without 3.1
        finetune(drafts["EAGLE-3"], os.path.join(work, "eagle3-tuned"), FinetuneOptions(
            target=target_dir, cache_dir=args.cache_dir, eval=None, force=True, data=data,
        train=TrainOptions(steps=args.steps, lr=args.lr)))
        drafts["EAGLE-3 + the same finetune (control)"] = os.path.join(work, "eagle3-tuned")
    drafts["EAGLE-3.1 from scratch"] = write("eagle31", BUNDLED["EAGLE-3.1 from scratch"])[0]  # kept: lossless
    data, training = report.data, report.training
    print(f"upgrade {upgrade_s:.1f} s; finetune {finetune_s:.0f} s: data {data['seconds']:.0f} s "
          f"({data['sequences']} sequences, {data['positions']} positions{', cached' if data['reused'] else ''}), "
          f"training {training['seconds']:.0f} s for {training['steps']} steps "
          f"({training['steps'] / FROM_SCRATCH_STEPS:.0%} of the from-scratch budget), "
          f"final loss {training['history'][-1]['loss']:.3f}")

    print(f"held out: the first {args.limit} bundled coding prompts x {args.max_new_tokens} new tokens, k=3, "
          f"{args.dtype}; each drafter replayed beside EAGLE-3 on one target pass per prompt (eaglekit compare), "
          "95 % bootstrap intervals over prompts, the difference's paired")
    contexts = (0, args.context_tokens)
    print("| drafter | " + " | ".join(f"τ +{c} [95 %] | vs EAGLE-3 [paired 95 %]" for c in contexts) + " |")
    print("|---|" + "---|---|" * len(contexts))
    source, diffs = {}, {}
    for label, path in drafts.items():
        if label == "EAGLE-3":
            continue
        cells = []
        for context in contexts:
            options = VerifyOptions(num_speculative_tokens=3, max_new_tokens=args.max_new_tokens, limit=args.limit,
                                    context_tokens=context, device="cpu", dtype=args.dtype)
            row = compare(drafts["EAGLE-3"], path, target_dir, options).rows()["all"]
            source.setdefault(context, row["a"])  # the same prompts and target pass for every pair
            diff = diffs[(label, context)] = row["b_minus_a"]
            cells.append(f"{interval_cell(row['b'])} | {difference_cell(diff)}")
        print(f"| {label} | {' | '.join(cells)} |", flush=True)
    print("| EAGLE-3 (source) | " + " | ".join(f"{interval_cell(source[c])} | —" for c in contexts) + " |")
    tuned = [diffs[("upgraded + finetune", c)] for c in contexts]
    print(f"fine-tuned 3.1 vs its EAGLE-3 source: τ {tuned[0]['acceptance_length_difference']:+.3f} short (goal +0.05, "
          f"{tuned[0]['verdict']}), {tuned[1]['acceptance_length_difference']:+.3f} at +{args.context_tokens} "
          f"(goal +0.10, {tuned[1]['verdict']})")


def interval_cell(summary: dict) -> str:
    interval = summary["acceptance_length_interval"]
    if interval is None:
        return f"{summary['acceptance_length']:.3f} ({too_few_text(summary['samples'])})"
    return f"{summary['acceptance_length']:.3f} [{interval['low']:.2f}, {interval['high']:.2f}]"


def difference_cell(diff: dict) -> str:
    interval = diff["interval"]
    if interval is None:
        return f"{diff['acceptance_length_difference']:+.3f} ({too_few_text(diff['samples'])})"
    return f"{diff['acceptance_length_difference']:+.3f} [{interval['low']:+.3f}, {interval['high']:+.3f}]"

if __name__ == "__main__":
    main()
