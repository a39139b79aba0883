"""Where EAGLE-3.1 acts: each drafter paired against a reference drafter (the EAGLE-3 source) across k, context
length and prompt template.

    python bench/bench_robustness.py                  # the bundled EAGLE-3.1 drafter, the full grid (hours on 2 cores)
    python bench/bench_robustness.py --limit 2 --max-new-tokens 16 --k 3 --contexts 0      # a smoke run
    python bench/bench_robustness.py --reference ./eagle3 --drafts tuned=./eagle3.1-tuned scratch=./eagle3.1 \\
        --k 3 --contexts 0,2048 --templates chat,raw

For every k, one sweep for all drafters (eaglekit.decode.compare.compare_against): the target and every drafter
are loaded once, the target decodes each prompt once per condition (template x context length) and every drafter
is replayed on that pass.
A cell is τ(drafter) − τ(reference) on identical text with its paired 95 % bootstrap interval over prompts
(templates: eaglekit.decode.prompts.TEMPLATES). Figures are printed, never asserted.
"""

from __future__ import annotations

import argparse
import os
import platform
import sys
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)

from eaglekit.cli.output import conditions, int_list  # noqa: E402
from eaglekit.decode.compare import compare_against  # noqa: E402
from eaglekit.decode.options import VerifyOptions  # noqa: E402
from eaglekit.errors import EaglekitError  # noqa: E402

DRAFTERS = os.path.join(REPO, "examples", "drafters")
REFERENCE = os.path.join(DRAFTERS, "smollm2-135m-eagle3")
BUNDLED = {"EAGLE-3.1": os.path.join(DRAFTERS, "smollm2-135m-eagle3.1")}


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--target", help="SmolLM2 directory (default: .cache/smollm2, materialised if missing)")
    p.add_argument("--reference", default=REFERENCE, help="the drafter every other is paired against (default: the "
                                                          "bundled EAGLE-3 drafter)")
    p.add_argument("--drafts", nargs="+", metavar="NAME=PATH",
                   help="drafters to measure, one row each (default: the bundled EAGLE-3.1 drafter)")
    p.add_argument("--k", default="3,6", help="drafts per round, a list (default: 3,6)")
    p.add_argument("--contexts", default="0,1024,2048,4096", help="context lengths in tokens, a list")
    p.add_argument("--templates", default="chat,system,raw", help="prompt templates, a list")
    p.add_argument("--prompts", help="JSONL or SPEED-Bench file (default: the bundled coding prompts)")
    p.add_argument("--limit", type=int, help="first N prompts (default: all)")
    p.add_argument("--max-new-tokens", type=int, default=64)
    p.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    p.add_argument("--device", default="cpu")
    return p.parse_args(argv)


def named(drafts: list[str] | None) -> dict[str, str]:
    """NAME=PATH arguments (a bare PATH is named by its folder)."""
    if not drafts:
        return dict(BUNDLED)
    out = {}
    for item in drafts:
        name, _, path = item.partition("=")
        if not path:
            name, path = os.path.basename(os.path.normpath(item)), item
        out[name] = path
    return out


def cell(difference: dict) -> str:
    interval = difference["interval"]
    span = f" [{interval['low']:+.3f}, {interval['high']:+.3f}]" if interval else ""
    return f"{difference['acceptance_length_difference']:+.3f}{span}"


def main(argv=None) -> None:
    args = parse_args(argv)
    try:
        ks = int_list(args.k, "--k", "3,6")
        sweep = conditions(args.contexts, args.templates)
        grid = [VerifyOptions(num_speculative_tokens=k, max_new_tokens=args.max_new_tokens, prompts_file=args.prompts,
                              limit=args.limit, device=args.device, dtype=args.dtype, **sweep) for k in ks]
        for options in grid:
            options.check()
    except EaglekitError as exc:
        sys.exit(f"error: {exc}")
    import torch

    from examples.smollm2 import materialize_smollm2

    target = args.target or materialize_smollm2(os.path.join(REPO, ".cache", "smollm2"))
    drafts = named(args.drafts)
    columns = [(options.num_speculative_tokens, c) for options in grid for c in options.conditions]
    reference_name = os.path.basename(os.path.normpath(args.reference))
    print(f"# {platform.processor() or platform.machine()}, {torch.get_num_threads()} torch threads, "
          f"torch {torch.__version__}, {args.dtype} on {args.device}, {args.max_new_tokens} new tokens per prompt, "
          f"{args.limit or 'all'} prompts; each cell τ(drafter) − τ({reference_name}) [paired 95 %]")
    print("| drafter | " + " | ".join(f"k={k} {c.label}" for k, c in columns) + " |")
    print("|---|" + "---|" * len(columns))
    cells: dict[str, list[str]] = {name: [] for name in drafts}
    start = time.perf_counter()
    for options in grid:
        try:
            sweeps = compare_against(args.reference, list(drafts.values()), target, options)
        except EaglekitError as exc:
            sys.exit(f"error: {exc}")
        for name, sweep in zip(drafts, sweeps):
            cells[name] += [cell(report.rows()["all"]["b_minus_a"]) for report in sweep.reports]
    for name in drafts:
        print(f"| {name} | {' | '.join(cells[name])} |")
    print(f"<!-- {len(drafts)} drafters in {time.perf_counter() - start:.0f} s -->", flush=True)

if __name__ == "__main__":
    main()
