"""Progress on stderr for every long step: a transient rich bar on a terminal, timestamped lines with an ETA in a
log (a file, CI), never both; `--no-progress` silences it. Library code reports through plain callbacks
(`stage(what, done, total)`, `item(done, total, name)`); this turns them into what the reader sees."""

from __future__ import annotations

import threading
import time
from typing import Any, TypeVar

import click

from eaglekit.cli.output import err

LOG_EVERY_S = 10.0
"""A log line at most this often within one stage (a new stage and its last item always print)."""
QUIET_START_S = 10.0
"""No log line in a command's first seconds: a refusal before the work stays the one line on stderr."""


def _clock(seconds: float) -> str:
    seconds = max(0, int(seconds))
    return f"{seconds // 3600}:{seconds // 60 % 60:02d}:{seconds % 60:02d}" if seconds >= 3600 else \
        f"{seconds // 60}:{seconds % 60:02d}"


P = TypeVar("P", bound="StageProgress")


class StageProgress:
    """Reports `what: done/total` as it moves; the ETA comes from the stage's own pace so far."""

    def __init__(self, command: str, enabled: bool = True, *, tty: bool | None = None):
        self.command, self.enabled = command, enabled
        self.tty = err.is_terminal if tty is None else tty
        self.bar: Any = None
        self.task: Any = None
        self.stage: str | None = None
        self.started = self.stage_started = time.monotonic()
        self.last_line = 0.0
        self.counted = ""
        self.done = threading.Event()
        self.heartbeat: threading.Thread | None = None

    def __enter__(self: P) -> P:
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
        elif self.enabled:  # a step that reports nothing for a while still shows it is alive
            self.heartbeat = threading.Thread(target=self._beat, daemon=True)
            self.heartbeat.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.done.set()
        if self.bar is not None:
            self.bar.__exit__(*exc)

    def _beat(self) -> None:
        while not self.done.wait(max(LOG_EVERY_S, 1.0)):
            if self.stage is not None and time.monotonic() - self.last_line >= LOG_EVERY_S:
                self.log(f"{self.stage}{self.counted} ({_clock(time.monotonic() - self.stage_started)} in this step)")

    def log(self, text: str, force: bool = False) -> None:
        """A timestamped line in a log (throttled unless `force`); nothing on a terminal, where the bar shows it."""
        now = time.monotonic()
        if now - self.started < QUIET_START_S:
            return
        if self.enabled and not self.tty and (force or now - self.last_line >= LOG_EVERY_S):
            click.echo(f"[{time.strftime('%H:%M:%S')}] {self.command}: {text}", err=True)
            self.last_line = now

    def stage_update(self, what: str, done: int = 0, total: int = 0) -> None:
        """`stage(what, done, total)`: total 0 when unknown."""
        if not self.enabled:
            return
        now = time.monotonic()
        new = what != self.stage
        if new:
            self.stage, self.stage_started = what, now
        if self.bar is not None:
            self.bar.update(self.task, description=what, completed=done, total=total or None)
            return
        eta = ""
        if total and 0 < done < total:
            eta = f", ETA {_clock((now - self.stage_started) / done * (total - done))}"
        self.counted = f" {done}/{total}" if total else ""
        self.log(f"{what}{self.counted}{eta}", force=new or (bool(total) and done >= total))

    def on_stage(self, what: str, done: int, total: int) -> None:
        """The library's `on_stage(what, done, total)` callback."""
        self.stage_update(what, done, total)

    def item(self, done: int, total: int, name: str) -> None:
        """`on_prompt(done, total, name)`: one item of a counted stage done."""
        if self.bar is not None and self.enabled:
            self.bar.update(self.task, description=name, completed=done, total=total)
            return
        self.stage_update("prompts", done, total)

    def text(self, what: str) -> None:
        """`on_stage(text)`: a stage without a count."""
        self.stage_update(what)


class TrainingProgress(StageProgress):
    """StageProgress that also shows each training step: loss, depth-0 top-1 and tokens/s on the bar, a line per
    logged step in a log."""

    def __init__(self, command: str, enabled: bool, steps: int):
        super().__init__(command, enabled)
        self.steps = steps

    def on_step(self, done: int, record: Any, live: dict) -> None:
        if not self.enabled:
            return
        if self.bar is not None:
            self.bar.update(self.task, completed=done, total=self.steps,
                            description=f"training: loss {live['loss']:.3f}, depth-0 top-1 {live['accuracy']:.1%}, "
                                        f"{live['tokens_per_s']:.0f} tok/s")
            return
        if record is not None:
            accuracy = " ".join(f"{a:.2f}" for a in record.accuracy)
            self.log(f"step {done}/{self.steps}: loss {record.loss:.3f}, top-1 by depth {accuracy}, "
                     f"{record.tokens_per_s:.0f} tok/s", force=True)
        self.stage_update("training", done, self.steps)  # between logged steps: the step count and an ETA
