"""Where EAGLE-3.1 acts: each drafter paired against a reference drafter (the EAGLE-3 source) across k, context
length and prompt template.

    python bench/bench_robustness.py                  # the bundled EAGLE-3.1 drafter, the full grid (hours on 2 cores)
    python bench/bench_robustness.py --contexts 0,2048,4096,7168 --k 3,6 --limit 16 \\
        --ledger bench/results/robustness-long-context.json          # the long-context grid (docs/benchmarks.md)
    python bench/bench_robustness.py --limit 2 --max-new-tokens 16 --k 3 --contexts 0      # a smoke run
    python bench/bench_robustness.py --reference ./eagle3 --drafts tuned=./eagle3.1-tuned scratch=./eagle3.1 \\
        --k 3 --contexts 0,2048 --templates chat,raw

The grid is measured one template at a time (eaglekit.decode.compare.compare_across_k): the target and every
drafter are loaded once, the target decodes each prompt once per context length, a shorter context reuses the
longer one's rows it shares, and every drafter is replayed on that pass at every k. After each template its
counters go to the --ledger file (bench/ledger.py) with the time it took, so a rerun with the same ledger and
settings skips what is measured and a grid of hours is paid over several sittings; the table is printed from the
ledger alone. A cell is τ(drafter) − τ(reference) on identical text with its paired 95 % bootstrap interval over
prompts (templates: eaglekit.decode.prompts.TEMPLATES). Figures are printed, never asserted.
"""

from __future__ import annotations

import argparse
import os
import platform
import sys
import tempfile

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)

from bench.ledger import Ledger, Replay, replay_by_template  # noqa: E402
from eaglekit.cli.output import conditions, int_list  # noqa: E402
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
    p.add_argument("--ledger", help="JSON file of the counters, added to after each template and read by a rerun "
                                    "(default: a new temporary file)")
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


def main(argv=None) -> None:
    args = parse_args(argv)
    try:
        ks = int_list(args.k, "--k", "3,6")
        grid = VerifyOptions(num_speculative_tokens=max(ks), max_new_tokens=args.max_new_tokens,
                             prompts_file=args.prompts, limit=args.limit, device=args.device, dtype=args.dtype,
                             **conditions(args.contexts, args.templates))
        grid.check()
    except EaglekitError as exc:
        sys.exit(f"error: {exc}")
    drafts = named(args.drafts)
    columns = [f"k={k} {c.label}" for k in ks for c in grid.conditions]
    ledger = Ledger(args.ledger or os.path.join(tempfile.mkdtemp(prefix="bench-robustness-"), "ledger.json"), {
        "reference": os.path.relpath(args.reference, REPO), "prompts": args.prompts, "limit": args.limit,
        "max_new_tokens": args.max_new_tokens, "dtype": args.dtype,
        "drafts": {name: os.path.relpath(path, REPO) for name, path in drafts.items()}}, columns)
    if not all(ledger.has(name) for name in drafts):
        measure(args, ledger, drafts, grid, ks)
    ledger.print_tables(list(drafts), [])
    spent = ledger.data.get("sittings", [])
    print(f"<!-- {len(drafts)} drafters, {len(columns)} columns: {sum(s['seconds'] for s in spent):.0f} s wall, "
          f"{sum(s['cpu_seconds'] for s in spent):.0f} s CPU over {len(spent)} part(s) -->", flush=True)


def measure(args, ledger: Ledger, drafts: dict[str, str], grid, ks: list[int]) -> None:
    """The templates the ledger does not hold yet, one compare_across_k each, into the ledger."""
    import torch

    from examples.smollm2 import materialize_smollm2

    target = args.target or materialize_smollm2(os.path.join(REPO, ".cache", "smollm2"))
    print(f"# {platform.processor() or platform.machine()}, {torch.get_num_threads()} torch threads, "
          f"torch {torch.__version__}, {args.dtype} on {args.device}, {args.max_new_tokens} new tokens per prompt, "
          f"{args.limit or 'all'} prompts; counters to {ledger.path}", flush=True)
    replay_by_template([Replay(ledger, drafts)], args.reference, target, grid, ks, "bench_robustness")


if __name__ == "__main__":
    main()
