"""Refusals that come before any work: every written path's folder, and every decode's options against the
target's context. Each command's work is replaced by a failure, so a refusal found after it fails the test."""

from __future__ import annotations

import os

import pytest

from tests.support.cli import run_cli
from tests.support.factory import edit_config, make_draft, make_target_config

# ------------------------------------------------------------------ every written path, checked before any work


@pytest.fixture
def pair(tmp_path):
    return make_draft(str(tmp_path / "draft"), "vllm"), make_target_config(str(tmp_path / "target"))


def no_work(monkeypatch):
    """Every command's work fails the test if it starts: a refusal must come first."""
    import eaglekit.bench.run
    import eaglekit.capture.cache
    import eaglekit.decode.setup
    import eaglekit.finetune.run
    import eaglekit.verify.run

    def work(*args, **kwargs):
        pytest.fail("the work started before the written paths were checked")

    for module, name in ((eaglekit.decode.setup, "load_target"), (eaglekit.decode.setup, "load_tokenizer"),
                         (eaglekit.bench.run, "start_server"), (eaglekit.bench.run, "BenchClient"),
                         (eaglekit.capture.cache, "capture_store")):
        monkeypatch.setattr(module, name, work)
    for module, name in ((eaglekit.bench.run, "check_engine_available"),
                         (eaglekit.verify.run, "check_engine_available")):  # an engine is there (probing is no work)
        monkeypatch.setattr(module, name, lambda *args: "0.0.0")


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


# ------------------------------------------------------------------ decode options against the target's context


@pytest.mark.parametrize("command", [
    lambda d, t: ["verify", d, "--target", t],
    lambda d, t: ["verify", d, "--target", t, "--engine", "vllm"],
    lambda d, t: ["compare", d, d, "--target", t],
    lambda d, t: ["bench", d, "--target", t, "--max-new-tokens", "64"],
])
def test_a_k_past_the_targets_context_is_one_line_before_any_decode(pair, monkeypatch, command):
    """verify's -k is bounded as compare's is, by one shared check: a huge k is refused, not drafted."""
    draft, target = pair
    edit_config(target, lambda cfg: cfg.update(max_position_embeddings=4096))
    no_work(monkeypatch)
    result = run_cli(command(draft, target) + ["-k", "100000000"])
    assert result.exit_code == 2
    assert result.stderr.strip() == ("Error: --context-tokens 0, 64 new tokens and -k 100,000,000 (the drafts of the "
                                     "last round and its bonus token) leave no room for a prompt in the target's "
                                     "4,096-token context (max_position_embeddings)")


@pytest.mark.parametrize("given, expected", [
    (["--eval-limit", "2"], "Error: --eval-limit 2 held-out prompts: an interval needs 10"),
    (["--eval-prompts", "FEW"], "Error: --eval-prompts FEW has 3 held-out prompts: an interval needs 10"),
])
def test_an_evaluation_too_small_to_resolve_a_gain_is_refused_before_training(pair, tmp_path, monkeypatch, given,
                                                                               expected):
    """Below the interval floor finetune could never write its result: it says so before capturing or training,
    and names both ways out."""
    few = tmp_path / "few.jsonl"
    few.write_text("".join(f'{{"prompt": "write function {i}"}}\n' for i in range(3)))
    given = [str(few) if a == "FEW" else a for a in given]
    draft, target = pair
    no_work(monkeypatch)
    result = run_cli(["finetune", draft, str(tmp_path / "out"), "--target", target, *given])
    assert result.exit_code == 2, result.output
    line = result.stderr.strip().replace(str(few), "FEW")
    assert line.startswith(expected) and line.endswith(
        "give --eval-limit 10 or more, or --keep-unresolved to write the result without a resolved gain"), line
    assert not os.path.exists(tmp_path / "out")


def test_keep_unresolved_takes_an_evaluation_below_the_interval_floor(pair, tmp_path, monkeypatch):
    """With --keep-unresolved the figures are wanted without an interval: the run goes on to its target."""
    draft, target = pair
    no_work(monkeypatch)
    result = run_cli(["finetune", draft, str(tmp_path / "out"), "--target", target, "--eval-limit", "2",
                      "--keep-unresolved"])
    assert result.exit_code == 1 and "cannot load the target model" in result.stderr, result.output


