"""vLLM's acceptance settings (rejection_sample_method, draft_sample_method, draft_lm_head_quantization,
num_speculative_tokens_per_batch_size): how --engine-arg passes them, what each release takes, what every report
records, and push refusing acceptance that is not a drafter's. The real engine runs them in
tests/engines/test_engine_vllm.py."""

from __future__ import annotations

import json
import os
from types import SimpleNamespace

import jsonschema
import pytest

from eaglekit.engines.vllm import (
    ACCEPTANCE_KNOBS,
    acceptance_settings,
    check_speculative_settings,
    split_speculative_settings,
)
from eaglekit.errors import CheckpointError, UsageError
from eaglekit.runtime.engine import EngineOptions, _decode_request
from tests.support import REPO
from tests.support.cli import run_cli
from tests.support.engines import stand_in_python
from tests.support.factory import make_draft, make_target_config
from tests.support.reports import TARGET, bench_row, measured, write_bench, write_report

SCHEMAS = os.path.join(str(REPO), "eaglekit", "schemas")
DRAFTER = os.path.join(str(REPO), "examples", "drafters", "smollm2-135m-eagle3")
PUSH = ["--repo-id", "org/draft", "--license", "apache-2.0", "--dry-run", "--offline"]


def schema(name: str) -> dict:
    with open(os.path.join(SCHEMAS, f"{name}.schema.json"), encoding="utf-8") as fh:
        return json.load(fh)


def block_schema(name: str) -> dict:
    """The schema's acceptance_settings block, with the $defs its reference resolves in."""
    whole = schema(name)
    return {**whole["$defs"]["acceptance_settings"], "$defs": whole["$defs"]}


def test_the_defaults_read_in_vllm_are_recorded_when_nothing_is_given():
    block = acceptance_settings({})
    assert {name: block[name] for name in ACCEPTANCE_KNOBS} == {
        "rejection_sample_method": "standard", "draft_sample_method": "greedy", "draft_lm_head_quantization": None,
        "num_speculative_tokens_per_batch_size": None}
    assert block["given"] == {} and block["drafter_acceptance"] is True and block["labels"] == []
    assert block["acceptance_length"] == "pooled τ (1 + Σ accepted / Σ drafting rounds)"
    for name in ("verify-report", "compare-report", "bench-report"):
        jsonschema.validate(block, block_schema(name))


@pytest.mark.parametrize("method, why", [("fly", "rejection_sample_method=fly is lossy"),
                                         ("synthetic", "rejection_sample_method=synthetic accepts drafts at preset")])
def test_fly_and_synthetic_are_labelled_not_a_drafters_acceptance(method, why):
    block = acceptance_settings({"rejection_sample_method": method, "fly_window_size": 2})
    assert block["drafter_acceptance"] is False
    assert block["labels"][0].startswith(f"not a drafter's acceptance: {why}")
    assert block["given"] == {"rejection_sample_method": method, "fly_window_size": 2}
    jsonschema.validate(block, block_schema("bench-report"))


def test_other_settings_are_labelled_but_remain_a_drafters_acceptance():
    block = acceptance_settings({"draft_lm_head_quantization": "fp8", "rejection_sample_method": "block",
                                 "num_speculative_tokens_per_batch_size": [[1, 4, 3], [5, 64, 1]]})
    assert block["drafter_acceptance"] is True
    text = " | ".join(block["labels"])
    assert "draft_lm_head_quantization=fp8" in text and "rejection_sample_method=block" in text
    assert "num_speculative_tokens_per_batch_size=[[1, 4, 3], [5, 64, 1]]" in text
    jsonschema.validate(block, block_schema("verify-report"))
    sampled = acceptance_settings({}, sampled=True)
    assert sampled["labels"] == ["draft_sample_method=greedy: the drafts are the drafter's argmax, one-hot in the "
                                 "ratio test"]
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate({**block, "rejection_sample_method": "lossy"}, block_schema("verify-report"))


def test_a_running_server_records_unknown_settings():
    block = acceptance_settings(None)
    assert all(block[name] == "unknown" for name in ACCEPTANCE_KNOBS) and block["drafter_acceptance"] is None
    assert "unknown: the server does not say" in block["labels"][0]
    jsonschema.validate(block, block_schema("bench-report"))


