"""The one way library code reports a long step: `stage` when it starts (what it does and on how much), `advance`
as units finish, `done` when it ends. The library only reports; `eaglekit/cli/progress.py` decides what a reader
sees (a bar on a terminal, timestamped lines with a heartbeat in a log)."""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import Protocol, TypeVar

T = TypeVar("T")


class Progress(Protocol):
    """A sink for progress reports; every method returns at once and never raises for a report it dislikes."""

    def stage(self, name: str, total: int | None = None, unit: str = "") -> None:
        """A new step begins: `name` says what it does ("calibrating fc_norm on 2,048 tokens"), `total` how many
        `unit`s it will count through (None: it cannot count)."""

    def advance(self, n: int = 1) -> None:
        """`n` more units of the current stage are done."""

    def done(self) -> None:
        """The current stage has ended (the next `stage` ends it too)."""


class Silent:
    """Progress that goes nowhere: what a library call reports to when its caller asked for nothing."""

    def stage(self, name: str, total: int | None = None, unit: str = "") -> None:
        pass

    def advance(self, n: int = 1) -> None:
        pass

    def done(self) -> None:
        pass


SILENT: Progress = Silent()


def quiet(progress: Progress | None) -> Progress:
    """`progress`, or the silent sink when none was given."""
    return SILENT if progress is None else progress


def counted(progress: Progress | None, name: str, items: Iterable[T], total: int, unit: str) -> Iterator[T]:
    """`items` as a stage of `total` `unit`s, one unit advanced after each item is consumed."""
    sink = quiet(progress)
    sink.stage(name, total, unit)
    for item in items:
        yield item
        sink.advance()
    sink.done()


class Within:
    """Progress of a step run inside a larger one: each stage name carries the larger step's name first."""

    def __init__(self, progress: Progress | None, prefix: str):
        self.progress, self.prefix = quiet(progress), prefix

    def stage(self, name: str, total: int | None = None, unit: str = "") -> None:
        self.progress.stage(f"{self.prefix}: {name}", total, unit)

    def advance(self, n: int = 1) -> None:
        self.progress.advance(n)

    def done(self) -> None:
        self.progress.done()
