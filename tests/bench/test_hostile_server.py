"""A hostile server behind `eaglekit bench --base-url`: it redirects to another host, trickles its answer, declares
or sends gigabytes, or writes numbers no vLLM writes. Each is one line on stderr and exit 1, in bounded time and
memory, with no credential sent anywhere but the server given and none in any output. --seed past what torch takes
is a usage error before any work.

Every server is a loopback one (tests/support/loopback_vllm.py) that stops itself; vLLM's benchmark client is
replaced in-process where a bench gets as far as measuring."""

from __future__ import annotations

import json
import os
import time

import jsonschema
import pytest

from eaglekit.io.http_client import Origin
from eaglekit.runtime import endpoint as endpoint_module
from tests.support import REPO
from tests.support.cli import run_cli
from tests.support.factory import make_draft, make_target_config
from tests.support.loopback_vllm import SPEC_METRICS, FakeBenchClient, LoopbackVllm, models_listing, send

KEY = "sk-loopback-secret-key"
PASSWORD = "pa55-loopback-secret"
SCHEMA = os.path.join(str(REPO), "eaglekit", "schemas",
                      "bench-report.schema.json")
DRAFTERS = os.path.join(str(REPO), "examples", "drafters")


@pytest.fixture
def loopback():
    servers: list[LoopbackVllm] = []

    def start(routes=None, **kwargs) -> LoopbackVllm:
        servers.append(LoopbackVllm(routes, **kwargs))
        return servers[-1]

    yield start
    for server in servers:
        server.close()


@pytest.fixture
def fake_client(monkeypatch):
    import eaglekit.bench.run as bench_run

    monkeypatch.setattr(bench_run, "BenchClient", FakeBenchClient)
    monkeypatch.setattr(FakeBenchClient, "on_run", staticmethod(lambda url: None))
    return FakeBenchClient


def bench(url: str, *extra: str):
    return run_cli(["bench", "my-draft", "--base-url", url, "--input-len", "4", "--max-new-tokens", "16",
                    "--concurrency", "2", *extra])


def one_line_exit_1(result, needle: str) -> str:
    assert result.exit_code == 1, result.output
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and needle in lines[0], result.stderr
    for secret in (KEY, PASSWORD):
        assert secret not in result.output
    return lines[0]


# ------------------------------------------------------------------ credentials stay with the server given


@pytest.mark.parametrize("credential", ["--api-key", "OPENAI_API_KEY", "user:password@"])
def test_a_redirect_to_another_origin_is_refused_and_the_other_server_never_sees_a_credential(loopback, fake_client,
                                                                                              monkeypatch,
                                                                                              credential):
    elsewhere = loopback()
    away = {f"GET {route}": (lambda h: send(h, 302, "", Location=f"{elsewhere.url}{h.path}"))
            for route in ("/v1/models", "/version", "/metrics")}
    server = loopback(away)
    url, extra = server.url, []
    if credential == "--api-key":
        extra = ["--api-key", KEY]
    elif credential == "OPENAI_API_KEY":
        monkeypatch.setenv("OPENAI_API_KEY", KEY)
    else:
        url = server.url.replace("http://", f"http://user:{PASSWORD}@")
    line = one_line_exit_1(bench(url, *extra), f"the speculative server at {server.url} gave no usable answer to "
                                                f"/v1/models: it redirects to another origin ({elsewhere.url})")
    assert "where eaglekit neither follows nor sends credentials" in line
    assert server.seen and elsewhere.seen == []  # asked nothing, so shown no key, no password
    assert KEY not in elsewhere.headers_seen() and "Authorization" not in elsewhere.headers_seen()


def test_a_redirect_within_the_origin_keeps_the_key_and_is_followed(loopback):
    from eaglekit.runtime.endpoint import Endpoint

    def listing(handler):
        authorized = handler.headers.get("Authorization") == f"Bearer {KEY}"
        send(handler, 200 if authorized else 401, models_listing())

    server = loopback({"GET /v1/models": lambda h: send(h, 307, "", Location="/moved/v1/models"),
                       "GET /moved/v1/models": listing})
    assert Endpoint(server.url, "speculative server", KEY).served_model().max_model_len == 2048
    assert [path for _, path, _ in server.seen] == ["/v1/models", "/moved/v1/models"]


def test_a_proxy_from_the_environment_carries_the_requests_as_urllib_and_vllms_client_send_them(loopback,
                                                                                                  monkeypatch):
    from eaglekit.runtime.endpoint import Endpoint

    server = loopback()
    proxy = loopback({f"GET {server.url}/v1/models": lambda h: send(h, 200, models_listing())})
    monkeypatch.setenv("http_proxy", proxy.url)
    monkeypatch.delenv("no_proxy", raising=False)
    monkeypatch.delenv("NO_PROXY", raising=False)
    assert Endpoint(server.url, "speculative server", KEY).served_model().id == "served-target"
    assert server.seen == [] and [(m, p) for m, p, _ in proxy.seen] == [("GET", f"{server.url}/v1/models")]
    assert proxy.seen[0][2]["Authorization"] == f"Bearer {KEY}"


