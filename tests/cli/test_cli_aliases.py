"""Options declared once: the data options capture and finetune share, and the old names kept one release as
deprecated aliases (listed in --help, one warning on stderr, both names at once refused)."""

import pytest

from tests.support.cli import run_cli
from tests.support.factory import make_draft, make_target_config


@pytest.mark.parametrize("command, alias, canonical", [("finetune", "--hidden-states", "--import"),
                                                       ("finetune", "--target-dtype", "--dtype"),
                                                       ("capture", "--prompts", "--data")])
def test_a_deprecated_alias_is_listed_in_the_help(command, alias, canonical):
    lines = run_cli([command, "--help"]).stdout.splitlines()
    line = next(i for i, text in enumerate(lines) if text.strip().startswith(alias))
    assert f"deprecated alias of {canonical}" in " ".join(lines[line:line + 2])


def test_the_data_options_are_the_same_in_capture_and_finetune():
    def data_lines(command):
        text = run_cli([command, "--help"]).stdout
        return {line.split()[0] for line in text.splitlines()
                if line.strip().startswith(("--data", "--generate", "--context-", "--max-length", "--code-tokens",
                                            "--templates"))}

    assert data_lines("capture") == data_lines("finetune") == {
        "--data", "--data-limit", "--generate", "--context-tokens", "--context-every", "--max-length", "--code-tokens",
        "--templates"}


def test_a_deprecated_alias_works_warns_once_and_cannot_be_given_with_its_name(tmp_path):
    draft = make_draft(str(tmp_path / "d"), "vllm")
    target = make_target_config(str(tmp_path / "t"))
    data = tmp_path / "data.jsonl"
    data.write_text('{"text": "x"}\n')
    base = ["finetune", draft, str(tmp_path / "out"), "--target", target, "--no-progress"]
    old = run_cli([*base, "--hidden-states", str(tmp_path), "--data", str(data)])
    assert old.exit_code == 2, old.stderr
    assert old.stderr.splitlines() == ["warning: --hidden-states is a deprecated alias of --import; use --import",
                                       "Error: --import brings its own sequences: it cannot be combined with --data, "
                                       "--generate, --context-tokens, --code-tokens or --templates"]
    both = run_cli([*base, "--hidden-states", str(tmp_path), "--import", str(tmp_path)])
    assert both.exit_code == 2 and "give --import or its deprecated alias --hidden-states, not both" in both.stderr
    dtype = run_cli([*base, "--target-dtype", "float16", "--dtype", "float16"])
    assert dtype.exit_code == 2 and "give --dtype or its deprecated alias --target-dtype, not both" in dtype.stderr
    capture = run_cli(["capture", target, str(tmp_path / "store"), "--prompts", str(data), "--data", str(data)])
    assert capture.exit_code == 2 and "give --data or its deprecated alias --prompts, not both" in capture.stderr
    assert not (tmp_path / "out").exists() and not (tmp_path / "store").exists()