def test_engine_args_split_into_llm_arguments_and_the_speculative_config():
    llm, spec = split_speculative_settings({
        "max_model_len": 4096, "rejection_sample_method": "block", "synthetic_acceptance_length": 2.0,
        "speculative_config": {"draft_lm_head_quantization": "fp8", "draft_tensor_parallel_size": 1}})
    assert llm == {"max_model_len": 4096}
    assert spec == {"rejection_sample_method": "block", "synthetic_acceptance_length": 2.0,
                    "draft_lm_head_quantization": "fp8", "draft_tensor_parallel_size": 1}
    with pytest.raises(UsageError, match="eaglekit sets num_speculative_tokens itself"):
        split_speculative_settings({"speculative_config": {"num_speculative_tokens": 5}})
    with pytest.raises(UsageError, match="expected a JSON object"):
        split_speculative_settings({"speculative_config": "fly"})


def test_the_offline_request_keeps_the_settings_out_of_the_target_alone_run():
    opts = EngineOptions(engine_args={"rejection_sample_method": "fly", "max_model_len": 512})
    request = _decode_request("model-id", [[1, 2, 3]], 3, 8, "float32", opts, None)
    assert "rejection_sample_method" not in request["engine_args"] and request["engine_args"]["max_model_len"] == 512
    assert request["speculative"] == {"rejection_sample_method": "fly"}


@pytest.mark.parametrize("settings, version, refusal", [
    ({"rejection_sample_method": "fly"}, "0.32.0+cpu", "vLLM 0.32.0+cpu does not have it (it is new in 0.33.0)"),
    ({"draft_lm_head_quantization": "fp8"}, "0.32.0", "draft_lm_head_quantization: vLLM 0.32.0 does not have it"),
    ({"fly_window_size": 2}, "0.32.1", "fly_window_size: vLLM 0.32.1 does not have it"),
    ({"rejection_sample_method": "greedy"}, "0.33.0", "vLLM 0.33.0 takes standard, synthetic, block, fly"),
    ({"draft_lm_head_quantization": "int4"}, None, "takes fp8, nvfp4"),
    ({"rejection_sample_method": "fly", "draft_lm_head_quantization": "nvfp4"}, "0.33.0", None),
    ({"rejection_sample_method": "block", "num_speculative_tokens_per_batch_size": [[1, 8, 3]]}, "0.32.0", None),
    ({"rejection_sample_method": "fly"}, "0.31.0", None),  # not read: vLLM judges it
    ({"rejection_sample_method": "tree"}, "0.34.0", None),  # newer than read: vLLM judges it
])
def test_each_release_is_held_to_the_settings_it_has(settings, version, refusal):
    if refusal is None:
        check_speculative_settings(settings, version)
        return
    with pytest.raises(UsageError) as refused:
        check_speculative_settings(settings, version)
    assert refusal in str(refused.value) and "\n" not in str(refused.value)


def _fake_vllm_python(tmp_path, version: str) -> str:
    python = tmp_path / "python"
    python.write_text(f"#!/bin/sh\necho vllm-version {version}\n")  # answers the version probe as vLLM's Python does
    python.chmod(0o755)
    return str(python)


def test_a_setting_the_installed_vllm_lacks_is_one_line_before_it_starts(tmp_path):
    target = make_target_config(str(tmp_path / "target"))
    result = run_cli(["verify", DRAFTER, "--target", target, "--engine", "vllm", "--engine-python",
                      _fake_vllm_python(tmp_path, "0.32.0"), "--engine-arg", "rejection_sample_method=fly"])
    assert result.exit_code == 2, result.output
    assert result.stderr.strip() == ("Error: --engine-arg rejection_sample_method=fly: vLLM 0.32.0 does not have it "
                                     "(it is new in 0.33.0)")


def test_the_reference_decode_refuses_settings_it_cannot_run(tmp_path):
    result = run_cli(["verify", DRAFTER, "--target", make_target_config(str(tmp_path / "target")),
                      "--engine-arg", "rejection_sample_method=block"])
    assert result.exit_code == 2 and "--engine reference does not run" in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1


# push: a report whose acceptance is not a drafter's is refused; the others reach the card with their rule


