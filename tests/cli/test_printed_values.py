"""Values from outside (a Hub account, a served model's name, a path, a probed version) are printed so they cannot
forge a line: a newline, carriage return, escape sequence or Unicode line separator in one is shown as its escape,
never obeyed. And a printed command is never wrapped inside an argument: at any width, its lines pasted into a
shell give the argv it stands for."""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys

import pytest

from tests.support import REPO
from tests.support.cli import run_cli
from tests.support.factory import edit_config, make_draft, make_target_config

ROOT = str(REPO)
HOSTILE = ["\n## Error: forged", "\r\x1b[2KError: forged", "\u2028Error: forged", "\x85## forged"]
FORGED = re.compile(r"^\s*(?:##|Error:)\s*forged")
RAW_CONTROL = re.compile("[\r\x1b\x85\u2028\u2029]")


def forged_lines(text: str) -> list[str]:
    """Lines a hostile value started, and any control character left raw in the output."""
    return [line for line in re.split(r"\n|\r|\u2028|\x85", text) if FORGED.match(line)] + RAW_CONTROL.findall(text)


@pytest.mark.parametrize("hostile", HOSTILE)
def test_a_hub_account_and_role_cannot_forge_a_push_dry_run_line(fake_hub, tmp_path, hostile):
    """The Hub's whoami names the account and its role in the org: both are printed escaped, in the table of notes
    and in the one error line a refused dry run ends with."""
    draft = make_draft(str(tmp_path / "draft"), "vllm", fc_norm=True, norm_output=True)
    fake_hub.user = "someone" + hostile
    fake_hub.orgs = {"eagle-org": "reader" + hostile}
    result = run_cli(["push", draft, "--repo-id", "eagle-org/draft", "--target", "meta-llama/Llama-3.1-8B-Instruct",
                      "--endpoint", fake_hub.endpoint, "--dry-run", "--license", "apache-2.0",
                      "--token", fake_hub.token])
    assert result.exit_code == 1, result.stderr  # a reader cannot write: the dry run says the push would fail
    assert not forged_lines(result.stdout + result.stderr), result.stdout + result.stderr
    assert "signed in as someone" + ascii(hostile)[1:-1] in result.stdout
    assert len(result.stderr.strip().splitlines()) == 1 and result.stderr.startswith("Error: eagle-org/draft")


@pytest.mark.parametrize("hostile", HOSTILE)
def test_a_model_id_a_target_config_records_cannot_forge_a_card_line(tmp_path, hostile):
    """A local target's config names its Hub id (_name_or_path): a name with a line break in it is no Hub id, so the
    card names no base model rather than a forged line; --target-id with one is refused in one line."""
    draft = make_draft(str(tmp_path / "draft"), "vllm", fc_norm=True, norm_output=True)
    target = make_target_config(str(tmp_path / "target"))
    edit_config(target, lambda c: c.update(_name_or_path="meta-llama/Llama" + hostile))
    result = run_cli(["push", draft, "--repo-id", "eagle-org/draft", "--target", target, "--dry-run", "--offline",
                      "--license", "apache-2.0"])
    assert result.exit_code == 0, result.stderr
    assert not forged_lines(result.stdout + result.stderr) and "base_model" not in result.stdout
    refused = run_cli(["push", draft, "--repo-id", "eagle-org/draft", "--target", target, "--dry-run", "--offline",
                       "--target-id", "meta-llama/Llama" + hostile])
    assert refused.exit_code == 2 and "is not a Hub id" in refused.stderr, refused.stderr
    assert not forged_lines(refused.stderr) and len(refused.stderr.strip().splitlines()) == 1


def test_a_trailing_newline_makes_no_hub_id():
    from eaglekit.hub.card_text import is_repo_id

    assert is_repo_id("meta-llama/Llama-3.1-8B") and not is_repo_id("meta-llama/Llama-3.1-8B\n")


