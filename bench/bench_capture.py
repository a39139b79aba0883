"""Capture through the engine against the reference hooks, the store's bytes against its formula, and training
from a store against training from memory, with each run's peak RSS (every run in a subprocess of its own).

    nice python bench/bench_capture.py                        # SmolLM2, 64 bundled prompts, both engines
    nice python bench/bench_capture.py --records 16 --engines reference --steps 20

Bytes per token of a store: aux K × H × (2 bytes in bfloat16, 4 in float32, 1 + 4/H in fp8 with its per-token
scale) + id L's H × 4 (float32) + token id 8 + loss mask 1 + the offsets (8 per record). Figures are printed,
never asserted.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)

DRAFT = os.path.join(REPO, "examples", "drafters", "smollm2-135m-eagle3")
AUX_BYTES = {"bfloat16": 2.0, "float32": 4.0}


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--target", help="SmolLM2 directory (default: .cache/smollm2, materialised if missing)")
    p.add_argument("--records", type=int, default=64, help="training prompts to capture")
    p.add_argument("--engines", default="reference,vllm")
    p.add_argument("--store-dtypes", default="bfloat16,float32,fp8")
    p.add_argument("--steps", type=int, default=40, help="training steps, from the store and from memory")
    p.add_argument("--work", help="folder for the stores (default: a temporary one)")
    p.add_argument("--run", nargs=argparse.REMAINDER, help=argparse.SUPPRESS)  # one measured run, in a child
    return p.parse_args(argv)


def formula_bytes_per_token(k: int, hidden: int, dtype: str, tokens: int, records: int) -> float:
    aux = k * hidden * (1 + 4 / hidden if dtype == "fp8" else AUX_BYTES[dtype])
    return aux + hidden * 4 + 8 + 1 + 8 * records / tokens


def child(args: list[str]) -> None:
    """One measured run: prints its result and peak RSS as one JSON line."""
    what, rest = args[0], json.loads(args[1])
    started = time.perf_counter()
    if what == "capture":
        from eaglekit.capture.plan import DataOptions
        from eaglekit.capture.run import CaptureOptions, capture_store

        report = capture_store(rest["store"], CaptureOptions(
            target=rest["target"], draft=DRAFT, engine=rest["engine"], store_dtype=rest["store_dtype"],
            dtype="float32", data=DataOptions(limit=rest["records"])))
        result = {"tokens": report.tokens, "bytes": report.bytes, "records": report.records}
    else:
        from eaglekit.capture.plan import DataOptions
        from eaglekit.finetune.options import FinetuneOptions
        from eaglekit.finetune.run import finetune
        from eaglekit.finetune.train import TrainOptions

        data = DataOptions(limit=rest["records"]) if not rest.get("store") else DataOptions()
        report = finetune(rest["start"], rest["out"], FinetuneOptions(
            target=rest["target"], data=data, store=rest.get("store"), cache_dir=rest["cache"], eval=None, force=True,
            keep_unresolved=True,
            validation_fraction=0, train=TrainOptions(steps=rest["steps"], seed=0)))
        result = {"train_s": report.to_dict()["training"].get("seconds")}
    result["seconds"] = time.perf_counter() - started
    result["peak_rss_mb"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(json.dumps(result))


def measured(what: str, **fields) -> dict:
    proc = subprocess.run([sys.executable, __file__, "--run", what, json.dumps(fields)], capture_output=True,
                          text=True, env={**os.environ, "PYTHONPATH": REPO})
    if proc.returncode != 0:
        return {"error": (proc.stderr.strip().splitlines() or ["failed"])[-1][:200]}
    return json.loads(proc.stdout.strip().splitlines()[-1])


def main(argv=None) -> None:
    args = parse_args(argv)
    if args.run:
        child(args.run)
        return
    from eaglekit.families import load_draft
    from eaglekit.target import read_target
    from eaglekit.upgrade import UpgradeOptions, upgrade
    from examples.smollm2 import materialize_smollm2

    target = args.target or materialize_smollm2(os.path.join(REPO, ".cache", "smollm2"))
    work = args.work or tempfile.mkdtemp(prefix="bench-capture-")
    os.makedirs(work, exist_ok=True)
    info = read_target(target)
    k = load_draft(DRAFT).num_aux_hidden_states or 3
    cache = os.path.join(work, "cache")
    print(f"target {os.path.basename(target)} (H={info.hidden_size}, L={info.num_layers}), {args.records} bundled "
          f"training prompts, K={k} aux ids + id L\n")
    print("| engine | store dtype | tokens | tokens/s | bytes/token (formula) | peak RSS MB |")
    print("|---|---|---|---|---|---|")
    stores = {}
    for engine in args.engines.split(","):
        for dtype in args.store_dtypes.split(",") if engine == "reference" else ["float32"]:
            store = os.path.join(work, f"store-{engine}-{dtype}")
            r = measured("capture", store=store, target=target, engine=engine, store_dtype=dtype,
                         records=args.records, cache=cache)
            if "error" in r:
                print(f"| {engine} | {dtype} | failed: {r['error']} | | | |")
                continue
            stores[(engine, dtype)] = store
            formula = formula_bytes_per_token(k, info.hidden_size, dtype, r["tokens"], r["records"])
            print(f"| {engine} | {dtype} | {r['tokens']:,} | {r['tokens'] / r['seconds']:.0f} | "
                  f"{r['bytes'] / r['tokens']:,.0f} ({formula:,.0f}) | {r['peak_rss_mb']:,.0f} |", flush=True)
    start = os.path.join(work, "start")
    upgrade(DRAFT, start, UpgradeOptions(target=target, fc_norm=False, norm_output=False, force=True))
    print(f"\n| training ({args.steps} steps) | steps/s | peak RSS MB |")
    print("|---|---|---|")
    runs = [("in memory (target loaded)", None)]
    if ("reference", "bfloat16") in stores:
        runs.append(("from the bfloat16 store (head tensors only)", stores[("reference", "bfloat16")]))
    for label, store in runs:
        r = measured("train", target=target, start=start, out=os.path.join(work, f"out-{len(label)}"), store=store,
                     records=args.records, cache=cache, steps=args.steps)
        if "error" in r:
            print(f"| {label} | failed: {r['error']} | |")
            continue
        rate = args.steps / r["train_s"] if r.get("train_s") else args.steps / r["seconds"]
        print(f"| {label} | {rate:.2f} | {r['peak_rss_mb']:,.0f} |", flush=True)


if __name__ == "__main__":
    main()
