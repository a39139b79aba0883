"""Where the real engines are: vLLM's own environment (scripts/vllm-env.sh writes .vllm-env, or EAGLEKIT_VLLM_PYTHON)
and the drafters bundled with the examples."""

from __future__ import annotations

import os
import stat
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
DRAFTERS = REPO / "examples" / "drafters"


def _vllm_python() -> str | None:
    python = os.environ.get("EAGLEKIT_VLLM_PYTHON") or str(REPO / ".vllm-env" / "bin" / "python")
    if not os.path.exists(python):
        return None
    probe = subprocess.run([python, "-c", "import vllm"], capture_output=True)
    return python if probe.returncode == 0 else None


VLLM_PYTHON = _vllm_python()


def stand_in_python(folder: Path, worker: str, device: str | None = None) -> str:
    """An interpreter in place of vLLM's: it runs eaglekit's process guard as Python does, answers vLLM's version
    probe (0.32.0; and the device type, when `device` is given) and runs the script `worker` with eaglekit's worker
    arguments, so a test of what eaglekit does with an engine's results runs in seconds."""
    script = folder / "worker.py"
    script.write_text(worker, encoding="utf-8")
    python = folder / "python"
    probe = "echo vllm-version 0.32.0" + (f"; echo vllm-device {device}" if device else "")
    python.write_text(f'#!/bin/sh\nif [ "$1" = "-I" ]; then exec {sys.executable} "$@"; fi\n'
                      f'if [ "$1" = "-c" ]; then {probe}; exit 0; fi\n'
                      f'exec {sys.executable} {script} "$@"\n', encoding="utf-8")
    python.chmod(python.stat().st_mode | stat.S_IEXEC)
    return str(python)