@pytest.mark.parametrize("hostile", HOSTILE)
def test_what_a_running_server_says_cannot_forge_a_bench_line(capsys, monkeypatch, hostile):
    """A server eaglekit did not start names its model and version and sits at a URL the user gave: each printed
    escaped."""
    from eaglekit.bench.report import BenchReport, BenchRow, ServedRun
    from eaglekit.cli.bench import render
    from eaglekit.cli.output import out

    def served(rates: list[float]) -> ServedRun:
        return ServedRun.from_vllm({
            "completed": len(rates), "duration": 1.0, "total_output_tokens": 10 * len(rates),
            "output_throughput": sum(rates), "output_lens": [10] * len(rates), "latencies": [10 / r for r in rates],
            **{f"{stat}_{name}_ms": 5.0 for stat in ("mean", "p50", "p99") for name in ("tpot", "ttft")},
            "generated_texts": [f"text {i}" for i in range(len(rates))]})

    doc = BenchReport("draft", "target", "3", 3, 64, "bfloat16", {"name": "p", "count": 2, "ignore_eos": False},
                      {"name": "vllm", "version": "0.33.0", "device_type": "cpu", "device_name": "cpu",
                       "tensor_parallel_size": 1, "max_model_len": 512},
                      {"model": "draft", "method": "eagle3", "num_speculative_tokens": 3}, {},
                      [BenchRow(1, None, served([10.0, 12.0]), served([13.0, 16.0]))]).to_dict()
    doc["servers"] = {"started_by_eaglekit": False, "speculative_url": "http://127.0.0.1:8000/v1" + hostile,
                      "baseline_url": "http://127.0.0.1:8001" + hostile, "served_model": "served" + hostile}
    doc["engine"]["version"] = "0.33.0" + hostile
    doc["target"] = "served" + hostile
    monkeypatch.setattr(out, "width", 200)
    render(doc)
    text = capsys.readouterr().out
    assert not forged_lines(text), text
    assert "serving served" + ascii(hostile)[1:-1] in text


@pytest.mark.parametrize("hostile", HOSTILE)
def test_a_path_from_the_environment_cannot_forge_a_doctor_line(tmp_path, monkeypatch, hostile):
    """EAGLEKIT_VLLM_PYTHON names a Python that is not there: doctor's row and its fix name the path, escaped."""
    monkeypatch.setenv("EAGLEKIT_VLLM_PYTHON", str(tmp_path / ("env" + hostile) / "python"))
    monkeypatch.setenv("EAGLEKIT_LLAMA_CPP", str(tmp_path / ("build" + hostile)))
    result = run_cli(["doctor", "--timeout", "30"])
    assert result.exit_code == 0, result.output
    assert not forged_lines(result.stdout + result.stderr), result.stdout
    assert ascii(hostile)[1:-1] in result.stdout


# ------------------------------------------------------------------ printed commands at narrow widths


def printed_command(stdout: str, label: str = "next: ") -> str:
    """The command after `label`, its ` \\`-continued lines joined as a shell joins them."""
    joined = stdout.replace(" \\\n", " ")
    lines = [line for line in joined.splitlines() if line.startswith(label)]
    assert len(lines) == 1, stdout
    return lines[0][len(label):]


