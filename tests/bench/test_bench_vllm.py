"""`eaglekit bench` in the real engine: vLLM's CPU build serves SmolLM2 alone and with the losslessly upgraded bundled
drafter, driven by vLLM's own benchmark client at C = 1 and 2, with no environment variable set.

Two server starts of about 25 s each on two cores, three prompts of 24 tokens per concurrency.
"""

from __future__ import annotations

import json
import math
import re

import jsonschema
import pytest

pytest.importorskip("torch")

from tests.support.cli import run_cli  # noqa: E402
from tests.support.engines import DRAFTERS, REPO, VLLM_PYTHON  # noqa: E402
from tests.support.smollm2 import smollm2_path  # noqa: E402

pytestmark = [pytest.mark.engine,
              pytest.mark.skipif(VLLM_PYTHON is None, reason="no vLLM environment (scripts/vllm-env.sh)")]
SCHEMA = json.loads((REPO / "eaglekit" / "schemas" / "bench-report.schema.json").read_text())


@pytest.fixture(autouse=True)
def _engine_env(monkeypatch):
    monkeypatch.setenv("EAGLEKIT_VLLM_PYTHON", VLLM_PYTHON or "")
    monkeypatch.delenv("VLLM_CPU_KVCACHE_SPACE", raising=False)  # eaglekit sizes vLLM's KV cache itself


@pytest.fixture(scope="module")
def upgraded(tmp_path_factory) -> str:
    out = str(tmp_path_factory.mktemp("bench") / "lossless")
    result = run_cli(["upgrade", str(DRAFTERS / "smollm2-135m-eagle3"), out, "--target", smollm2_path(),
                      "--no-fc-norm", "--no-norm-output"])
    assert result.exit_code == 0, result.stderr
    return out


def test_bench_measures_both_servers_at_each_concurrency_from_the_engine_counters(upgraded, tmp_path):
    saved = tmp_path / "bench.json"
    result = run_cli(["bench", upgraded, "--target", smollm2_path(), "--concurrency", "1,2", "--limit", "3",
                      "--max-new-tokens", "24", "--save-report", str(saved), "--format", "json"])
    assert result.exit_code == 0, result.stderr
    doc = json.loads(result.stdout)
    jsonschema.validate(doc, SCHEMA)
    assert json.loads(saved.read_text()) == doc
    assert [r["concurrency"] for r in doc["rows"]] == [1, 2]
    engine = doc["engine"]
    assert engine["name"] == "vllm" and engine["version"] and engine["device_type"] == "cpu"
    assert engine["cpu_kv_cache_gib"] == "1"  # sized from the job, not 92 % of the machine
    spec_flags, base_flags = engine["server_args"]["speculative"], engine["server_args"]["baseline"]
    config = json.loads(spec_flags[spec_flags.index("--speculative-config") + 1])
    assert config == doc["speculative_config"] and config["method"] == "eagle3" and config["model"].endswith("lossless")
    assert "--speculative-config" not in base_flags
    assert base_flags == [f for f in spec_flags if f not in ("--speculative-config", spec_flags[
        spec_flags.index("--speculative-config") + 1])]
    for row in doc["rows"]:
        base, spec = row["baseline"], row["speculative"]
        assert base["completed"] == spec["completed"] == row["requests"] >= 3
        assert row["speed_up"] == pytest.approx(spec["per_user_tokens_per_s"]["mean"]
                                                / base["per_user_tokens_per_s"]["mean"], rel=1e-3)
        assert row["num_drafts"] > 0 and 1 < row["acceptance_length"] <= 4
        assert row["acceptance_length"] == pytest.approx(1 + row["num_accepted_tokens"] / row["num_drafts"], abs=1e-4)
        per_position = [r * row["num_drafts"] for r in row["per_position_acceptance"]]
        assert all(math.isclose(c, round(c), abs_tol=0.01) for c in per_position)  # counts, from the counters
        assert round(sum(per_position)) == row["num_accepted_tokens"]
        assert base["tpot_ms"]["mean"] > 0 and spec["ttft_ms"]["mean"] > 0
    (verdict,) = doc["verdicts"]
    assert "C=1" in verdict["text"] and "C=2" in verdict["text"]
    assert sorted(verdict["pays_at"] + verdict["unresolved_at"] + verdict["loses_at"]) == [1, 2]

    # three or four requests a row: below the sample floor, no interval and no p99, and push refuses the figure
    assert all(r["too_few_samples"] and r["speed_up_interval"] is None for r in doc["rows"])
    refused = run_cli(["push", upgraded, "--repo-id", "org/smollm2-eagle3", "--target", smollm2_path(), "--bench",
                       str(saved), "--dry-run"])
    assert refused.exit_code == 1 and "--allow-few-samples" in refused.stderr
    # forced, the card's speed section is this report, bound to the files it measured, and says n is too small
    card = run_cli(["push", upgraded, "--repo-id", "org/smollm2-eagle3", "--target", smollm2_path(), "--bench",
                    str(saved), "--dry-run", "--offline", "--allow-few-samples", "--format", "json"])
    assert card.exit_code == 0, card.stderr
    section = json.loads(card.stdout)["card"].split("## Serving speed", 1)[1]
    assert f"vllm {engine['version']} on {engine['device_name']} (cpu, tensor parallel 1), bfloat16, k = 3" in section
    for row in doc["rows"]:
        assert f"| {row['concurrency']} | {row['baseline']['per_user_tokens_per_s']['mean']:.1f} |" in section
    assert "measured on other files" not in section
    assert "too few to estimate an interval" in section


