"""`eaglekit inspect` through the real CLI entry point: flags, exit codes, JSON schema, no torch."""

import json
import os
import subprocess
import sys

import jsonschema
import pytest
from click.testing import CliRunner

from bench.bench_inspect_cpu import on_a_terminal
from eaglekit.cli.main import cli
from tests.support import REPO
from tests.support.cli import run_cli as run
from tests.support.factory import make_draft, make_target_config

SCHEMA = json.load(open(os.path.join(str(REPO), "schemas", "inspect-report.schema.json")))


@pytest.fixture(scope="module")
def drafts(tmp_path_factory):
    base = tmp_path_factory.mktemp("drafts")
    return {
        "specforge": make_draft(str(base / "specforge"), "specforge"),
        "vllm31": make_draft(str(base / "vllm31"), "vllm", fc_norm=True, norm_output=True),
        "kimi": make_draft(str(base / "kimi"), "kimi", attention="mla", draft_vocab=None, embed=True),
        "eagle": make_draft(str(base / "eagle"), "eagle"),
        "target": make_target_config(str(base / "target")),
    }


@pytest.mark.parametrize("name", ["specforge", "vllm31", "kimi", "eagle"])
def test_json_report_validates_against_schema(drafts, name):
    result = run(["inspect", drafts[name], "--format", "json", "--tensors", "--target", drafts["target"]])
    assert result.exit_code == 0, result.output
    doc = json.loads(result.stdout)
    jsonschema.validate(doc, SCHEMA)
    assert doc["aux_layer_ids"] == [2, 6, 9]
    names = {t["name"] for t in doc["tensors"]}
    assert {"fc.weight", "norm.weight", "layers.0.mlp.down_proj.weight"} <= names


def test_json_facts_for_a_specforge_draft(drafts):
    doc = json.loads(run(["inspect", drafts["specforge"], "--format", "json"]).stdout)
    assert doc["family"] == "specforge"
    assert doc["aux_layer_ids_as_written"] == [1, 5, 8] and doc["aux_layer_ids"] == [2, 6, 9]
    assert doc["aux_layer_id_convention"] == "output"
    assert doc["eagle_version"] == "3"
    assert doc["has_d2t"] and doc["has_t2d"] and not doc["has_embed_tokens"]
    assert "tensors" not in doc
    on_disk = sum(os.path.getsize(os.path.join(drafts["specforge"], f)) for f in doc["files"])
    assert doc["total_bytes"] == on_disk - _header_bytes(drafts["specforge"], doc["files"])


def _header_bytes(root, files):
    import struct

    total = 0
    for f in files:
        with open(os.path.join(root, f), "rb") as fh:
            total += 8 + struct.unpack("<Q", fh.read(8))[0]
    return total


def test_human_output_names_the_essentials(drafts):
    result = run(["inspect", drafts["vllm31"], "--target", drafts["target"]])
    assert result.exit_code == 0, result.output
    text = result.stdout
    for needle in ("vllm", "3.1", "fc_norm=True", "[2, 6, 9]", "Serving these files"):
        assert needle in text, needle


def test_eagle_default_ids_need_the_target(drafts):
    doc = json.loads(run(["inspect", drafts["eagle"], "--format", "json"]).stdout)
    assert doc["aux_layer_ids"] is None
    doc = json.loads(run(["inspect", drafts["eagle"], "--format", "json", "--target", drafts["target"]]).stdout)
    assert doc["aux_layer_ids"] == [2, 6, 9] and doc["aux_layer_ids_source"].startswith("engine default")


@pytest.mark.parametrize("case", ["missing", "no-config", "truncated", "unknown-layout", "pickle"])
def test_bad_inputs_are_one_line_exit_1(tmp_path, case):
    path = tmp_path / "d"
    if case == "no-config":
        path.mkdir()
    elif case == "truncated":
        make_draft(str(path), "vllm")
        weights = path / "model.safetensors"
        weights.write_bytes(weights.read_bytes()[:200])
    elif case == "unknown-layout":
        make_draft(str(path), "vllm", config_patch={"architectures": ["Whatever"]})
    elif case == "pickle":
        path.mkdir()
        (path / "config.json").write_text("{}")
        (path / "pytorch_model.bin").write_bytes(b"not really a pickle")
    result = run(["inspect", str(path)])
    assert result.exit_code == 1
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("Error: ") and str(path) in lines[0]
    assert "Traceback" not in result.output


def test_usage_errors_exit_2(drafts):
    assert run(["inspect"]).exit_code == 2
    assert run(["inspect", drafts["vllm31"], "--format", "xml"]).exit_code == 2


