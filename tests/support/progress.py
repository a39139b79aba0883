"""A Progress that records what the library reported, for tests of which stages a step announces."""

from __future__ import annotations


class Recorder:
    """Every stage reported, with how many units were advanced in it."""

    def __init__(self) -> None:
        self.stages: list[tuple[str, int | None, str]] = []
        self.advanced: list[int] = []

    def stage(self, name: str, total: int | None = None, unit: str = "") -> None:
        self.stages.append((name, total, unit))
        self.advanced.append(0)

    def advance(self, n: int = 1) -> None:
        self.advanced[-1] += n

    def done(self) -> None:
        pass

    @property
    def names(self) -> list[str]:
        return [name for name, _, _ in self.stages]
