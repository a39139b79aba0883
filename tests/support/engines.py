"""Where the real engines are: vLLM's own environment (scripts/vllm-env.sh writes .vllm-env, or EAGLEKIT_VLLM_PYTHON)
and the drafters bundled with the examples."""

from __future__ import annotations

import os
import subprocess
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