@pytest.fixture
def draft(tmp_path) -> str:
    return make_draft(str(tmp_path / "draft"), "vllm")


def _refused(args: list[str], path: str, why: str) -> None:
    result = run_cli(["push", *args, *PUSH])
    assert result.exit_code == 1, result.output
    line = result.stderr.strip()
    assert len(line.splitlines()) == 1 and path in line and f"not a drafter's acceptance: {why}" in line


@pytest.mark.parametrize("where", ["top", "engine", "condition"])
def test_push_refuses_a_verify_report_counted_under_fly(draft, tmp_path, where):
    fly = acceptance_settings({"rejection_sample_method": "fly"})
    fields = {"top": {"acceptance_settings": fly}, "engine": {"engine": {"acceptance_settings": fly}},
              "condition": {"conditions": [{"acceptance_settings": fly}]}}[where]
    report = write_report(tmp_path / "verify.json", draft, **fields)
    _refused([draft, "--report", report], report, "rejection_sample_method=fly is lossy")


def test_push_refuses_a_bench_report_served_with_synthetic_acceptance(draft, tmp_path):
    bench = write_bench(tmp_path / "bench.json", draft,
                        speculative_config={"model": draft, "method": "eagle3", "num_speculative_tokens": 3,
                                            "rejection_sample_method": "synthetic",
                                            "synthetic_acceptance_length": 3.0})
    _refused([draft, "--bench", bench, "--target", TARGET], bench,
             "rejection_sample_method=synthetic accepts drafts at preset rates")


def test_the_card_states_the_rule_and_its_labels_beside_tau(draft, tmp_path):
    from eaglekit.hub import evidence

    standard = acceptance_settings({}, source="eaglekit's reference decode")
    report = write_report(tmp_path / "verify.json", draft, acceptance_settings=standard,
                          measured=measured(draft, name_or_path=TARGET))
    head = acceptance_settings({"draft_lm_head_quantization": "fp8"})
    bench = write_bench(tmp_path / "bench.json", draft, acceptance_settings=head)
    assert evidence.load_report(report).doc["acceptance_settings"] == standard
    result = run_cli(["push", draft, "--report", report, "--bench", bench, "--target", TARGET, *PUSH, "--format",
                      "json"])
    assert result.exit_code == 0, result.stderr
    card = json.loads(result.stdout)["card"]
    assert ("| Acceptance counted under | pooled τ (1 + Σ accepted / Σ drafting rounds) under "
            "rejection\\_sample\\_method=standard, draft\\_sample\\_method=greedy, "
            "draft\\_lm\\_head\\_quantization=none") in card
    assert "| Pooled τ (engine) |" in card
    assert "> τ above: draft\\_lm\\_head\\_quantization=fp8: the draft proposes through a fp8 copy" in card


def test_a_bench_report_that_predates_the_record_is_read_from_its_speculative_config(draft, tmp_path):
    from eaglekit.hub.card_figures import bench_acceptance

    assert bench_acceptance({"speculative_config": {"model": "d", "rejection_sample_method": "block"}})[
        "rejection_sample_method"] == "block"
    assert bench_acceptance({"servers": {"started_by_eaglekit": False}})["rejection_sample_method"] == "unknown"
    with pytest.raises(CheckpointError, match="rejection_sample_method=fly is lossy"):
        from eaglekit.hub.evidence import load_bench_report

        load_bench_report(write_bench(tmp_path / "old.json", draft, rows=[bench_row(1, 50.0, 100.0)],
                                      verdicts=None, speculative_config={"rejection_sample_method": "fly"}))


# bench with a server eaglekit starts: the settings reach the speculative server only, and its report


def _client_result(requests: int) -> dict:
    """What vLLM's `bench serve` returns for `requests` requests of 16 tokens (p50 and p99 of every latency)."""
    rates = [10.0 + i for i in range(requests)]
    result = {"completed": requests, "failed": 0, "duration": 2.0, "total_output_tokens": 16 * requests,
              "output_throughput": 8.0 * requests, "output_lens": [16] * requests,
              "latencies": [16 / r for r in rates], "generated_texts": ["text"] * requests}
    for name in ("ttft", "tpot", "itl", "e2el"):
        result.update({f"{stat}_{name}_ms": 10.0 for stat in ("mean", "p50", "p99")})
    return result


