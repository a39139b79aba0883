"""Serving speed-up of the bundled SmolLM2 drafters in vLLM at each concurrency: `eaglekit bench` for both.

    scripts/vllm-env.sh && python bench/bench_serving.py                        # CPU: C = 1, 2, 4
    python bench/bench_serving.py --concurrency 1,2 --max-new-tokens 32         # quicker
    VLLM_PACKAGE=vllm scripts/vllm-env.sh && python bench/bench_serving.py --concurrency 1,4,16 \\
        --tensor-parallel-size 1                                                 # a CUDA machine

Each drafter is upgraded losslessly first (the EAGLE-3 one gains no 3.1 flag, the EAGLE-3.1 one keeps its trained
norms), as vLLM must read it. For each: vLLM's server alone and with the draft (bfloat16), driven by vLLM's own
benchmark client over the bundled held-out coding prompts; per concurrency the mean per-user output tokens/s both
ways, the speed-up with its paired 95 % interval, TPOT, TTFT, total throughput and the engine's τ. Needs vLLM in
its own environment (EAGLEKIT_VLLM_PYTHON, or .vllm-env from scripts/vllm-env.sh). Figures are printed, never
asserted.
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


class Printed:
    """Each stage the bench reports, as a line on stderr."""

    def stage(self, name: str, total: int | None = None, unit: str = "") -> None:
        print(name, file=sys.stderr)

    def advance(self, n: int = 1) -> None:
        pass

    def done(self) -> None:
        pass


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--target", help="SmolLM2 directory (default: .cache/smollm2, materialised if missing)")
    p.add_argument("--concurrency", default="1,2,4")
    p.add_argument("--max-new-tokens", type=int, default=64)
    p.add_argument("--dtype", default="bfloat16")
    p.add_argument("--tensor-parallel-size", type=int, default=1)
    p.add_argument("-k", type=int, default=3)
    args = p.parse_args(argv)
    os.environ.setdefault("EAGLEKIT_VLLM_PYTHON", os.path.join(REPO, ".vllm-env", "bin", "python"))

    from eaglekit.bench.run import BenchOptions, run_bench
    from eaglekit.progress import Within
    from eaglekit.runtime.engine import EngineOptions
    from eaglekit.upgrade import UpgradeOptions, upgrade
    from examples.smollm2 import materialize_smollm2

    target = args.target or materialize_smollm2(os.path.join(REPO, ".cache", "smollm2"))
    work = tempfile.mkdtemp(prefix="bench-serving-")
    keep = {"EAGLE-3": ("smollm2-135m-eagle3", UpgradeOptions(target=target, fc_norm=False, norm_output=False)),
            "EAGLE-3.1": ("smollm2-135m-eagle3.1", UpgradeOptions(target=target))}
    options = BenchOptions(concurrency=tuple(int(c) for c in args.concurrency.split(",")),
                           num_speculative_tokens=args.k, max_new_tokens=args.max_new_tokens, dtype=args.dtype,
                           engine_options=EngineOptions(tensor_parallel_size=args.tensor_parallel_size))
    reports = {}
    for label, (name, upgrade_options) in keep.items():
        out = os.path.join(work, name)
        upgrade(os.path.join(DRAFTERS, name), out, upgrade_options)
        reports[label] = run_bench(out, target, options, progress=Within(Printed(), f"[{label}]"))
    engine = next(iter(reports.values())).engine
    print(f"# vLLM {engine['version']} on {engine['device_name']} ({engine['device_type']}), {args.dtype}, "
          f"k={args.k}, {next(iter(reports.values())).prompts['count']} held-out prompts, up to "
          f"{args.max_new_tokens} new tokens, greedy; {platform.python_version()}")
    print("| drafter | C | per-user tok/s alone | with draft | speed-up (95 %) | TPOT ms | TTFT ms | "
          "total tok/s | τ (engine) | same text |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for label, report in reports.items():
        for row in report.rows:
            base, spec = row.baseline, row.speculative
            iv = row.speed_up_interval
            interval = f" ({iv.low:.2f}–{iv.high:.2f})" if iv else ""
            print(f"| {label} | {row.concurrency} | {base.per_user.mean:.1f} | {spec.per_user.mean:.1f} | "
                  f"{row.speed_up:.2f}×{interval} | {base.tpot_ms.mean:.1f} → {spec.tpot_ms.mean:.1f} | "
                  f"{base.ttft_ms.mean:.0f} → {spec.ttft_ms.mean:.0f} | {base.output_throughput:.1f} → "
                  f"{spec.output_throughput:.1f} | {row.acceptance_length or 0:.2f} | "
                  f"{row.identical_outputs}/{len(base.per_user_rates)} |")
    for label, report in reports.items():
        for verdict in report.verdicts:
            print(f"- {label}: {verdict.text}")


if __name__ == "__main__":
    main()
