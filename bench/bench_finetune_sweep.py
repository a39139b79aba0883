"""A small sweep of finetune recipes over seeds on the bundled example: which recipe gains over its source?

    nice python bench/bench_finetune_sweep.py                       # every recipe x seeds 0,1,2, k = 3
    nice python bench/bench_finetune_sweep.py --recipes answers,mixed --seeds 0 --limit 8 -k 3,5

Each recipe fine-tunes the default upgrade of the bundled EAGLE-3 drafter (written with --keep-unresolved, so
every result can be measured), then every result is replayed beside the EAGLE-3 source on one target pass per
prompt and condition (`compare_against`, once per k): verify's bundled coding prompts, every template and
context setting. The table gives, per recipe and k x condition, the paired τ difference against the source: the
mean over seeds and min..max. The upgraded draft (what the default `finetune` keeps when no step gains) also gets
each cell's 95 % paired interval from the compare report, with the cells resolved worse or better named.
Figures are printed, never asserted.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from typing import Any

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)

EAGLE3 = os.path.join(REPO, "examples", "drafters", "smollm2-135m-eagle3")
RECIPES: dict[str, tuple[dict[str, Any], dict[str, Any]]] = {  # name: (data options, train options)
    "default": ({}, {}),
    "answers": ({"generate": 96}, {}),
    "mixed": ({"generate": 96, "templates": ("chat", "system", "raw")}, {}),
    "mixed-lr1e-3-depth5": ({"generate": 96, "templates": ("chat", "system", "raw")},
                            {"lr": 1e-3, "steps": 200, "depth": 5}),
}


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--target", help="SmolLM2 directory (default: .cache/smollm2, materialised if missing)")
    p.add_argument("--recipes", default=",".join(RECIPES))
    p.add_argument("--seeds", default="0,1,2")
    p.add_argument("--data-limit", type=int, help="training prompts (default: all 535)")
    p.add_argument("--limit", type=int, default=16, help="held-out prompts (of the 16 bundled coding prompts)")
    p.add_argument("--max-new-tokens", type=int, default=64)
    p.add_argument("--templates", default="chat,system,raw")
    p.add_argument("--context-tokens", default="0,1024")
    p.add_argument("-k", default="3", help="speculative tokens, a comma list: one compare pass per k")
    p.add_argument("--work", help="folder for the drafts (default: a temporary one; drafts already there are reused)")
    return p.parse_args(argv)


def main(argv=None) -> None:
    args = parse_args(argv)
    started = time.perf_counter()
    from eaglekit.capture.plan import DataOptions
    from eaglekit.decode.compare import compare_against
    from eaglekit.decode.options import VerifyOptions
    from eaglekit.finetune.options import FinetuneOptions
    from eaglekit.finetune.run import finetune
    from eaglekit.finetune.train import TrainOptions
    from eaglekit.upgrade import UpgradeOptions, upgrade
    from examples.smollm2 import materialize_smollm2

    target = args.target or materialize_smollm2(os.path.join(REPO, ".cache", "smollm2"))
    work = args.work or tempfile.mkdtemp(prefix="bench-finetune-sweep-")
    os.makedirs(work, exist_ok=True)
    source = os.path.join(work, "eagle3")
    start = os.path.join(work, "upgraded")
    if not os.path.isfile(os.path.join(start, "config.json")):
        upgrade(EAGLE3, source, UpgradeOptions(target=target, fc_norm=False, norm_output=False, force=True))
        upgrade(EAGLE3, start, UpgradeOptions(target=target, force=True))
    seeds = [int(s) for s in args.seeds.split(",")]
    drafts: dict[str, list[str]] = {}
    for name in args.recipes.split(","):
        data, train = RECIPES[name]
        for seed in seeds:
            out = os.path.join(work, f"{name}-{seed}")
            if os.path.isfile(os.path.join(out, "config.json")):  # a --work folder of an earlier run: kept
                drafts.setdefault(name, []).append(out)
                continue
            finetune(start, out, FinetuneOptions(
                target=target, eval=None, force=True, keep_unresolved=True,
                data=DataOptions(limit=args.data_limit, **data),
                train=TrainOptions(seed=seed, **train)))
            drafts.setdefault(name, []).append(out)
            print(f"# trained {name} seed {seed}", flush=True)
    labels = ["upgraded"] + [name for name in drafts for _ in seeds]
    columns: list[str] = []
    differences: list[list[dict]] = [[] for _ in labels]  # per draft, per column: the report's b_minus_a
    for k in (int(k) for k in args.k.split(",")):
        options = VerifyOptions(num_speculative_tokens=k, max_new_tokens=args.max_new_tokens, limit=args.limit,
                                context_tokens=tuple(int(c) for c in args.context_tokens.split(",")),
                                template=tuple(args.templates.split(",")), device="cpu", dtype="float32")
        sweeps = compare_against(source, [start] + [d for ds in drafts.values() for d in ds], target, options)
        for condition in sweeps[0].conditions:
            context = f" +{condition.context_tokens}" if condition.context_tokens else ""
            columns.append(f"k={k} {condition.template}{context}")
        for draft_differences, sweep in zip(differences, sweeps):
            draft_differences.extend(r.rows()["all"]["b_minus_a"] for r in sweep.reports)
        print(f"# compared at k={k} ({time.perf_counter() - started:.0f} s)", flush=True)
    print(f"\nheld out: {args.limit} bundled coding prompts x {args.max_new_tokens} new tokens; paired τ difference "
          f"against the EAGLE-3 source, mean over seeds {seeds} [min..max]")
    print("| recipe | " + " | ".join(columns) + " |")
    print("|---|" + "---|" * len(columns))
    by_recipe: dict[str, list] = {}
    for label, draft_differences in zip(labels, differences):
        by_recipe.setdefault(label, []).append(draft_differences)
    for label, runs in by_recipe.items():
        cells = []
        for i in range(len(columns)):
            diffs = [r[i]["acceptance_length_difference"] for r in runs]
            cells.append(f"{statistics.mean(diffs):+.3f} [{min(diffs):+.3f}..{max(diffs):+.3f}]")
        print(f"| {label} | " + " | ".join(cells) + " |", flush=True)
    print("\nupgraded − source per cell, [95 % paired interval] from the compare report:")
    named = {"A better": " resolved worse", "B better": " resolved better"}  # the report's verdict, A = the source
    for column, difference in zip(columns, differences[0]):
        interval = difference["interval"]
        bounds = f"[{interval['low']:+.3f}, {interval['high']:+.3f}]" if interval else "(no interval)"
        print(f"  {column}: {difference['acceptance_length_difference']:+.3f} {bounds}"
              f"{named.get(difference['verdict'], '')}")
    print(f"\nwall time {time.perf_counter() - started:.0f} s")


if __name__ == "__main__":
    main()
