"""inspect is header-only: its time must not depend on checkpoint size.

Writes the 8B-class bench drafter (single file and 3 shards) and a tiny draft, then times `inspect`
in-process (median of 20) and as a CLI process (median of 5, Python start-up included).

    python bench/bench_inspect.py [--workdir DIR]
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

from bench.make_bench_drafter import write_bench_drafter  # noqa: E402
from eaglekit.inspection import inspect_draft  # noqa: E402
from tests.support.factory import make_draft  # noqa: E402


def _median_time(fn, repeat: int) -> float:
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def _reuse_or_write(path: str, **kw) -> str:
    """The 8B-class drafter at `path`, written only if an earlier run in the same --workdir left none."""
    return path if os.path.exists(path) else write_bench_drafter(path, **kw)


def _size(path: str) -> int:
    return sum(os.path.getsize(os.path.join(path, f)) for f in os.listdir(path))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workdir", default=None)
    args = parser.parse_args()
    work = args.workdir or tempfile.mkdtemp(prefix="eaglekit-bench-")
    drafts = {
        "tiny": make_draft(os.path.join(work, "tiny"), "specforge"),
        "8B-class, 1 file": _reuse_or_write(os.path.join(work, "big1")),
        "8B-class, 3 shards": _reuse_or_write(os.path.join(work, "big3"), shards=3),
    }
    rows = []
    for label, path in drafts.items():
        lib = _median_time(lambda p=path: inspect_draft(p), 20)
        command = [sys.executable, "-m", "eaglekit.cli", "inspect", path, "--format", "json"]
        cli = _median_time(lambda c=command: subprocess.run(c, check=True, capture_output=True), 5)
        rows.append((label, _size(path), lib, cli))
    tiny_lib, tiny_cli = rows[0][2], rows[0][3]
    print(f"{'draft':22} {'size':>10} {'library ms':>11} {'CLI ms':>8} {'lib ratio':>10} {'CLI ratio':>10}")
    for label, size, lib, cli in rows:
        print(f"{label:22} {size / 1e6:>8.1f}MB {lib * 1e3:>11.2f} {cli * 1e3:>8.0f} "
              f"{lib / tiny_lib:>9.2f}x {cli / tiny_cli:>9.2f}x")


if __name__ == "__main__":
    main()
