"""The `fake_hub` fixture (registered by tests/conftest.py): a loopback Hub for one test, with the client set up to
reach it over plain LFS; and `prefill_cache`, a Hugging Face cache laid out as a download would have."""

from __future__ import annotations

import pytest

from tests.support.hubserver import FakeHub


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


def prefill_cache(cache: str, repo_id: str, folder: str,
                  commit: str = "0123456789abcdef0123456789abcdef01234567") -> str:
    """Lay `folder`'s files out as the Hugging Face cache stores repo `repo_id` (blobs named by SHA-256, snapshot
    symlinks, refs/main), as a download would have; returns the snapshot folder."""
    import hashlib
    import os

    repo = os.path.join(cache, "models--" + repo_id.replace("/", "--"))
    snapshot = os.path.join(repo, "snapshots", commit)
    os.makedirs(os.path.join(repo, "blobs"), exist_ok=True)
    os.makedirs(os.path.join(repo, "refs"), exist_ok=True)
    os.makedirs(snapshot, exist_ok=True)
    with open(os.path.join(repo, "refs", "main"), "w") as fh:
        fh.write(commit)
    for name in os.listdir(folder):
        with open(os.path.join(folder, name), "rb") as fh:
            data = fh.read()
        digest = hashlib.sha256(data).hexdigest()
        with open(os.path.join(repo, "blobs", digest), "wb") as fh:
            fh.write(data)
        os.symlink(os.path.join("..", "..", "blobs", digest), os.path.join(snapshot, name))
    return snapshot
