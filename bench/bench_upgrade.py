"""Time `eaglekit upgrade` on the 8B-class bench drafter against `cp -r` of the same checkpoint; print a table.

Each case runs in a child process (wall time and that child's own peak RSS), `--repeat` times (median and min),
with `sync` and the previous output removed before every run. upgrade writes fsync'd files; cp does not, so
`cp -r + sync` is shown as the like-for-like durable baseline too, and the last lines pair each upgrade with a
durable copy run just before it (median of the per-pair ratios). With `--speculators PATH` (the
`speculators` executable of a throwaway venv), `speculators convert` of the same input is timed as well.
The `--dtype fp32` case computes every tensor in chunks (nothing is a raw copy): the streaming transform path.

    python bench/bench_upgrade.py [WORKDIR] [--repeat 3] [--speculators /tmp/specvenv/bin/speculators]
"""

from __future__ import annotations

import argparse
import json
import math
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from bench.make_bench_drafter import tensor_table  # noqa: E402


def _run(argv: list[str]) -> tuple[subprocess.CompletedProcess, float]:
    """Run a command; return it and its own peak RSS in MB (via /usr/bin/time where installed)."""
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    if os.path.exists("/usr/bin/time"):
        with tempfile.NamedTemporaryFile("r") as stat:
            proc = subprocess.run(["/usr/bin/time", "-f", "%M", "-o", stat.name, *argv], capture_output=True,
                                  env=env, check=False)
            text = stat.read().split()
        return proc, int(text[-1]) / 1024 if proc.returncode == 0 and text else -1.0
    # no GNU time: the child's ru_maxrss (an upper bound: it starts from this small process's size at fork)
    child = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env)
    out, err = child.communicate()
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return subprocess.CompletedProcess(argv, child.returncode, out, err), usage.ru_maxrss / 1024


def timed(label: str, argv: list[str], out_dir: str, repeat: int, *, sync: bool = False,
          may_fail: bool = False) -> dict:
    """Run a command `repeat` times, each in its own child; sync and clear the output before each run."""
    walls, rss, report = [], [], None
    for _ in range(repeat):
        shutil.rmtree(out_dir, ignore_errors=True)
        os.sync()
        start = time.perf_counter()
        proc, peak = _run(argv)
        if sync:
            os.sync()
        walls.append(time.perf_counter() - start)
        if proc.returncode != 0:
            if may_fail:
                lines = [ln for ln in proc.stderr.decode().splitlines() if "Error" in ln] or ["failed"]
                return {"label": label, "failed": lines[-1].strip()[:90]}
            raise SystemExit(f"{label} failed:\n{proc.stderr.decode()[-2000:]}")
        rss.append(peak)
        if proc.stdout.strip().startswith(b"{"):
            report = json.loads(proc.stdout)
    return {"label": label, "wall": statistics.median(walls), "min": min(walls), "walls": walls, "rss": max(rss),
            "report": report}


VERIFIER = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 4096, "num_hidden_layers": 32,
            "vocab_size": 128256, "num_attention_heads": 32, "num_key_value_heads": 8, "intermediate_size": 14336,
            "tie_word_embeddings": False, "rms_norm_eps": 1e-5, "max_position_embeddings": 131072,
            "rope_theta": 500000.0}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("workdir", nargs="?", help="where the drafter and outputs go (default: a temp dir)")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--speculators", help="path to a `speculators` executable to time `speculators convert`")
    args = parser.parse_args(argv)
    work = args.workdir or tempfile.mkdtemp(prefix="eaglekit-bench-upgrade-")
    os.makedirs(work, exist_ok=True)
    sources = {"1 file": os.path.join(work, "src-1"), "3 shards": os.path.join(work, "src-3")}
    maker = os.path.join(os.path.dirname(os.path.abspath(__file__)), "make_bench_drafter.py")
    for path, shards in zip(sources.values(), (1, 3)):
        if not os.path.exists(os.path.join(path, "config.json")):  # in a child: keeps this process small
            subprocess.run([sys.executable, maker, path, "--shards", str(shards)], check=True)
    verifier = os.path.join(work, "verifier")
    os.makedirs(verifier, exist_ok=True)
    with open(os.path.join(verifier, "config.json"), "w") as fh:
        json.dump(VERIFIER, fh)
    size = sum(os.path.getsize(os.path.join(sources["1 file"], f)) for f in os.listdir(sources["1 file"]))
    largest = max(math.prod(shape) * {"BF16": 2, "I64": 8, "BOOL": 1}[dtype] for _, dtype, shape in tensor_table())
    out = os.path.join(work, "out")
    cli = [sys.executable, "-m", "eaglekit.cli", "upgrade"]
    rows = []
    for name, src in sources.items():
        base = timed(f"cp -r ({name})", ["cp", "-r", src, out], out, args.repeat)
        durable = timed(f"cp -r + sync ({name})", ["cp", "-r", src, out], out, args.repeat, sync=True)
        rows += [(base, base), (durable, base)]
        for label, extra in (("3.1, fc_norm ones", []), ("lossless", ["--no-fc-norm", "--no-norm-output"]),
                             ("lossless --dtype fp32", ["--no-fc-norm", "--no-norm-output", "--dtype", "fp32"])):
            rows.append((timed(f"upgrade {label} ({name})", cli + [src, out, "--format", "json", *extra], out,
                               args.repeat), base))
        if args.speculators:
            rows.append((timed(f"speculators convert ({name})",
                               [args.speculators, "convert", src, "--algorithm", "eagle3", "--output-path", out,
                                "--verifier", verifier], out, args.repeat, may_fail=True), base))
    print(f"\nbench drafter: {size / 1e9:.2f} GB (largest tensor {largest / 1e6:.0f} MB), {os.cpu_count()} CPUs, "
          f"{args.repeat} runs each\n")
    print(f"{'case':40} {'median s':>9} {'x cp -r':>8} {'min s':>7} {'x cp -r':>8} {'peak RSS MB':>12}  runs")
    for row, base in rows:
        if "failed" in row:
            print(f"{row['label']:40} {row['failed']}")
            continue
        runs = " ".join(f"{w:.2f}" for w in row["walls"])
        print(f"{row['label']:40} {row['wall']:9.2f} {row['wall'] / base['wall']:8.2f} {row['min']:7.2f} "
              f"{row['min'] / base['min']:8.2f} {row['rss']:12.0f}  {runs}")
        t = (row["report"] or {}).get("timings")
        if t:
            print(f"{'':4}inside: write+hash {t['write_s']:.2f} s, validate {t['validate_s']:.2f} s, "
                  f"total {t['total_s']:.2f} s")
    print(f"\nRSS bound (largest tensor + 300 MB): {largest / 2**20 + 300:.0f} MB")
    print("\npaired against the durable copy (cp -r + sync, then upgrade, back to back; goal <= 1.3x):")
    for name, src in sources.items():
        for label, extra in (("lossless", ["--no-fc-norm", "--no-norm-output"]), ("3.1, fc_norm ones", [])):
            ratios = []
            for _ in range(args.repeat):
                copy = timed("cp", ["cp", "-r", src, out], out, 1, sync=True)
                up = timed("upgrade", cli + [src, out, "--format", "json", *extra], out, 1)
                ratios.append(up["wall"] / copy["wall"])
            shown = " ".join(f"{r:.2f}" for r in ratios)
            print(f"  upgrade {label} ({name}): median {statistics.median(ratios):.2f}x  ({shown})")


if __name__ == "__main__":
    main()
