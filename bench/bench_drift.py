"""Attention drift by context length: verify's per-depth diagnostics (the RMS of the hidden state each draft step is
fed, the attention that step pays to the first position) for each drafter at each context length, beside the
acceptance at that depth.

    python bench/bench_drift.py                                  # both bundled drafters, 0/2048/4096/7168, k = 6
    python bench/bench_drift.py --limit 8 --out bench/results/drift-by-context.json

EAGLE 3.1's norm_output feeds the next step the normed hidden state, which its authors give as the fix for the
drift that grows with depth and with context; this prints where that drift shows and whether acceptance follows
it. Each drafter is one verify sweep (eaglekit.verify.run.verify_conditions: the target and the drafter loaded
once, every context on the same prompts). The table and how it was measured (command, machine, date, load average)
go to --out, a JSON record whose quoted rows are the printed table's, with each condition's whole drift and
acceptance rows. Figures are printed, never asserted.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import sys
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)

DRAFTERS = os.path.join(REPO, "examples", "drafters")
DEFAULT_DRAFTS = [f"EAGLE-3={os.path.join(DRAFTERS, 'smollm2-135m-eagle3')}",
                  f"EAGLE-3.1={os.path.join(DRAFTERS, 'smollm2-135m-eagle3.1')}"]
HEADER = ("| drafter | context | τ | acceptance, depth 1 → k | sink attention, depth 1 → k | "
          "hidden RMS fed, depth 1 → k | prompts |")


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--target", help="SmolLM2 directory (default: .cache/smollm2, materialised if missing)")
    p.add_argument("--drafts", nargs="+", default=DEFAULT_DRAFTS, metavar="NAME=PATH",
                   help="drafters, one row group each (default: the bundled EAGLE-3 and EAGLE-3.1 drafters)")
    p.add_argument("--contexts", default="0,2048,4096,7168", help="context lengths in tokens, a list")
    p.add_argument("--template", default="chat")
    p.add_argument("-k", type=int, default=6)
    p.add_argument("--limit", type=int, default=8, help="first N bundled prompts")
    p.add_argument("--max-new-tokens", type=int, default=64)
    p.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    p.add_argument("--out", help="JSON record of the figures (default: none)")
    return p.parse_args(argv)


def ends(values: list, spec: str) -> str:
    """A per-depth series as its first and last value, the way drift reads: where it starts, where it ends."""
    shown = ["—" if v is None else format(v, spec) for v in (values[0], values[-1])]
    return " → ".join(shown)


def rows_of(name: str, condition: dict) -> list[str]:
    interval = condition["acceptance_length_interval"]
    tau = f"{condition['acceptance_length']:.2f}" + (f" [{interval['low']:.2f}, {interval['high']:.2f}]"
                                                     if interval else "")
    drift = condition["drift"]
    return [name, f"{condition['prompts']['context_tokens']:,}", tau,
            ends(condition["per_position_acceptance"], ".2f"),
            ends([row["sink_attention"] for row in drift], ".3f"),
            ends([row["hidden_rms"] for row in drift], ".3g"), str(condition["prompts"]["count"])]


def main(argv=None) -> None:
    args = parse_args(argv)
    from eaglekit.cli.output import int_list, write_text_atomically
    from eaglekit.cli.progress import ProgressLog
    from eaglekit.decode.options import VerifyOptions
    from eaglekit.errors import EaglekitError
    from eaglekit.verify.run import verify_conditions
    from examples.smollm2 import materialize_smollm2

    try:
        contexts = int_list(args.contexts, "--contexts", "0,2048,4096,7168")
    except EaglekitError as exc:
        sys.exit(f"error: {exc}")
    drafts = dict(spec.split("=", 1) for spec in args.drafts)
    args.target = args.target or materialize_smollm2(os.path.join(REPO, ".cache", "smollm2"))

    import torch

    host = (f"{platform.processor() or platform.machine()}, {os.cpu_count()} CPUs, torch {torch.__version__}, "
            f"{torch.get_num_threads()} threads")
    load_before = os.getloadavg()
    print(f"# {host}, {args.dtype}, k={args.k}, {args.limit} prompts x {args.max_new_tokens} new tokens, template "
          f"{args.template}; load average {load_before[0]:.1f}")
    print(HEADER)
    print("|" + "---|" * HEADER.count(" | ") + "---|")
    options = VerifyOptions(num_speculative_tokens=args.k, max_new_tokens=args.max_new_tokens, limit=args.limit,
                            context_tokens=tuple(contexts), template=args.template, device="cpu", dtype=args.dtype)
    measured, table, started = {}, [], time.perf_counter()
    for name, path in drafts.items():
        with ProgressLog(f"bench_drift: {name}", True) as progress:
            doc = verify_conditions(path, args.target, options, progress=progress).to_dict()
        measured[name] = [{key: condition[key] for key in ("context_tokens", "acceptance_length",
                                                           "acceptance_length_interval", "per_position_acceptance",
                                                           "drift", "num_drafts")}
                          for condition in doc["conditions"]]
        for condition in doc["conditions"]:
            table.append(rows_of(name, condition))
            print("| " + " | ".join(table[-1]) + " |", flush=True)
    seconds, load_after = time.perf_counter() - started, os.getloadavg()
    print(f"<!-- {seconds:.0f} s; load average {load_before[0]:.1f} before, {load_after[0]:.1f} after -->")
    if not args.out:
        return
    command = " ".join(["python", "bench/bench_drift.py", *(argv if argv is not None else sys.argv[1:])])
    date = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d (%H:%M:%S UTC)")
    record = {
        "what": f"verify's drift diagnostics per draft depth by context length ({', '.join(drafts)}), "
                f"k = {args.k}, {args.limit} prompts x {args.max_new_tokens} tokens, {args.template} template",
        "command": command,
        "machine": f"{host}; load average {load_before[0]:.2f} before and {load_after[0]:.2f} after",
        "date": date,
        "source": "measured here by the command; its own output is kept in raw",
        "raw": {"seconds": round(seconds),
                "settings": {key: value for key, value in vars(args).items() if key not in ("target", "drafts", "out")},
                "drafts": {name: os.path.relpath(path, REPO) for name, path in drafts.items()},
                "measured": measured},
        "quoted": [{"in": "docs/benchmarks.md", "table": HEADER, "rows": table, "recorded_in": f"this run {date}"}],
    }
    write_text_atomically(args.out, json.dumps(record, indent=1, ensure_ascii=False) + "\n")
    print(f"<!-- written to {args.out} -->")


if __name__ == "__main__":
    main()
