"""`eaglekit bench` without a running engine: its arithmetic, verdict, server flags, and every refusal made before a
server starts (each one line, exit 2). The real engine runs in tests/test_bench_vllm.py."""

from __future__ import annotations

import json
import os
import sys

import jsonschema
import pytest

from eaglekit.bench.report import BenchReport, BenchRow, ServedRun, Spread, spread, verdict
from eaglekit.errors import EngineError, UsageError
from eaglekit.runtime.engine import fitted_model_len
from eaglekit.runtime.server import engine_flags, start_server
from tests.support.cli import run_cli

SCHEMAS = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "eaglekit", "schemas")


def schema(name: str) -> dict:
    with open(os.path.join(SCHEMAS, f"{name}.schema.json"), encoding="utf-8") as fh:
        return json.load(fh)

DRAFTERS = os.path.join(os.path.dirname(__file__), "..", "examples", "drafters")


def _served(rates: list[float], throughput: float, *, drafts: int = 0, accepted: int = 0) -> ServedRun:
    none = Spread(0.0, 0.0, 0.0)
    return ServedRun(len(rates), 1.0, 10 * len(rates), throughput, tuple(rates), none, none,
                     tuple(f"text {i}" for i in range(len(rates))), drafts, 3 * drafts, accepted)


def _row(concurrency: int, base: list[float], spec: list[float], category: str | None = None) -> BenchRow:
    return BenchRow(concurrency, category, _served(base, sum(base)), _served(spec, sum(spec), drafts=40, accepted=50))


def test_speed_up_is_the_ratio_of_mean_per_user_rates_with_a_paired_interval():
    base, spec = [10.0, 20.0, 30.0, 40.0] * 3, [15.0, 26.0, 33.0, 60.0] * 3  # 12 requests: above the floor
    row = _row(1, base, spec)
    assert row.speed_up == pytest.approx(sum(spec) / sum(base))
    assert row.acceptance_length == pytest.approx(1 + 50 / 40)
    interval = row.speed_up_interval
    assert interval is not None and interval.low <= row.speed_up <= interval.high
    assert min(s / b for s, b in zip(spec, base)) <= interval.low  # resampled means stay within the pairs' ratios
    assert row.to_dict()["speed_up_interval"]["method"] == "paired bootstrap over requests"


def test_the_slow_tail_of_rates_is_their_low_end_and_of_times_their_high_end():
    values = [float(v) for v in range(1, 101)]
    assert spread(values, slow_tail_low=True).p99 < 2.5 < 99 < spread(values).p99
    assert spread(values).p50 == pytest.approx(50.5)


def test_the_verdict_names_the_concurrency_where_speculation_stops_paying():
    rows = [_row(1, [10, 12, 11] * 4, [18, 20, 19] * 4), _row(4, [8, 9, 10] * 4, [10, 11, 12] * 4),
            _row(8, [8, 9, 10] * 4, [6, 11, 12] * 4), _row(16, [5, 6, 7] * 4, [4, 5, 6] * 4),
            _row(1, [10, 11] * 5, [9, 10] * 5, "math")]  # 10 to 12 requests each: every interval is estimated
    found = verdict(rows)
    assert (found.pays_at, found.unresolved_at, found.loses_at, found.stops_paying_at) == ((1, 4), (8,), (16,), 8)
    assert "not resolved at C=8" in found.text and "stops being shown to pay at C=8" in found.text
    math = verdict(rows, "math")
    assert math.pays_at == () and math.loses_at == (1,) and math.stops_paying_at == 1
    always = verdict(rows[:2])
    assert always.stops_paying_at is None and "pays at every concurrency measured" in always.text


def test_engine_settings_become_vllm_server_flags():
    flags = engine_flags({"max_model_len": 4096, "enforce_eager": True, "enable_prefix_caching": False,
                          "speculative_config": {"method": "eagle3", "num_speculative_tokens": 3}})
    assert flags[:3] == ["--max-model-len", "4096", "--enforce-eager"]
    assert "--no-enable-prefix-caching" in flags
    assert json.loads(flags[flags.index("--speculative-config") + 1]) == {"method": "eagle3",
                                                                          "num_speculative_tokens": 3}


def test_max_model_len_holds_the_longest_request_within_the_target_context():
    assert fitted_model_len(100, 256, 3, 8192) == 512
    assert fitted_model_len(8000, 256, 3, 8192) == 8192
    assert fitted_model_len(8000, 256, 3, None) == 8448


