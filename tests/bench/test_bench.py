"""`eaglekit bench` without a running engine: its arithmetic, verdict, server flags, and every refusal made before a
server starts (each one line, exit 2). The real engine runs in tests/bench/test_bench_vllm.py."""

from __future__ import annotations

import json
import os
import sys

import jsonschema
import pytest

from eaglekit.bench.report import BenchReport, BenchRow, ServedRun, Spread, spread, verdict
from eaglekit.errors import EngineError, EngineMissing, UsageError
from eaglekit.runtime.engine import fitted_model_len
from eaglekit.runtime.server import engine_flags, start_server
from tests.support import REPO
from tests.support.cli import run_cli

SCHEMAS = os.path.join(str(REPO), "eaglekit", "schemas")


def schema(name: str) -> dict:
    with open(os.path.join(SCHEMAS, f"{name}.schema.json"), encoding="utf-8") as fh:
        return json.load(fh)

DRAFTERS = os.path.join(str(REPO), "examples", "drafters")


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
    with pytest.raises(EngineMissing) as refused:
        check_engine_available(EngineOptions())
    assert str(python) in str(refused.value) and "EAGLEKIT_VLLM_PYTHON=.vllm-env/bin/python" in str(refused.value)


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

    schema = json.load(open(os.path.join(str(REPO), "schemas", "bench-report.schema.json")))
    assert report(BenchOptions())["sampling"] == "greedy"
    doc = report(BenchOptions(temperature=0.7, top_p=0.9))
    assert doc["sampling"] == {"temperature": 0.7, "top_p": 0.9}
    import jsonschema

    jsonschema.validate(doc["sampling"], schema["properties"]["sampling"])


# A running deployment (--base-url): a loopback server speaking the routes bench reads from vLLM's server.

PROMETHEUS = """# HELP vllm:spec_decode_num_drafts_total Number of spec decoding drafts.
# TYPE vllm:spec_decode_num_drafts_total counter
vllm:spec_decode_num_drafts_total{{engine="0",model_name="served-target"}} {drafts0}
vllm:spec_decode_num_drafts_total{{engine="1",model_name="served-target"}} {drafts1}
vllm:spec_decode_num_drafts_created{{engine="0",model_name="served-target"}} 1.7e+09
vllm:spec_decode_num_draft_tokens_total{{engine="0",model_name="served-target"}} {draft_tokens}
vllm:spec_decode_num_accepted_tokens_total{{engine="0",model_name="served-target"}} {accepted}
vllm:spec_decode_num_accepted_tokens_per_pos_total{{engine="0",model_name="served-target",position="0"}} {pos0}
vllm:spec_decode_num_accepted_tokens_per_pos_total{{engine="0",model_name="served-target",position="1"}} {pos1}
vllm:spec_decode_num_accepted_tokens_per_pos_total{{engine="0",model_name="served-target",position="2"}} {pos2}
"""
NO_SPEC = """# HELP vllm:num_requests_running Number of requests in model execution batches.
vllm:num_requests_running{engine="0",model_name="served-target"} 0.0
vllm:generation_tokens_total{engine="0",model_name="served-target"} 1234.0
"""


