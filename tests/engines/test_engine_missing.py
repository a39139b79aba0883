"""A machine without vLLM, asked for it by a right command line: exit 1 with one line that gives the command that
installs it (a usage error, exit 2, would blame the command line)."""

from __future__ import annotations

import os

import pytest

from tests.support.cli import run_cli
from tests.support.factory import make_draft, make_target_config
from tests.support.targets import make_target_with_tokenizer

COMMANDS = {
    "verify --engine vllm": lambda d, t, o: ["verify", d, "--target", t, "--engine", "vllm"],
    "bench": lambda d, t, o: ["bench", d, "--target", t],
    "capture --engine vllm": lambda d, t, o: ["capture", t, o, "--aux-layer-ids", "1,2,3", "--engine", "vllm",
                                              "--calibration"],
    "finetune --eval-engine vllm": lambda d, t, o: ["finetune", d, o, "--target", t, "--eval-engine", "vllm"],
}


@pytest.mark.parametrize("lookup", ["EAGLEKIT_VLLM_PYTHON names none", "nothing set, no .vllm-env"])
@pytest.mark.parametrize("command", sorted(COMMANDS))
def test_a_missing_vllm_exits_1_with_the_command_that_installs_it(tmp_path, monkeypatch, command, lookup):
    import eaglekit.runtime.engine

    draft = make_draft(str(tmp_path / "draft"), "vllm")
    target = (make_target_with_tokenizer(str(tmp_path / "target")) if command.startswith("capture")  # it encodes
              else make_target_config(str(tmp_path / "target")))
    if lookup.startswith("EAGLEKIT"):
        monkeypatch.setenv("EAGLEKIT_VLLM_PYTHON", str(tmp_path / "no-env" / "bin" / "python"))
    else:  # the lookup ends at this Python, which has no vLLM
        monkeypatch.delenv("EAGLEKIT_VLLM_PYTHON", raising=False)
        monkeypatch.setattr(eaglekit.runtime.engine, "project_environments",
                            lambda: [str(tmp_path / ".vllm-env" / "bin" / "python")])
    result = run_cli(COMMANDS[command](draft, target, str(tmp_path / "out")))
    assert result.exit_code == 1, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("Error: --engine vllm: "), lines
    assert "scripts/vllm-env.sh` (it makes .vllm-env)" in lines[0]
    assert "`EAGLEKIT_VLLM_PYTHON=.vllm-env/bin/python`" in lines[0]
    assert not os.path.exists(tmp_path / "out")
