"""What `eaglekit inspect` costs as a whole process: CPU seconds (user + sys), not wall time.

Wall time on a shared machine measures the scheduler; the CPU a process burns is what a CI job or a shell loop pays
and moves far less with load. Each run is one `python -m eaglekit inspect DRAFT` child; its user + sys seconds are
read from getrusage(RUSAGE_CHILDREN) before and after, and the median over the runs is printed beside a bare
interpreter's (`python -c pass`, the floor no import work can go below), for the tables (the default) and for
`--format json` with stdout a pipe, and for the tables at a terminal: stdout and stderr on a pseudo-terminal
(TERM=xterm-256color, COLUMNS=100), read until the child closes it, as a user at a shell sees them, in rich's
colours. None of them loads rich: eaglekit.cli.plain draws the panel and tables as rich would, styles included.
Then one `python -X importtime` run lists the modules whose own import costs most, and the top-level imports that
pull in the most.

Two settings of Python's bytecode cache are measured, since they differ by the cost of compiling every module:
"as run here" is the environment as it is (with PYTHONDONTWRITEBYTECODE=1 and no __pycache__ in the checkout,
eaglekit's modules are compiled from source at every start; installed packages keep theirs), and "bytecode cached"
is an installed eaglekit's case: every module's .pyc written once (under a temporary PYTHONPYCACHEPREFIX) and read.

    python bench/bench_inspect_cpu.py [--runs 15] [--top 15] [DRAFT]
"""

from __future__ import annotations

import argparse
import os
import pty
import re
import resource
import statistics
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DEFAULT_DRAFT = os.path.join(ROOT, "examples", "drafters", "smollm2-135m-eagle3")
IMPORT_LINE = re.compile(r"import time:\s+(\d+) \|\s+(\d+) \|( *)(\S+)")


def environment(pycache: str | None) -> dict[str, str]:
    """This checkout's eaglekit first on the path, as the CLI tests run it; with `pycache`, bytecode written to and
    read from that folder (the cached setting), else the environment's own setting."""
    env = dict(os.environ)
    env["PYTHONPATH"] = ROOT + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    if pycache is not None:
        env.pop("PYTHONDONTWRITEBYTECODE", None)
        env["PYTHONPYCACHEPREFIX"] = pycache
    return env


TERMINAL = {"TERM": "xterm-256color", "COLUMNS": "100"}
"""The terminal the tables are drawn for: 256 colours (as most terminal emulators announce), 100 columns."""
BOLD = b"\x1b[1m"


def child_cpu(argv: list[str], env: dict[str, str], terminal: bool = False) -> float:
    """User + sys CPU seconds of one child process running `argv` to completion: its output discarded, or written
    to a pseudo-terminal (`terminal`) whose every byte is read."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    if terminal:
        run_on_terminal(argv, {**env, **TERMINAL})
    else:
        subprocess.run(argv, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def run_on_terminal(argv: list[str], env: dict[str, str]) -> bytes:
    """Run `argv` with stdout and stderr on a new pseudo-terminal; what it wrote (CalledProcessError unless it
    exits 0)."""
    returncode, written = on_a_terminal(argv, env)
    if returncode:
        raise subprocess.CalledProcessError(returncode, argv, written)
    return written


def on_a_terminal(argv: list[str], env: dict[str, str]) -> tuple[int, bytes]:
    """Run `argv` with stdout and stderr on a new pseudo-terminal: its exit status and every byte it wrote there,
    read until it closed it."""
    controller, terminal = pty.openpty()
    try:
        child = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=terminal, stderr=terminal, env=env)
    finally:
        os.close(terminal)
    chunks = []
    try:
        while chunk := os.read(controller, 65536):
            chunks.append(chunk)
    except OSError:  # EIO: every copy of the terminal's end closed, the child's included
        pass
    finally:
        os.close(controller)
    return child.wait(), b"".join(chunks)


def median_cpu(argv: list[str], env: dict[str, str], runs: int, terminal: bool = False
               ) -> tuple[float, list[float]]:
    samples = [child_cpu(argv, env, terminal) for _ in range(runs)]
    return statistics.median(samples), samples


def import_offenders(argv: list[str], env: dict[str, str], top: int
                     ) -> tuple[list[tuple[int, str]], list[tuple[int, str]]]:
    """From one `-X importtime` run: (self µs, module) of the costliest modules, and (cumulative µs, module) of the
    costliest imports made directly by the program (depth 0), each sorted, most first."""
    done = subprocess.run([argv[0], "-X", "importtime", *argv[1:]], capture_output=True, text=True, env=env,
                          check=True)
    own, outer = [], []
    for line in done.stderr.splitlines():
        match = IMPORT_LINE.match(line)
        if not match:
            continue
        self_us, cumulative_us, indent, module = int(match[1]), int(match[2]), match[3], match[4]
        own.append((self_us, module))
        if len(indent) == 1:
            outer.append((cumulative_us, module))
    return sorted(own, reverse=True)[:top], sorted(outer, reverse=True)[:top]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("draft", nargs="?", default=DEFAULT_DRAFT)
    parser.add_argument("--runs", type=int, default=15)
    parser.add_argument("--top", type=int, default=15)
    args = parser.parse_args()
    inspect = [sys.executable, "-m", "eaglekit", "inspect", args.draft]
    as_json = [*inspect, "--format", "json"]
    bare = [sys.executable, "-c", "pass"]
    print(f"runs: {args.runs}; PYTHONDONTWRITEBYTECODE={os.environ.get('PYTHONDONTWRITEBYTECODE', '')!r}; "
          f"eaglekit __pycache__ present: {os.path.isdir(os.path.join(ROOT, 'eaglekit', '__pycache__'))}")
    shown = run_on_terminal(inspect, {**environment(None), **TERMINAL})
    print(f"at a terminal ({', '.join(f'{k}={v}' for k, v in TERMINAL.items())}): {len(shown)} bytes, in SGR styles: "
          f"{BOLD in shown}")
    with tempfile.TemporaryDirectory(prefix="eaglekit-pycache-") as pycache:
        for label, env in (("as run here", environment(None)), ("bytecode cached", environment(pycache))):
            child_cpu(as_json, env)  # one unmeasured run: the page cache (and, cached, every .pyc written)
            floor, floor_samples = median_cpu(bare, env, args.runs)
            print(f"\n{label}; load average {', '.join(f'{x:.2f}' for x in os.getloadavg())}")
            print(f"  bare interpreter (python -c pass): median {floor:.3f} s CPU (user+sys); "
                  f"range {min(floor_samples):.3f}–{max(floor_samples):.3f}")
            for name, argv, terminal in (("tables", inspect, False), ("--format json", as_json, False),
                                         ("tables at a terminal", inspect, True)):
                cost, samples = median_cpu(argv, env, args.runs, terminal)
                print(f"  eaglekit inspect {os.path.relpath(args.draft, ROOT)}, {name}: median {cost:.3f} s CPU "
                      f"(user+sys); range {min(samples):.3f}–{max(samples):.3f}; above the bare interpreter "
                      f"{cost - floor:.3f} s")
        own, outer = import_offenders(inspect, environment(None), args.top)
    print("\nimport times below: as run here")
    print(f"\nimports, own time (µs), top {args.top}:")
    for micros, module in own:
        print(f"  {micros:>8}  {module}")
    print(f"\nimports made by the program itself, cumulative (µs), top {args.top}:")
    for micros, module in outer:
        print(f"  {micros:>8}  {module}")


if __name__ == "__main__":
    main()
