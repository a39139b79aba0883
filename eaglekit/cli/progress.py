"""What a reader sees of the library's progress reports (eaglekit/progress.py) on stderr: a transient rich bar on a
terminal; without one (a file, CI, a pipe) a timestamped line when each stage starts and a heartbeat line while it
runs, so no two lines are more than HEARTBEAT_S apart (the first seconds' lines are held back: QUIET_START_S).
`--no-progress` silences both."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

import click

from eaglekit.cli.output import err, with_given

HEARTBEAT_S = 10.0
"""Without a terminal, a line at least this often while a command works (documented in docs/cli.md)."""
ETA_AFTER_S = 5.0
"""No ETA before a stage has run this long and finished one unit: an estimate from nothing is noise."""
POLL_S = 1.0
"""How often the heartbeat thread looks at the clock (a gap is at most HEARTBEAT_S + POLL_S)."""
QUIET_START_S = 5.0
"""Lines of a command's first seconds are held, then written together: a command that ends or refuses within
them leaves only its own output (a refusal stays the one line on stderr)."""


def clock_text(seconds: float) -> str:
    """m:ss, or h:mm:ss past an hour."""
    seconds = max(0, int(seconds))
    return f"{seconds // 3600}:{seconds // 60 % 60:02d}:{seconds % 60:02d}" if seconds >= 3600 else \
        f"{seconds // 60}:{seconds % 60:02d}"


def _count(n: int, unit: str) -> str:
    return f"{n:,} {unit}".rstrip()


class ProgressLog:
    """The CLI's `eaglekit.progress.Progress`: it renders the stages the library reports. `clock` and `write` are
    injectable so the heartbeat can be tested without waiting; `given` (output.given_paths) names the files a stage
    reads as the user typed them."""

    def __init__(self, command: str, enabled: bool = True, *, tty: bool | None = None,
                 clock: Callable[[], float] = time.monotonic, write: Callable[[str], None] | None = None,
                 given: dict[str, str] | None = None):
        self.command, self.enabled, self.given = command, enabled, given or {}
        self.tty = err.is_terminal if tty is None else tty
        self.clock = clock
        self.write = write or (lambda line: click.echo(line, err=True))
        self.lock = threading.RLock()
        self.name: str | None = None
        self.total: int | None = None
        self.unit = ""
        self.count = 0
        self.running = False
        self.started = self.stage_started = self.last_line = clock()
        self.held: list[str] | None = []  # None once the quiet start is over
        self.bar: Any = None
        self.task: Any = None
        self.stopped = threading.Event()
        self.heartbeat: threading.Thread | None = None

    def __enter__(self) -> ProgressLog:
        if self.enabled and self.tty:
            from rich.progress import (
                BarColumn,
                MofNCompleteColumn,
                Progress,
                TextColumn,
                TimeElapsedColumn,
                TimeRemainingColumn,
            )

            self.bar = Progress(TextColumn(self.command), TextColumn("{task.description}", markup=False), BarColumn(),
                                MofNCompleteColumn(), TimeElapsedColumn(), TextColumn("ETA"), TimeRemainingColumn(),
                                console=err, transient=True)
            self.bar.__enter__()
            self.task = self.bar.add_task("starting", total=None)
        elif self.enabled:
            self.heartbeat = threading.Thread(target=self._beat, daemon=True)
            self.heartbeat.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stopped.set()
        if self.heartbeat is not None:
            self.heartbeat.join(POLL_S * 2)
        if self.bar is not None:
            self.bar.__exit__(*exc)

    # the Progress protocol
    def stage(self, name: str, total: int | None = None, unit: str = "") -> None:
        name = with_given(name, self.given)
        with self.lock:
            self.name, self.total, self.unit, self.count, self.running = name, total, unit, 0, True
            self.stage_started = self.clock()
            if self.bar is not None:
                self.bar.reset(self.task, description=name, total=total, completed=0)
                return
            self.line(f"{name} ({_count(total, unit)})" if total is not None else name)

    def advance(self, n: int = 1) -> None:
        with self.lock:
            self.count += n
            if self.bar is not None:
                self.bar.advance(self.task, n)
                return
            self.tick()

    def done(self) -> None:
        with self.lock:
            self.running = False
            self.stage_started = self.clock()

    # rendering
    def note(self, text: str) -> None:
        """A line of its own in a log (a training record); a terminal's bar shows it as its description."""
        with self.lock:
            if self.bar is not None:
                self.bar.update(self.task, description=text)
            else:
                self.line(text)

    def line(self, text: str) -> None:
        """A timestamped line in a log (held in the quiet start); nothing when silenced or on a terminal."""
        if not self.enabled or self.tty:
            return
        self.last_line = self.clock()
        stamped = f"[{time.strftime('%H:%M:%S')}] {self.command}: {text}"
        if self.held is None:
            self.write(stamped)
        else:
            self.held.append(stamped)
            self._release()

    def _release(self) -> None:
        """Write the held lines once the quiet start is over."""
        if self.held is not None and self.clock() - self.started >= QUIET_START_S:
            held, self.held = self.held, None
            for stamped in held:
                self.write(stamped)

    def status(self) -> str:
        """Where the current stage stands: count, time in it, and an ETA once one can be estimated."""
        now = self.clock()
        elapsed = now - self.stage_started
        if self.name is None:
            return f"starting ({clock_text(elapsed)})"
        if not self.running:
            return f"{self.name}: done, {clock_text(elapsed)} since"
        counted = f"{self.count:,}/{_count(self.total, self.unit)}" if self.total is not None else \
            (_count(self.count, self.unit) if self.count else "")
        parts = [p for p in (counted, clock_text(elapsed)) if p]
        if self.total and 0 < self.count < self.total and elapsed >= ETA_AFTER_S:
            parts.append(f"ETA {clock_text(elapsed / self.count * (self.total - self.count))}")
        return f"{self.name}: {', '.join(parts)}"

    def tick(self) -> None:
        """A status line if none was written for HEARTBEAT_S: the heartbeat, and the throttle of `advance`."""
        with self.lock:
            self._release()
            if self.clock() - self.last_line >= HEARTBEAT_S:
                self.line(self.status())

    def _beat(self) -> None:
        while not self.stopped.wait(POLL_S):
            self.tick()


def training_figures(progress: ProgressLog) -> Callable[[int, Any, dict], None]:
    """finetune's `on_step`: the step's loss, depth-0 top-1 and tokens/s on a terminal's bar; a line per logged
    step (every --log-every) in a log. The step count itself comes through the progress protocol."""

    def on_step(done: int, record: Any, live: dict) -> None:
        if not progress.enabled:
            return
        if progress.bar is not None:
            progress.note(f"training: loss {live['loss']:.3f}, depth-0 top-1 {live['accuracy']:.1%}, "
                          f"{live['tokens_per_s']:.0f} tok/s")
        elif record is not None:
            accuracy = " ".join(f"{a:.2f}" for a in record.accuracy)
            progress.note(f"step {done}: loss {record.loss:.3f}, top-1 by depth {accuracy}, "
                          f"{record.tokens_per_s:.0f} tok/s")

    return on_step