# ------------------------------------------------------------------ options that cannot apply together


IGNORED = {
    "verify --engine reference --tensor-parallel-size": (
        lambda d, t, s: ["verify", d, "--target", t, "--tensor-parallel-size", "2"],
        "--tensor-parallel-size with --engine reference"),
    "compare --engine reference --engine-arg": (
        lambda d, t, s: ["compare", d, d, "--target", t, "--engine-arg", "max_model_len=4096"],
        "--engine-arg with --engine reference"),
    "verify --engine vllm --diagnose": (
        lambda d, t, s: ["verify", d, "--target", t, "--engine", "vllm", "--diagnose"],
        "--diagnose with --engine vllm"),
    "verify --engine vllm --min-acceptance": (
        lambda d, t, s: ["verify", d, "--target", t, "--engine", "vllm", "--min-acceptance", "2"],
        "--min-acceptance with --engine vllm"),
    "verify --engine vllm --aux-layer-ids": (
        lambda d, t, s: ["verify", d, "--target", t, "--engine", "vllm", "--aux-layer-ids", "1,2,3"],
        "--aux-layer-ids with --engine vllm"),
    "compare --engine vllm --turns all": (
        lambda d, t, s: ["compare", d, d, "--target", t, "--engine", "vllm", "--turns", "all"],
        "--turns all with --engine vllm"),
    "finetune --no-eval --eval-limit": (
        lambda d, t, s: ["finetune", d, s, "--target", t, "--no-eval", "--eval-limit", "20"],
        "--eval-limit with --no-eval"),
    "finetune --no-eval -k": (
        lambda d, t, s: ["finetune", d, s, "--target", t, "--no-eval", "-k", "5"], "-k with --no-eval"),
    "finetune --no-eval --tensor-parallel-size": (
        lambda d, t, s: ["finetune", d, s, "--target", t, "--no-eval", "--tensor-parallel-size", "2"],
        "--tensor-parallel-size with --no-eval"),
    "finetune --eval-engine reference --engine-python": (
        lambda d, t, s: ["finetune", d, s, "--target", t, "--eval-engine", "reference", "--engine-python",
                         "/usr/bin/python3"],
        "--engine-python with --eval-engine reference"),
    "finetune --max-resident-shards without --store": (
        lambda d, t, s: ["finetune", d, s, "--target", t, "--max-resident-shards", "4"],
        "--max-resident-shards without --store"),
    "capture --engine vllm --device": (
        lambda d, t, s: ["capture", t, s, "--engine", "vllm", "--device", "cuda"], "--device with --engine vllm"),
    "capture --calibration-tokens without --calibration": (
        lambda d, t, s: ["capture", t, s, "--calibration-tokens", "512"],
        "--calibration-tokens without --calibration"),
    "bench --speed-bench-dataset-subset without --dataset-name": (
        lambda d, t, s: ["bench", d, "--target", t, "--speed-bench-dataset-subset", "throughput_1k"],
        "--speed-bench-dataset-subset chooses a part of --dataset-name"),
}


@pytest.mark.parametrize("case", sorted(IGNORED))
def test_an_option_that_cannot_apply_is_refused_before_any_work(pair, tmp_path, monkeypatch, case):
    """An option the run would silently ignore (another engine's, a skipped evaluation's, a missing store's) is a
    usage error in one line naming both options, before any load, capture, training or engine start."""
    import eaglekit.capture.run
    import eaglekit.finetune.run

    no_work(monkeypatch)
    for module, name in ((eaglekit.capture.run, "capture_store"), (eaglekit.finetune.run, "finetune")):
        monkeypatch.setattr(module, name, lambda *a, **k: pytest.fail("the work started before the refusal"))
    command, expected = IGNORED[case]
    result = run_cli(command(*pair, str(tmp_path / "out")))
    assert result.exit_code == 2, result.output
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("Error: ") and expected in lines[0], lines
    assert not os.path.exists(tmp_path / "out")