class FakeVllm:
    """/v1/models, /version, /metrics and /v1/completions as vLLM's OpenAI server answers them. Every completion
    (a warm-up) and every `serve(...)` call (a measured request) adds to the spec-decode counters; a key, when set,
    is required as vLLM's --api-key requires it (on /v1 routes)."""

    def __init__(self, *, speculative: bool = True, api_key: str | None = None, model: str = "served-target"):
        import threading
        from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

        self.speculative, self.api_key, self.model = speculative, api_key, model
        self.counts = {"drafts0": 7, "drafts1": 3, "draft_tokens": 30, "accepted": 12, "pos0": 6, "pos1": 4, "pos2": 2}
        self.seen: list[tuple[str, str | None]] = []  # (route, Authorization header)
        fake = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def _send(self, status: int, body: str, kind: str = "application/json") -> None:
                data = body.encode()
                self.send_response(status)
                self.send_header("Content-Type", kind)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def _authorized(self) -> bool:
                auth = self.headers.get("Authorization")
                fake.seen.append((self.path, auth))
                if fake.api_key and self.path.startswith("/v1") and auth != f"Bearer {fake.api_key}":
                    self._send(401, '{"error": "Unauthorized"}')
                    return False
                return True

            def do_GET(self):
                if not self._authorized():
                    return
                if self.path == "/v1/models":
                    self._send(200, json.dumps({"object": "list", "data": [
                        {"id": fake.model, "object": "model", "root": f"/models/{fake.model}",
                         "max_model_len": 2048}]}))
                elif self.path == "/version":
                    self._send(200, '{"version": "0.32.0"}')
                elif self.path == "/metrics":
                    self._send(200, PROMETHEUS.format(**fake.counts) if fake.speculative else NO_SPEC,
                               "text/plain; version=0.0.4")
                else:
                    self._send(404, "{}")

            def do_POST(self):
                length = int(self.headers.get("Content-Length") or 0)
                self.rfile.read(length)
                if not self._authorized():
                    return
                fake.serve(drafts=100, accepted=1000)  # warm-ups: outside the measurement, far off its τ
                self._send(200, '{"choices": [{"text": "warm"}]}')

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}"

    def serve(self, *, drafts: int, accepted: int) -> None:
        """What requests between two readings leave in the counters (k = 3, positions filled in order)."""
        self.counts["drafts0"] += drafts
        self.counts["draft_tokens"] += 3 * drafts
        self.counts["accepted"] += accepted
        left = accepted
        for pos in ("pos0", "pos1", "pos2"):
            taken = min(left, drafts)
            self.counts[pos] += taken
            left -= taken

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def fake_vllm():
    servers: list[FakeVllm] = []

    def start(**kwargs) -> FakeVllm:
        servers.append(FakeVllm(**kwargs))
        return servers[-1]

    yield start
    for server in servers:
        server.close()


def test_spec_decode_counters_are_read_from_prometheus_text_summed_over_engines_and_differenced():
    from eaglekit.runtime.endpoint import SpecCounters, spec_counters

    text = PROMETHEUS.format(drafts0=7, drafts1=3, draft_tokens=30, accepted=12, pos0=6, pos1=4, pos2=2)
    before = spec_counters(text)
    assert before == SpecCounters(10, 30, 12, (6, 4, 2))  # engine 1's drafts counted, the _created sample not
    after = spec_counters(PROMETHEUS.format(drafts0=27, drafts1=3, draft_tokens=90, accepted=42, pos0=26, pos1=12,
                                            pos2=4))
    assert after is not None
    delta = after - before
    assert delta == SpecCounters(20, 60, 30, (20, 8, 2))
    assert delta.acceptance_length == pytest.approx(1 + 30 / 20)
    assert delta.per_position == pytest.approx((1.0, 0.4, 0.1))
    assert spec_counters(NO_SPEC) is None and spec_counters("") is None
    assert SpecCounters().acceptance_length is None and SpecCounters().per_position == ()


def test_a_url_is_recorded_without_credentials_query_or_fragment_and_a_bad_one_is_refused_unshown():
    from eaglekit.io.urls import check_http_url
    from eaglekit.runtime.endpoint import public_url

    assert public_url("https://user:s3cret@gpu-node:8000/vllm/") == "https://gpu-node:8000/vllm"
    assert public_url("http://[::1]:8000") == "http://[::1]:8000"
    assert check_http_url("http://gpu-node:8000/", "--base-url", "http://gpu-node:8000") == "http://gpu-node:8000"
    for bad in ("ftp://gpu-node", "gpu-node:8000", "http://gpu-node:8000/?token=s3cret", "http://h/#s3cret"):
        with pytest.raises(UsageError) as refused:
            check_http_url(bad, "--base-url", "http://gpu-node:8000")
        assert "s3cret" not in str(refused.value) and "--base-url must be an http(s) URL" in str(refused.value)


