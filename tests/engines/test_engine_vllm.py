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
pytestmark = [pytest.mark.engine,
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


@pytest.fixture(scope="module")
def upgraded(tmp_path_factory) -> dict[str, str]:
    """The bundled EAGLE-3 drafter in vLLM's layout, as it is (lossless) and as the default EAGLE-3.1 start."""
    base = tmp_path_factory.mktemp("upgraded")
    drafts = {}
    for name, flags in (("lossless", ["--no-fc-norm", "--no-norm-output"]), ("eagle31", [])):
        drafts[name] = str(base / name)
        result = run_cli(["upgrade", str(DRAFTERS / "smollm2-135m-eagle3"), drafts[name], "--target", smollm2_path(),
                          *flags])
        assert result.exit_code == 0, result.stderr
    return drafts


def test_vllm_counts_what_the_reference_counts_on_an_upgraded_draft(upgraded):
    doc = _both(upgraded["lossless"])
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



def test_a_comparison_in_vllm_pairs_what_the_reference_pairs(upgraded):
    """Two drafts served by vLLM over two conditions' prompts (one engine start each): its per-request counters,
    split back by condition, are the reference's compare counters prompt by prompt, so the paired check of a
    target too large to load here measures what the reference would."""
    from eaglekit.decode.compare import compare_conditions, compare_in_vllm
    from eaglekit.decode.options import VerifyOptions

    options = VerifyOptions(limit=3, max_new_tokens=16, template=("chat", "raw"), device="cpu", dtype="float32")
    a, b = upgraded["lossless"], upgraded["eagle31"]
    served = compare_in_vllm(a, b, smollm2_path(), options)
    reference = compare_conditions(a, b, smollm2_path(), options)
    assert served.engine.startswith("vLLM ") and served.differing_prompts == 0 and served.read_otherwise == ()
    assert [r.settings.condition for r in served.sweep.reports] == [r.settings.condition for r in reference.reports]
    for engine, ours in zip(served.sweep.reports, reference.reports):
        assert engine.names == ours.names
        assert engine.a.counters == ours.a.counters and engine.b.counters == ours.b.counters
        assert engine.rows() == ours.rows()


def test_block_verification_on_the_cpu_build_is_recorded_and_counts_token_by_token(upgraded):
    """vLLM's V1 runner (all its CPU build runs) has no block verifier: rejection_sample_method=block reaches the
    engine's speculative config, the report records and labels it, and the counters stay the reference's."""
    doc = _both(upgraded["lossless"], "--engine-arg", "rejection_sample_method=block")
    rule, verdict = doc["engine"]["acceptance_settings"], doc["engine_comparison"]
    assert rule["rejection_sample_method"] == "block" and rule["given"] == {"rejection_sample_method": "block"}
    assert any("no block verifier" in label for label in rule["labels"]) and rule["drafter_acceptance"] is True
    assert doc["acceptance_settings"]["rejection_sample_method"] == "standard"  # the reference's own rule
    assert verdict["verdict"] == "agree" and "rejection_sample_method=block" in verdict["message"]


def test_a_speculative_setting_reaches_vllms_speculative_config_only(upgraded):
    """A companion setting without its method: the target-alone run starts (LLM(...) never sees it), and vLLM's own
    SpeculativeConfig refuses it in the run with the draft, in one line naming its reason."""
    result = run_cli(["verify", upgraded["lossless"], "--target", smollm2_path(), *RUN[:6], "--engine", "vllm",
                      "--engine-arg", "synthetic_acceptance_length=2.0", "--no-progress"])
    assert result.exit_code == 1, result.output
    line = result.stderr.strip()
    assert len(line.splitlines()) == 1 and "vLLM (target + draft) failed" in line
    assert "only valid with rejection_sample_method='synthetic'" in line
