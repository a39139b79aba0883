"""The `fake_hub` fixture: a loopback Hub for one test, with the client set up to reach it over plain LFS."""

from __future__ import annotations

import pytest

from tests.hubserver import FakeHub


@pytest.fixture
def fake_hub(monkeypatch):
    """Yield a started FakeHub (`.endpoint`, `.token`, recorded state); stop it at teardown.

    huggingface_hub reads HF_HUB_DISABLE_XET and HF_HUB_OFFLINE into constants at import, so both the
    environment and the constants are patched: xet would otherwise hang against a non-Hub endpoint, and
    offline mode would refuse the loopback requests.
    """
    from huggingface_hub import constants

    monkeypatch.setenv("HF_HUB_DISABLE_XET", "1")
    monkeypatch.setattr(constants, "HF_HUB_DISABLE_XET", True)
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
    with FakeHub() as hub:
        yield hub
        assert not hub.server_errors, hub.server_errors