def test_the_endpoint_reads_the_served_model_and_counters_and_sends_the_key(fake_vllm):
    from eaglekit.runtime.endpoint import Endpoint

    server = fake_vllm(api_key="sk-loopback-key")
    endpoint = Endpoint(server.url, "speculative server", "sk-loopback-key")
    served = endpoint.served_model()
    assert (served.id, served.root, served.max_model_len) == ("served-target", "/models/served-target", 2048)
    assert endpoint.version() == "0.32.0"
    assert endpoint.counters() is not None
    assert all(auth == "Bearer sk-loopback-key" for _, auth in server.seen)
    with pytest.raises(EngineError) as refused:
        Endpoint(server.url, "speculative server").served_model()
    assert "answered /v1/models with HTTP 401 (pass --api-key or set OPENAI_API_KEY)" in str(refused.value)


def _free_port() -> int:
    from eaglekit.runtime.server import free_port

    return free_port()


@pytest.mark.parametrize("case", ["unreachable", "no spec counters", "baseline speculates", "other model",
                                  "other target"])
def test_a_running_server_that_cannot_be_measured_is_one_line_exit_1(fake_vllm, tmp_path, case):
    spec = fake_vllm(speculative=case != "no spec counters")
    base_url = f"http://user:s3cret@127.0.0.1:{_free_port()}" if case == "unreachable" else spec.url
    args = ["bench", "my-draft", "--base-url", base_url]
    if case == "baseline speculates":
        args += ["--baseline-url", fake_vllm().url]
    if case == "other model":
        args += ["--baseline-url", fake_vllm(speculative=False, model="another-target").url]
    if case == "other target":
        (tmp_path / "Llama-3.1-8B-Instruct").mkdir()
        (tmp_path / "Llama-3.1-8B-Instruct" / "config.json").write_text("{}")
        args += ["--target", str(tmp_path / "Llama-3.1-8B-Instruct")]
    result = run_cli(args)
    assert result.exit_code == 1, result.output
    line = result.stderr.strip()
    assert len(line.splitlines()) == 1 and "s3cret" not in result.output
    assert {"unreachable": "cannot reach the speculative server at http://127.0.0.1:",
            "no spec counters": "exposes no spec-decode counters at /metrics",
            "baseline speculates": "the baseline server at http://127.0.0.1:",
            "other model": "serves 'another-target', the speculative one 'served-target'",
            "other target": "serves 'served-target', not the --target 'Llama-3.1-8B-Instruct'"}[case] in line


@pytest.mark.parametrize("args, needle", [
    (["--engine-arg", "max_model_len=4096"], "--engine-arg is a setting of a server eaglekit starts"),
    (["--tensor-parallel-size", "8"], "--tensor-parallel-size is a setting of a server eaglekit starts"),
    (["-k", "5"], "-k is a setting of a server eaglekit starts"),
    (["--dtype", "float16"], "--dtype is a setting of a server eaglekit starts"),
    (["--plot", "speed.png"], "--plot draws the speed-up: without --baseline-url there is none"),
    (["--input-len", "64", "--limit", "3"], "--input-len draws random prompts"),
    (["--request-rate", "0"], "--request-rate 0: expected a positive number"),
    (["--percentiles", "50,100"], "--percentiles takes distinct numbers between 0 and 100"),
    (["--percentiles", "p99"], "--percentiles 'p99': expected comma-separated numbers"),
])
def test_base_url_with_server_options_or_bad_load_options_is_a_usage_error(fake_vllm, args, needle):
    server = fake_vllm()
    result = run_cli(["bench", "my-draft", "--base-url", server.url, *args])
    assert result.exit_code == 2, result.output
    assert needle in result.stderr and len(result.stderr.strip().splitlines()) == 1
    assert server.seen == []  # refused before the server is asked anything


def test_a_baseline_url_alone_or_no_target_without_a_base_url_is_a_usage_error():
    alone = run_cli(["bench", "my-draft", "--baseline-url", "http://127.0.0.1:9"])
    assert alone.exit_code == 2 and "give that one as --base-url" in alone.stderr
    nothing = run_cli(["bench", "my-draft"])
    assert nothing.exit_code == 2 and "--target is required unless --base-url" in nothing.stderr


