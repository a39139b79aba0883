"""Hostile-input contract helpers: run the CLI within a time bound and check it answers in one line, exit 0/1/2."""

from __future__ import annotations

import json
import os
import re
import signal
import struct
from contextlib import contextmanager

from hypothesis import HealthCheck, settings

from tests.support.cli import run_cli

FUZZ = settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
SECONDS = 60
"""A hang bound, not a speed check: every command here finishes in about a second, but on a loaded machine the
first one of a run imports numpy and torch; a hang fails instead of blocking CI. Bounded work is asserted by
counting it (entries checked, bytes read), never by the clock."""


@contextmanager
def bounded(seconds: int = SECONDS):
    def expire(*_):
        raise AssertionError(f"no answer within {seconds} s (blocked or unbounded)")

    previous = signal.signal(signal.SIGALRM, expire)
    signal.alarm(seconds)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)


PROGRESS_LINE = re.compile(r"^\[\d\d:\d\d:\d\d\] \w+: ")
"""A timestamped progress line: a command that runs past the quiet start writes them to stderr without a terminal
(docs/progress-logs.md), before its one error line, if any."""


def clean(*args: str, codes=(0, 1, 2), seconds: int = SECONDS):
    """Run eaglekit ARGS and check the contract; returns the result."""
    with bounded(seconds):
        result = run_cli(list(args))
    lines = [line for line in result.stderr.strip().splitlines() if not PROGRESS_LINE.match(line)]
    assert result.exit_code in codes, (args, result.exit_code, result.stderr)
    assert len(lines) <= 1, result.stderr
    assert "internal error" not in result.stderr and "Traceback" not in result.stderr, result.stderr
    return result


def refused(*args: str, code: int = 1, contains: str = ""):
    result = clean(*args, codes=(code,))
    line = "".join(line for line in result.stderr.splitlines(keepends=True) if not PROGRESS_LINE.match(line))
    assert line.startswith("Error: ") and contains in line, result.stderr
    return result


def strict_json(text: str):
    """JSON as every other parser reads it: bare NaN / Infinity are not JSON."""
    def reject(name):
        raise ValueError(f"non-standard JSON constant {name}")

    return json.loads(text, parse_constant=reject)


def write_header(path: str, header: str | bytes, data: bytes = b"") -> str:
    os.makedirs(path, exist_ok=True)
    raw = header.encode("utf-8", "surrogatepass") if isinstance(header, str) else header
    with open(os.path.join(path, "model.safetensors"), "wb") as fh:
        fh.write(struct.pack("<Q", len(raw)) + raw + data)
    with open(os.path.join(path, "config.json"), "w") as fh:
        json.dump({"architectures": ["LlamaForCausalLMEagle3"], "model_type": "llama", "hidden_size": 64}, fh)
    return path
