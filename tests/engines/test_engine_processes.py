"""No engine process outlives eaglekit: a fake engine (tests/support/fake_engine.py: a main process and an "engine core"
child that ignores SIGTERM, as vLLM's tree is) runs through eaglekit's own code paths for `bench` (the server and
its client) and `verify --engine vllm` (one offline run), and is stopped however eaglekit ends."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from eaglekit.errors import EngineError, UsageError
from eaglekit.runtime import engine, processes
from eaglekit.runtime import server as bench_server
from tests.support import REPO
from tests.support.cli import ctrl_c_reaches_it

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads process states from /proc")

FAKE = str(REPO / "tests" / "support" / "fake_engine.py")
GRACE_S = 0.5  # the engine core ignores SIGTERM: every stop waits this long before its SIGKILL
GONE_WITHIN_S = GRACE_S + 10.0

DRIVER = """
import sys, time
from eaglekit.runtime import engine, processes, server

processes.STOP_GRACE_S = {grace}
server.HEALTH_POLL_S = 0.1
server.WORKER = engine.WORKER = {fake!r}
work = {work!r}
if sys.argv[1] == "bench":
    running = server.start_server(sys.executable, work, "target alone", argv=[], target=work, dtype="bfloat16",
                                  positions=1, given=[], timeout_s=60)
    try:
        print("serving", flush=True)
        time.sleep(600)
    finally:
        running.stop()
else:
    engine._run_worker(engine.EngineOptions(python=sys.executable), {{}}, "target alone")
"""


def alive(pid: int) -> bool:
    """Running, a zombie (exited, not yet collected) counting as gone."""
    try:
        with open(f"/proc/{pid}/stat", encoding="utf-8") as fh:
            return fh.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def wait_for(condition, within_s: float) -> bool:
    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(0.05)
    return condition()


def read_pids(path: Path, within_s: float = 60.0) -> dict[str, int]:
    assert wait_for(path.exists, within_s), "the fake engine did not start"
    return json.loads(path.read_text())


@pytest.fixture
def fake_engine(tmp_path, monkeypatch):
    """eaglekit's worker replaced by the fake one; its pids file."""
    monkeypatch.setattr(processes, "STOP_GRACE_S", GRACE_S)
    monkeypatch.setattr(bench_server, "HEALTH_POLL_S", 0.1)
    monkeypatch.setattr(bench_server, "WORKER", FAKE)
    monkeypatch.setattr(engine, "WORKER", FAKE)
    pids = tmp_path / "pids.json"
    monkeypatch.setenv("FAKE_ENGINE_PIDS", str(pids))
    return pids


def _driver(tmp_path: Path, mode: str, pids: Path, grace_s: float = GRACE_S) -> subprocess.Popen:
    """eaglekit's own code running the fake engine in a process of its own, as the CLI would."""
    code = DRIVER.format(grace=grace_s, fake=FAKE, work=str(tmp_path))
    env = dict(os.environ, PYTHONPATH=str(REPO), FAKE_ENGINE_PIDS=str(pids))
    return subprocess.Popen([sys.executable, "-c", code, mode], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            env=env, text=True, cwd=REPO, preexec_fn=ctrl_c_reaches_it)


def _start_server(tmp_path: Path) -> bench_server.Server:
    return bench_server.start_server(sys.executable, str(tmp_path), "target alone", argv=[], target=str(tmp_path),
                                     dtype="bfloat16", positions=1, given=[], timeout_s=60)


@pytest.mark.parametrize("mode", ["bench", "verify"])
def test_every_engine_process_dies_when_eaglekit_is_killed(tmp_path, fake_engine, mode):
    """SIGKILL leaves eaglekit no cleanup to run: the guard sees its parent gone and stops the whole group."""
    driver = _driver(tmp_path, mode, fake_engine)
    try:
        pids = read_pids(fake_engine)
        assert all(alive(pid) for pid in pids.values())
        driver.kill()
        driver.wait(10)
        assert wait_for(lambda: not any(alive(pid) for pid in pids.values()), GONE_WITHIN_S), \
            {name: alive(pid) for name, pid in pids.items()}
    finally:
        driver.kill()
        driver.communicate()


