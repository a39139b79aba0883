"""Hidden-state capture: the target runs in a backend (the serving engine, or the reference hooks for small targets)
and its states stream into a resumable, sharded store that upgrade and finetune read without loading the target."""

from __future__ import annotations

import os

MANIFEST = "manifest.json"
"""A store's manifest, in its top folder: what makes a folder a store."""


def is_store(path: str) -> bool:
    """Whether `path` is a folder holding a store's manifest (what `inspect` shows as a store). Here, beside the
    name, so that telling a store from a draft imports none of the store's code."""
    return os.path.isdir(path) and os.path.isfile(os.path.join(path, MANIFEST))
