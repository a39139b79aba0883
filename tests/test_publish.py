"""Single-file outputs (a GGUF, a report, a plot): two runs publishing one path at once never silently replace
each other's file; every written path is checked before any work."""

from __future__ import annotations

import os
import threading

import pytest

from eaglekit.errors import OutputError
from eaglekit.io.writer import publish_file


def race(destination: str, replace: bool, runs: int = 2) -> list[OutputError | None]:
    """`runs` threads publish `destination` at once (each finishes writing before any names it); their outcomes."""
    ready = threading.Barrier(runs)
    outcomes: list[OutputError | None] = [None] * runs

    def run(i: int) -> None:
        def write(tmp: str) -> None:
            with open(tmp, "w") as fh:
                fh.write(f"run {i}")
            ready.wait(timeout=30)

        try:
            publish_file(destination, write, replace=replace)
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
    publish_file(destination, lambda tmp: open(tmp, "w").write("first"), replace=False)
    with pytest.raises(OutputError, match="exists: another run wrote it first"):
        publish_file(destination, lambda tmp: open(tmp, "w").write("second"), replace=False)
    assert open(destination).read() == "first" and os.listdir(tmp_path) == ["draft.gguf"]


# ------------------------------------------------------------------ every written path, checked before any work


@pytest.fixture
def pair(tmp_path):
    from tests.factory import make_draft, make_target_config

    return make_draft(str(tmp_path / "draft"), "vllm"), make_target_config(str(tmp_path / "target"))


def no_work(monkeypatch):
    """Every command's work fails the test if it starts: a refusal must come first."""
    import eaglekit.bench.run
    import eaglekit.finetune.run
    import eaglekit.verify.setup

    def work(*args, **kwargs):
        pytest.fail("the work started before the written paths were checked")

    for module, name in ((eaglekit.verify.setup, "load_target"), (eaglekit.verify.setup, "load_tokenizer"),
                         (eaglekit.bench.run, "start_server"), (eaglekit.finetune.run, "build_data")):
        monkeypatch.setattr(module, name, work)
    for name in ("check_engine_available", "check_client_available"):  # an engine is there (its probe is no work)
        monkeypatch.setattr(eaglekit.bench.run, name, lambda *args: "0.0.0")


WRITES = {
    "verify --save-report": lambda d, t, p: ["verify", d, "--target", t, "--save-report", p],
    "verify --profile-out": lambda d, t, p: ["verify", d, "--target", t, "--profile-out", p],
    "verify --plot": lambda d, t, p: ["verify", d, "--target", t, "--plot", p],
    "compare --save-report": lambda d, t, p: ["compare", d, d, "--target", t, "--save-report", p],
    "bench --save-report": lambda d, t, p: ["bench", d, "--target", t, "--save-report", p],
    "bench --plot": lambda d, t, p: ["bench", d, "--target", t, "--plot", p],
    "finetune --plot": lambda d, t, p: ["finetune", d, os.path.dirname(os.path.dirname(d)) + "/out", "--target", t,
                                        "--plot", p],
    "finetune OUT": lambda d, t, p: ["finetune", d, p, "--target", t],
    "upgrade DST": lambda d, t, p: ["upgrade", d, p, "--target", t],
    "push --card-out": lambda d, t, p: ["push", d, "--repo-id", "org/name", "--dry-run", "--card-out", p],
}


@pytest.mark.parametrize("problem", ["missing", "a file", "read-only"])
@pytest.mark.parametrize("write", sorted(WRITES))
def test_a_written_path_whose_folder_cannot_hold_it_is_refused_before_any_work(tmp_path, pair, monkeypatch, write,
                                                                                problem):
    from tests.cli import run_cli

    folder = tmp_path / "reports"
    if problem == "a file":
        folder.write_text("not a folder")
    elif problem == "read-only":  # as root, permission bits do not stop a write: the check asks os.access
        folder.mkdir()
        real_access = os.access
        monkeypatch.setattr(os, "access", lambda p, mode, **kw: os.path.abspath(p) != str(folder)
                            and real_access(p, mode, **kw))
    no_work(monkeypatch)
    path = str(folder / "x.json")
    before = sorted(os.listdir(tmp_path))
    result = run_cli(WRITES[write](*pair, path) + ["--format", "json"])
    want = {"missing": "does not exist", "a file": "is a file, not a folder", "read-only": "is not writable"}[problem]
    assert result.exit_code == (1 if problem == "read-only" else 2), result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"Error: {folder}: the parent") and want in lines[0], lines
    assert sorted(os.listdir(tmp_path)) == before
