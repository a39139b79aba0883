"""What `compare` costs at long context: wall time and peak memory of the bundled drafters' comparison on SmolLM2
per --context-tokens value, up to the target's 8192-token context.

    python bench/bench_long_context.py                                   # 0/2048/4096/7168, 2 prompts, 64 tokens
    python bench/bench_long_context.py --limit 2 --contexts 0,2048,7168 --together
    python bench/bench_long_context.py --prefill-chunk 0 ...             # one forward per pass, nothing shared
    python bench/bench_long_context.py --against-one-forward ...         # each run, then again with one forward

Each context is measured in a process of its own (compare_conditions: load, decode, replay both drafters), so its
peak RSS is its own; --together adds one run over every context at once, where a longer context takes the rows of
the prompt it shares with a shorter one. Printed per run: wall and CPU seconds, peak RSS, the target rows computed
and taken from an earlier pass over the same prompt (eaglekit.decode.prefix), and τ of both drafters. The figures
and how they were measured (command, machine, date, load average before and after) go to --out, a JSON file, with
every prompt's counters: equal with and without chunks when the chunked prefill decodes what one forward decodes.
Figures are printed, never asserted: the machine this runs on is often shared, so read the load average beside them.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import resource
import subprocess
import sys
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)

DRAFTERS = os.path.join(REPO, "examples", "drafters")
REFERENCE = os.path.join(DRAFTERS, "smollm2-135m-eagle3")
DRAFT = os.path.join(DRAFTERS, "smollm2-135m-eagle3.1")
DEFAULT_OUT = os.path.join(REPO, "bench", "results", "long-context.json")


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--target", help="SmolLM2 directory (default: .cache/smollm2, materialised if missing)")
    p.add_argument("--reference", default=REFERENCE, help="draft A (default: the bundled EAGLE-3 drafter)")
    p.add_argument("--draft", default=DRAFT, help="draft B (default: the bundled EAGLE-3.1 drafter)")
    p.add_argument("--contexts", default="0,2048,4096,7168", help="context lengths in tokens, a list")
    p.add_argument("--limit", type=int, default=2, help="first N bundled prompts")
    p.add_argument("--max-new-tokens", type=int, default=64)
    p.add_argument("-k", type=int, default=3)
    p.add_argument("--prefill-chunk", type=int, default=512, help="prompt rows per forward; 0: one forward per pass "
                                                                   "and nothing shared between passes")
    p.add_argument("--together", action="store_true", help="also one run over every context at once")
    p.add_argument("--against-one-forward", action="store_true",
                   help="each run again right after it with --prefill-chunk 0, so both meet the same machine load")
    p.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    p.add_argument("--out", default=DEFAULT_OUT, help=f"JSON file of the figures (default: {DEFAULT_OUT})")
    p.add_argument("--child", help=argparse.SUPPRESS)  # the contexts one measuring process runs
    return p.parse_args(argv)


def measure(args) -> dict:
    """One compare over the --child contexts, in this process: seconds, peak RSS and the target's rows."""
    from eaglekit.cli.output import int_list
    from eaglekit.decode import compare as compare_module
    from eaglekit.decode.options import VerifyOptions

    prefixes = []

    class Counted(compare_module.SharedPrefix):
        def __init__(self, *a, **kw):
            super().__init__(*a, **kw)
            prefixes.append(self)

    compare_module.SharedPrefix = Counted
    contexts = int_list(args.child, "--child", "0,2048")
    options = VerifyOptions(num_speculative_tokens=args.k, max_new_tokens=args.max_new_tokens, limit=args.limit,
                            context_tokens=contexts if len(contexts) > 1 else contexts[0], device="cpu",
                            dtype=args.dtype, prefill_chunk=args.prefill_chunk or None)
    start = time.perf_counter()
    sweep = compare_module.compare_conditions(args.reference, args.draft, args.target, options)
    seconds = time.perf_counter() - start
    rows = [report.rows()["all"] for report in sweep.reports]
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return {"contexts": list(contexts), "prefill_chunk": args.prefill_chunk, "seconds": round(seconds, 1),
            "cpu_seconds": round(usage.ru_utime + usage.ru_stime, 1),
            "peak_rss_mib": round(usage.ru_maxrss / 1024),
            "target_rows_computed": sum(p.computed_rows for p in prefixes),
            "target_rows_reused": sum(p.reused_rows for p in prefixes),
            "tau_a": [row["a"]["acceptance_length"] for row in rows],
            "tau_b": [row["b"]["acceptance_length"] for row in rows],
            "counters_a": [[c.drafts, c.accepted_at] for r in sweep.reports for c in r.a.counters],
            "counters_b": [[c.drafts, c.accepted_at] for r in sweep.reports for c in r.b.counters]}


