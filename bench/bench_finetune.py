"""EAGLE-3 → EAGLE-3.1 with eaglekit: the bundled EAGLE-3 SmolLM2 drafter, its default upgrade, that upgrade
fine-tuned, and the EAGLE-3.1 drafter trained from scratch, all measured on held-out prompts.

    python bench/bench_finetune.py                    # 100 steps (20 % of the bundled drafters' 500), k=3
    python bench/bench_finetune.py --steps 50 --limit 4

Training data: what the bundled drafters were trained on, rebuilt by finetune's own data path: the bundled
training prompts (eaglekit/data/prompts/train.jsonl) with the target's own greedy answers (--generate 128),
standard-library source as long context on every fifth, and 96 k tokens of plain standard-library source;
captured once and cached.
Evaluation: verify's bundled coding prompts (never trained on), short and with 1024 tokens of context from
standard-library modules the training context never uses; τ with vLLM's counter definitions. Figures are
printed, never asserted.
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

BUNDLED = {
    "EAGLE-3": os.path.join(REPO, "examples", "drafters", "smollm2-135m-eagle3"),
    "EAGLE-3.1 from scratch": os.path.join(REPO, "examples", "drafters", "smollm2-135m-eagle3.1"),
}
FROM_SCRATCH_STEPS = 500  # examples/train_tiny_drafter.py's budget for both bundled drafters


def standard_error(acc) -> float:
    """SE of τ over verify rounds: the counters give the distribution of accepted drafts per round exactly
    (P(A >= i) is the per-position rate); prompts are treated as independent rounds."""
    at_least = [1.0, *acc.per_position, 0.0]
    mean = sum(acc.per_position)
    second = sum(i * i * (at_least[i] - at_least[i + 1]) for i in range(len(at_least) - 1))
    return ((second - mean * mean) / max(acc.drafts, 1)) ** 0.5


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--target", help="SmolLM2 directory (default: .cache/smollm2, materialised if missing)")
    p.add_argument("--steps", type=int, default=100)
    p.add_argument("--lr", type=float, default=2e-4)
    p.add_argument("--data-limit", type=int, help="training prompts (default: all 535)")
    p.add_argument("--generate", type=int, default=128)
    p.add_argument("--code-tokens", type=int, default=96000)
    p.add_argument("--limit", type=int, default=8, help="held-out prompts (of the 16 bundled coding prompts)")
    p.add_argument("--max-new-tokens", type=int, default=64)
    p.add_argument("--context-tokens", type=int, default=1024)
    p.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"], help="target dtype for evaluation")
    p.add_argument("--work", help="folder for the drafts written on the way (default: a temporary one)")
    p.add_argument("--cache-dir", help="captured-data cache (default: finetune's, ~/.cache/eaglekit/finetune)")
    return p.parse_args(argv)


def main(argv=None) -> None:
    args = parse_args(argv)
    import torch

    from eaglekit.finetune.data import DataOptions
    from eaglekit.finetune.evaluate import EvalOptions, acceptance, held_out_prompts
    from eaglekit.finetune.run import FinetuneOptions, finetune
    from eaglekit.finetune.train import TrainOptions
    from eaglekit.upgrade import UpgradeOptions, upgrade
    from eaglekit.verify.smollm2 import materialize_smollm2
    from eaglekit.verify.target import load_target
    from eaglekit.drafter.model import Drafter
    from eaglekit.families import apply_target, load_draft
    from eaglekit.target import read_target

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
                       code_tokens=args.code_tokens, cache_dir=args.cache_dir)
    t = time.perf_counter()
    report = finetune(drafts["upgraded (no finetune)"], os.path.join(work, "tuned"), FinetuneOptions(
        target=target_dir, eval=None, force=True, data=data, train=TrainOptions(steps=args.steps, lr=args.lr)))
    finetune_s = time.perf_counter() - t
    finetune(drafts["upgraded (no finetune)"], os.path.join(work, "warm"), FinetuneOptions(
        target=target_dir, eval=None, force=True, data=data, train=TrainOptions(steps=0)))
    drafts["upgraded + warm start only (--steps 0)"] = os.path.join(work, "warm")
    drafts["upgraded + finetune"] = os.path.join(work, "tuned")
    drafts["EAGLE-3.1 from scratch"] = write("eagle31", BUNDLED["EAGLE-3.1 from scratch"])[0]  # kept: lossless
    data, training = report.data, report.training
    print(f"upgrade {upgrade_s:.1f} s; finetune {finetune_s:.0f} s: data {data['seconds']:.0f} s "
          f"({data['sequences']} sequences, {data['positions']} positions{', cached' if data['reused'] else ''}), "
          f"training {training['seconds']:.0f} s for {training['steps']} steps "
          f"({training['steps'] / FROM_SCRATCH_STEPS:.0%} of the from-scratch budget), "
          f"final loss {training['history'][-1]['loss']:.3f}")

    target = load_target(target_dir, dtype=args.dtype)
    info = read_target(target_dir)
    opts = EvalOptions(limit=args.limit, max_new_tokens=args.max_new_tokens, k=3,
                       context_tokens=(0, args.context_tokens))
    name, prompts = held_out_prompts(opts)
    print(f"held out: {name}, {len(prompts)} prompts x {args.max_new_tokens} new tokens, k=3, {args.dtype}")
    print("| drafter | τ short (± SE) | per position | τ +%d (± SE) | per position |" % args.context_tokens)
    print("|---|---|---|---|---|")
    results = {}
    for label, path in drafts.items():
        spec = apply_target(load_draft(path), info)
        drafter = Drafter.from_spec(spec, dtype=target.dtype, embed_tokens=target.embed_tokens,
                                    lm_head=target.lm_head)
        row = [acceptance(target, drafter, spec.aux.ids, prompts, opts, c) for c in opts.context_tokens]
        results[label] = row
        cells = [f"{a.acceptance_length:.3f} ± {standard_error(a):.3f} | {' '.join(f'{r:.2f}' for r in a.per_position)}"
                 for a in row]
        print(f"| {label} | {' | '.join(cells)} |", flush=True)
    base, tuned = results["EAGLE-3"], results["upgraded + finetune"]
    gain = [tuned[i].acceptance_length - base[i].acceptance_length for i in range(2)]
    print(f"fine-tuned 3.1 vs its EAGLE-3 source: τ {gain[0]:+.3f} short (goal +0.05), {gain[1]:+.3f} at "
          f"+{args.context_tokens} (goal +0.10)")


if __name__ == "__main__":
    main()
