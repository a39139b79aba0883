"""bench/gpu_smoke.py, the device smoke test, runs its whole check on CPU too (Triton kernels interpreted)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from tests.support import REPO

pytestmark = pytest.mark.triton

pytest.importorskip("torch")
pytest.importorskip("triton")

SCRIPT = os.path.join(str(REPO), "bench", "gpu_smoke.py")


def test_the_oracle_draft_reaches_k_plus_one_with_the_fused_kernels(tmp_path):
    env = {**os.environ, "TRITON_INTERPRET": "1"}
    result = subprocess.run([sys.executable, SCRIPT, "--device", "cpu", "--kernels", "triton", "--hidden", "64",
                             "--vocab", "128", "--max-new-tokens", "8", "--prompts", "2", "-k", "4",
                             "--work", str(tmp_path)], capture_output=True, text=True, env=env, timeout=600)
    assert result.returncode == 0, result.stderr[-2000:]
    doc = json.loads(result.stdout[result.stdout.index("{"):])
    assert doc["kernels"] == "triton" and [r["draft"] for r in doc["results"]] == ["EAGLE-3", "EAGLE-3.1"]
    for r in doc["results"]:
        assert r["passed"] and r["lossless"] and r["drafts"] > 0
        assert r["acceptance_length"] == 5 and r["per_position_acceptance"] == [1.0] * 4
    with open(tmp_path / "draft-3.1" / "config.json") as fh:
        assert json.load(fh)["norm_output"] is True
