"""eaglekit's reference decode against the real vLLM engine, for the bundled SmolLM2 drafters.

    scripts/vllm-env.sh && python bench/bench_engine.py                  # fp32 and bf16, 4 prompts x 48 tokens
    python bench/bench_engine.py --dtypes float32 --limit 2 --max-new-tokens 32

For each drafter (the bundled EAGLE-3 as shipped, the same upgraded losslessly, the bundled EAGLE-3.1 upgraded
keeping its trained norms) and dtype: τ and per-position acceptance from the reference and from vLLM's own counters, the
verdict of `verify --engine both`, and tokens/s of both engines (vLLM eager, one sequence at a time, as the
comparison runs it; engine start-up excluded). Needs vLLM in its own environment (EAGLEKIT_VLLM_PYTHON, or
.vllm-env from scripts/vllm-env.sh). Figures are printed, never asserted.
"""

from __future__ import annotations

import argparse
import os
import platform
import sys
import tempfile

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)
DRAFTERS = os.path.join(REPO, "examples", "drafters")


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--target", help="SmolLM2 directory (default: .cache/smollm2, materialised if missing)")
    p.add_argument("--dtypes", default="float32,bfloat16")
    p.add_argument("--limit", type=int, default=4)
    p.add_argument("--max-new-tokens", type=int, default=48)
    p.add_argument("-k", type=int, default=3)
    args = p.parse_args(argv)
    os.environ.setdefault("EAGLEKIT_VLLM_PYTHON", os.path.join(REPO, ".vllm-env", "bin", "python"))

    from eaglekit import VerifyOptions, verify_draft
    from eaglekit.runtime.engine import EngineOptions
    from eaglekit.upgrade import UpgradeOptions, upgrade
    from examples.smollm2 import materialize_smollm2

    target = args.target or materialize_smollm2(os.path.join(REPO, ".cache", "smollm2"))
    work = tempfile.mkdtemp(prefix="bench-engine-")
    # lossless both: the EAGLE-3 drafter gains no 3.1 flag, the 3.1 drafter keeps its trained ones
    keep = {"smollm2-135m-eagle3": UpgradeOptions(target=target, fc_norm=False, norm_output=False),
            "smollm2-135m-eagle3.1": UpgradeOptions(target=target)}
    drafts = {"EAGLE-3 as shipped (SpecForge layout)": os.path.join(DRAFTERS, "smollm2-135m-eagle3")}
    for label, name in (("EAGLE-3 upgraded", "smollm2-135m-eagle3"), ("EAGLE-3.1 upgraded", "smollm2-135m-eagle3.1")):
        out = os.path.join(work, name)
        upgrade(os.path.join(DRAFTERS, name), out, keep[name])
        drafts[label] = out
    print(f"# {platform.processor() or platform.machine()}, {os.cpu_count()} CPUs; {args.limit} prompts x "
          f"{args.max_new_tokens} tokens, k={args.k}")
    print("| drafter | dtype | τ reference | τ vLLM | per position (vLLM) | verdict | tok/s ref spec / target | "
          "tok/s vLLM spec / target |")
    print("|---|---|---|---|---|---|---|---|")
    for dtype in args.dtypes.split(","):
        for label, path in drafts.items():
            options = VerifyOptions(num_speculative_tokens=args.k, max_new_tokens=args.max_new_tokens,
                                    limit=args.limit, device="cpu", dtype=dtype, engine="both",
                                    engine_options=EngineOptions())
            report = verify_draft(path, target, options)
            e, cmp = report.engine, report.engine_comparison
            seconds = e["timings"]
            reference = f"{report.acceptance_length:.3f}"
            if cmp["reference_as_served_acceptance_length"] is not None:
                reference += f" (as served: {cmp['reference_as_served_acceptance_length']:.3f})"
            print(f"| {label} | {dtype} | {reference} | {e['acceptance_length']:.3f} | "
                  f"{' '.join(f'{r:.2f}' for r in e['per_position_acceptance'])} | {cmp['verdict']} | "
                  f"{report.tokens_per_s_spec:.1f} / {report.tokens_per_s_target:.1f} | "
                  f"{seconds['tokens_per_s_spec']:.1f} / {seconds['tokens_per_s_target']:.1f} |", flush=True)


if __name__ == "__main__":
    main()
