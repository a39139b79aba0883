"""The long commands on SmolLM2 without a terminal, as a log or CI sees them (the very runs
scripts/progress_logs.py writes into docs/progress-logs.md): every stage is announced by name when it starts, in
order, and no two stderr lines (nor the start and the first line) are further apart than the heartbeat allows. The
bound is the protocol's contract plus slack for a loaded machine, not a speed figure."""

from __future__ import annotations

import importlib.util
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

from eaglekit.cli.progress import HEARTBEAT_S, POLL_S, QUIET_START_S
from tests.support import REPO
from tests.support.smollm2 import smollm2_path

pytestmark = pytest.mark.model

SCRIPT = REPO / "scripts" / "progress_logs.py"
SLACK_S = 15.0
"""A loaded 2-core machine can hold the heartbeat thread back this long (GIL, scheduling): generous on purpose."""
GAP_BOUND_S = max(HEARTBEAT_S, QUIET_START_S) + POLL_S + SLACK_S
LINE = re.compile(r"^\[\d\d:\d\d:\d\d\] (\w+): (.*)$")
HEARTBEAT = re.compile(r"(\d+:\d\d|, ETA \d+:\d\d(:\d\d)?| since|^starting \(\d+:\d\d\))$")
COUNT = re.compile(r" \([\d,]+ \w+\)$")
NUMBER = re.compile(r"\d[\d,]*")


def _timed(args: list[str], cwd: Path) -> list[tuple[float, str]]:
    """Run `eaglekit ARGS` with stderr a pipe (no terminal): each stderr line with the seconds since the start at
    which it arrived, and a last entry for the exit."""
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    env.pop("EAGLEKIT_DEBUG", None)
    start = time.monotonic()
    proc = subprocess.Popen([sys.executable, "-m", "eaglekit", *args], cwd=cwd, env=env, stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, text=True)
    assert proc.stderr is not None
    lines = [(time.monotonic() - start, line.rstrip("\n")) for line in proc.stderr]
    code = proc.wait(timeout=60)
    assert code == 0, "\n".join(text for _, text in lines)[-3000:]
    return lines + [(time.monotonic() - start, "")]


def _stages(lines: list[tuple[float, str]], command: str) -> list[str]:
    """The stage names announced, in order (start lines without their count; heartbeats left out)."""
    names = []
    for _, text in lines[:-1]:
        m = LINE.match(text)
        assert m and m.group(1) == command, text
        if not HEARTBEAT.search(m.group(2)) and not m.group(2).startswith("step "):
            names.append(NUMBER.sub("N", COUNT.sub("", m.group(2))))
    return names


def _longest_gap(lines: list[tuple[float, str]]) -> float:
    stamps = [0.0] + [t for t, _ in lines]
    return max(b - a for a, b in zip(stamps, stamps[1:]))


def _script():
    spec = importlib.util.spec_from_file_location("progress_logs", SCRIPT)
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


SCRIPT_MODULE = _script()
TRAINING_DATA = ["encoding N prompts of train.jsonl", "loading the target", "generating answers to N prompts",
                 "capturing target states on N tokens"]
EXPECTED = {
    "upgrade with calibration": ["loading the target", "calibrating fc_norm, rescale",
                                 "fitting fc_norm, rescale and measuring it on held-out tokens", "writing the output",
                                 "reading the output back and validating it"],
    "verify": ["loading the target", "warming up both decodes", "prompt N/N: target alone", "prompt N/N: speculative",
               "prompt N/N: target alone", "prompt N/N: speculative"],
    "compare": ["loading the target", "prompt N/N: target alone", "prompt N/N: the drafts on the target's pass"],
    "capture": TRAINING_DATA,
    "finetune": [*TRAINING_DATA, "setting up the drafter", "scoring the held-out sequences before training", "training",
                 "writing the output (staged)", "reading the staged output back and validating it",
                 "writing the output with its measurement and publishing it"],
}
ENGINE_EXPECTED = {
    "bench": ["checking vLLM: importing it in its Python", "reading the draft and the target's tokenizer",
              "starting vLLM's benchmark client (vllm bench serve)", "target alone: starting vLLM",
              "target alone: C=N", "target + draft: starting vLLM", "target + draft: C=N"],
}
"""The stage names of each run of scripts/progress_logs.py, counts as N (ENGINE_EXPECTED: its runs in vLLM)."""


@pytest.fixture(scope="module")
def work(tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("progress-log")
    SCRIPT_MODULE.prepare(folder, Path(smollm2_path()))
    return folder


def test_every_documented_run_has_its_expected_stages():
    assert [title for title, _ in SCRIPT_MODULE.RUNS] == list(EXPECTED)
    assert [title for title, _ in SCRIPT_MODULE.ENGINE_RUNS] == list(ENGINE_EXPECTED)


@pytest.mark.parametrize("title,args", SCRIPT_MODULE.RUNS, ids=[t for t, _ in SCRIPT_MODULE.RUNS])
def test_each_long_command_says_each_stage_and_keeps_a_heartbeat(work, title, args):
    """In order: a run takes the output of the one before where it needs one (finetune trains upgrade's)."""
    _says_each_stage_and_keeps_a_heartbeat(work, args, EXPECTED[title])


@pytest.mark.engine
@pytest.mark.parametrize("title,args", SCRIPT_MODULE.ENGINE_RUNS, ids=[t for t, _ in SCRIPT_MODULE.ENGINE_RUNS])
def test_each_long_command_in_vllm_says_each_stage_and_keeps_a_heartbeat(work, title, args, monkeypatch):
    """The same contract where vLLM does the work: its import, each server's start and each measured run."""
    from tests.support.engines import VLLM_PYTHON  # probes vLLM: only where this tier runs

    if VLLM_PYTHON is None:
        pytest.skip("no vLLM environment (scripts/vllm-env.sh)")
    monkeypatch.setenv("EAGLEKIT_VLLM_PYTHON", VLLM_PYTHON)
    monkeypatch.delenv("VLLM_CPU_KVCACHE_SPACE", raising=False)  # eaglekit sizes vLLM's KV cache itself
    _says_each_stage_and_keeps_a_heartbeat(work, args, ENGINE_EXPECTED[title])


def _says_each_stage_and_keeps_a_heartbeat(work: Path, args: str, expected: list[str]) -> None:
    command = args.split()[0]
    lines = _timed(args.split(), work)
    gap = _longest_gap(lines)
    print(f"\n{command}: {len(lines)} lines, longest gap {gap:.1f} s (bound {GAP_BOUND_S:.0f} s)")
    assert _stages(lines, command) == expected
    assert gap <= GAP_BOUND_S, lines
