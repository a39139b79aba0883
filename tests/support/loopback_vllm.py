"""A loopback stand-in for a running vLLM server (bench --base-url) whose answers a test scripts route by route.

It answers /v1/models, /version, /metrics (the spec-decode counters, in Prometheus text) and a warm-up's POST
/v1/completions as vLLM does, unless a route is given a behaviour of its own (a redirect, a trickle, a huge or
hostile answer). It records every request's path and headers, serves at most MAX_REQUESTS requests, and stops
itself after LIFETIME_S whatever the client does. `FakeBenchClient` replaces vLLM's benchmark client in-process.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

MAX_REQUESTS = 200
LIFETIME_S = 60.0

Route = Callable[[BaseHTTPRequestHandler], None]

SPEC_METRICS = """# TYPE vllm:spec_decode_num_drafts_total counter
vllm:spec_decode_num_drafts_total{{engine="0",model_name="served-target"}} {drafts}
vllm:spec_decode_num_draft_tokens_total{{engine="0",model_name="served-target"}} {draft_tokens}
vllm:spec_decode_num_accepted_tokens_total{{engine="0",model_name="served-target"}} {accepted}
vllm:spec_decode_num_accepted_tokens_per_pos_total{{engine="0",model_name="served-target",position="0"}} {pos0}
vllm:spec_decode_num_accepted_tokens_per_pos_total{{engine="0",model_name="served-target",position="1"}} {pos1}
vllm:spec_decode_num_accepted_tokens_per_pos_total{{engine="0",model_name="served-target",position="2"}} {pos2}
"""
NO_SPEC_METRICS = 'vllm:generation_tokens_total{engine="0",model_name="served-target"} 1234.0\n'


def send(handler: BaseHTTPRequestHandler, status: int, body: bytes | str, **headers: str) -> None:
    data = body.encode() if isinstance(body, str) else body
    handler.send_response(status)
    handler.send_header("Content-Length", str(len(data)))
    for name, value in headers.items():
        handler.send_header(name.replace("_", "-"), value)
    handler.end_headers()
    handler.wfile.write(data)


def models_listing(max_model_len: object = 2048) -> str:
    return json.dumps({"object": "list", "data": [{"id": "served-target", "object": "model",
                                                   "root": "/models/served-target", "max_model_len": max_model_len}]})


class LoopbackVllm:
    """A server on 127.0.0.1: `routes` maps a path ("GET /metrics") to what it does instead of vLLM's answer;
    `speculative`: whether /metrics carries spec-decode counters; `seen`: (method, path, headers) of every request."""

    def __init__(self, routes: dict[str, Route] | None = None, *, speculative: bool = True, k: int = 3):
        self.routes = dict(routes or {})
        self.speculative = speculative
        self.k = k
        positions = {f"pos{i}": max(6 - 2 * i, 0) for i in range(k)}  # 6, 4, 2, 0...: 12 accepted when k = 3
        self.counts = {"drafts": 10, "draft_tokens": 10 * k, "accepted": sum(positions.values()), **positions}
        self.seen: list[tuple[str, str, dict[str, str]]] = []
        self.stopping = threading.Event()
        fake = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def do_GET(self):
                fake.answer(self, "GET")

            def do_POST(self):
                self.rfile.read(int(self.headers.get("Content-Length") or 0))
                fake.answer(self, "POST")

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.server.timeout = 0.1
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    @property
    def port(self) -> int:
        return int(self.server.server_address[1])

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def _serve(self) -> None:
        """A bounded loop: at most MAX_REQUESTS requests, for at most LIFETIME_S, until `close`."""
        stop_at = time.monotonic() + LIFETIME_S
        while len(self.seen) < MAX_REQUESTS and time.monotonic() < stop_at and not self.stopping.is_set():
            self.server.handle_request()
        self.server.server_close()

    def answer(self, handler: BaseHTTPRequestHandler, method: str) -> None:
        self.seen.append((method, handler.path, dict(handler.headers.items())))
        route = self.routes.get(f"{method} {handler.path}")
        if route is not None:
            route(handler)
        elif method == "POST":
            send(handler, 200, '{"choices": [{"text": "warm"}]}')
        elif handler.path == "/v1/models":
            send(handler, 200, models_listing())
        elif handler.path == "/version":
            send(handler, 200, '{"version": "0.32.0"}')
        elif handler.path == "/metrics":
            send(handler, 200, self.metrics_text() if self.speculative else NO_SPEC_METRICS)
        else:
            send(handler, 404, "{}")

    def metrics_text(self) -> str:
        """The spec-decode counters in Prometheus text, one per-position line per draft position (k of them)."""
        if self.k == 3:
            return SPEC_METRICS.format(**self.counts)
        head = SPEC_METRICS.split("vllm:spec_decode_num_accepted_tokens_per_pos_total")[0].format(**self.counts)
        line = ('vllm:spec_decode_num_accepted_tokens_per_pos_total{{engine="0",model_name="served-target",'
                'position="{i}"}} {n}\n')
        return head + "".join(line.format(i=i, n=self.counts[f"pos{i}"]) for i in range(self.k))

    def serve(self, *, drafts: int, accepted: int) -> None:
        """What measured requests leave in the counters (k drafts a round, positions filled in order)."""
        self.counts["drafts"] += drafts
        self.counts["draft_tokens"] += self.k * drafts
        self.counts["accepted"] += accepted
        left = accepted
        for pos in (f"pos{i}" for i in range(self.k)):
            taken = min(left, drafts)
            self.counts[pos] += taken
            left -= taken

    def headers_seen(self) -> str:
        """Every header value every request carried, as one text (to look for a credential in)."""
        return "\n".join(f"{name}: {value}" for _, _, headers in self.seen for name, value in headers.items())

    def close(self) -> None:
        self.stopping.set()
        self.thread.join(timeout=5)


class FakeBenchClient:
    """vLLM's `bench serve` client replaced in-process: each run answers as the client does for requests of 16
    tokens (request i: first token after 10 (i + 1) ms, 10 + i tokens/s), and calls `on_run(endpoint_url)` in
    between the counter readings (what the measured requests do). `runs` records each run's endpoint, arguments and
    the prompts of its dataset file, in order."""

    on_run: Callable[[str], None] = staticmethod(lambda url: None)
    runs: list[dict] = []

    def __init__(self, python, work, api_key):
        self.api_key = api_key

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        pass

    def run(self, endpoint, args, *, what, timeout_s, server=None):
        requests = int(args[args.index("--num-prompts") + 1])
        prompts = []
        if "--dataset-path" in args:
            with open(args[args.index("--dataset-path") + 1], encoding="utf-8") as fh:
                prompts = [json.loads(line)["prompt"] for line in fh]
        type(self).runs.append({"url": endpoint.url, "args": list(args), "prompts": prompts})
        type(self).on_run(endpoint.url)
        rates = [10.0 + i for i in range(requests)]
        input_len = int(args[args.index("--random-input-len") + 1]) if "--random-input-len" in args else 100
        result = {"completed": requests, "failed": 0, "duration": 2.0, "total_output_tokens": 16 * requests,
                  "output_throughput": 8.0 * requests, "output_lens": [16] * requests,
                  "latencies": [16 / r for r in rates], "generated_texts": [f"text {i}" for i in range(requests)],
                  "ttfts": [0.01 * (i + 1) for i in range(requests)], "total_input_tokens": input_len * requests}
        for scale, name in enumerate(("ttft", "tpot", "itl", "e2el"), start=1):
            result[f"mean_{name}_ms"] = 10.0 * scale
            result.update({f"p{q}_{name}_ms": 10.0 * scale + float(q)
                           for q in args[args.index("--metric-percentiles") + 1].split(",")})
        return result