class CountingEndpoint:
    """A server's endpoint as bench reads it: warm-ups, and spec-decode counters that each measurement adds to."""

    def __init__(self, speculative: bool):
        from eaglekit.runtime.endpoint import SpecCounters

        self.speculative, self.reading = speculative, SpecCounters(0, 0, 0, (0, 0, 0))

    def warm_up(self, *args, **kwargs) -> None:
        pass

    def counters(self):
        return self.reading if self.speculative else None

    def serve(self) -> None:
        from eaglekit.runtime.endpoint import SpecCounters

        r = self.reading
        self.reading = SpecCounters(r.drafts + 40, r.draft_tokens + 120, r.accepted + 50,
                                    tuple(a + b for a, b in zip(r.accepted_per_position, (40, 10, 0))))


def test_bench_passes_the_settings_to_the_speculative_server_only_and_records_them(monkeypatch, tmp_path):
    import eaglekit.bench.run as bench_run
    import eaglekit.decode.setup as decode_setup
    from eaglekit.families import load_draft
    from eaglekit.target import read_target

    target = make_target_config(str(tmp_path / "target"))
    spec = load_draft(DRAFTER)
    monkeypatch.setattr(bench_run, "check_engine_available", lambda engine, progress=None: "0.33.0")
    monkeypatch.setattr(decode_setup, "decode_setup", lambda *a, **k: SimpleNamespace(
        drafts=[SimpleNamespace(path=DRAFTER, spec=spec)], info=read_target(target), tokenizer=None,
        prompts=SimpleNamespace(prompts=[], name="random", speed_bench=False)))
    started: list[tuple[str, list[str]]] = []

    def start(python, work, side, *, argv, **_):
        started.append((side, argv))
        return SimpleNamespace(endpoint=CountingEndpoint(side != "target alone"), stop=lambda: None, start_s=1.0,
                               flags=argv, info={"vllm_version": "0.33.0", "device_type": "cpu", "device_name": "cpu"})

    class Client:
        def __init__(self, *args):
            pass

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            pass

        def run(self, endpoint, args, **_):
            endpoint.serve()
            return _client_result(int(args[args.index("--num-prompts") + 1]))

    monkeypatch.setattr(bench_run, "start_server", start)
    monkeypatch.setattr(bench_run, "BenchClient", Client)
    options = bench_run.BenchOptions(concurrency=(1,), input_len=16, max_new_tokens=8, engine_options=EngineOptions(
        engine_args={"rejection_sample_method": "block", "draft_lm_head_quantization": "fp8", "max_model_len": 256}))
    doc = json.loads(json.dumps(bench_run.run_bench(DRAFTER, target, options).to_dict()))
    jsonschema.validate(doc, schema("bench-report"))
    (alone, alone_argv), (drafted, drafted_argv) = started
    assert alone == "target alone" and "--speculative-config" not in alone_argv
    assert not any("rejection" in a or "quantization" in a for a in alone_argv)
    config = json.loads(drafted_argv[drafted_argv.index("--speculative-config") + 1])
    assert config["rejection_sample_method"] == "block" and config["draft_lm_head_quantization"] == "fp8"
    assert config["method"] == "eagle3" and config["num_speculative_tokens"] == 3
    assert doc["speculative_config"]["rejection_sample_method"] == "block"
    settings = doc["acceptance_settings"]
    assert (settings["rejection_sample_method"], settings["draft_lm_head_quantization"]) == ("block", "fp8")
    assert settings["draft_sample_method"] == "greedy" and settings["drafter_acceptance"] is True
    assert any("draft_lm_head_quantization=fp8" in label for label in settings["labels"])
    assert doc["rows"][0]["acceptance_length"] == pytest.approx(1 + 50 / 40)  # figures unchanged by the labels


# verify and compare end to end on a tiny random target: the reference's rule, and vLLM's (a stand-in for it)

