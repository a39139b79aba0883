"""The tiers hold by construction: a test that loads SmolLM2 must be marked `model` (or `engine`), and one that
starts a real engine (vLLM's interpreter, the llama.cpp binary) must be marked `engine`; otherwise it fails, naming
the marker, at the moment it reaches for them (registered by tests/conftest.py).

The contributor's loop (`pytest`, no arguments) deselects both markers: an unmarked test that loads the model or
starts an engine would make that loop slow without anyone choosing it. The check is an audit hook on process starts
(every way a process starts, the library's and the tests' own) and a call from tests/support/smollm2.py, the only way
a test reaches the real target.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

TIERS = {"model": ("model", "engine"), "engine": ("engine",)}
"""What a test does → the markers that allow it."""

REPO = Path(__file__).resolve().parents[2]
_running: list[pytest.Item] = []


def _engine_programs() -> frozenset[str]:
    """The real engines' programs as they are started: vLLM's interpreter (EAGLEKIT_VLLM_PYTHON or the one
    scripts/vllm-env.sh makes) and the llama.cpp binary. Not resolved through links: the vLLM environment's python
    links to the system's, which every other process also runs."""
    from eaglekit.engines.llamacpp import speculative_binary

    vllm = os.environ.get("EAGLEKIT_VLLM_PYTHON") or str(REPO / ".vllm-env" / "bin" / "python")
    return frozenset(os.path.abspath(p) for p in (vllm, speculative_binary()))


_ENGINES = _engine_programs()


def require_tier(tier: str, what: str) -> None:
    """Fail the running test unless it carries a marker that allows `what` (a no-op outside a test)."""
    if not _running:
        return
    item = _running[-1]
    allowed = TIERS[tier]
    if not any(item.get_closest_marker(name) for name in allowed):
        pytest.fail(f"{item.nodeid} {what} but is not marked {' or '.join(allowed)}: mark it "
                    f"@pytest.mark.{tier} (the contributor's loop leaves that tier out)", pytrace=False)


def _on_process_start(event: str, args: tuple) -> None:
    if event != "subprocess.Popen" or not _running:
        return
    executable, argv = args[0], args[1]
    programs = [executable] if executable else []
    if isinstance(argv, (list, tuple)) and argv:
        programs.append(argv[0])
    elif isinstance(argv, (str, bytes)):
        programs.append(argv.split()[0] if argv.split() else argv)
    for program in programs:
        path = os.fsdecode(program)
        if os.path.abspath(path) in _ENGINES:
            require_tier("engine", f"starts a real engine ({path})")


sys.addaudithook(_on_process_start)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item):
    """The running test, for the checks above (its fixtures' set-up and teardown included)."""
    _running.append(item)
    try:
        yield
    finally:
        _running.pop()
