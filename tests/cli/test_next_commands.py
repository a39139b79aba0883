"""Every `next:` command and every command a refusal says to run is filled from what the command knows (the target it
was given, the output it wrote), quoted for the shell, and parses when pasted; where the target is not known the step
is said in words, never printed as a command with a placeholder."""

from __future__ import annotations

import json
import re
import shlex

import pytest

from tests.support.cli import run_cli
from tests.support.factory import make_draft, make_target_config

PLACEHOLDER = re.compile(r"\b(?:TARGET|DRAFT|OUT|DIR)\b|<[A-Z_]+>")
USAGE_ERROR = 2


@pytest.fixture
def folders(tmp_path, monkeypatch):
    """An EAGLE-3 draft in a non-vLLM layout and a target with only its config, in folders of the working directory
    whose names hold a space (a command pasted into a shell must quote them), named as a user types them."""
    monkeypatch.chdir(tmp_path)
    make_draft(str(tmp_path / "source draft"), "modelopt")
    make_target_config(str(tmp_path / "the target"))
    return "source draft", "the target", tmp_path


def pasted(command: str) -> tuple[int, str]:
    """Run `command` as a shell would split it, in-process: (exit code, its error line)."""
    args = shlex.split(command)
    assert args[0] == "eaglekit" and not PLACEHOLDER.search(command), command
    result = run_cli(args[1:])
    return result.exit_code, result.stderr


def next_line(stdout: str) -> str:
    """The command after `next: `, its ` \\`-continued lines joined as a shell joins them."""
    joined = stdout.replace(" \\\n", " ")
    lines = [line for line in joined.splitlines() if line.startswith("next: ")]
    assert len(lines) == 1, stdout
    return lines[0][len("next: "):]


def test_a_warm_start_names_the_target_and_output_it_was_given(folders):
    source, target, tmp_path = folders
    result = run_cli(["upgrade", source, "warm start", "--target", target, "--fc-norm"])
    assert result.exit_code == 0, result.stderr
    command = next_line(result.stdout)
    assert shlex.split(command) == ["eaglekit", "finetune", "warm start", "warm start-tuned", "--target", target]
    assert str(tmp_path) not in result.stdout  # every path as the user typed it
    code, error = pasted(command)
    assert code != USAGE_ERROR and "cannot load the target model" in error  # parsed; the target has no weights


def test_a_warm_start_without_a_target_says_the_step_in_words(folders):
    source, _, tmp_path = folders
    result = run_cli(["upgrade", source, str(tmp_path / "out"), "--fc-norm-init", "ones"])
    assert result.exit_code == 0, result.stderr
    step = " ".join(result.stdout[result.stdout.index("next: "):].split())
    assert step.startswith(f"next: fine-tune {tmp_path / 'out'} against its target with `eaglekit finetune`: give "
                           "the target model (its Hub id or folder) as --target")
    assert not PLACEHOLDER.search(result.stdout)
    doc = json.loads(run_cli(["upgrade", source, str(tmp_path / "json"), "--fc-norm-init", "ones",
                              "--format", "json"]).stdout)
    assert doc["next_command"] is None and doc["next_step"].startswith("fine-tune json against its target")


def test_finetune_of_another_layout_prints_the_upgrade_that_converts_it(folders):
    source, target, tmp_path = folders
    refused = run_cli(["finetune", source, str(tmp_path / "tuned"), "--target", target])
    assert refused.exit_code == USAGE_ERROR
    command = re.search(r"run `([^`]+)` first", refused.stderr).group(1)
    assert shlex.split(command)[2:] == [source, f"{source}-vllm", "--no-fc-norm", "--no-norm-output"]
    code, error = pasted(command)
    assert code == 0, error
    assert f"fine-tune {shlex.quote(source + '-vllm')}" in refused.stderr
    from eaglekit.families import load_draft

    converted = load_draft(f"{source}-vllm")
    assert converted.facts.vllm_layout and converted.eagle_version == "3"  # what finetune takes, function kept


def test_push_refusing_a_warm_start_names_the_finetune_to_run(folders):
    source, target, _ = folders
    warm = "warm start"
    assert run_cli(["upgrade", source, warm, "--fc-norm-init", "ones"]).exit_code == 0
    refused = run_cli(["push", warm, "--repo-id", "org/draft", "--target", target, "--dry-run"])
    assert refused.exit_code == 1 and "refusing to push an untrained warm start" in refused.stderr
    command = re.search(r"run `([^`]+)` first", refused.stderr).group(1)
    assert shlex.split(command) == ["eaglekit", "finetune", warm, f"{warm}-tuned", "--target", target]
    code, error = pasted(command)
    assert code != USAGE_ERROR and "cannot load the target model" in error
    unnamed = run_cli(["push", warm, "--repo-id", "org/draft", "--dry-run"])
    assert unnamed.exit_code == 1 and "giving its target model (Hub id or folder) as --target" in unnamed.stderr
    assert not PLACEHOLDER.search(unnamed.stderr)


def test_validate_says_the_warm_start_step_in_words(folders):
    source, _, tmp_path = folders
    warm = str(tmp_path / "warm")
    assert run_cli(["upgrade", source, warm, "--fc-norm-init", "ones"]).exit_code == 0
    doc = json.loads(run_cli(["validate", warm, "--format", "json"]).stdout)
    message = next(f["message"] for f in doc["findings"] if f["code"] == "EK156")
    assert message.endswith("fine-tune it against its target with `eaglekit finetune`")
    assert not PLACEHOLDER.search(message)
