"""validate --deep streams tensor by tensor: time against `cat` of the same files, peak RSS against the largest tensor.

Writes the 8B-class bench drafter (H=4096, I=14336, V=128256, Vd=32000, bf16, ~0.85 GB) with
bench/make_bench_drafter.py, then reports medians of --repeat runs, warm (page cache) and, when this process may
drop the page cache (root), cold. Targets: CLI peak RSS < 2 x largest tensor + 200 MB; wall time within 2x of cat.

    python bench/bench_validate.py [--workdir DIR] [--repeat 3]
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

from bench.make_bench_drafter import write_bench_drafter
from eaglekit.families import load_draft
from eaglekit.rules import run_rules


def drop_caches() -> bool:
    try:
        os.sync()
        with open("/proc/sys/vm/drop_caches", "w") as fh:
            fh.write("3\n")
        return True
    except OSError:
        return False


def timed_process(cmd: list[str], cold: bool) -> tuple[float, int]:
    """Wall seconds and peak RSS (bytes) of one child process."""
    if cold:
        drop_caches()
    start = time.perf_counter()
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    _, status, usage = os.wait4(proc.pid, 0)
    wall = time.perf_counter() - start
    if os.waitstatus_to_exitcode(status) not in (0, 1):
        raise SystemExit(f"{' '.join(cmd)} failed with status {status}")
    return wall, usage.ru_maxrss * 1024


def median_process(cmd: list[str], cold: bool, repeat: int) -> tuple[float, int]:
    runs = [timed_process(cmd, cold) for _ in range(repeat)]
    return statistics.median(r[0] for r in runs), max(r[1] for r in runs)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workdir", default=None)
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    work = args.workdir or tempfile.mkdtemp(prefix="eaglekit-bench-")
    path = os.path.join(work, "big1")
    if not os.path.exists(os.path.join(path, "config.json")):
        write_bench_drafter(path)
    spec = load_draft(path)
    files = [os.path.join(path, f) for f in spec.files]
    size = sum(os.path.getsize(f) for f in files)
    largest = max(t.nbytes for t in spec.tensors.values())
    cat = ["sh", "-c", 'cat "$@" > /dev/null', "cat", *files]
    validate = [sys.executable, "-m", "eaglekit.cli", "validate", path, "--deep", "--format", "json"]
    headers = [sys.executable, "-m", "eaglekit.cli", "validate", path, "--format", "json"]

    startup = [sys.executable, "-m", "eaglekit.cli", "validate", "--list-rules"]

    def in_process(cold: bool) -> float:
        runs = []
        for _ in range(args.repeat):
            if cold:
                drop_caches()
            start = time.perf_counter()
            run_rules(load_draft(path), deep=True)
            runs.append(time.perf_counter() - start)
        return statistics.median(runs)

    modes = [("warm", False)] + ([("cold", True)] if drop_caches() else [])
    rows = []
    for label, cold in modes:
        timed_process(cat, False)  # warm the page cache (a cold run drops it again)
        cat_s, _ = median_process(cat, cold, args.repeat)
        rows.append((f"cat files ({label})", cat_s, None, None))
        for what, cmd in (("CLI start-up only (--list-rules)", startup), ("validate, headers only, CLI", headers),
                          ("validate --deep, CLI", validate)):
            wall, rss = median_process(cmd, cold, args.repeat)
            rows.append((f"{what} ({label})", wall, wall / cat_s, rss))
        lib_s = in_process(cold)
        rows.append((f"run_rules(deep=True), in-process ({label})", lib_s, lib_s / cat_s, None))

    budget = 2 * largest + 200 * 1024 * 1024
    print(f"drafter: {size / 1e9:.3f} GB in {len(files)} file(s), {len(spec.tensors)} tensors, "
          f"largest {largest / 1e6:.0f} MB; RSS budget 2 x largest + 200 MB = {budget / 1e6:.0f} MB")
    print(f"{'operation':48} {'wall s':>8} {'x cat':>7} {'peak RSS MB':>12}")
    for label, wall, ratio, rss in rows:
        print(f"{label:48} {wall:>8.3f} {'' if ratio is None else f'{ratio:.2f}':>7} "
              f"{'' if rss is None else f'{rss / 1e6:.0f}':>12}")
    worst = max(r[3] for r in rows if r[3] is not None)
    print(f"peak RSS {worst / 1e6:.0f} MB {'within' if worst < budget else 'OVER'} budget")


if __name__ == "__main__":
    main()
