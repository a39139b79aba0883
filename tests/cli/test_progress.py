"""The progress renderer without a terminal: a line when a stage starts, a heartbeat while it runs, no ETA before
one can be estimated, nothing from a command that ends in its first seconds; driven by a fake clock."""

from __future__ import annotations

import re

import eaglekit.cli.progress as progress_module
from eaglekit.cli.progress import ETA_AFTER_S, HEARTBEAT_S, QUIET_START_S, ProgressLog
from eaglekit.progress import Within, counted

LINE = re.compile(r"^\[\d\d:\d\d:\d\d\] verify: (.*)$")


class FakeClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def _log(clock: FakeClock, lines: list[str], enabled: bool = True) -> ProgressLog:
    """A log renderer on `clock` whose quiet start is already over (the quiet start has a test of its own)."""
    log = ProgressLog("verify", enabled, tty=False, clock=clock, write=lines.append)
    clock.now += QUIET_START_S
    log.tick()
    return log


def _texts(lines: list[str]) -> list[str]:
    matches = [LINE.match(line) for line in lines]
    assert all(matches), lines
    return [m.group(1) for m in matches if m]


def test_a_stage_prints_when_it_starts_and_names_how_much():
    clock, lines = FakeClock(), []
    log = _log(clock, lines)
    log.stage("loading the target")
    log.stage("calibrating fc_norm on 2,048 tokens", 8, "sequences")
    assert _texts(lines) == ["loading the target", "calibrating fc_norm on 2,048 tokens (8 sequences)"]


def test_no_eta_before_one_unit_is_done_and_some_seconds_have_passed():
    clock, lines = FakeClock(), []
    log = _log(clock, lines)
    log.stage("prompt 1/2: target alone", 16, "tokens")
    clock.now += HEARTBEAT_S  # a heartbeat with nothing done: a count, no ETA
    log.tick()
    log.advance(4)  # one unit done, but within ETA_AFTER_S of a fresh line: no line, and no estimate yet
    log.stage("prompt 1/2: speculative", 16, "tokens")
    log.advance(1)
    clock.now += ETA_AFTER_S / 2
    assert "ETA" not in log.status()
    clock.now += HEARTBEAT_S
    log.advance(1)  # the throttle lets a line through, now with an estimate from 2 tokens in the stage's time
    texts = _texts(lines)
    assert texts[1] == "prompt 1/2: target alone: 0/16 tokens, 0:10"
    assert re.fullmatch(r"prompt 1/2: speculative: 2/16 tokens, 0:12, ETA 1:27", texts[-1]), texts
    assert not any("ETA" in t for t in texts[:-1])


def test_the_heartbeat_keeps_every_gap_within_its_period():
    clock, lines = FakeClock(), []
    log = _log(clock, lines)
    log.stage("capturing target states on 512 tokens", 4, "sequences")
    stamps = [clock.now]
    for _ in range(100):  # a poll a second, as the heartbeat thread does
        clock.now += progress_module.POLL_S
        before = len(lines)
        log.tick()
        if len(lines) > before:
            stamps.append(clock.now)
    assert len(stamps) == 11 and max(b - a for a, b in zip(stamps, stamps[1:])) <= HEARTBEAT_S
    assert _texts(lines)[-1] == "capturing target states on 512 tokens: 0/4 sequences, 1:40"


def test_a_stage_that_ended_says_so_in_the_heartbeat():
    clock, lines = FakeClock(), []
    log = _log(clock, lines)
    for _ in counted(Within(log, "held-out evaluation"), "prompts", range(3), 3, "prompts"):
        clock.now += 1
    clock.now += HEARTBEAT_S
    log.tick()
    assert _texts(lines) == ["held-out evaluation: prompts (3 prompts)",
                             "held-out evaluation: prompts: done, 0:10 since"]


def test_the_first_seconds_are_held_then_written_and_a_short_command_writes_nothing():
    clock, lines = FakeClock(), []
    log = ProgressLog("verify", tty=False, clock=clock, write=lines.append)
    log.stage("loading the target")
    clock.now += QUIET_START_S / 2
    log.tick()
    assert lines == []  # a refusal here would stay the one line on stderr
    clock.now += QUIET_START_S
    log.tick()
    assert _texts(lines) == ["loading the target"]
    silenced: list[str] = []
    off = _log(FakeClock(), silenced, enabled=False)
    off.stage("loading the target")
    off.clock.now += HEARTBEAT_S * 3  # type: ignore[attr-defined]
    off.tick()
    assert silenced == []


def test_the_heartbeat_thread_writes_while_the_library_is_silent(monkeypatch):
    """The real thread, on a real clock shortened: a stage that reports nothing still gets lines."""
    import time

    monkeypatch.setattr(progress_module, "QUIET_START_S", 0.0)
    monkeypatch.setattr(progress_module, "HEARTBEAT_S", 0.2)
    monkeypatch.setattr(progress_module, "POLL_S", 0.05)
    lines: list[str] = []
    with ProgressLog("verify", tty=False, write=lines.append) as log:
        log.stage("vLLM: the target alone, then with the draft")
        time.sleep(1.0)
    beats = [t for t in _texts(lines) if t.startswith("vLLM: the target alone, then with the draft: ")]
    assert len(beats) >= 2 and all(re.search(r": \d+:\d\d$", t) for t in beats), lines
