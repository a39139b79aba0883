"""Test environment: Triton runs interpreted on CPU, the Hub is a loopback server, nothing touches $HOME.

The shared fixtures live in tests/support and are registered here: `fake_hub` (tests/support/hub.py) and
`smollm2_dir` / `smollm2` (tests/support/smollm2.py).
"""

import os

# Read by @triton.jit at decoration time: must be set before any kernel module is imported.
os.environ.setdefault("TRITON_INTERPRET", "1")
os.environ.setdefault("HF_HUB_DISABLE_TELEMETRY", "1")

import pytest  # noqa: E402

# the helpers' asserts report their operands as a test's own do
pytest.register_assert_rewrite("tests.support")

pytest_plugins = ["tests.support.hub", "tests.support.smollm2"]


@pytest.fixture(autouse=True)
def _isolated_env(tmp_path_factory, monkeypatch):
    home = tmp_path_factory.getbasetemp() / "hf-home"
    monkeypatch.setenv("HF_HOME", str(home))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("NO_COLOR", "1")
    monkeypatch.setenv("COLUMNS", "200")
    monkeypatch.delenv("EAGLEKIT_DEBUG", raising=False)
    monkeypatch.delenv("HF_TOKEN", raising=False)
