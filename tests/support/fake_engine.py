"""Stands in for eaglekit's vLLM worker (same command line) with the process tree vLLM makes: a main process and an
"engine core" child in its process group. The engine core ignores SIGTERM, so only a SIGKILL stops it.

    python fake_engine.py serve REQUEST INFO          # answers /health on the request's --port
    python fake_engine.py bench-client FOLDER         # FAKE_CLIENT=kill-server: SIGKILLs the server first
    python fake_engine.py REQUEST RESULT              # FAKE_OFFLINE=finish: writes a result and exits, else sleeps

The pids ({"guard", "main", "engine_core"}) go to the JSON file named by FAKE_ENGINE_PIDS once the engine core has
set its SIGTERM handler.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from http.server import BaseHTTPRequestHandler, HTTPServer

ENGINE_CORE = ("import signal, sys, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); print('ready', flush=True); "
               "time.sleep(600)")


def _start_engine_core() -> None:
    core = subprocess.Popen([sys.executable, "-c", ENGINE_CORE], stdout=subprocess.PIPE)
    assert core.stdout is not None and core.stdout.readline().strip() == b"ready"
    path = os.environ["FAKE_ENGINE_PIDS"]
    with open(f"{path}.part", "w", encoding="utf-8") as fh:
        json.dump({"guard": os.getppid(), "main": os.getpid(), "engine_core": core.pid}, fh)
    os.replace(f"{path}.part", path)


class Health(BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        self.send_response(200 if self.path == "/health" else 404)
        self.end_headers()

    def log_message(self, *args) -> None:
        pass


def serve(request_path: str, info_path: str) -> None:
    with open(request_path, encoding="utf-8") as fh:
        argv = json.load(fh)["argv"]
    _start_engine_core()
    with open(info_path, "w", encoding="utf-8") as fh:
        json.dump({"vllm_version": "fake", "argv": argv}, fh)
    print("fake server: serving", flush=True)
    HTTPServer(("127.0.0.1", int(argv[argv.index("--port") + 1])), Health).serve_forever()


def bench_client(folder: str) -> None:
    """Ready at once; answers its first request as vLLM's client does when the server goes away."""
    open(os.path.join(folder, "ready"), "w").close()
    while not os.path.exists(os.path.join(folder, "0.request.json")):
        time.sleep(0.05)
    if os.environ.get("FAKE_CLIENT") == "kill-server":
        with open(os.environ["FAKE_ENGINE_PIDS"], encoding="utf-8") as fh:
            os.kill(json.load(fh)["main"], signal.SIGKILL)
        time.sleep(0.2)
    with open(os.path.join(folder, "0.result.json.part"), "w", encoding="utf-8") as fh:
        json.dump({"completed": 0, "failed": 4, "errors": ["Cannot connect to host 127.0.0.1"]}, fh)
    os.replace(os.path.join(folder, "0.result.json.part"), os.path.join(folder, "0.result.json"))
    time.sleep(600)


def offline(result_path: str) -> None:
    _start_engine_core()
    if os.environ.get("FAKE_OFFLINE") != "finish":
        time.sleep(600)
    with open(result_path, "w", encoding="utf-8") as fh:
        json.dump({"tokens": []}, fh)


if __name__ == "__main__":
    if sys.argv[1] == "serve":
        serve(sys.argv[2], sys.argv[3])
    elif sys.argv[1] == "bench-client":
        bench_client(sys.argv[2])
    else:
        offline(sys.argv[2])
