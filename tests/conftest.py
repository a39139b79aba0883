"""Test environment: Triton runs interpreted on CPU, the Hub is a loopback server, nothing touches $HOME.

Under pytest-xdist (`-n 2`, the README's test command) each worker owns its share of the CPUs (affinity and
OpenMP threads, inherited by every process it starts, vLLM's CPU worker included) and a temporary folder of its
own, so two workers never fight over a core and a test that looks for leftovers in the temporary folder sees only
its own worker's.

The shared fixtures live in tests/support and are registered here: `fake_hub` (tests/support/hub.py) and
`smollm2_dir` / `smollm2` (tests/support/smollm2.py); tests/support/tiers.py counts skips by reason and, under
CI=true, fails a run in which a tier .ci/run sets up (vLLM, llama.cpp, SmolLM2, the test extra's packages) skipped.
"""

import atexit
import os
import shutil
import tempfile


def _usable_cpus() -> list[int]:
    """The CPUs this process may run on, cut to the cgroup's CPU quota where one is set (a container's `--cpus`)."""
    cpus = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else list(range(os.cpu_count() or 1))
    try:
        with open("/sys/fs/cgroup/cpu.max", encoding="ascii") as fh:
            quota, period = fh.read().split()
        if quota != "max":
            cpus = cpus[:max(1, int(quota) // int(period))]
    except (OSError, ValueError):
        pass
    return cpus


def _own_share_of_the_machine() -> None:
    """Pin this xdist worker to its slice of the CPUs, with as many OpenMP threads, and give it a temporary folder
    of its own (before torch loads; every process it starts inherits both)."""
    worker, count = os.environ.get("PYTEST_XDIST_WORKER"), int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
    if not worker or count < 2:
        return
    cpus, index = _usable_cpus(), int(worker.removeprefix("gw"))
    share = cpus[index::count] if count < len(cpus) else [cpus[index % len(cpus)]]
    if hasattr(os, "sched_setaffinity"):
        os.sched_setaffinity(0, share)
    os.environ["OMP_NUM_THREADS"] = str(len(share))
    folder = tempfile.mkdtemp(prefix=f"eaglekit-tests-{worker}-")
    os.environ["TMPDIR"] = folder
    tempfile.tempdir = None
    atexit.register(shutil.rmtree, folder, ignore_errors=True)


_own_share_of_the_machine()

# the stores finetune and upgrade capture into (eaglekit.capture.cache) go to a folder of this run, never $HOME's
os.environ["EAGLEKIT_CACHE"] = tempfile.mkdtemp(prefix="eaglekit-cache-")
atexit.register(shutil.rmtree, os.environ["EAGLEKIT_CACHE"], ignore_errors=True)

# Read by @triton.jit at decoration time: must be set before any kernel module is imported.
os.environ.setdefault("TRITON_INTERPRET", "1")
os.environ.setdefault("HF_HUB_DISABLE_TELEMETRY", "1")
# the CLI's consoles are made at import: a width inherited here (an xdist worker starts with COLUMNS=80) would fix
# them at that width; without one they follow the COLUMNS each test sets
os.environ.pop("COLUMNS", None)

import pytest  # noqa: E402

# the helpers' asserts report their operands as a test's own do
pytest.register_assert_rewrite("tests.support")

pytest_plugins = ["tests.support.hub", "tests.support.smollm2", "tests.support.tiers", "tests.support.guard"]


@pytest.fixture(autouse=True)
def _isolated_env(tmp_path_factory, monkeypatch):
    home = tmp_path_factory.getbasetemp() / "hf-home"
    monkeypatch.setenv("HF_HOME", str(home))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("NO_COLOR", "1")
    monkeypatch.setenv("COLUMNS", "200")
    monkeypatch.delenv("EAGLEKIT_DEBUG", raising=False)
    monkeypatch.delenv("HF_TOKEN", raising=False)
