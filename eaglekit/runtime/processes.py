"""Every process eaglekit starts in the engine's Python, started so that none outlives eaglekit.

Each command runs under process_guard.py, a session leader of its own that runs the command in a process group
(vLLM's engine-core process joins it) and stops that group when the command ends, when eaglekit stops it, and when
eaglekit is gone however it ended (SIGKILL and the OOM killer included). Stopping is SIGTERM to the guard, which
stops the group (SIGTERM, then SIGKILL after a grace period), then SIGKILL if the guard itself is still there; a
Ctrl-C or SIGTERM that arrives meanwhile waits until the stop is done, then takes effect.
"""

from __future__ import annotations

import os
import signal
import subprocess
import threading
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import IO

GUARD = os.path.join(os.path.dirname(os.path.abspath(__file__)), "process_guard.py")
STOP_GRACE_S = 30.0
"""How long an engine may take to shut down on SIGTERM before it is killed."""
GUARD_MARGIN_S = 10.0
"""Beyond the grace period: the guard's own SIGKILL wait and its exit."""
DEFERRED_SIGNALS = (signal.SIGINT, signal.SIGTERM)


def start(python: str, args: Sequence[str], *, stdout: IO | int, env: dict[str, str] | None = None,
          cwd: str | None = None) -> subprocess.Popen:
    """`python ARGS` under the guard, stdout and stderr both to `stdout`; the Popen is the guard's. Call it from a
    thread that outlives the command: Linux's parent-death signal follows the thread that started the guard."""
    guard = [python, "-I", GUARD, str(os.getpid()), str(STOP_GRACE_S), "--", python, *args]
    return subprocess.Popen(guard, stdin=subprocess.DEVNULL, stdout=stdout, stderr=subprocess.STDOUT, env=env,
                            cwd=cwd, start_new_session=True)


def stop(process: subprocess.Popen) -> None:
    """Stop the guard and, through it, every process of the command; signals that arrive meanwhile wait."""
    with signals_deferred():
        if process.poll() is not None:
            return
        for signum, wait_s in ((signal.SIGTERM, STOP_GRACE_S + GUARD_MARGIN_S), (signal.SIGKILL, None)):
            try:
                os.killpg(process.pid, signum)
            except ProcessLookupError:
                pass
            try:
                process.wait(wait_s)
                return
            except subprocess.TimeoutExpired:
                continue


@dataclass(frozen=True)
class Finished:
    """A command that ran to its end: its exit status and everything it printed."""

    returncode: int
    log: str


def run(python: str, args: Sequence[str], log_path: str, *, timeout_s: float,
        env: dict[str, str] | None = None) -> Finished:
    """`python ARGS` under the guard to its end, its output in `log_path`; stopped on any way out (timeout:
    subprocess.TimeoutExpired, after the stop)."""
    with open(log_path, "w", encoding="utf-8") as log:
        process = start(python, args, stdout=log, env=env)
    try:
        process.wait(timeout_s)
    finally:
        stop(process)
    with open(log_path, encoding="utf-8", errors="replace") as fh:
        return Finished(process.returncode, fh.read())


def ended_by(returncode: int | None) -> str:
    """How a guarded command ended, for a message: "exit status 1", "killed by SIGKILL"."""
    if returncode is None:
        return "still running"
    signum = -returncode if returncode < 0 else returncode - 128 if returncode > 128 else 0
    try:
        return f"killed by {signal.Signals(signum).name}" if signum else f"exit status {returncode}"
    except ValueError:
        return f"exit status {returncode}"


@contextmanager
def signals_deferred() -> Iterator[None]:
    """Run the block to its end even when Ctrl-C or SIGTERM arrives; the first such signal is delivered after it.
    Signal handlers belong to the main thread: elsewhere the block runs as it is."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    caught: list[int] = []
    previous = {signum: signal.signal(signum, lambda signum, frame: caught.append(signum))
                for signum in DEFERRED_SIGNALS}
    try:
        yield
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, signal.SIG_DFL if handler is None else handler)
        if caught:
            signal.raise_signal(caught[0])