def upgrade_at(columns: int, cwd: str, *args: str) -> str:
    """`eaglekit upgrade ARGS` in a terminal `columns` wide (rich reads COLUMNS), its stdout."""
    env = {**os.environ, "COLUMNS": str(columns), "PYTHONPATH": ROOT}
    result = subprocess.run([sys.executable, "-m", "eaglekit", "upgrade", *args], cwd=cwd, env=env,
                            capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr
    return result.stdout


@pytest.mark.parametrize("columns", [40, 60])
def test_a_next_command_pasted_from_a_narrow_terminal_names_the_same_arguments(tmp_path, columns):
    """Folder names with spaces, quoted as one argument each, wider than the line: the command is broken between
    arguments only, never inside a quoted one (where ` \\` would become part of the path)."""
    make_draft(str(tmp_path / "source draft with a long name"), "modelopt")
    make_target_config(str(tmp_path / "the target folder with spaces"))
    out = "warm start output folder"  # printed as typed, relative to where the user ran it
    stdout = upgrade_at(columns, str(tmp_path), "source draft with a long name", out,
                        "--target", "the target folder with spaces", "--fc-norm")
    assert shlex.split(printed_command(stdout)) == ["eaglekit", "finetune", out, f"{out}-tuned", "--target",
                                                    "the target folder with spaces"]
    for line in stdout[stdout.index("next: "):].splitlines()[:-1]:
        if line.endswith(" \\"):
            assert len(shlex.split(line[:-2])) >= 1  # each continued line is whole arguments: it splits alone


def test_a_command_naming_a_path_with_a_newline_stays_on_its_lines_and_bash_reads_the_same_argv(tmp_path):
    """A control character in an argument is printed in bash's $'...' form: no line is forged, and bash, given the
    printed lines, passes the program the very path."""
    hostile = "warm\n## Error: forged"
    make_draft(str(tmp_path / "source"), "modelopt")
    make_target_config(str(tmp_path / "target"))
    stdout = upgrade_at(60, str(tmp_path), "source", hostile, "--target", "target", "--fc-norm")
    assert not forged_lines(stdout), stdout
    command = printed_command(stdout)
    argv = subprocess.run(["bash", "-c", "printf '%s\\0' " + command.removeprefix("eaglekit ")],
                          capture_output=True, text=True, check=True).stdout.split("\0")[:-1]
    assert argv == ["finetune", hostile, f"{hostile}-tuned", "--target", "target"]  # as typed, from where it ran


def test_shell_words_round_trip_through_bash():
    from eaglekit.cli.output import command_lines, shell_word

    words = ["a b", "it's", "x\ny", "tab\there", "esc\x1b[2K", "back\\slash'\n", "plain"]
    lines = command_lines("next: ", " ".join(shlex.quote(w) for w in ["eaglekit", *words]), 30)
    assert all("\n" not in line for line in lines) and all(not FORGED.match(line) for line in lines)
    pasted = "\n".join(lines)[len("next: eaglekit"):]
    argv = subprocess.run(["bash", "-c", "printf '%s\\0' " + pasted], capture_output=True, text=True,
                          check=True).stdout.split("\0")[:-1]
    assert argv == words and shell_word("plain") == "plain"


@pytest.mark.parametrize("columns", [60, 200])
def test_the_serve_line_after_an_upgrade_names_the_paths_as_given_and_pastes_as_one_command(tmp_path, columns):
    """A vLLM-ready output gets the `vllm serve` line that serves it: the target and the draft as the user named
    them (relative, with spaces), the speculative config as vLLM's JSON, one command however the line is broken."""
    make_draft(str(tmp_path / "source"), "modelopt")
    make_target_config(str(tmp_path / "my target"))
    (tmp_path / "out dir").mkdir()
    stdout = upgrade_at(columns, str(tmp_path), "source", "out dir/eagle3", "--target", "my target",
                        "--no-fc-norm", "--no-norm-output")
    argv = shlex.split(printed_command(stdout, "serve: "))
    assert argv[:3] == ["vllm", "serve", "my target"] and argv[3] == "--speculative-config" and len(argv) == 5
    assert json.loads(argv[4]) == {"model": "out dir/eagle3", "method": "eagle3", "num_speculative_tokens": 3}
    dry = upgrade_at(columns, str(tmp_path), "source", "dry", "--target", "my target", "--dry-run")
    other = upgrade_at(columns, str(tmp_path), "source", "for-sglang", "--target", "my target", "--to", "sglang")
    assert "serve: " not in dry and "vllm serve" not in other