def _client_result(args: list[str], rates: list[float]) -> dict:
    """What vLLM's `bench serve` returns for these arguments: requests of 16 tokens at these per-user rates, every
    latency percentile it was asked for."""
    percentiles = args[args.index("--metric-percentiles") + 1].split(",")
    result = {"completed": len(rates), "failed": 0, "duration": 2.0, "total_output_tokens": 16 * len(rates),
              "output_throughput": 8.0 * len(rates), "output_lens": [16] * len(rates),
              "latencies": [16 / r for r in rates], "generated_texts": [f"text {i}" for i in range(len(rates))]}
    for scale, name in enumerate(("ttft", "tpot", "itl", "e2el"), start=1):
        result[f"mean_{name}_ms"] = 10.0 * scale
        result.update({f"p{q}_{name}_ms": 10.0 * scale + float(q) for q in percentiles})
    return result


def _fake_client(monkeypatch, served: list[tuple[str, list[str], str | None]], measured: dict):
    """vLLM's client replaced by one that serves `measured` drafts/accepted on the server it is pointed at."""
    import eaglekit.bench.run as bench_run

    class FakeClient:
        def __init__(self, python, work, api_key):
            self.api_key = api_key

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            pass

        def run(self, endpoint, args, *, what, timeout_s, server=None):
            assert server is None  # a running server is never eaglekit's to stop
            requests = int(args[args.index("--num-prompts") + 1])
            served.append((endpoint.url, list(args), self.api_key))
            fake = measured.get(endpoint.url)
            if fake is not None:
                fake.serve(drafts=40, accepted=50)
            return _client_result(args, [10.0 + i for i in range(requests)])

    monkeypatch.setattr(bench_run, "BenchClient", FakeClient)


def test_base_url_measures_the_running_server_from_its_counters_without_a_baseline(fake_vllm, monkeypatch,
                                                                                     tmp_path, capsys):
    from eaglekit.bench.run import BenchOptions, run_bench
    from eaglekit.cli.bench import render

    server = fake_vllm(api_key="sk-loopback-key")
    calls: list = []
    _fake_client(monkeypatch, calls, {server.url: server})
    options = BenchOptions(concurrency=(1, 4), input_len=32, max_new_tokens=16, percentiles=(50, 90, 99),
                           request_rate=2.5, base_url=server.url, api_key="sk-loopback-key")
    report = run_bench("my-draft", None, options)
    doc = json.loads(json.dumps(report.to_dict()))
    jsonschema.validate(doc, schema("bench-report"))
    assert doc["num_speculative_tokens"] == 3  # the per-position counters' length
    assert doc["target"] == "served-target" and doc["measured"] is None and doc["verdicts"] == []
    assert doc["servers"] == {"started_by_eaglekit": False, "speculative_url": server.url, "baseline_url": None,
                              "served_model": "served-target"}
    assert doc["engine"]["version"] == "0.32.0" and doc["engine"]["max_model_len"] == 2048
    assert doc["request_rate"] == 2.5 and doc["percentiles"] == [50, 90, 99]
    assert any("other traffic" in n or "whatever else it served" in n for n in doc["notes"])
    assert any("no speed-up" in n for n in doc["notes"])
    assert {doc["acceptance_settings"][k] for k in ("rejection_sample_method", "draft_lm_head_quantization")} == {
        "unknown"} and doc["acceptance_settings"]["drafter_acceptance"] is None  # the server does not say
    for row in doc["rows"]:
        # 40 drafts and 50 accepted per measurement; the warm-ups' 100 drafts and 1000 accepted are outside it
        assert (row["num_drafts"], row["num_accepted_tokens"]) == (40, 50)
        assert row["acceptance_length"] == pytest.approx(1 + 50 / 40)
        assert row["per_position_acceptance"] == pytest.approx([1.0, 0.25, 0.0])
        assert row["baseline"] is None and row["speed_up"] is None and row["speed_up_interval"] is None
        assert row["requests"] == 10 and row["too_few_samples"] is False  # random prompts: at least 10 requests
        spec = row["speculative"]
        assert spec["itl_ms"] == {"mean": 30.0, "p50": 80.0, "p90": 120.0, "p99": 129.0}
        assert spec["e2el_ms"]["p90"] == 130.0 and spec["tpot_ms"]["p90"] == 110.0
        rates = spec["per_user_tokens_per_s"]
        assert rates["p90"] < rates["p50"]  # the rate 90 % of requests reach: the slow end
    url, args, _ = calls[0]
    assert url == server.url and args[args.index("--request-rate") + 1] == "2.5"
    assert args[args.index("--dataset-name") + 1] == "random" and args[args.index("--random-input-len") + 1] == "32"
    assert args[args.index("--model") + 1] == "served-target" and args[args.index("--num-warmups") + 1] == "0"
    assert args[args.index("--percentile-metrics") + 1] == "ttft,tpot,itl,e2el"
    assert args[args.index("--metric-percentiles") + 1] == "50,90,99"
    assert "sk-loopback-key" not in " ".join(args)  # the key is no argument a process list shows
    assert all(auth == "Bearer sk-loopback-key" for route, auth in server.seen)
    assert any(route == "/v1/completions" for route, _ in server.seen)  # the warm-ups, C of them per level

    from eaglekit.cli.output import out

    monkeypatch.setattr(out, "width", 80)
    render(doc)
    text = capsys.readouterr().out
    assert "(no baseline: no speed-up)" in text and "ITL ms" in text and "E2EL ms" in text and "p90" in text
    assert "not started by eaglekit" in text and "2.5 requests/s" in text
    assert max(len(line) for line in text.splitlines()) <= 80 and "…" not in text  # readable at 80 columns

    saved = tmp_path / "bench.json"
    from eaglekit.cli.output import write_report

    write_report(str(saved), doc)
    refused = run_cli(["push", os.path.join(DRAFTERS, "smollm2-135m-eagle3"), "--repo-id", "org/d", "--bench",
                       str(saved), "--dry-run"])
    assert refused.exit_code == 1 and "no baseline was measured" in refused.stderr


