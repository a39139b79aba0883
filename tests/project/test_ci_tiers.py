"""CI cannot pass with a whole tier skipped: under CI=true a run whose tests skipped for want of what `.ci/run` sets
up (vLLM's environment, the llama.cpp build, SmolLM2, a package of the test extra) fails, one line per tier, and
llama.cpp's build script fails when cmake or the compiler is missing; other skips stay skips, and every run counts
its skips by reason. Checked on tiny pytest runs of fake skips."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support import REPO

TIERS = '''
import sys

import pytest


def test_engine():
    pytest.skip("no vLLM environment (scripts/vllm-env.sh)")


def test_a_package_of_the_test_extra():
    sys.modules["gguf"] = None  # as if it were not installed
    pytest.importorskip("gguf")


def test_a_platform():
    pytest.skip("reads process states from /proc")


def test_runs():
    pass
'''
MODULE_SKIP = '''
import sys

sys.modules["pyarrow"] = None
import pytest  # noqa: E402

pytest.importorskip("pyarrow")


def test_never_collected():
    pass
'''
ONLY_PLATFORM = '''
import pytest


def test_a_platform():
    pytest.skip("reads process states from /proc")
'''


def tiny_run(tmp_path: Path, ci: bool, files: dict[str, str], *extra: str) -> subprocess.CompletedProcess:
    """pytest over `files` in a folder of their own, with this suite's skip plugin, CI=true or not."""
    for name, text in files.items():
        (tmp_path / name).write_text(text)
    env = {k: v for k, v in os.environ.items() if k not in ("CI", "PYTEST_XDIST_WORKER", "PYTEST_ADDOPTS")}
    env.update(PYTHONPATH=str(REPO), **({"CI": "true"} if ci else {}))
    return subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "tests.support.tiers", "-p", "no:cacheprovider",
                           *extra, str(tmp_path)], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)


@pytest.mark.parametrize("workers", [[], ["-n", "2"]])
def test_under_ci_a_skipped_tier_fails_the_run_naming_it(tmp_path, workers):
    result = tiny_run(tmp_path, True, {"test_tiers.py": TIERS, "test_module_skip.py": MODULE_SKIP}, *workers)
    out = result.stdout
    assert result.returncode == 1, out + result.stderr
    tiers = [line for line in out.splitlines() if line.startswith("CI: ")]
    assert len(tiers) == 3, out
    assert any("the vLLM tier (scripts/vllm-env.sh) did not run: 1 skipped" in line for line in tiers)
    assert any("the gguf package" in line for line in tiers) and any("the pyarrow package" in line for line in tiers)
    assert not any("/proc" in line for line in tiers)
    summary, = [line for line in out.splitlines() if line.startswith("skips by reason: ")]
    assert "1 × no vLLM environment" in summary and "1 × reads process states from /proc" in summary


def test_outside_ci_skips_stay_skips_and_are_counted(tmp_path):
    result = tiny_run(tmp_path, False, {"test_tiers.py": TIERS, "test_module_skip.py": MODULE_SKIP})
    assert result.returncode == 0, result.stdout + result.stderr
    assert "skips by reason: " in result.stdout and "CI: " not in result.stdout


def test_under_ci_a_skip_of_another_kind_passes(tmp_path):
    result = tiny_run(tmp_path, True, {"test_platform.py": ONLY_PLATFORM})
    assert result.returncode == 0 and "skips by reason: 1 × reads process states from /proc" in result.stdout


@pytest.mark.parametrize("ci", [True, False])
def test_the_llamacpp_build_without_cmake_or_a_compiler_names_them_and_fails_only_in_ci(tmp_path, ci):
    """A PATH with neither: one line naming both and their apt packages; exit 1 under CI=true, else 0."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for tool in ("bash", "sed"):
        (bin_dir / tool).symlink_to(shutil.which(tool))
    env = {"PATH": str(bin_dir), **({"CI": "true"} if ci else {})}
    result = subprocess.run([str(bin_dir / "bash"), str(REPO / "scripts" / "llamacpp-build.sh"),
                             str(tmp_path / "build")], env=env, capture_output=True, text=True, timeout=60)
    line, = result.stderr.strip().splitlines()
    assert result.returncode == (1 if ci else 0), result.stderr
    assert "cmake, c++ (a C++ compiler) not found on PATH (apt-get install cmake g++)" in line
    assert line.startswith("Error: ") == ci and not (tmp_path / "build").exists()


GUARDED = '''
import subprocess

import pytest

from tests.support.smollm2 import smollm2_path

ENGINE = {engine!r}


def test_unmarked_starts_an_engine():
    subprocess.run([ENGINE, "-c", "pass"], check=True)


@pytest.mark.engine
def test_marked_starts_an_engine():
    subprocess.run([ENGINE, "-c", "pass"], check=True)


def test_unmarked_runs_another_program():
    subprocess.run(["true"], check=True)


def test_unmarked_loads_smollm2():
    smollm2_path()
'''


def test_an_unmarked_test_that_starts_an_engine_or_loads_smollm2_fails_naming_the_marker(tmp_path, monkeypatch):
    """The guard the tiers stand on: the engine here is a stand-in named as vLLM's interpreter is named."""
    engine = tmp_path / "vllm-python"
    engine.symlink_to(sys.executable)
    monkeypatch.setenv("EAGLEKIT_VLLM_PYTHON", str(engine))
    result = tiny_run(tmp_path, False, {"test_guarded.py": GUARDED.format(engine=str(engine))},
                      "-p", "tests.support.guard", "-rA")
    out = result.stdout
    outcomes = {name: outcome for outcome, name in re.findall(r"^(PASSED|FAILED) test_guarded.py::(\w+)", out, re.M)}
    assert outcomes == {"test_unmarked_starts_an_engine": "FAILED", "test_marked_starts_an_engine": "PASSED",
                        "test_unmarked_runs_another_program": "PASSED", "test_unmarked_loads_smollm2": "FAILED"}, out
    assert f"starts a real engine ({engine}) but is not marked engine" in out
    assert "test_unmarked_loads_smollm2 loads SmolLM2 but is not marked model or engine" in out


def _tier_expressions() -> dict[str, str]:
    """Each tier of scripts/test-tiers.sh → its marker expression (the fast tier's is pyproject.toml's default)."""
    import shlex
    import tomllib

    addopts = shlex.split(tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["pytest"]["ini_options"]
                          ["addopts"])
    default = addopts[addopts.index("-m") + 1]
    tiers = {}
    for line in (REPO / "scripts" / "test-tiers.sh").read_text().splitlines():
        if line.startswith("tier "):
            words = shlex.split(line)
            tiers[words[1]] = words[words.index("-m") + 1] if "-m" in words else default
    return tiers


def test_every_test_belongs_to_exactly_one_tier_and_pytest_alone_runs_the_fast_one():
    """For every combination of the tier markers a test can carry, exactly one tier of the CI script selects it."""
    from itertools import combinations

    from _pytest.mark.expression import Expression

    tiers = _tier_expressions()
    assert list(tiers) == ["fast", "triton", "model", "engine"]
    markers = ("model", "engine", "triton", "cuda")
    for size in range(len(markers) + 1):
        for carried in combinations(markers, size):
            chosen = [name for name, expr in tiers.items()
                      if Expression.compile(expr).evaluate(lambda marker, carried=carried: marker in carried)]
            assert len(chosen) == 1, (carried, chosen)
    assert tiers["fast"] == "not model and not engine and not triton"