@pytest.mark.parametrize("first, then, keeps", [
    ("http://gpu-node:8000/v1", "http://gpu-node:8000/v2", True),
    ("http://gpu-node/v1", "https://gpu-node/v1", True),  # the upgrade requests allows too
    ("https://gpu-node/v1", "http://gpu-node/v1", False),  # a downgrade would send the key in clear text
    ("http://gpu-node:8000/v1", "http://gpu-node:8001/v1", False),
    ("http://gpu-node:8000/v1", "http://elsewhere:8000/v1", False),
    ("http://gpu-node:8000/v1", "https://gpu-node:8000/v1", False),
])
def test_credentials_may_follow_a_redirect_only_within_their_origin(first, then, keeps):
    assert Origin.of(then).may_receive_credentials_of(Origin.of(first)) is keeps


# ------------------------------------------------------------------ every answer bounded in time and in bytes


def _trickle(what: str):
    """Answers /v1/models a byte every 0.3 s (its status line and headers, or its body), for at most 30 s."""
    head = b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
    body = models_listing().encode()

    def route(handler):
        handler.close_connection = True
        if what == "body":
            handler.wfile.write(head + f"Content-Length: {len(body)}\r\n\r\n".encode())
        data = (head + f"Content-Length: {len(body)}\r\n\r\n".encode() if what == "headers" else b"") + body
        stop_at = time.monotonic() + 30
        for byte in data:
            if time.monotonic() > stop_at:
                return
            try:
                handler.wfile.write(bytes([byte]))
                handler.wfile.flush()
            except OSError:
                return  # the client gave up
            time.sleep(0.3)

    return route


@pytest.mark.parametrize("what", ["headers", "body"])
def test_a_trickling_server_is_cut_off_at_the_request_deadline(loopback, monkeypatch, what):
    monkeypatch.setattr(endpoint_module, "REQUEST_TIMEOUT_S", 1.0)  # each byte comes well within it
    server = loopback({"GET /v1/models": _trickle(what)})
    one_line_exit_1(bench(server.url, "--api-key", KEY),
                    "gave no usable answer to /v1/models: no complete answer within 1 s")


def _huge(declared: str | None):
    """An answer that declares `declared` bytes and sends 64 KiB, or declares nothing and sends 8 MiB."""

    def route(handler):
        handler.close_connection = True
        handler.send_response(200)
        if declared is not None:
            handler.send_header("Content-Length", declared)
        handler.end_headers()
        chunk = b" " * 65536
        try:
            handler.wfile.write(b'{"data": [')
            for _ in range(1 if declared else 128):
                handler.wfile.write(chunk)
        except OSError:
            pass

    return route


@pytest.mark.parametrize("declared, needle", [
    (str(10**12), "an answer of 1,000,000,000,000 bytes declared, more than the 4,194,304 allowed"),
    ("9" * 30, "an answer of a 30-digit number of bytes declared, more than the 4,194,304 allowed"),
    (None, "an answer of more than the 4,194,304 bytes allowed"),
])
def test_an_answer_past_its_cap_is_refused_without_being_read_whole(loopback, declared, needle):
    server = loopback({"GET /v1/models": _huge(declared)})
    one_line_exit_1(bench(server.url), f"gave no usable answer to /v1/models: {needle}")


# ------------------------------------------------------------------ every number read from a server checked


def _metrics(**changes: str):
    text = SPEC_METRICS.format(drafts=10, draft_tokens=30, accepted=12, pos0=6, pos1=4, pos2=2)
    for old, new in changes.items():
        text = text.replace(old.replace("__", '"'), new)
    return lambda handler: send(handler, 200, text)


@pytest.mark.parametrize("position", ["10000000", "1000000000000", "9" * 5000])
def test_an_absurd_draft_position_is_one_line(loopback, position):
    server = loopback({"GET /metrics": _metrics(**{'position=__2__': f'position="{position}"'})})
    line = one_line_exit_1(bench(server.url), "answered /metrics with a sample no vLLM writes: "
                                              "vllm:spec_decode_num_accepted_tokens_per_pos_total has the draft "
                                              "position")
    assert "no drafter proposes more than 128 tokens a round" in line and len(line) < 600


