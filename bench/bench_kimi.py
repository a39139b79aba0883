"""The Kimi K2.6 EAGLE-3.1 MLA draft at its published shape (3.02 B params, ~6 GB): inspect and lossless upgrade.

The draft is written only when asked (`--write`, about a minute and 6 GB of disk). Times, each the median of
`--repeat` runs: `eaglekit inspect` (in-process and CLI), `cp -r`, and `eaglekit upgrade` (the draft is already
3.1, so upgrade keeps its trained fc_norm and norm_output: it only normalises layout and ids, copying every tensor
byte for byte).

    python bench/bench_kimi.py WORKDIR [--write] [--repeat 3]
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from bench.make_bench_drafter import write_bench_drafter  # noqa: E402
from eaglekit.inspection import inspect_draft  # noqa: E402


def _timed(argv: list[str]) -> float:
    subprocess.run(["sync"], check=True)
    start = time.perf_counter()
    subprocess.run(argv, check=True, capture_output=True)
    return time.perf_counter() - start


def _median(fn, repeat: int) -> float:
    return statistics.median(fn() for _ in range(repeat))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("workdir")
    parser.add_argument("--write", action="store_true", help="write the 6 GB draft first")
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    src = os.path.join(args.workdir, "kimi")
    if args.write:
        write_bench_drafter(src, kimi=True)
    if not os.path.exists(os.path.join(src, "config.json")):
        parser.error(f"{src} has no draft: run with --write")
    out = os.path.join(args.workdir, "kimi-out")
    size = sum(os.path.getsize(os.path.join(src, f)) for f in os.listdir(src))

    def fresh(cmd: list[str]) -> float:
        shutil.rmtree(out, ignore_errors=True)
        return _timed(cmd)

    eaglekit = [sys.executable, "-m", "eaglekit.cli"]
    rows = [
        ("inspect (library)", _median(lambda: _clock(lambda: inspect_draft(src)), args.repeat)),
        ("inspect (CLI)", _median(lambda: _timed([*eaglekit, "inspect", src, "--format", "json"]), args.repeat)),
        ("cp -r", _median(lambda: fresh(["cp", "-r", src, out]), args.repeat)),
        ("upgrade (lossless)",
         _median(lambda: fresh([*eaglekit, "upgrade", src, out, "--format", "json"]), args.repeat)),
    ]
    shutil.rmtree(out, ignore_errors=True)
    print(f"Kimi K2.6 EAGLE-3.1 MLA draft: {size / 1e9:.2f} GB")
    print(f"{'operation':20} {'seconds':>9} {'GB/s':>7}")
    for label, seconds in rows:
        rate = "" if label.startswith("inspect") else f"{size / 1e9 / seconds:7.2f}"
        print(f"{label:20} {seconds:9.3f} {rate:>7}")


def _clock(fn) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


if __name__ == "__main__":
    main()
