"""`eaglekit doctor`: every row's status, detail and fix, with fake interpreters and builds standing in for vLLM
and llama.cpp."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import jsonschema
import pytest

from tests.support import REPO
from tests.support.cli import run_cli

SCHEMA = json.loads((REPO / "eaglekit" / "schemas" / "doctor-report.schema.json").read_text())


def fake_program(path: Path, body: str) -> str:
    path.write_text(f"#!/bin/sh\n{body}\n")
    path.chmod(0o755)
    return str(path)


def rows(result) -> dict[str, dict]:
    doc = json.loads(result.stdout)
    jsonschema.validate(doc, SCHEMA)
    return {c["name"]: c for c in doc["checks"]}


def test_a_missing_vllm_environment_names_the_setup_script(tmp_path, monkeypatch):
    monkeypatch.chdir(REPO)
    monkeypatch.setenv("EAGLEKIT_VLLM_PYTHON", str(tmp_path / "no-such-env" / "bin" / "python"))
    monkeypatch.setenv("EAGLEKIT_LLAMA_CPP", str(tmp_path / "no-such-build"))
    result = run_cli(["doctor", "--format", "json"])
    assert result.exit_code == 0, result.output  # engines widen what eaglekit does; it runs without them
    found = rows(result)
    assert found["vllm"]["status"] == "missing" and found["vllm"]["fix"] == "scripts/vllm-env.sh"
    assert os.access(REPO / found["vllm"]["fix"], os.X_OK)  # runs as printed from here
    assert found["llama.cpp"]["status"] == "missing" and found["llama.cpp"]["fix"] == "scripts/llamacpp-build.sh"
    human = run_cli(["doctor"])
    assert "vllm: fix: scripts/vllm-env.sh" in human.stdout and "eaglekit can run" in human.stdout


def test_a_present_vllm_and_llamacpp_build_are_reported_with_their_versions(tmp_path, monkeypatch):
    monkeypatch.setenv("EAGLEKIT_VLLM_PYTHON", fake_program(tmp_path / "python", "echo 'vllm-version 0.33.0'"))
    monkeypatch.setenv("EAGLEKIT_LLAMA_CPP", fake_program(tmp_path / "llama", "echo 'version: 11434 (abc)' >&2"))
    found = rows(run_cli(["doctor", "--format", "json"]))
    assert found["vllm"]["status"] == "ok" and found["vllm"]["fix"] is None and not found["vllm"]["core"]
    assert found["vllm"]["detail"].startswith("vLLM 0.33.0 in ")  # the JSON names a local path by its folder
    assert found["llama.cpp"]["status"] == "ok" and found["llama.cpp"]["detail"].startswith("version: 11434 (abc)")
    assert all(found[name]["status"] == "ok" and found[name]["core"] for name in ("python", "eaglekit", "click"))


def test_an_environment_whose_vllm_does_not_import_is_broken_and_a_hung_one_is_bounded(tmp_path, monkeypatch):
    monkeypatch.setenv("EAGLEKIT_LLAMA_CPP", str(tmp_path / "no-such-build"))
    monkeypatch.setenv("EAGLEKIT_VLLM_PYTHON",
                       fake_program(tmp_path / "python", "echo 'ImportError: libcudart.so.12' >&2; exit 1"))
    broken = rows(run_cli(["doctor", "--format", "json"]))["vllm"]
    assert broken["status"] == "broken" and "ImportError: libcudart.so.12" in broken["detail"]
    monkeypatch.setenv("EAGLEKIT_VLLM_PYTHON", fake_program(tmp_path / "slow", "sleep 30"))
    hung = rows(run_cli(["doctor", "--format", "json", "--timeout", "1"]))["vllm"]
    assert hung["status"] == "broken" and "took over 1 s" in hung["detail"]


def test_a_missing_core_dependency_is_the_only_exit_1(monkeypatch, tmp_path):
    from eaglekit import doctor

    monkeypatch.setenv("EAGLEKIT_VLLM_PYTHON", str(tmp_path / "none"))
    monkeypatch.setenv("EAGLEKIT_LLAMA_CPP", str(tmp_path / "none"))  # the engines are the engine tier's
    core = doctor.core_modules()
    monkeypatch.setattr(doctor, "core_modules", lambda: {**core, "no_such_module_xyz": "no-such-dist"})
    result = run_cli(["doctor", "--format", "json"])
    assert result.exit_code == 1
    found = rows(result)["no-such-dist"]
    assert found["status"] == "missing" and found["core"] and found["fix"].endswith("-m pip install no-such-dist")
    assert json.loads(result.stdout)["usable"] is False


def test_doctor_never_imports_torch_itself(tmp_path):
    """torch is asked in a child interpreter: the doctor process stays free of it."""
    code = ("import sys\nfrom eaglekit.cli.main import main\nsys.argv = ['eaglekit', 'doctor', '--format', 'json']\n"
            "try:\n    main()\nexcept SystemExit:\n    pass\nprint('torch' in sys.modules, file=sys.stderr)")
    env = {**os.environ, "EAGLEKIT_VLLM_PYTHON": str(tmp_path / "none"), "PYTHONPATH": str(REPO)}
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=300)
    assert done.stderr.strip().splitlines()[-1] == "False", done.stderr
    assert any(c["name"] == "torch" for c in json.loads(done.stdout)["checks"])


def test_the_dependencies_checked_are_the_ones_pyproject_declares(monkeypatch, tmp_path):
    """The doctor reads the installed metadata, so a dependency added to pyproject.toml is checked without a second
    list to keep in step."""
    tomllib = pytest.importorskip("tomllib")
    from eaglekit import doctor

    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]

    def names(specs):
        return {re.match(r"[A-Za-z0-9._-]+", s).group(0).lower() for s in specs} - {"eaglekit"}

    assert set(doctor.core_modules().values()) == names(project["dependencies"])
    extras = {extra: names(specs) for extra, specs in project["optional-dependencies"].items()
              if extra not in doctor.GATHERING_EXTRAS}
    assert {(doctor.import_name(d), e) for e, dists in extras.items() for d in dists} == set(
        doctor.optional_modules().items())
    for engine in ("EAGLEKIT_VLLM_PYTHON", "EAGLEKIT_LLAMA_CPP"):  # the engines are the engine tier's
        monkeypatch.setenv(engine, str(tmp_path / "none"))
    doctor_rows = rows(run_cli(["doctor", "--format", "json"]))
    assert all(dist in doctor_rows for dist in names(project["dependencies"]))


def test_a_path_wider_than_the_detail_column_is_printed_whole(tmp_path, monkeypatch):
    """A long llama.cpp build path in an 80-column log: the rows become lines, the path is never split or cut."""
    from eaglekit.cli.output import out

    build = tmp_path / ("a-build-folder-with-a-long-name-" * 2) / "llama"
    monkeypatch.setenv("EAGLEKIT_VLLM_PYTHON", str(tmp_path / "no-such-env" / "bin" / "python"))
    monkeypatch.setenv("EAGLEKIT_LLAMA_CPP", str(build))
    monkeypatch.setattr(out, "_width", 80)
    human = run_cli(["doctor"]).stdout
    assert str(build) in human.split() and "…" not in human
    assert all(len(line) <= 80 or len(line.split()) == 1 for line in human.splitlines()), human  # a path alone