def test_an_engine_that_rejects_its_settings_is_reported_by_the_root_cause(upgraded):
    result = run_cli(["bench", upgraded, "--target", smollm2_path(), "--concurrency", "1", "--limit", "1",
                      "--max-new-tokens", "8", "--engine-arg", "max_model_len=1000000"])
    assert result.exit_code == 1
    *progress, line = result.stderr.strip().splitlines()  # a log gets timestamped progress lines, then the error
    assert all(re.match(r"\[\d\d:\d\d:\d\d\] bench: ", p) for p in progress)
    assert line.startswith("Error: vLLM server (target alone) failed: ")
    assert "max_model_len" in line and "See root cause above" not in line


def test_a_report_path_inside_the_draft_is_refused_before_a_server_starts(upgraded):
    result = run_cli(["bench", upgraded, "--target", smollm2_path(), "--concurrency", "1",
                      "--save-report", f"{upgraded}/config.json"])
    assert result.exit_code == 2 and "--save-report" in result.stderr


def test_bench_base_url_measures_a_running_server_from_its_counters_and_leaves_it_running(upgraded, tmp_path):
    """One server, started here as bench starts its own (the target with the draft); bench --base-url measures it
    through its routes alone and leaves it serving."""
    from eaglekit.engines.vllm import speculative_config
    from eaglekit.runtime.server import engine_flags, start_server

    target = smollm2_path()
    settings = {"tokenizer": target, "dtype": "bfloat16", "max_model_len": 512, "max_num_seqs": 1, "seed": 0,
                "speculative_config": speculative_config(upgraded, 3)}
    server = start_server(VLLM_PYTHON or "", str(tmp_path), "target + draft",
                          argv=["--model", target, *engine_flags(settings)], target=target, dtype="bfloat16",
                          positions=512, given=[], timeout_s=600)
    try:
        result = run_cli(["bench", upgraded, "--base-url", server.url, "--target", target, "--concurrency", "1",
                          "--limit", "3", "--max-new-tokens", "16", "--format", "json"])
        assert result.exit_code == 0, result.stderr
        doc = json.loads(result.stdout)
        jsonschema.validate(doc, SCHEMA)
        assert doc["servers"]["started_by_eaglekit"] is False and doc["servers"]["speculative_url"] == server.url
        assert doc["num_speculative_tokens"] == 3 and doc["verdicts"] == []
        (row,) = doc["rows"]
        assert row["baseline"] is None and row["speed_up"] is None and row["speculative"]["completed"] == 3
        assert row["num_drafts"] > 0
        assert row["acceptance_length"] == pytest.approx(1 + row["num_accepted_tokens"] / row["num_drafts"])
        assert row["acceptance_length"] > 1
        per_position = [r * row["num_drafts"] for r in row["per_position_acceptance"]]
        assert round(sum(per_position)) == row["num_accepted_tokens"]
        assert row["speculative"]["itl_ms"]["mean"] > 0 and row["speculative"]["e2el_ms"]["p50"] > 0
        assert server.healthy()  # eaglekit stopped nothing it did not start
    finally:
        server.stop()
