"""vLLM's OpenAI-compatible server and its own benchmark client, run in the Python that has vLLM.

The server is vLLM's `vllm.entrypoints.openai.api_server` module (the CPU wheel's `vllm` console script fails),
started by eaglekit's worker so that its memory is sized for the job first; the load comes from vLLM's
`vllm bench serve` client, run the same way. Each runs under eaglekit's process guard (eaglekit.runtime.processes):
a server is stopped with every process it started (vLLM starts an engine-core process of its own) when the bench
ends however it ends, also when eaglekit itself is killed.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from eaglekit.errors import EngineError, UsageError
from eaglekit.io import http_client
from eaglekit.runtime import processes
from eaglekit.runtime.endpoint import Endpoint
from eaglekit.runtime.engine import PROBE_TIMEOUT_S, WORKER, root_cause

HEALTH_POLL_S = 1.0
HEALTH_CHECK_S = 5.0  # a server that does not answer /health this soon is not serving
HEALTH_BYTES = 64 * 1024  # vLLM's /health answers with an empty body
CLIENT_POLL_S = 0.05  # how often the benchmark client's answer is looked for


def engine_flags(settings: dict[str, Any]) -> list[str]:
    """vLLM server flags from engine settings (`max_model_len=4096` -> `--max-model-len 4096`; true -> the flag
    alone, false -> its `--no-` form; dicts and lists as JSON)."""
    flags: list[str] = []
    for name, value in settings.items():
        flag = f"--{name.replace('_', '-')}"
        if value is True:
            flags.append(flag)
        elif value is False:
            flags.append(f"--no-{name.replace('_', '-')}")
        else:
            flags += [flag, json.dumps(value) if isinstance(value, (dict, list)) else str(value)]
    return flags


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@dataclass
class Server:
    """One running vLLM server: its URL, the device it reports, the flags it was started with, its start time."""

    what: str
    port: int
    process: subprocess.Popen
    log_path: str
    info: dict[str, Any]
    start_s: float

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def endpoint(self) -> Endpoint:
        return Endpoint(self.url, self.what)

    @property
    def flags(self) -> list[str]:
        """The flags vLLM's server ran with, sizing included, without this run's host and port."""
        argv, kept, skip = list(self.info.get("argv") or []), [], False
        for arg in argv:
            if skip:
                skip = False
            elif arg in ("--host", "--port"):
                skip = True
            else:
                kept.append(arg)
        return kept

    def log(self) -> str:
        with open(self.log_path, encoding="utf-8", errors="replace") as fh:
            return fh.read()

    def healthy(self, timeout_s: float = HEALTH_CHECK_S) -> bool:
        """Whether the server answers /health now."""
        if self.process.poll() is not None:
            return False
        try:
            http_client.request(f"{self.url}/health", deadline_s=timeout_s, max_bytes=HEALTH_BYTES)
        except http_client.HttpFailure:
            return False
        return True

    def stop(self) -> None:
        """Stop the server and every process it started (SIGTERM, SIGKILL after a grace period)."""
        processes.stop(self.process)


def start_server(python: str, work: str, what: str, *, argv: Sequence[str], target: str, dtype: str, positions: int,
                 given: Sequence[str], timeout_s: float) -> Server:
    """Start vLLM's server for `what` ("target alone", "target + draft") and wait until it answers /health; a
    server that exits first is reported by the root cause in its log."""
    port = free_port()
    tag = what.replace(" ", "-").replace("+", "and")
    request, info_path, log_path = (os.path.join(work, f"{tag}.{suffix}") for suffix in ("request.json", "info.json",
                                                                                           "log"))
    with open(request, "w", encoding="utf-8") as fh:
        json.dump({"argv": [*argv, "--host", "127.0.0.1", "--port", str(port)], "target": target, "dtype": dtype,
                   "positions": positions, "given": list(given)}, fh)
    env = dict(os.environ, VLLM_LOGGING_LEVEL=os.environ.get("VLLM_LOGGING_LEVEL", "INFO"))
    started = time.perf_counter()
    with open(log_path, "w", encoding="utf-8") as log:
        process = processes.start(python, [WORKER, "serve", request, info_path], stdout=log, env=env)
    server = Server(what, port, process, log_path, {}, 0.0)
    try:
        _wait_healthy(server, timeout_s)
        with open(info_path, encoding="utf-8") as fh:
            server.info = json.load(fh)
    except BaseException:
        server.stop()
        raise
    server.start_s = time.perf_counter() - started
    return server


def _wait_healthy(server: Server, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if server.process.poll() is not None:
            raise EngineError(f"vLLM server ({server.what}) failed: {root_cause(server.log())[:300]}")
        if server.healthy():
            return
        time.sleep(HEALTH_POLL_S)
    raise EngineError(f"vLLM server ({server.what}) did not answer /health within {timeout_s:.0f} s "
                      f"(last log line: {root_cause(server.log())[:200]})")


class BenchClient:
    """vLLM's own benchmark client (`vllm bench serve`) in one process for a whole bench: vLLM and pandas are
    imported once (about 10 s each time on a CPU) instead of once per measurement, and a client that cannot import
    is found before any server starts.

    Each measurement is a request file in the client's folder, answered by a result file or an error file. The
    endpoints' API key reaches the client in its environment (OPENAI_API_KEY, which vLLM's client sends as a
    bearer token), never on a command line or in a file."""

    def __init__(self, python: str, work: str, api_key: str | None, *, timeout_s: float = PROBE_TIMEOUT_S):
        self.python = python
        self.folder = tempfile.mkdtemp(prefix="client-", dir=work)
        self.log_path = os.path.join(self.folder, "client.log")
        self.sent = 0
        env = dict(os.environ)
        env.pop("OPENAI_API_KEY", None)
        if api_key:
            env["OPENAI_API_KEY"] = api_key
        with open(self.log_path, "w", encoding="utf-8") as log:
            self.process = processes.start(python, [WORKER, "bench-client", self.folder], stdout=log, env=env)
        try:
            self._wait_ready(timeout_s)
        except BaseException:
            self.close()
            raise

    def __enter__(self) -> BenchClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        processes.stop(self.process)

    def _log(self) -> str:
        return _read(self.log_path)

    def _wait_ready(self, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        while not os.path.exists(os.path.join(self.folder, "ready")):
            if self.process.poll() is not None:
                last = (self._log().strip().splitlines() or ["no output"])[-1]
                raise UsageError(f"vLLM's benchmark client does not import in {self.python} ({last[:160]}): install "
                                 "pandas there (pip install pandas, vLLM's bench extra; scripts/vllm-env.sh does)")
            if time.monotonic() > deadline:
                raise EngineError(f"vLLM's benchmark client did not start within {timeout_s:.0f} s")
            time.sleep(CLIENT_POLL_S)

    def run(self, endpoint: Endpoint, args: Sequence[str], *, what: str, timeout_s: float,
            server: Server | None = None) -> dict[str, Any]:
        """One `bench serve` run against `endpoint`; its result dict. A failed client, or any failed request, is an
        EngineError naming the cause (the log of `server`, one eaglekit started, is read when the client says
        nothing useful)."""
        number, self.sent = self.sent, self.sent + 1
        request = os.path.join(self.folder, f"{number}.request.json")
        with open(f"{request}.part", "w", encoding="utf-8") as fh:
            json.dump({"args": ["--base-url", endpoint.url, *args]}, fh)
        os.replace(f"{request}.part", request)
        result_path, error_path = (os.path.join(self.folder, f"{number}.{end}") for end in ("result.json", "error"))
        deadline = time.monotonic() + timeout_s
        while not os.path.exists(result_path):
            if os.path.exists(error_path) or self.process.poll() is not None:
                _check_running(server, what)
                failure = _read(error_path) if os.path.exists(error_path) else self._log()
                raise EngineError(f"vLLM's benchmark client ({what}) failed: {root_cause(failure)[:300]}")
            if time.monotonic() > deadline:
                self.close()
                _check_running(server, what)
                raise EngineError(f"vLLM's benchmark client ({what}) did not finish within {timeout_s:.0f} s")
            time.sleep(CLIENT_POLL_S)
        with open(result_path, encoding="utf-8") as fh:
            result = json.load(fh)
        failed = int(result.get("failed") or 0)
        if failed or not result.get("completed"):
            _check_running(server, what)
            errors = [e for e in result.get("errors") or [] if e]
            first = str(errors[0]).strip()[:200] if errors else "no error given"
            sent = failed + int(result.get("completed") or 0)
            raise EngineError(f"vLLM ({endpoint.what}, {what}): {failed} of {sent} requests failed (first: {first})")
        return result


def _read(path: str) -> str:
    with open(path, encoding="utf-8", errors="replace") as fh:
        return fh.read()


def _check_running(server: Server | None, what: str) -> None:
    """A client that failed because the server stopped under it is reported as the server's failure: the server is
    stopped for good (with every process it started) and its log says why. A server eaglekit did not start (None)
    is left as it is."""
    if server is None or server.healthy():
        return
    server.stop()
    raise EngineError(f"vLLM ({server.what}): the server stopped during {what} "
                      f"({processes.ended_by(server.process.returncode)}): {root_cause(server.log())[:300]}")
