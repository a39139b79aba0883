"""`eaglekit verify` through the real entry point, on a tiny real target that carries SmolLM2's tokenizer."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import jsonschema
import pytest

pytest.importorskip("torch")

from tests.support import REPO  # noqa: E402
from tests.support.cli import run_cli as run  # noqa: E402
from tests.support.factory import make_draft, make_target_config  # noqa: E402
from tests.support.smollm2 import smollm2_path  # noqa: E402
from tests.support.targets import make_tiny_target  # noqa: E402

pytestmark = pytest.mark.model

SCHEMA = json.load(open(os.path.join(str(REPO), "schemas", "verify-report.schema.json")))
VOCAB = 49152  # SmolLM2's tokenizer


@pytest.fixture(scope="module")
def env(tmp_path_factory):
    base = tmp_path_factory.mktemp("verify-cli")
    target = make_tiny_target(base / "target", vocab=VOCAB, tokenizer_from=smollm2_path())
    draft = make_draft(str(base / "draft"), "specforge", hidden=64, vocab=VOCAB, draft_vocab=512, aux_ids=(1, 2, 3),
                       target_layers=4)
    return {"target": target, "draft": draft, "base": base}


FAST = ["--limit", "2", "--max-new-tokens", "8", "--no-progress"]
ENOUGH = ["--limit", "10", "--max-new-tokens", "8", "--no-progress"]  # prompts enough for an interval


def test_json_report_is_schema_valid_and_lossless(env, tmp_path):
    saved = tmp_path / "report.json"
    result = run(["verify", env["draft"], "--target", env["target"], "--format", "json", "--save-report", str(saved),
                  *ENOUGH])
    assert result.exit_code == 0, result.output
    doc = json.loads(result.stdout)
    jsonschema.validate(doc, SCHEMA)
    assert doc["lossless"] and doc["passed"]
    assert doc["num_speculative_tokens"] == 3 and len(doc["per_position_acceptance"]) == 3
    assert doc["acceptance_length"] == pytest.approx(1 + sum(doc["per_position_acceptance"]))
    assert doc["prompts"] == {**doc["prompts"], "name": "eaglekit-coding", "count": 10, "context_tokens": 0}
    # every decode rule passes but EK299: SpecForge writes the ids where vLLM's V2 runner never looks
    assert [(c["code"], c["severity"]) for c in doc["checks"]] == [("EK299", "warning")]
    served = doc["checks"][0]["message"]
    assert "EK307" in served and "--engine both" in served and "eaglekit upgrade" in served
    assert doc["aux_layer_ids"] == [1, 2, 3]  # written as output-of-layer [0, 1, 2] by the SpecForge layout
    assert [d["depth"] for d in doc["drift"]] == [1, 2, 3]
    assert json.loads(saved.read_text()) == doc
    assert "hypotheses" not in doc
    speed = doc["speedup_interval"]  # ten prompts, each timed both ways: the ratio's spread
    assert speed["low"] <= doc["speedup"] <= speed["high"] and speed["method"].startswith("bootstrap over prompts")
    interval = doc["acceptance_length_interval"]
    assert interval["low"] <= doc["acceptance_length"] <= interval["high"]
    assert doc["samples"] == 10 and doc["too_few_samples"] is False


def test_two_prompts_are_too_few_for_an_interval(env):
    result = run(["verify", env["draft"], "--target", env["target"], "--format", "json", *FAST])
    assert result.exit_code == 0, result.output
    doc = json.loads(result.stdout)
    jsonschema.validate(doc, SCHEMA)
    assert doc["acceptance_length_interval"] is None and doc["speedup_interval"] is None
    assert doc["samples"] == 2 and doc["too_few_samples"] is True and doc["acceptance_length"] >= 1  # kept
    human = run(["verify", env["draft"], "--target", env["target"], *FAST])
    assert human.exit_code == 0, human.output
    assert "95 % interval: too few to estimate (n=2, needs 10)" in human.stdout
    assert "its spread over prompts: too few to estimate (n=2, needs 10)" in human.stdout


def test_the_defaults_record_greedy_and_a_sampled_run_is_a_seeded_draw_with_no_lossless_verdict(env):
    def verify(*args):
        result = run(["verify", env["draft"], "--target", env["target"], "--format", "json", *FAST, *args])
        assert result.exit_code == 0, result.output
        doc = json.loads(result.stdout)
        jsonschema.validate(doc, SCHEMA)
        return doc

    def measured(doc):
        return doc["num_drafts"], doc["num_accepted_tokens"], doc["per_position_acceptance"], [
            (p["generated_tokens"], p["num_drafts"], p["identical"]) for p in doc["per_prompt"]]

    greedy = verify()
    assert greedy["sampling"] == {"temperature": 0.0, "top_p": 1.0, "seed": None}
    assert measured(verify("--temperature", "0", "--seed", "5")) == measured(greedy)
    sampled = verify("--temperature", "0.8", "--top-p", "0.95", "--seed", "3")
    assert sampled["sampling"] == {"temperature": 0.8, "top_p": 0.95, "seed": 3}
    assert sampled["lossless"] is None and sampled["exact_match"] is None and sampled["passed"] is True
    assert all(p["identical"] is None and p["divergence"] is None for p in sampled["per_prompt"])
    assert any("--seed 3" in note for note in sampled["notes"])
    assert measured(verify("--temperature", "0.8", "--top-p", "0.95", "--seed", "3")) == measured(sampled)


def test_human_output_names_the_verdict(env):
    result = run(["verify", env["draft"], "--target", env["target"], *ENOUGH, "-k", "2"])
    assert result.exit_code == 0, result.output
    for text in ("Compatibility", "lossless", "acceptance length", "Drift per draft depth", "(max 3)"):
        assert text in result.stdout
    assert "over prompts;" in result.stdout and ("not a serving figure" in result.stdout
                                                 or "not a measured speed-up" in result.stdout)


def test_diagnose_scores_every_hypothesis(env):
    result = run(["verify", env["draft"], "--target", env["target"], "--diagnose", "--format", "json", *FAST])
    assert result.exit_code == 0, result.output
    doc = json.loads(result.stdout)
    jsonschema.validate(doc, SCHEMA)
    names = [h["name"] for h in doc["hypotheses"]]
    assert names[0] == "declared" and doc["hypotheses"][0]["declared"]
    assert {"aux ids +1", "aux ids -1", "norm_before_residual=True", "norm_output=True"} <= set(names)
    assert {"aux ids +1": [2, 3, 4], "aux ids -1": [0, 1, 2]} == {
        h["name"]: h["aux_layer_ids"] for h in doc["hypotheses"] if h["kind"] == "aux-shift"}
    assert doc["diagnosis"]["verdict"] in ("declared", "mismatch", "broken")


def test_context_tokens_lengthen_every_prompt(env):
    short = json.loads(run(["verify", env["draft"], "--target", env["target"], "--format", "json", *FAST]).stdout)
    long = json.loads(run(["verify", env["draft"], "--target", env["target"], "--format", "json", *FAST,
                           "--context-tokens", "100"]).stdout)
    assert long["prompts"]["context_tokens"] == 100
    for a, b in zip(short["per_prompt"], long["per_prompt"]):
        assert 100 <= b["prompt_tokens"] - a["prompt_tokens"] <= 130  # + the context template's own words


def test_min_acceptance_fails_the_run_but_keeps_the_report(env, tmp_path):
    saved = tmp_path / "r.json"
    result = run(["verify", env["draft"], "--target", env["target"], *FAST, "--min-acceptance", "3.5",
                  "--save-report", str(saved)])
    assert result.exit_code == 1
    assert "below --min-acceptance 3.5" in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1
    doc = json.loads(saved.read_text())
    assert doc["passed"] is False and doc["min_acceptance"] == 3.5


def test_user_prompt_file(env, tmp_path):
    prompts = tmp_path / "mine.jsonl"
    prompts.write_text('{"name": "a", "prompt": "Say hi"}\n\n{"text": "def add(a, b):"}\n'
                       '{"messages": [{"role": "user", "content": "Hello"}]}\n')
    doc = json.loads(run(["verify", env["draft"], "--target", env["target"], "--format", "json", "--prompts",
                          str(prompts), "--max-new-tokens", "4", "--no-progress"]).stdout)
    assert doc["prompts"]["name"] == "mine" and doc["prompts"]["count"] == 3
    assert [p["name"] for p in doc["per_prompt"]] == ["a", "3", "4"]  # unnamed: the line number
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"prompt": 3}\n')
    result = run(["verify", env["draft"], "--target", env["target"], "--prompts", str(bad), "--no-progress"])
    assert result.exit_code == 1 and "line 1: needs" in result.stderr


def _refused(result, *fragments):
    assert result.exit_code == 1, result.output
    line = result.stderr.strip()
    assert len(line.splitlines()) == 1 and "Traceback" not in result.output
    for fragment in fragments:
        assert fragment in line
    return line


def test_vocab_mismatch_is_refused_before_any_weight_is_loaded(tmp_path):
    # the target has only a config.json: reaching the decode would fail differently
    target = make_target_config(str(tmp_path / "t"), layers=4, hidden=64, vocab=VOCAB)
    draft = make_draft(str(tmp_path / "d"), "specforge", hidden=64, vocab=256, draft_vocab=128, aux_ids=(1, 2, 4),
                       target_layers=4)
    line = _refused(run(["verify", draft, "--target", target]), "EK292 draft vocabulary V=256, the target has V=49152")
    assert line.startswith(f"Error: {draft}")


def test_target_hidden_mismatch_is_refused(tmp_path):
    target = make_target_config(str(tmp_path / "t"), layers=4, hidden=64, vocab=VOCAB)
    draft = make_draft(str(tmp_path / "d"), "vllm", hidden=64, target_hidden=96, vocab=VOCAB, draft_vocab=128,
                       aux_ids=(1, 2, 4), target_layers=4)
    _refused(run(["verify", draft, "--target", target]), "EK293", "T=96", "T=64")


def test_aux_ids_outside_the_target_are_refused(env):
    _refused(run(["verify", env["draft"], "--target", env["target"], "--aux-layer-ids", "1,2,9"]),
             "EK294 aux layer ids [9] lie outside [0, L=4]")
    _refused(run(["verify", env["draft"], "--target", env["target"], "--aux-layer-ids", "1,2"]),
             "EK294", "fc takes K=3")


def test_usage_errors_exit_2(env):
    result = run(["verify", env["draft"], "--target", env["target"], "--aux-layer-ids", "a,b"])
    assert result.exit_code == 2 and "comma-separated integers" in result.stderr
    result = run(["verify", env["draft"], "--target", env["target"], "-k", "0"])
    assert result.exit_code == 2


def test_missing_target_dir(env, tmp_path):
    _refused(run(["verify", env["draft"], "--target", str(tmp_path / "nope")]), "no such file or directory")


def test_cli_module_does_not_import_torch():
    code = ("import sys, eaglekit.cli.verify, eaglekit.verify.run; "
            "assert 'torch' not in sys.modules and 'transformers' not in sys.modules")
    subprocess.run([sys.executable, "-c", code], check=True)


@pytest.mark.parametrize("engine", ["vllm", "both"])
def test_without_vllm_the_engine_is_one_line_before_any_decode(tmp_path, monkeypatch, engine):
    monkeypatch.setenv("EAGLEKIT_VLLM_PYTHON", "/nonexistent/python")
    draft = make_draft(str(tmp_path / "d"), "vllm")
    result = run(["verify", draft, "--target", make_target_config(str(tmp_path / "t")), "--engine", engine])
    assert result.exit_code == 1 and len(result.stderr.strip().splitlines()) == 1
    assert "EAGLEKIT_VLLM_PYTHON" in result.stderr and "scripts/vllm-env.sh" in result.stderr


def test_push_takes_the_report_of_these_files_and_refuses_it_once_they_change(env, tmp_path):
    draft = make_draft(str(tmp_path / "draft"), "vllm", hidden=64, vocab=VOCAB, draft_vocab=512, aux_ids=(1, 2, 3),
                       target_layers=4)
    saved = tmp_path / "report.json"
    result = run(["verify", draft, "--target", env["target"], "--save-report", str(saved), *FAST])
    assert result.exit_code == 0, result.output
    measured = json.loads(saved.read_text())["measured"]
    assert set(measured["draft_files"]) == {"config.json", "model.safetensors"}
    pushed = run(["push", draft, "--repo-id", "org/draft", "--report", str(saved), "--dry-run", "--offline"])
    assert pushed.exit_code == 0, pushed.output
    assert "measured on other files" not in pushed.stdout
    with open(os.path.join(draft, "config.json"), "a") as fh:
        fh.write("\n")  # the same config, other bytes: the report no longer describes these files
    refused = run(["push", draft, "--repo-id", "org/draft", "--report", str(saved), "--dry-run"])
    assert refused.exit_code == 1 and "config.json differs from the file the report measured" in refused.output


def test_a_hub_id_target_is_read_through_the_cache_everywhere(env, tmp_path, monkeypatch):
    from huggingface_hub import constants

    from tests.support.hub import prefill_cache

    prefill_cache(str(tmp_path / "hub"), "org/tiny-target", env["target"])
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path / "hub"))
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    by_id = run(["verify", env["draft"], "--target", "org/tiny-target", "--format", "json", *FAST])
    by_path = run(["verify", env["draft"], "--target", env["target"], "--format", "json", *FAST])
    assert by_id.exit_code == 0, by_id.output
    a, b = json.loads(by_id.stdout), json.loads(by_path.stdout)
    assert a["num_drafts"] == b["num_drafts"] and a["per_position_acceptance"] == b["per_position_acceptance"]
    for command in (["inspect"], ["validate"]):
        result = run([*command, env["draft"], "--target", "org/tiny-target", "--format", "json"])
        assert result.exit_code in (0, 1) and json.loads(result.stdout), result.output
        assert "no local folder" not in result.output
    missing = run(["inspect", env["draft"], "--target", str(tmp_path / "no-such-target")])
    assert missing.exit_code == 1 and "no such file or directory" in missing.output
    uncached = run(["inspect", env["draft"], "--target", "org/not-cached"])
    assert uncached.exit_code == 1 and "not in the local Hugging Face cache" in uncached.output


def test_compare_below_the_floor_says_too_few_and_at_the_floor_estimates(env):
    compare_schema = json.load(open(os.path.join(str(REPO), "schemas",
                                                 "compare-report.schema.json")))
    args = ["compare", env["draft"], env["draft"], "--target", env["target"], "--max-new-tokens", "8", "--no-progress"]
    few = run([*args, "--limit", "2", "--format", "json"])
    assert few.exit_code == 0, few.output
    doc = json.loads(few.stdout)
    jsonschema.validate(doc, compare_schema)
    diff = doc["categories"]["all"]["b_minus_a"]
    assert diff["acceptance_length_difference"] == 0 and diff["interval"] is None
    assert diff["samples"] == 2 and diff["too_few_samples"] is True and diff["verdict"] == "too few prompts"
    assert doc["categories"]["all"]["a"]["too_few_samples"] is True
    human = run([*args, "--limit", "2"])
    assert human.exit_code == 0, human.output
    assert "too few to estimate (n=2, needs 10)" in human.stdout and "+0.000 – +0.000" not in human.stdout
    enough = run([*args, "--limit", "10", "--format", "json"])
    assert enough.exit_code == 0, enough.output
    doc = json.loads(enough.stdout)
    jsonschema.validate(doc, compare_schema)
    diff = doc["categories"]["all"]["b_minus_a"]
    assert diff["samples"] == 10 and diff["too_few_samples"] is False
    assert (diff["interval"]["low"], diff["interval"]["high"]) == (0, 0) and diff["verdict"] == "not resolved"