def test_base_url_with_a_baseline_url_gives_the_speed_up_and_never_shows_the_key(fake_vllm, monkeypatch,
                                                                                    tmp_path):
    spec = fake_vllm(api_key="sk-loopback-key")
    base = fake_vllm(speculative=False, api_key="sk-loopback-key")
    calls: list = []
    url = spec.url.replace("http://", "http://user:s3cret@")
    _fake_client(monkeypatch, calls, {url: spec, spec.url: spec})
    monkeypatch.setenv("OPENAI_API_KEY", "sk-loopback-key")
    saved = tmp_path / "bench.json"
    result = run_cli(["bench", "my-draft", "--base-url", url, "--baseline-url", base.url, "--concurrency", "2",
                      "--input-len", "16", "--max-new-tokens", "16", "--save-report", str(saved), "--format", "json"])
    assert result.exit_code == 0, result.output
    doc = json.loads(result.stdout)
    jsonschema.validate(doc, schema("bench-report"))
    (row,) = doc["rows"]
    assert row["baseline"] is not None and row["speed_up"] == pytest.approx(1.0) and row["identical_outputs"] == 10
    assert row["acceptance_length"] == pytest.approx(1 + 50 / 40) and row["num_drafts"] == 40
    assert doc["servers"]["speculative_url"] == spec.url and doc["servers"]["baseline_url"] == base.url
    assert [c[0] for c in calls] == [base.url, url]  # the target alone first, as bench measures its own servers
    assert all(c[2] == "sk-loopback-key" for c in calls)  # the client's key, given to its process
    for text in (result.output, saved.read_text()):
        assert "sk-loopback-key" not in text and "s3cret" not in text
    assert spec.seen and base.seen  # both were only asked, and both still serve
    assert run_cli(["bench", "my-draft", "--base-url", spec.url, "--input-len", "4", "--concurrency", "1",
                    "--api-key", "sk-loopback-key", "--format", "json"]).exit_code == 0