def test_a_server_that_cannot_start_is_reported_by_its_root_cause(tmp_path):
    """This interpreter has no vLLM: the server process dies, and the error says why in one line."""
    with pytest.raises(EngineError) as caught:
        start_server(sys.executable, str(tmp_path), "target alone", argv=["--model", str(tmp_path)],
                     target=str(tmp_path), dtype="bfloat16", positions=1024, given=[], timeout_s=120)
    message = str(caught.value)
    assert message.startswith("vLLM server (target alone) failed: ModuleNotFoundError: No module named 'vllm'")
    assert "\n" not in message


@pytest.mark.parametrize("args, needle", [
    (["--concurrency", "0"], "--concurrency takes positive integers"),
    (["--concurrency", "1,1"], "--concurrency lists a value twice"),
    (["--concurrency", "a"], "expected comma-separated integers"),
    (["--max-new-tokens", "0"], "--max-new-tokens must be at least 1"),
    (["--num-prompts", "0"], "--num-prompts must be at least 1"),
    (["--num-prompts", "1000000000"], "--num-prompts 1,000,000,000: at most 100,000"),
    (["--concurrency", "1,100000"], "--concurrency 100000: at most 4096"),
    (["--engine-arg", "max_model_len=\"long\""], "expected a positive integer"),
    (["--tensor-parallel-size", "0"], "--tensor-parallel-size must be at least 1"),
    (["--temperature", "-1"], "--temperature -1.0: expected a finite number, at least 0"),
    (["--temperature", "0.7", "--top-p", "1.5"], "--top-p 1.5: expected a number in (0, 1]"),
    (["--top-p", "0.9"], "a greedy decode ignores top-p"),
])
def test_bad_options_are_refused_before_any_engine_starts(tmp_path, args, needle):
    result = run_cli(["bench", os.path.join(DRAFTERS, "smollm2-135m-eagle3"), "--target", str(tmp_path), *args])
    assert result.exit_code == 2, result.output
    assert needle in result.stderr and len(result.stderr.strip().splitlines()) == 1


def test_a_missing_engine_is_one_line_saying_how_to_install_it(tmp_path):
    result = run_cli(["bench", os.path.join(DRAFTERS, "smollm2-135m-eagle3"), "--target", str(tmp_path),
                      "--engine-python", str(tmp_path / "no-python")])
    assert result.exit_code == 2
    assert "cannot run" in result.stderr and "scripts/vllm-env.sh" in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1


def test_the_project_vllm_environment_is_found_where_the_setup_script_makes_it(tmp_path, monkeypatch):
    from eaglekit.runtime.engine import EngineOptions, check_engine_available

    monkeypatch.delenv("EAGLEKIT_VLLM_PYTHON", raising=False)
    monkeypatch.chdir(tmp_path)
    python = tmp_path / ".vllm-env" / "bin" / "python"
    python.parent.mkdir(parents=True)
    python.write_text("#!/bin/sh\necho vllm-version 9.9.9\n")  # answers the version probe as vLLM's Python does
    python.chmod(0o755)
    assert EngineOptions().interpreter == str(python)
    assert check_engine_available(EngineOptions()) == "9.9.9"
    python.write_text("#!/bin/sh\necho 'ModuleNotFoundError: No module named vllm'; exit 1\n")
    with pytest.raises(UsageError) as refused:
        check_engine_available(EngineOptions())
    assert str(python) in str(refused.value) and "--engine-python .vllm-env/bin/python" in str(refused.value)


def _vllm_result(rates: list[float]) -> dict:
    """What vLLM's `bench serve` returns for requests of 10 tokens at these per-user rates."""
    return {"completed": len(rates), "duration": 1.0, "total_output_tokens": 10 * len(rates),
            "output_throughput": sum(rates), "output_lens": [10] * len(rates), "latencies": [10 / r for r in rates],
            **{f"{stat}_{name}_ms": 5.0 for stat in ("mean", "p50", "p99") for name in ("tpot", "ttft")},
            "generated_texts": [f"text {i}" for i in range(len(rates))]}


def _report(rows: list[BenchRow]) -> BenchReport:
    return BenchReport("draft", "target", "3", 3, 64, "bfloat16", {"name": "p", "count": 2, "ignore_eos": False},
                       {"name": "vllm", "version": "0.33.0", "device_type": "cpu", "device_name": "cpu",
                        "tensor_parallel_size": 1, "max_model_len": 512},
                       {"model": "draft", "method": "eagle3", "num_speculative_tokens": 3}, {}, rows)