def test_a_second_ctrl_c_does_not_cut_the_stop_short(tmp_path, fake_engine):
    """Ctrl-C starts the stop (its SIGKILL comes `grace_s` later); another Ctrl-C meanwhile waits for the stop to
    end, so when eaglekit exits, nothing of the engine is left."""
    grace_s = 2.0
    driver = _driver(tmp_path, "bench", fake_engine, grace_s)
    try:
        assert driver.stdout is not None and driver.stdout.readline().strip() == "serving"
        pids = read_pids(fake_engine)
        driver.send_signal(signal.SIGINT)
        time.sleep(grace_s / 8)
        assert alive(pids["engine_core"])  # still in the stop's grace period
        driver.send_signal(signal.SIGINT)
        # the stop takes about grace_s; the bound only catches a hang (a loaded CI worker shares its core)
        _, err = driver.communicate(timeout=grace_s + 4 * GONE_WITHIN_S)
        assert not [name for name, pid in pids.items() if alive(pid)]
        assert err.strip().endswith("KeyboardInterrupt")  # the interrupt still ends the program, after the stop
    finally:
        driver.kill()
        driver.communicate()


def test_a_stop_outlasts_any_number_of_interrupts(tmp_path, fake_engine):
    server = _start_server(tmp_path)
    pids = read_pids(fake_engine)
    def interrupt(signum, frame):  # as the CLI handles both
        raise KeyboardInterrupt

    previous = {signum: signal.signal(signum, interrupt) for signum in (signal.SIGINT, signal.SIGTERM)}
    try:
        with pytest.raises(KeyboardInterrupt):
            with processes.signals_deferred():
                for signum in (signal.SIGINT, signal.SIGTERM, signal.SIGINT):
                    os.kill(os.getpid(), signum)
                server.stop()
                assert not any(alive(pid) for pid in pids.values())
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)
        server.stop()


def test_the_engine_core_dies_when_the_server_main_process_dies(tmp_path, fake_engine):
    server = _start_server(tmp_path)
    try:
        pids = read_pids(fake_engine)
        os.kill(pids["main"], signal.SIGKILL)
        assert wait_for(lambda: server.process.poll() is not None, GONE_WITHIN_S)
        assert not alive(pids["engine_core"])
        assert processes.ended_by(server.process.returncode) == "killed by SIGKILL"
    finally:
        server.stop()


def test_a_server_that_stops_during_a_concurrency_level_is_named_as_the_cause(tmp_path, fake_engine, monkeypatch):
    """The client's failed requests are the server's doing: the error says so, with the concurrency."""
    server = _start_server(tmp_path)
    try:
        pids = read_pids(fake_engine)
        monkeypatch.setenv("FAKE_CLIENT", "kill-server")
        with pytest.raises(EngineError) as caught, \
                bench_server.BenchClient(sys.executable, str(tmp_path), None) as client:
            client.run(server.endpoint, [], what="C=4", timeout_s=60, server=server)
        message = str(caught.value)
        assert "the server stopped during C=4 (killed by SIGKILL)" in message and "\n" not in message
        assert not any(alive(pid) for pid in pids.values())
    finally:
        server.stop()


def test_failed_requests_against_a_running_server_stay_the_client_s_error(tmp_path, fake_engine):
    server = _start_server(tmp_path)
    try:
        with pytest.raises(EngineError, match=r"4 of 4 requests failed \(first: Cannot connect"), \
                bench_server.BenchClient(sys.executable, str(tmp_path), None) as client:
            client.run(server.endpoint, [], what="C=4", timeout_s=60, server=server)
        assert server.healthy()
    finally:
        server.stop()
    assert not any(alive(pid) for pid in read_pids(fake_engine).values())


def test_an_engine_core_left_behind_by_a_finished_run_is_stopped(fake_engine, monkeypatch):
    monkeypatch.setenv("FAKE_OFFLINE", "finish")
    result, _ = engine._run_worker(engine.EngineOptions(python=sys.executable), {}, "target alone")
    assert result == {"tokens": []}
    assert not any(alive(pid) for pid in read_pids(fake_engine).values())


def test_a_benchmark_client_that_cannot_import_is_refused_before_any_measurement(tmp_path, monkeypatch):
    worker = tmp_path / "worker.py"
    worker.write_text("import sys\nsys.exit(\"ModuleNotFoundError: No module named 'pandas'\")\n")
    monkeypatch.setattr(bench_server, "WORKER", str(worker))
    with pytest.raises(UsageError, match=r"No module named 'pandas'\): install pandas there") as caught:
        bench_server.BenchClient(sys.executable, str(tmp_path), None)
    assert "\n" not in str(caught.value)