def run_child(args, contexts: str, chunk: int) -> dict:
    command = [sys.executable, os.path.abspath(__file__), "--child", contexts, "--target", args.target,
               "--reference", args.reference, "--draft", args.draft, "--limit", str(args.limit),
               "--max-new-tokens", str(args.max_new_tokens), "-k", str(args.k),
               "--prefill-chunk", str(chunk), "--dtype", args.dtype]
    done = subprocess.run(command, capture_output=True, text=True)
    if done.returncode:
        sys.exit(f"error: the run at --context-tokens {contexts} failed: "
                 f"{(done.stderr.strip().splitlines() or ['no message'])[-1]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def machine() -> dict:
    import torch

    return {"processor": platform.processor() or platform.machine(),
            "cpus": os.cpu_count(), "torch": torch.__version__, "torch_threads": torch.get_num_threads(),
            "omp_num_threads": os.environ.get("OMP_NUM_THREADS")}


def row(run: dict) -> str:
    label = ",".join(str(c) for c in run["contexts"])
    prefill = f"{run['prefill_chunk']}-token chunks" if run["prefill_chunk"] else "one forward"
    taus = " / ".join(f"{a:.3f} · {b:.3f}" for a, b in zip(run["tau_a"], run["tau_b"]))
    return (f"| {label} | {prefill} | {run['seconds']:.0f} | {run['cpu_seconds']:.0f} | {run['peak_rss_mib']} | "
            f"{run['target_rows_computed']:,} | {run['target_rows_reused']:,} | {taus} |")


def main(argv=None) -> None:
    args = parse_args(argv)
    if args.child:
        print(json.dumps(measure(args)))
        return
    from eaglekit.cli.output import int_list, write_text_atomically
    from eaglekit.errors import EaglekitError
    from examples.smollm2 import materialize_smollm2

    try:
        contexts = int_list(args.contexts, "--contexts", "0,2048,4096,7168")
    except EaglekitError as exc:
        sys.exit(f"error: {exc}")
    args.target = args.target or materialize_smollm2(os.path.join(REPO, ".cache", "smollm2"))
    host, load_before = machine(), os.getloadavg()
    chunk = f"prefill in {args.prefill_chunk}-token chunks" if args.prefill_chunk else "one forward per pass"
    print(f"# {host['processor']}, {host['cpus']} CPUs, {host['torch_threads']} torch threads, torch {host['torch']}, "
          f"{args.dtype}, k={args.k}, {args.limit} prompts x {args.max_new_tokens} new tokens, {chunk}; "
          f"load average {load_before[0]:.1f}")
    print("| context | prefill | seconds | CPU seconds | peak RSS MiB | target rows computed | rows reused | "
          "τ A · τ B |")
    print("|---|---|---|---|---|---|---|---|")
    runs = []
    chunks = [args.prefill_chunk, 0] if args.against_one_forward and args.prefill_chunk else [args.prefill_chunk]
    for spec in [str(c) for c in contexts] + ([",".join(map(str, contexts))] if args.together else []):
        for chunk in chunks:
            runs.append(run_child(args, spec, chunk))
            print(row(runs[-1]), flush=True)
    load_after = os.getloadavg()
    print(f"<!-- load average {load_before[0]:.1f} before, {load_after[0]:.1f} after -->")
    document = {"command": " ".join(["python", "bench/bench_long_context.py", *(argv or sys.argv[1:])]),
                "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
                "machine": host, "load_average": {"before": list(load_before), "after": list(load_after)},
                "settings": {"reference": os.path.relpath(args.reference, REPO),
                             "draft": os.path.relpath(args.draft, REPO), "limit": args.limit,
                             "max_new_tokens": args.max_new_tokens, "k": args.k, "prefill_chunk": args.prefill_chunk,
                             "dtype": args.dtype},
                "runs": runs}
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    write_text_atomically(args.out, json.dumps(document, indent=1) + "\n")
    print(f"<!-- written to {os.path.relpath(args.out)} -->")


if __name__ == "__main__":
    main()