def _served_row(concurrency: int, base: list[float], spec: list[float]) -> BenchRow:
    return BenchRow(concurrency, None, ServedRun.from_vllm(_vllm_result(base)), ServedRun.from_vllm(_vllm_result(spec)))


def test_below_the_floor_bench_reports_the_estimate_and_says_too_few_in_json_and_text(capsys):
    from eaglekit.cli.bench import render

    doc = _report([_served_row(1, [10.0, 12.0], [13.0, 16.0])]).to_dict()
    row = doc["rows"][0]
    jsonschema.validate(row, schema("bench-report")["properties"]["rows"]["items"])
    assert row["speed_up"] == pytest.approx(29 / 22, abs=1e-4) and row["speed_up_interval"] is None
    assert row["samples"] == 2 and row["too_few_samples"] is True
    for side in ("baseline", "speculative"):
        assert [row[side][key]["p99"] for key in ("per_user_tokens_per_s", "tpot_ms", "ttft_ms")] == [None] * 3
        assert row[side]["per_user_tokens_per_s"]["p50"] is not None
    assert doc["verdicts"][0]["unresolved_at"] == [1] and doc["verdicts"][0]["pays_at"] == []
    render(doc)
    text = capsys.readouterr().out
    assert "too few to estimate (n=2, needs 10)" in text and "[" not in text.split("verdict:")[0]
    assert "x1.32 too few to estimate (n=2, needs 10)" in text.split("verdict:")[1]


def test_at_the_floor_bench_estimates_the_interval_and_the_tail():
    doc = _report([_served_row(1, [10.0 + i for i in range(10)], [13.0 + i for i in range(10)])]).to_dict()
    row = doc["rows"][0]
    jsonschema.validate(row, schema("bench-report")["properties"]["rows"]["items"])
    assert row["too_few_samples"] is False and row["samples"] == 10
    assert row["speed_up_interval"]["low"] <= row["speed_up"] <= row["speed_up_interval"]["high"]
    assert row["speculative"]["per_user_tokens_per_s"]["p99"] is not None and row["baseline"]["tpot_ms"]["p99"] == 5.0


def test_the_plot_draws_no_band_without_an_interval():
    from eaglekit.bench.plot import bench_figure

    few = bench_figure(_report([_served_row(1, [10.0, 12.0], [13.0, 16.0]),
                                _served_row(2, [9.0, 11.0], [12.0, 13.0])]))
    enough = bench_figure(_report([_served_row(c, [10.0 + i for i in range(10)], [13.0 + i for i in range(10)])
                                   for c in (1, 2)]))
    speed_few, speed_enough = few.axes[0], enough.axes[0]
    assert len(speed_enough.collections) == 1 and "shaded: 95 % interval" in speed_enough.get_title()
    assert len(speed_few.collections) == 0 and "no interval" in speed_few.get_title()
    assert len(speed_few.lines) == len(speed_enough.lines)  # the estimates are drawn either way


def test_requests_carry_the_sampling_asked_for_and_the_report_records_it():
    from eaglekit.bench.report import BenchReport
    from eaglekit.bench.run import BenchOptions, _client_args

    def client(options: BenchOptions) -> list[str]:
        return _client_args("m", __file__, 4, options)

    greedy = client(BenchOptions())
    assert greedy[greedy.index("--temperature") + 1] == "0" and "--top-p" not in greedy
    sampled = client(BenchOptions(temperature=0.7, top_p=0.9))
    assert sampled[sampled.index("--temperature") + 1] == "0.7" and sampled[sampled.index("--top-p") + 1] == "0.9"
    at = sampled.index("--top-p")
    expected = [*greedy[:at], "--top-p", "0.9", *greedy[at:]]
    expected[expected.index("--temperature") + 1] = "0.7"
    assert sampled == expected  # nothing else changes

    def report(options: BenchOptions) -> dict:
        return BenchReport("d", "t", "3", 3, 8, "bfloat16", {}, {}, {}, {}, sampling=options.sampling).to_dict()

    schema = json.load(open(os.path.join(os.path.dirname(__file__), "..", "schemas", "bench-report.schema.json")))
    assert report(BenchOptions())["sampling"] == "greedy"
    doc = report(BenchOptions(temperature=0.7, top_p=0.9))
    assert doc["sampling"] == {"temperature": 0.7, "top_p": 0.9}
    import jsonschema

    jsonschema.validate(doc["sampling"], schema["properties"]["sampling"])
