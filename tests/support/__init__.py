"""Helpers shared by the test modules: checkpoint factory, tiny targets, SmolLM2, Hub server, CLI runner, engines.

Test modules import from here, never from each other; shared fixtures are registered in tests/conftest.py.
"""
