"""Single-file outputs (a GGUF, a report, a plot): two runs publishing one path at once never silently replace
each other's file."""

from __future__ import annotations

import os
import threading

import pytest

from eaglekit.errors import OutputError
from eaglekit.io.publish import publish


def race(destination: str, replace: bool, runs: int = 2) -> list[OutputError | None]:
    """`runs` threads publish `destination` at once (each finishes writing before any names it); their outcomes."""
    ready = threading.Barrier(runs)
    outcomes: list[OutputError | None] = [None] * runs

    def run(i: int) -> None:
        def write(stage) -> None:
            with open(stage.path, "w") as fh:
                fh.write(f"run {i}")
            ready.wait(timeout=30)

        try:
            publish(destination, write, replace=replace)
        except OutputError as exc:
            outcomes[i] = exc

    threads = [threading.Thread(target=run, args=(i,)) for i in range(runs)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    return outcomes


@pytest.mark.parametrize("runs", [2, 5])
def test_of_runs_publishing_one_file_at_once_exactly_one_wins(tmp_path, runs):
    destination = str(tmp_path / "draft.gguf")
    outcomes = race(destination, replace=False, runs=runs)
    winners = [i for i, o in enumerate(outcomes) if o is None]
    assert len(winners) == 1, outcomes
    assert open(destination).read() == f"run {winners[0]}"
    for loser in (o for o in outcomes if o is not None):
        assert str(loser) == f"{destination}: exists: another run wrote it first; nothing was written (--force " \
                             "replaces it)"
    assert os.listdir(tmp_path) == ["draft.gguf"]  # no temporary file left by any run


def test_with_replace_each_run_replaces_the_file_whole(tmp_path):
    destination = str(tmp_path / "report.json")
    with open(destination, "w") as fh:
        fh.write("earlier")
    assert race(destination, replace=True) == [None, None]
    assert open(destination).read() in ("run 0", "run 1") and os.listdir(tmp_path) == ["report.json"]


def test_without_hard_links_an_existing_file_is_still_never_replaced(tmp_path, monkeypatch):
    """Some network and FUSE file systems have no hard links: the rule holds there too."""
    import errno

    def no_links(src, dst):
        raise OSError(errno.EPERM, "Operation not permitted")

    monkeypatch.setattr(os, "link", no_links)
    destination = str(tmp_path / "draft.gguf")
    publish(destination, lambda stage: open(stage.path, "w").write("first"), replace=False)
    with pytest.raises(OutputError, match="exists: another run wrote it first"):
        publish(destination, lambda stage: open(stage.path, "w").write("second"), replace=False)
    assert open(destination).read() == "first" and os.listdir(tmp_path) == ["draft.gguf"]