@pytest.mark.parametrize("value", ["NaN", "+Inf", "-Inf", "1e400", "-3", "12.5", "1e17", "twelve"])
def test_a_counter_that_is_no_whole_number_is_one_line(loopback, value):
    server = loopback({"GET /metrics": _metrics(**{"} 10\n": "} " + value + "\n"})})
    one_line_exit_1(bench(server.url), f"vllm:spec_decode_num_drafts_total has the value {value!r}: a counter is a "
                                       "whole number from 0 to 2^53")


def test_spec_counters_refuse_an_absurd_position_before_building_anything():
    from eaglekit.runtime.endpoint import MetricsError, spec_counters

    text = SPEC_METRICS.format(drafts=10, draft_tokens=30, accepted=12, pos0=6, pos1=4, pos2=2)
    with pytest.raises(MetricsError):
        spec_counters(text.replace('position="2"', 'position="1000000000000"'))
    assert len(spec_counters(text).accepted_per_position) == 3


@pytest.mark.parametrize("value", [2048.5, "2048", True, 0, -1, 10**20, [2048]])
def test_a_max_model_len_that_is_no_token_count_is_one_line(loopback, fake_client, value):
    server = loopback({"GET /v1/models": lambda h: send(h, 200, models_listing(value))})
    one_line_exit_1(bench(server.url), f"lists max_model_len {value!r} at /v1/models: expected a whole number of "
                                       "tokens from 1 to 2,147,483,647")


# ------------------------------------------------------------------ counters gone or reset during a measurement


@pytest.mark.parametrize("change, reason", [
    ("absent", "absent from /metrics (vLLM exports none with --disable-log-stats)"),
    ("reset", "lower after the measurement than before it (the server restarted?)"),
])
def test_counters_gone_during_a_measurement_leave_tau_unknown_and_push_takes_the_report(loopback, fake_client,
                                                                                       tmp_path, change, reason):
    spec, base = loopback(), loopback(speculative=False)

    def measured(url: str) -> None:
        if url == spec.url and change == "absent":
            spec.speculative = False
        elif url == spec.url:
            spec.counts = {"drafts": 4, "draft_tokens": 12, "accepted": 5, "pos0": 3, "pos1": 2, "pos2": 0}

    fake_client.on_run = staticmethod(measured)
    saved = tmp_path / "bench.json"
    result = bench(spec.url, "--baseline-url", base.url, "--api-key", KEY, "--save-report", str(saved),
                   "--format", "json")
    assert result.exit_code == 0, result.output
    doc = json.loads(saved.read_text())
    with open(SCHEMA, encoding="utf-8") as fh:
        jsonschema.validate(doc, json.load(fh))
    (row,) = doc["rows"]
    assert doc["num_speculative_tokens"] == 3
    assert (row["acceptance_length"], row["per_position_acceptance"], row["num_drafts"]) == (None, [], 0)
    unknown = f"τ unknown at C=2, 4 input tokens: the speculative server's spec-decode counters were {reason}"
    assert unknown in doc["notes"]
    for text in (result.output, saved.read_text()):
        assert KEY not in text

    card = tmp_path / "README.md"
    pushed = run_cli(["push", os.path.join(DRAFTERS, "smollm2-135m-eagle3"), "--repo-id", "org/d", "--bench",
                      str(saved), "--dry-run", "--offline", "--force", "--allow-few-samples", "--card-out",
                      str(card)])
    assert pushed.exit_code == 0, pushed.output
    assert "| 2 | " in card.read_text() and "× |" in card.read_text() and "| — |" in card.read_text()


# ------------------------------------------------------------------ seeds bounded while the command line is read


@pytest.mark.parametrize("seed", [str(2**64), str(-(2**63) - 1), "9" * 30])
@pytest.mark.parametrize("command", ["verify", "compare", "finetune"])
def test_a_seed_torch_cannot_take_is_a_usage_error_before_any_work(tmp_path, monkeypatch, command, seed):
    import eaglekit.decode.setup
    import eaglekit.finetune.data
    import eaglekit.finetune.run

    def work(*args, **kwargs):
        pytest.fail("the work started before --seed was checked")

    for module, name in ((eaglekit.decode.setup, "load_target"), (eaglekit.decode.setup, "load_tokenizer"),
                         (eaglekit.finetune.data, "captured_data"), (eaglekit.finetune.run, "finetune")):
        monkeypatch.setattr(module, name, work)
    draft = make_draft(str(tmp_path / "draft"), "vllm")
    target = make_target_config(str(tmp_path / "target"))
    args = {"verify": ["verify", draft], "compare": ["compare", draft, draft],
            "finetune": ["finetune", draft, str(tmp_path / "out")]}[command]
    result = run_cli([*args, "--target", target, "--seed", seed])
    assert result.exit_code == 2, result.output
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and f"--seed {seed}: torch takes seeds from -2^63 to 2^64 - 1" in lines[0], result.stderr
    assert not os.path.exists(tmp_path / "out")
