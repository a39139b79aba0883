"""Paths are printed as the user typed them (relative stays relative, `./` stays), in reports and inside the
commands printed to paste; a pasted fix runs; a path in a finding is never cut to fit a table column."""

from __future__ import annotations

import shlex

import pytest

from eaglekit.cli.output import out, print_findings
from tests.support.cli import run_cli
from tests.support.factory import make_draft, make_target_config

SOURCE, TARGET = "./source draft", "the target"


@pytest.fixture
def folders(tmp_path, monkeypatch):
    """A draft in a layout vLLM does not serve as is and a target with only its config, in folders of the working
    directory whose names hold a space."""
    monkeypatch.chdir(tmp_path)
    make_draft(str(tmp_path / "source draft"), "modelopt")
    make_target_config(str(tmp_path / TARGET))
    return tmp_path


def joined(stdout: str) -> str:
    """stdout with ` \\`-continued lines joined as a shell joins them."""
    return stdout.replace(" \\\n", " ")


@pytest.mark.parametrize("args", [
    ["inspect", SOURCE, "--target", TARGET],
    ["validate", SOURCE, "--target", TARGET],
    ["validate", SOURCE, "--target", f"{TARGET}/config.json", "--engine", "all"],
    ["upgrade", SOURCE, "out dir", "--target", TARGET],
], ids=["inspect", "validate", "validate-config", "upgrade"])
def test_reports_name_each_path_as_typed(folders, args):
    result = run_cli(args)
    assert str(folders) not in result.stdout, result.stdout
    assert SOURCE in result.stdout


def test_validates_fix_runs_as_pasted_and_names_the_paths_typed(folders):
    shown = run_cli(["validate", SOURCE, "--target", TARGET])
    assert shown.exit_code == 1
    lines = joined(shown.stdout).splitlines()
    command = lines[lines.index(next(line for line in lines if line.startswith("fix "))) + 1].strip()
    args = shlex.split(command)
    assert args[:4] == ["eaglekit", "upgrade", SOURCE, "source draft-vllm"] and args[5] == TARGET
    result = run_cli(args[1:])
    assert result.exit_code == 0, result.stderr
    assert run_cli(["validate", "source draft-vllm", "--target", TARGET]).exit_code == 0


def test_a_path_wider_than_a_findings_column_stays_whole(monkeypatch):
    """A message naming a path wider than the message column: every word of it is printed whole, no `…`."""
    path = "/data/checkpoints/" + "a-very-long-folder-name-" * 3 + "draft"
    message = f"aux ids are only in eagle_config; `eaglekit upgrade {path} out` writes what vLLM reads"
    monkeypatch.setattr(out, "_width", 80)
    with out.capture() as captured:
        print_findings([{"code": "EK307", "severity": "error", "pitfall": "P17", "message": message}])
    text = captured.get()
    assert path in text.split() and "…" not in text
    assert all(len(line) <= 80 or line.strip() == path for line in text.splitlines())


@pytest.mark.parametrize("args, named, status", [
    (["inspect", "./empty draft"], "Error: ./empty draft: ", 1),
    (["validate", "empty draft"], "Error: empty draft: ", 1),
    (["upgrade", "./source draft", "./source draft/out"], "overlaps the source ./source draft:", 2),
], ids=["inspect", "validate", "upgrade-into-source"])
def test_an_error_from_the_library_names_each_path_as_typed(folders, args, named, status):
    (folders / "empty draft").mkdir()
    (folders / "empty draft" / "config.json").write_text('{"architectures": ["LlamaForCausalLMEagle3"]}')
    result = run_cli(args)
    assert result.exit_code == status and result.stdout == ""
    assert named in result.stderr and str(folders) not in result.stderr, result.stderr
