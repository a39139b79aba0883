"""Helpers shared by the test modules: checkpoint factory, tiny targets, SmolLM2, Hub server, CLI runner, engines.

Test modules import from here, never from each other; shared fixtures are registered in tests/conftest.py. The test
modules sit in folders that mirror the package (tests/capture/ for eaglekit/capture/, ...; tests/project/ for what
holds the repository together), so they find the checkout through REPO, not through their own depth.
"""

from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
"""The checkout's root."""
