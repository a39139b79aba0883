"""Progress in a log: timestamped lines with an ETA, a heartbeat through silent steps, and none in a command's
first seconds (a refusal before the work stays the one line on stderr)."""

from __future__ import annotations

import re
import time

import eaglekit.cli.progress as progress_module
from eaglekit.cli.progress import StageProgress

LINE = re.compile(r"^\[\d\d:\d\d:\d\d\] verify: ")


def test_a_log_gets_timestamped_lines_with_an_eta(monkeypatch, capsys):
    monkeypatch.setattr(progress_module, "QUIET_START_S", 0.0)
    monkeypatch.setattr(progress_module, "LOG_EVERY_S", 3600.0)  # only the lines that always print
    with StageProgress("verify", tty=False) as progress:
        progress.stage_update("loading the target")
        progress.item(1, 4, "first prompt")
        progress.item(4, 4, "last prompt")
    lines = capsys.readouterr().err.splitlines()
    assert all(LINE.match(line) for line in lines) and len(lines) == 3
    assert lines[0].endswith("loading the target")
    assert re.search(r"prompts 1/4, ETA \d+:\d\d$", lines[1]) and lines[-1].endswith("prompts 4/4")


def test_a_silent_step_still_shows_it_is_alive(monkeypatch, capsys):
    monkeypatch.setattr(progress_module, "QUIET_START_S", 0.0)
    monkeypatch.setattr(progress_module, "LOG_EVERY_S", 0.01)  # the heartbeat waits at least a second
    with StageProgress("verify", tty=False) as progress:
        progress.text("vLLM: the target alone")
        time.sleep(1.5)
    lines = capsys.readouterr().err.splitlines()
    assert any(line.endswith("in this step)") and "vLLM: the target alone" in line for line in lines)


def test_nothing_in_the_first_seconds_and_nothing_when_silenced(capsys):
    with StageProgress("verify", tty=False) as progress:
        progress.item(1, 2, "a")
    with StageProgress("verify", False, tty=False) as progress:
        progress.started -= 60
        progress.item(1, 2, "a")
    assert capsys.readouterr().err == ""


def test_training_between_logged_steps_is_named_by_its_step_count(monkeypatch, capsys):
    """The heartbeat during training says which step it is on, not the stage that came before it."""
    from eaglekit.cli.progress import TrainingProgress

    monkeypatch.setattr(progress_module, "QUIET_START_S", 0.0)
    monkeypatch.setattr(progress_module, "LOG_EVERY_S", 0.01)
    with TrainingProgress("finetune", True, 100) as progress:
        progress.tty = False
        progress.stage_update("encoding prompts", 0, 535)
        progress.on_step(7, None, {"loss": 1.0, "accuracy": 0.5, "tokens_per_s": 10.0})
        time.sleep(1.5)
    lines = capsys.readouterr().err.splitlines()
    assert re.search(r"finetune: training 7/100, ETA \d+:\d\d$", "\n".join(lines), re.M), lines
    beats = [line for line in lines if line.endswith("in this step)")]
    assert beats and all("training 7/100 (" in line for line in beats), lines
