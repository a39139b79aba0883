"""The real engine: vLLM's CPU build runs SmolLM2 with the bundled drafters, and its counters are the reference's.

Needs vLLM in an environment of its own (scripts/vllm-env.sh writes .vllm-env; or set EAGLEKIT_VLLM_PYTHON).
Float32, two prompts of 32 tokens, k = 3: each vLLM start takes about 40 s on two cores (eager, no compile).
"""

from __future__ import annotations

import json

import jsonschema
import pytest

pytest.importorskip("torch")

from tests.support.cli import run_cli  # noqa: E402
from tests.support.engines import DRAFTERS, REPO, VLLM_PYTHON  # noqa: E402
from tests.support.smollm2 import smollm2_path  # noqa: E402

RUN = ["--limit", "2", "--max-new-tokens", "32", "--dtype", "float32", "--engine", "both", "--format", "json"]
pytestmark = [pytest.mark.engine, pytest.mark.slow,
              pytest.mark.skipif(VLLM_PYTHON is None, reason="no vLLM environment (scripts/vllm-env.sh)")]


@pytest.fixture(autouse=True)
def _engine_env(monkeypatch):
    monkeypatch.setenv("EAGLEKIT_VLLM_PYTHON", VLLM_PYTHON or "")
    monkeypatch.delenv("VLLM_CPU_KVCACHE_SPACE", raising=False)  # eaglekit sizes vLLM's KV cache itself


def _both(draft: str, *extra: str) -> dict:
    result = run_cli(["verify", draft, "--target", smollm2_path(), *RUN, *extra])
    assert result.exit_code == 0, result.stderr
    doc = json.loads(result.stdout)
    jsonschema.validate(doc, json.loads((REPO / "eaglekit" / "schemas" / "verify-report.schema.json").read_text()))
    return doc


def test_vllm_counts_what_the_reference_counts_on_an_upgraded_draft(tmp_path):
    out = str(tmp_path / "lossless")
    upgraded = run_cli(["upgrade", str(DRAFTERS / "smollm2-135m-eagle3"), out, "--target", smollm2_path(),
                        "--no-fc-norm", "--no-norm-output"])
    assert upgraded.exit_code == 0, upgraded.stderr
    doc = _both(out)
    engine, verdict = doc["engine"], doc["engine_comparison"]
    assert engine["lossless"] and doc["lossless"]
    assert verdict["verdict"] == "agree" and verdict["counters_equal"]
    assert (engine["num_drafts"], engine["num_accepted_tokens"]) == (doc["num_drafts"], doc["num_accepted_tokens"])
    assert engine["per_position_acceptance"] == doc["per_position_acceptance"]
    assert "auxiliary layers" in engine["aux_layers_log"] and verdict["engine_aux_layer_ids"] == doc["aux_layer_ids"]
    # vLLM >= 0.29 counts per request too: the reference agrees prompt by prompt, not only in total
    per_request = engine["per_request"]
    assert per_request is not None and len(per_request) == len(doc["per_prompt"])
    assert [r["num_drafts"] for r in per_request] == [p["num_drafts"] for p in doc["per_prompt"]]
    assert [r["acceptance_length"] for r in per_request] == [p["acceptance_length"] for p in doc["per_prompt"]]
    assert verdict["prompts_with_other_counters"] == [] and "prompt by prompt" in verdict["message"]


def test_a_draft_vllm_reads_differently_is_reported_with_both_taus():
    """The bundled SpecForge export writes eagle_config ids in output-of-layer convention; vLLM's V1 runner
    captures them literally, eaglekit reads them +1: both τ are reported, and the reference run with the
    engine's ids reproduces the engine's counters."""
    doc = _both(str(DRAFTERS / "smollm2-135m-eagle3"), "--vllm-runner", "v1", "--engine-version", "0.32.0")
    verdict = doc["engine_comparison"]
    assert verdict["verdict"] == "engine reads other aux ids", verdict
    assert verdict["engine_aux_layer_ids"] == [i - 1 for i in verdict["reference_aux_layer_ids"]]
    assert verdict["reference_as_served_acceptance_length"] == doc["engine"]["acceptance_length"]
    assert verdict["engine_acceptance_length"] != verdict["reference_acceptance_length"]
    # the reference's own model of the installed engine (CPU build: V1 runner) predicts what the engine measured
    served = doc["served"]
    assert served["differs"] and served["aux_layer_ids"] == verdict["engine_aux_layer_ids"]
    assert served["acceptance_length"] == doc["engine"]["acceptance_length"]
    assert served["per_position_acceptance"] == doc["engine"]["per_position_acceptance"]

