"""The bundled SmolLM2 drafters against the target as it is served quantized, and what recalibration and finetune on
the quantized target recover.

    python bench/bench_quantized.py                           # 16 held-out prompts x 48 tokens, finetune 200 steps
    python bench/bench_quantized.py --limit 8 --steps 50      # quicker
    python bench/bench_quantized.py --precisions full,nvfp4 --code-tokens 96000   # the recovery, with code data

1. τ of each bundled drafter (the EAGLE-3 one upgraded losslessly; the EAGLE-3.1 one upgraded keeping its trained
   norms) against the target in full precision and with each served format (fp8, int8, int4, nvfp4;
   eaglekit/quantization.py), all in float64 so only the format's rounding differs; the drop against full
   precision.
2. At `--recover` (nvfp4): the EAGLE-3 drafter's default EAGLE-3.1 upgrade calibrated on the full-precision target,
   the same upgrade calibrated on the quantized one (`upgrade --target-quantization`), and that fine-tuned on the
   quantized target's own answers and states (`finetune --target-quantization`, all bundled training prompts);
   as controls, the same fine-tune of the EAGLE-3 drafter itself and of the bundled EAGLE-3.1 drafter. Each is
   paired with the EAGLE-3 drafter on one quantized-target pass per prompt (`eaglekit compare`, 95 % bootstrap),
   with the share of the EAGLE-3 drafter's drop it recovers. Figures are printed, never asserted.
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

DRAFTERS = os.path.join(REPO, "examples", "drafters")
PRECISIONS = (None, "fp8", "int8", "int4", "nvfp4")


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--target", help="SmolLM2 directory (default: .cache/smollm2, materialised if missing)")
    p.add_argument("--limit", type=int, default=16, help="held-out prompts (of the 16 bundled coding prompts)")
    p.add_argument("--max-new-tokens", type=int, default=48)
    p.add_argument("--precisions", default="full,fp8,int8,int4,nvfp4",
                   help="target formats measured in part 1 (full and --recover are always measured)")
    p.add_argument("--recover", default="nvfp4", help="the format recalibration and finetune are measured at")
    p.add_argument("--steps", type=int, default=200, help="finetune steps on the quantized target")
    p.add_argument("--lr", type=float, default=1e-3, help="finetune's default 2e-4 barely moves a drafter this far "
                   "off its training distribution")
    p.add_argument("--data-limit", type=int, help="training prompts (default: all bundled ones)")
    p.add_argument("--generate", type=int, default=64)
    p.add_argument("--code-tokens", type=int, default=0,
                   help="add about this many tokens of standard-library source to the finetune data")
    p.add_argument("--work", help="folder for the drafts written on the way (default: a temporary one)")
    return p.parse_args(argv)


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


def main(argv=None) -> None:
    args = parse_args(argv)
    import torch

    from eaglekit import verify_draft
    from eaglekit.capture.plan import DataOptions
    from eaglekit.decode.compare import compare
    from eaglekit.decode.options import VerifyOptions
    from eaglekit.finetune.options import FinetuneOptions
    from eaglekit.finetune.run import finetune
    from eaglekit.finetune.train import TrainOptions
    from eaglekit.upgrade import UpgradeOptions, upgrade
    from examples.smollm2 import materialize_smollm2

    target = args.target or materialize_smollm2(os.path.join(REPO, ".cache", "smollm2"))
    work = args.work or tempfile.mkdtemp(prefix="bench-quantized-")
    os.makedirs(work, exist_ok=True)
    print(f"# {platform.processor() or platform.machine()}, {torch.get_num_threads()} torch threads, torch "
          f"{torch.__version__}; {args.limit} held-out coding prompts x {args.max_new_tokens} tokens, k = 3, greedy, "
          "float64; drafts in " + work)

    def write(name: str, source: str, **options) -> str:
        path = os.path.join(work, name)
        upgrade(source, path, UpgradeOptions(target=target, force=True, **options))
        return path

    drafts = {"EAGLE-3": write("eagle3", os.path.join(DRAFTERS, "smollm2-135m-eagle3"), fc_norm=False,
                               norm_output=False),
              "EAGLE-3.1": write("eagle31", os.path.join(DRAFTERS, "smollm2-135m-eagle3.1"))}

    def options(quantization: str | None) -> VerifyOptions:
        return VerifyOptions(num_speculative_tokens=3, max_new_tokens=args.max_new_tokens, limit=args.limit,
                             device="cpu", dtype="float64", target_quantization=quantization,
                             as_eaglekit_reads=True)

    print("\n| drafter | target | τ [95 %] | drop vs full | lossless | seconds |")
    print("|---|---|---|---|---|---|")
    taus: dict[tuple[str, str | None], float] = {}
    asked = {None if name == "full" else name for name in args.precisions.split(",")} | {None, args.recover}
    for label, path in drafts.items():
        for quantization in (p for p in PRECISIONS if p in asked):
            started = time.perf_counter()
            report = verify_draft(path, target, options(quantization)).to_dict()
            tau = taus[(label, quantization)] = report["acceptance_length"]
            drop = "—" if quantization is None else f"{tau - taus[(label, None)]:+.3f}"
            print(f"| {label} | {quantization or 'full'} | {interval_cell(report)} | {drop} | "
                  f"{'yes' if report['lossless'] else 'NO'} | {time.perf_counter() - started:.0f} |", flush=True)

    scheme = args.recover
    drop = taus[("EAGLE-3", None)] - taus[("EAGLE-3", scheme)]
    eagle3 = os.path.join(DRAFTERS, "smollm2-135m-eagle3")
    started = time.perf_counter()
    recovered = {
        "EAGLE-3.1 upgrade calibrated on the full-precision target": write("upgraded", eagle3),
        f"EAGLE-3.1 upgrade calibrated on the {scheme} target": write("recalibrated", eagle3,
                                                                       target_quantization=scheme),
    }
    calibrate_s = time.perf_counter() - started
    data = DataOptions(limit=args.data_limit, generate=args.generate, code_tokens=args.code_tokens)
    recipe = f"{args.steps} steps, lr {args.lr:g}" + (f", + {args.code_tokens} code tokens" if args.code_tokens else "")
    sources = {f"+ finetune on the {scheme} target ({recipe})":
               recovered[f"EAGLE-3.1 upgrade calibrated on the {scheme} target"],
               "control: the EAGLE-3 drafter fine-tuned the same way": drafts["EAGLE-3"],
               "control: the bundled EAGLE-3.1 drafter fine-tuned the same way": drafts["EAGLE-3.1"]}
    for number, (label, source) in enumerate(sources.items()):
        started = time.perf_counter()
        tuned = os.path.join(work, f"tuned-{number}")
        trained = finetune(source, tuned, FinetuneOptions(
            target=target, eval=None, force=True, data=data, target_quantization=scheme,
            train=TrainOptions(steps=args.steps, lr=args.lr)))
        recovered[label] = tuned
        print(f"finetune {number + 1}: {time.perf_counter() - started:.0f} s ({trained.data['sequences']} sequences, "
              f"{trained.data['positions']} positions from the {scheme} target; kept step "
              f"{trained.training['selected_step']})", flush=True)
    print(f"\nat {scheme}: the EAGLE-3 drafter drops {drop:.3f} τ; upgrades {calibrate_s:.0f} s")
    print(f"\n| against the {scheme} target | τ [95 %] | vs EAGLE-3 [paired 95 %] | share of the drop recovered |")
    print("|---|---|---|---|")
    for label, path in recovered.items():
        row = compare(drafts["EAGLE-3"], path, target, options(scheme)).rows()["all"]
        diff = row["b_minus_a"]
        share = diff["acceptance_length_difference"] / drop if drop > 0 else float("nan")
        print(f"| {label} | {interval_cell(row['b'])} | {difference_cell(diff)} | {share:.0%} |", flush=True)


if __name__ == "__main__":
    main()