def test_debug_env_shows_the_traceback(tmp_path, monkeypatch):
    monkeypatch.setenv("EAGLEKIT_DEBUG", "1")
    with pytest.raises(Exception):
        run(["inspect", str(tmp_path / "nope")])


@pytest.mark.parametrize("terminal", [False, True])
@pytest.mark.parametrize("fmt", ["human", "json"])
def test_help_and_inspect_never_import_torch_or_numpy(drafts, fmt, terminal):
    """A header-only command loads neither: the rules, families and provenance it reads import them where they
    compute. Nor jsonschema; nor rich, whose output, in a pipe or at a terminal in colour, is drawn by
    eaglekit.cli.plain (what every start-up pays, bench/bench_inspect_cpu.py)."""
    code = (
        "import sys\n"
        "from eaglekit.cli.main import main\n"
        f"for args in (['--help'], ['inspect', sys.argv[1], '--format', '{fmt}']):\n"
        "    try:\n"
        "        main(args)\n"
        "    except SystemExit:\n"
        "        pass\n"
        "heavy = sorted({'torch', 'numpy', 'jsonschema', 'rich', *sys.argv[2:]} & set(sys.modules))\n"
        "assert not heavy, f'{heavy} imported'\n"
        "print('clean')\n"
    )
    argv = [sys.executable, "-c", code, drafts["vllm31"], *NOT_ON_INSPECTS_PATH]
    if terminal:
        env = {**os.environ, "TERM": "xterm-256color", "COLUMNS": "100"}
        for name in ("NO_COLOR", "FORCE_COLOR", "TTY_COMPATIBLE"):
            env.pop(name, None)
        returncode, stdout = on_a_terminal(argv, env)
        assert (b"\x1b[1m" in stdout) == (fmt == "human")
        stdout_text = stdout.decode()
    else:
        proc = subprocess.run(argv, capture_output=True, text=True)
        returncode, stdout_text = proc.returncode, proc.stdout + proc.stderr
    assert returncode == 0, stdout_text
    assert stdout_text.strip().endswith("clean")


NOT_ON_INSPECTS_PATH = ("eaglekit.io.hub_client", "logging", "eaglekit.other_drafts", "eaglekit.quantization",
                        "eaglekit.decode.metrics")
"""What inspecting a local EAGLE-3 draft has no use for, each a cost every start-up would pay: the Hub client (and
logging), other methods' descriptions, quantization schemes, acceptance counters."""


def test_every_command_is_listed_in_help():
    result = CliRunner().invoke(cli, ["--help"])
    assert result.exit_code == 0
    for name in ("inspect", "validate", "upgrade", "verify", "push"):
        assert name in result.output


@pytest.mark.parametrize("columns", [80, 200])
def test_tensor_names_are_never_truncated_or_wrapped(drafts, monkeypatch, columns, tmp_path):
    """At 80 columns a table that cannot show every name whole becomes plain lines; names stay copyable."""
    from eaglekit.cli import output

    monkeypatch.setattr(output.out, "width", columns)
    doc = json.loads(run(["inspect", drafts["specforge"], "--format", "json", "--tensors"]).stdout)
    text = run(["inspect", drafts["specforge"], "--tensors"]).stdout
    for t in doc["tensors"]:
        assert t["name"] in text and t["source_name"] in text
    plan = run(["upgrade", drafts["specforge"], str(tmp_path / "out"), "--dry-run"]).stdout
    assert all(name in plan for name in (t["name"] for t in doc["tensors"]))


def test_rows_too_wide_for_80_columns_keep_every_header(tmp_path, capsys):
    from eaglekit.cli.output import identifier_table, out

    columns = ["category", "prompts", "τ A", "τ B", "B − A", "95 % interval", "verdict", "per position A"]
    row = ["coding", "16", "1.995", "1.900", "-0.095", "-0.201 – +0.012", "not resolved", "0.61 0.33 0.12"]
    width = out.width
    out.width = 80
    try:
        with out.capture() as captured:
            identifier_table("τ by category", columns, [row], prose="verdict")
    finally:
        out.width = width
    lines = captured.get().splitlines()
    # every header with its value whole on one line, continued under an indent within 80 columns
    assert lines[1:] == ["  coding — prompts: 16; τ A: 1.995; τ B: 1.900; B − A: -0.095;",
                         "    95 % interval: -0.201 – +0.012; verdict: not resolved;",
                         "    per position A: 0.61 0.33 0.12"]
    assert all(len(line) <= 80 for line in lines)