ENGINE_RUN = r"""
import json, sys
request = json.load(open(sys.argv[-2]))
with open(sys.argv[-2] + ".seen", "w") as seen:
    json.dump(request, seen)
drafted = bool(request.get("draft"))
k, n = request["k"], request["max_new_tokens"]
json.dump({"vllm_version": "0.32.0", "tokens": [[7] * n for _ in request["prompts"]],
           "metrics": {"drafts": 4, "accepted": 6, "accepted_per_position": [3, 2, 1][:k]} if drafted else {},
           "per_request": [[1, 1, 0, 1][:k + 1] for _ in request["prompts"]] if drafted else None,
           "init_s": 0.1, "generate_s": 0.1}, open(sys.argv[-1], "w"))
with open(request["target"] + "/requests.jsonl", "a") as log:
    log.write(json.dumps(request) + "\n")
"""


@pytest.fixture(scope="module")
def tiny(tmp_path_factory) -> dict[str, str]:
    pytest.importorskip("torch")
    from tests.support.targets import make_target_with_tokenizer

    base = tmp_path_factory.mktemp("tiny")
    target = make_target_with_tokenizer(str(base / "target"))
    draft = make_draft(str(base / "draft"), "vllm", hidden=64, vocab=384, draft_vocab=384, aux_ids=(1, 2, 3),
                       target_layers=4)
    return {"target": target, "draft": draft}


FAST = ["--limit", "2", "--max-new-tokens", "6", "--no-progress", "--format", "json"]


def test_the_reference_decode_records_vllms_default_rule_in_verify_and_compare(tiny):
    verify = run_cli(["verify", tiny["draft"], "--target", tiny["target"], *FAST, "--temperature", "0.7"])
    assert verify.exit_code == 0, verify.stderr
    doc = json.loads(verify.stdout)
    jsonschema.validate(doc, schema("verify-report"))
    rule = doc["acceptance_settings"]
    assert (rule["rejection_sample_method"], rule["draft_sample_method"]) == ("standard", "greedy")
    assert rule["draft_lm_head_quantization"] is None and rule["source"].startswith("eaglekit's reference decode")
    assert rule["labels"] == ["draft_sample_method=greedy: the drafts are the drafter's argmax, one-hot in the "
                              "ratio test"]  # sampled: that is what its τ means
    compare = run_cli(["compare", tiny["draft"], tiny["draft"], "--target", tiny["target"], *FAST])
    assert compare.exit_code == 0, compare.stderr
    doc = json.loads(compare.stdout)
    jsonschema.validate(doc, schema("compare-report"))
    assert doc["acceptance_settings"]["rejection_sample_method"] == "standard"
    assert doc["acceptance_settings"]["labels"] == []


def test_verify_in_vllm_records_the_settings_it_passed_and_push_refuses_the_report(tiny, tmp_path):
    python = stand_in_python(tmp_path, ENGINE_RUN)
    saved = tmp_path / "verify.json"
    result = run_cli(["verify", tiny["draft"], "--target", tiny["target"], "--engine", "vllm", "--engine-python",
                      python, "--engine-arg", "rejection_sample_method=synthetic", "--engine-arg",
                      "synthetic_acceptance_length=2.5", "--save-report", str(saved), *FAST])
    assert result.exit_code == 0, result.stderr
    doc = json.loads(saved.read_text())
    assert json.loads(result.stdout) == doc
    requests = [json.loads(line) for line in open(os.path.join(tiny["target"], "requests.jsonl"))][-2:]
    assert [r.get("draft") is not None for r in requests] == [False, True]
    for request in requests:  # LLM(...) never sees them; the worker puts them in the speculative config
        assert request["speculative"] == {"rejection_sample_method": "synthetic", "synthetic_acceptance_length": 2.5}
        assert "rejection_sample_method" not in request["engine_args"]
    for rule in (doc["acceptance_settings"], doc["engine"]["acceptance_settings"]):
        assert rule["rejection_sample_method"] == "synthetic" and rule["drafter_acceptance"] is False
        assert rule["given"] == {"rejection_sample_method": "synthetic", "synthetic_acceptance_length": 2.5}
        assert rule["labels"][0].startswith("not a drafter's acceptance: rejection_sample_method=synthetic")
    assert doc["engine"]["acceptance_length"] == 1 + 6 / 4  # the counters, as vLLM gave them
    _refused([tiny["draft"], "--report", str(saved)], str(saved), "rejection_sample_method=synthetic accepts")
