"""`verify --engine vllm`: the same prompts and k through vLLM's offline API, measured by vLLM's own counters.

vLLM runs in a child process of the Python that has it (`--engine-python`, else EAGLEKIT_VLLM_PYTHON, else the
`.vllm-env` that scripts/vllm-env.sh makes, in the working directory or the eaglekit checkout, else this one):
vLLM pins its own torch and transformers, so it often lives in an environment of its own. Two runs, each
in a fresh process (vLLM frees an engine only with its process): the target alone, then with the draft as
`method: eagle3`. Targets too big for one device use vLLM's own tensor parallelism (--tensor-parallel-size).
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import tempfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from eaglekit.decode.metrics import AcceptanceCounter
from eaglekit.engines.vllm import (
    CPU_THREADS_BIND,
    CPU_VISIBLE_MEMORY_NODES,
    acceptance_settings,
    check_speculative_settings,
    cpu_threads_bind,
    split_speculative_settings,
)
from eaglekit.errors import EngineError, EngineMissing, UsageError
from eaglekit.progress import Progress, quiet
from eaglekit.runtime import processes
from eaglekit.runtime.checkout import CHECKOUT, checkout_script

WORKER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "vllm_worker.py")
AUX_LOG = re.compile(r"[^\n]*auxiliary layers[^\n]*", re.IGNORECASE)
AUX_IDS_IN_LOG = re.compile(r"\[([\d,\s]+)\]|\(([\d,\s]+)\)")
EXCEPTION_LINE = re.compile(r"(?:^|[\s\]])(?:[a-z_]\w*\.)*([A-Z]\w*(?:Error|Exception)): (.+)$")
"""`ValueError: why`, also behind the `(EngineCore pid=…) ERROR … [file.py:N]` prefix of an engine process."""
WRAPPERS = ("Engine core initialization failed", "See root cause above", "Worker failed", "Engine process failed")
"""Exceptions vLLM raises about an exception raised earlier in its log (the root cause is that one)."""
PYDANTIC_DETAIL = re.compile(r"^\s+(?:Value error, |Assertion failed, )?(.+?)(?: \[type=[^\]]*\])?$")
DEFAULT_ENGINE_ARGS: dict[str, Any] = {"max_num_seqs": 1, "enforce_eager": True}
"""One sequence at a time, as the reference decodes (so batching cannot change float rounding), and no graph
capture or compilation: on a CPU that warm-up costs minutes and changes no result. max_model_len is fitted to the
prompts (fitted_model_len) unless given."""
ANSWER_BATCH = 16  # prompts vLLM answers at once (--generate): batching changes no greedy token beyond rounding
VERSION_TAG = "vllm-version"  # marks the version among the log lines importing vLLM may print
DEVICE_TAG = "vllm-device"  # and the device type its platform runs on
PROBE_TIMEOUT_S = 300.0  # importing vLLM the first time compiles its bytecode
MODEL_LEN_SLACK = 32  # tokens beyond the longest request's: a server tokenises rendered text itself
MODEL_LEN_STEP = 256


PROJECT_ENVIRONMENT = ".vllm-env"  # where scripts/vllm-env.sh writes by default


def project_environments() -> list[str]:
    """The Pythons of `.vllm-env` in the working directory and in the eaglekit checkout, where the README's setup
    puts vLLM."""
    places = dict.fromkeys(os.path.join(os.path.abspath(p), PROJECT_ENVIRONMENT, "bin", "python")
                           for p in (os.getcwd(), CHECKOUT))
    return list(places)


def where_looked(opts: EngineOptions) -> str:
    """Where eaglekit looked for vLLM, for the line that says it is missing."""
    if opts.python:
        return "--engine-python"
    if os.environ.get("EAGLEKIT_VLLM_PYTHON"):
        return "$EAGLEKIT_VLLM_PYTHON"
    return f"looked in --engine-python, $EAGLEKIT_VLLM_PYTHON, {', '.join(project_environments())} and this Python"


@dataclass(frozen=True)
class EngineOptions:
    python: str | None = None  # interpreter with vLLM; default: see `interpreter`
    tensor_parallel_size: int = 1
    engine_args: dict[str, Any] = field(default_factory=dict)  # extra LLM(...) keyword arguments
    timeout_s: float = 3600.0
    environment: dict[str, str] = field(default_factory=dict)  # variables eaglekit adds to vLLM's environment

    @property
    def llm_args(self) -> dict[str, Any]:
        """The engine arguments vLLM takes beside the speculative config (LLM(...) keywords, server flags)."""
        return split_speculative_settings(self.engine_args)[0]

    @property
    def speculative_settings(self) -> dict[str, Any]:
        """The engine arguments that go into the speculative config eaglekit writes (rejection_sample_method, ...)."""
        return split_speculative_settings(self.engine_args)[1]

    @property
    def interpreter(self) -> str:
        """--engine-python, else $EAGLEKIT_VLLM_PYTHON, else the first project environment that exists, else this
        Python."""
        if self.python or os.environ.get("EAGLEKIT_VLLM_PYTHON"):
            return self.python or os.environ["EAGLEKIT_VLLM_PYTHON"]
        return next((p for p in project_environments() if os.access(p, os.X_OK)), sys.executable)

    def check(self) -> None:
        if self.tensor_parallel_size < 1:
            raise UsageError("--tensor-parallel-size must be at least 1")
        split_speculative_settings(self.engine_args)  # a malformed speculative_config is refused before any work

    @property
    def given(self) -> tuple[str, ...]:
        """The options that set how vLLM runs which were given (not left at their defaults): refused where no vLLM
        runs, rather than silently ignored."""
        return tuple(flag for flag, value in (("--engine-python", self.python),
                                              ("--tensor-parallel-size", self.tensor_parallel_size != 1),
                                              ("--engine-arg", self.engine_args)) if value)


@dataclass
class EngineRun:
    """What vLLM did: its counters, its outputs against its own target-only outputs, the layers it captured."""

    engine: str
    version: str
    counter: AcceptanceCounter
    lossless: bool
    mismatched_prompts: list[int]
    target_outputs: list[list[int]]  # vLLM's target-only greedy tokens per prompt
    aux_log: str | None  # vLLM's own line naming the aux layers it captures (None: it printed none)
    timings: dict[str, float]  # engine start and generate seconds, tokens/s with and without the draft
    per_request: list[AcceptanceCounter] | None = None  # vLLM's per-request counters (from 0.29), prompt order
    settings: dict[str, Any] = field(default_factory=dict)  # the speculative-config settings it ran under

    @property
    def acceptance_settings(self) -> dict[str, Any]:
        return acceptance_settings(self.settings)

    def to_dict(self) -> dict[str, Any]:
        c = self.counter
        return {"engine": self.engine, "version": self.version, "acceptance_settings": self.acceptance_settings,
                "acceptance_length": c.acceptance_length,
                "per_position_acceptance": c.per_position, "num_drafts": c.drafts, "num_draft_tokens": c.draft_tokens,
                "num_accepted_tokens": c.accepted, "num_accepted_tokens_per_pos": list(c.accepted_at),
                "lossless": self.lossless, "mismatched_prompts": self.mismatched_prompts,
                "aux_layers_log": self.aux_log, "timings": {k: round(v, 3) for k, v in self.timings.items()},
                "per_request": None if self.per_request is None else [
                    {"acceptance_length": c.acceptance_length, "num_drafts": c.drafts,
                     "num_accepted_tokens_per_pos": list(c.accepted_at)} for c in self.per_request]}


def parse_engine_args(pairs: Sequence[str]) -> dict[str, Any]:
    """KEY=VALUE pairs for LLM(...); values are JSON where they parse as JSON, else strings."""
    out: dict[str, Any] = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key.isidentifier():
            raise UsageError(f"--engine-arg {pair!r}: expected KEY=VALUE, e.g. max_model_len=4096")
        try:
            out[key] = json.loads(value)
        except ValueError:
            out[key] = value
    return out


def install_hint() -> str:
    """The command that installs vLLM and the setting that points eaglekit at it, named from the working directory."""
    script = checkout_script("scripts", "vllm-env.sh")
    where = f"`{script}`" if script else "`scripts/vllm-env.sh` of the eaglekit sources"
    return (f"install it with {where} (it makes {PROJECT_ENVIRONMENT}) and run with "
            f"`EAGLEKIT_VLLM_PYTHON={PROJECT_ENVIRONMENT}/bin/python` (or --engine-python)")


PROBE = (f"import vllm\nprint({VERSION_TAG!r}, vllm.__version__, flush=True)\n"
         "try:\n    from vllm.platforms import current_platform\n"
         f"    print({DEVICE_TAG!r}, current_platform.device_type)\nexcept Exception:\n    pass\n")
"""Prints vLLM's version, then the device its platform runs on (a platform that fails to load says nothing)."""


@dataclass(frozen=True)
class EngineProbe:
    version: str
    device_type: str | None  # "cpu" for vLLM's CPU build, "cuda", ...; None where the probe could not tell


def refuse_unused(opts: EngineOptions, setting: str) -> None:
    """Refuse, before any work, a vLLM option given where `setting` (e.g. "--engine reference") runs no vLLM."""
    if opts.given:
        raise UsageError(f"{opts.given[0]} with {setting}: it sets how vLLM runs, and {setting} runs none; drop "
                         f"{opts.given[0]}")


def check_engine_available(opts: EngineOptions, timeout_s: float = PROBE_TIMEOUT_S,
                           progress: Progress | None = None) -> str:
    """vLLM's version in the engine interpreter; EngineMissing, one line with the command that installs it first,
    when it is not there (a machine without vLLM, not a wrong command line)."""
    return probe_engine(opts, timeout_s, progress).version


def probe_engine(opts: EngineOptions, timeout_s: float = PROBE_TIMEOUT_S,
                 progress: Progress | None = None) -> EngineProbe:
    """vLLM's version and device type in the engine interpreter (see check_engine_available). Importing vLLM takes
    tens of seconds on a CPU, so `progress` hears of it as its own stage."""
    python = opts.interpreter
    quiet(progress).stage("checking vLLM: importing it in its Python")
    with tempfile.TemporaryDirectory(prefix="eaglekit-vllm-") as work:
        try:
            probe = processes.run(python, ["-c", PROBE], os.path.join(work, "probe.log"), timeout_s=timeout_s)
        except (OSError, subprocess.TimeoutExpired) as exc:
            why = exc.strerror if isinstance(exc, OSError) else f"importing vLLM took over {timeout_s:.0f} s"
            raise _missing(f"cannot run {python}", f"{why}; {where_looked(opts)}") from None
    if probe.returncode != 0:
        last = (probe.log.strip().splitlines() or ["no output"])[-1]
        raise _missing(f"vLLM does not import in {python}", f"{last[:160]}; {where_looked(opts)}")
    found = re.search(rf"^{VERSION_TAG} (\S+)$", probe.log, re.MULTILINE)
    device = re.search(rf"^{DEVICE_TAG} (\S+)$", probe.log, re.MULTILINE)
    version = found.group(1) if found else ""
    check_speculative_settings(opts.speculative_settings, version or None)
    return EngineProbe(version, device.group(1) if device else None)


def cpu_engine_environment(device_type: str | None, ranks: int) -> dict[str, str]:
    """What eaglekit adds to the environment of a vLLM run of `ranks` local ranks: on vLLM's CPU build, a thread
    binding where vLLM's own cannot bind (eaglekit.engines.vllm.cpu_threads_bind); nothing the user has set."""
    if device_type != "cpu":
        return {}
    cpus = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else list(range(os.cpu_count() or 1))
    bind = cpu_threads_bind(cpus, len(memory_nodes(os.environ)), ranks, os.environ)
    return {} if bind is None else {CPU_THREADS_BIND: bind}


def local_ranks(opts: EngineOptions) -> int:
    """The worker processes vLLM starts on one machine: tensor x pipeline parallel ranks (its local world size)."""
    try:
        stages = max(1, int(opts.engine_args.get("pipeline_parallel_size") or 1))
    except (TypeError, ValueError):
        stages = 1
    return opts.tensor_parallel_size * stages


def memory_nodes(environ: Mapping[str, str]) -> list[int]:
    """The memory nodes this process may allocate on, as vLLM's CPU build counts them: Mems_allowed_list in
    /proc/self/status, narrowed by CPU_VISIBLE_MEMORY_NODES ([0] where the file cannot be read)."""
    allowed = [0]
    try:
        with open("/proc/self/status", encoding="utf-8") as fh:
            line = next((ln for ln in fh if ln.startswith("Mems_allowed_list:")), None)
        if line is not None:
            allowed = id_list(line.split(":", 1)[1])
    except (OSError, ValueError):
        pass
    visible = environ.get(CPU_VISIBLE_MEMORY_NODES, "")
    if visible.strip():
        try:
            return [n for n in id_list(visible) if n in allowed]
        except ValueError:
            return allowed
    return allowed


def id_list(text: str) -> list[int]:
    """Ids written as "0-2,4" (the kernel's and vLLM's list syntax), ascending and distinct."""
    ids: set[int] = set()
    for part in text.strip().split(","):
        if part.strip():
            low, _, high = part.partition("-")
            ids.update(range(int(low), int(high or low) + 1))
    return sorted(ids)


def _missing(what: str, details: str) -> EngineMissing:
    """The install command before the details: a line cut to its length keeps its start."""
    return EngineMissing(f"--engine vllm: {what}; {install_hint()} ({details})", f"{what} ({details})")


TORCHRUN_VARIABLES = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "GROUP_RANK", "GROUP_WORLD_SIZE",
                      "ROLE_RANK", "ROLE_WORLD_SIZE", "ROLE_NAME", "MASTER_ADDR", "MASTER_PORT")


def engine_environment() -> dict[str, str]:
    """The environment an offline vLLM run starts with: ours with its log at INFO (the parent reads the aux layers
    it captures from it), less torchrun's rank variables: launched from a rank of a fine-tune, vLLM would read
    them as its own place in a process group it is not part of."""
    env = {name: value for name, value in os.environ.items()
           if name not in TORCHRUN_VARIABLES and not name.startswith("TORCHELASTIC_")}
    env["VLLM_LOGGING_LEVEL"] = os.environ.get("VLLM_LOGGING_LEVEL", "INFO")
    return env


def _run_worker(opts: EngineOptions, request: dict[str, Any], what: str) -> tuple[dict[str, Any], str]:
    with tempfile.TemporaryDirectory(prefix="eaglekit-vllm-") as work:
        req, res = os.path.join(work, "request.json"), os.path.join(work, "result.json")
        with open(req, "w", encoding="utf-8") as fh:
            json.dump(request, fh)
        env = {**engine_environment(), **opts.environment}
        try:
            proc = processes.run(opts.interpreter, [WORKER, req, res], os.path.join(work, "vllm.log"), env=env,
                                 timeout_s=opts.timeout_s)
        except subprocess.TimeoutExpired:
            raise EngineError(f"vLLM ({what}) did not finish within {opts.timeout_s:.0f} s") from None
        if proc.returncode != 0 or not os.path.isfile(res):
            raise EngineError(f"vLLM ({what}) failed: {root_cause(proc.log)[:300]}")
        with open(res, encoding="utf-8") as fh:
            return json.load(fh), proc.log


def root_cause(log: str) -> str:
    """The line of vLLM's log that says why it failed: the first exception that is not a wrapper of another (for a
    config pydantic rejects, the reason it gives), else the last line that mentions an error, else the last line."""
    lines = [ln.rstrip() for ln in log.splitlines() if ln.strip()]
    for i, line in enumerate(lines):
        found = EXCEPTION_LINE.search(line)
        if found is None or any(w in line for w in WRAPPERS):
            continue
        if found.group(1) == "ValidationError":  # pydantic: the reason is on the indented line below the field name
            details = [PYDANTIC_DETAIL.match(ln) for ln in lines[i + 1:i + 4] if ln.startswith((" ", "\t"))]
            reasons = [d.group(1) for d in details if d is not None and not d.group(1).startswith("For further")]
            if reasons:
                return f"{found.group(2)}: {reasons[-1]}"
        return f"{found.group(1)}: {found.group(2)}"
    errors = [ln for ln in lines if "error" in ln.lower()]
    return (errors or lines or ["no output"])[-1].strip()


def fitted_model_len(longest: int, new_tokens: int, k: int, context: int | None) -> int:
    """The smallest max_model_len (a multiple of MODEL_LEN_STEP) that holds the longest prompt, its new tokens and
    the k drafts of its last round, within the target's context: vLLM's KV cache, and its memory, follow from it."""
    needed = longest + new_tokens + k + MODEL_LEN_SLACK
    rounded = -(-needed // MODEL_LEN_STEP) * MODEL_LEN_STEP
    return min(rounded, context) if context else rounded


def check_model_len(prompts: Sequence[Sequence[int]], max_new_tokens: int, k: int, max_model_len,
                    given: bool = True) -> None:
    """Refuse before vLLM starts (minutes) a prompt it would reject: prompt, new tokens and the k drafts of the
    last round must fit its max_model_len (`given`: the caller's; else fitted, and capped by the target's context).
    The prompt is named when its ids came from `prompts.encode`."""
    if not isinstance(max_model_len, int) or isinstance(max_model_len, bool):
        return
    for ids in prompts:
        if len(ids) + max_new_tokens + k > max_model_len:
            source = getattr(ids, "prompt", None)
            limit = (f"vLLM's max_model_len {max_model_len:,}: raise it with --engine-arg max_model_len=N (up to "
                     "the target's context)" if given else f"the target's {max_model_len:,}-token context "
                     "(max_position_embeddings): shorten the prompt or generate fewer tokens")
            raise UsageError(f"{source.label + ': ' if source else ''}the prompt's {len(ids):,} tokens, "
                             f"{max_new_tokens:,} new ones and {k} drafts exceed {limit}",
                             source.file if source else None)


def answers_with_vllm(target: str, prompts: Sequence[Sequence[int]], *, max_new_tokens: int, dtype: str,
                      opts: EngineOptions, context: int | None = None) -> list[list[int]]:
    """The target's greedy answer to each prompt, decoded by vLLM in batches of up to ANSWER_BATCH, each ending
    at its first end-of-sequence token, where vLLM stops: what --generate appends when the target is served."""
    request = _decode_request(target, prompts, 0, max_new_tokens, dtype, opts, context,
                              batch=min(ANSWER_BATCH, len(prompts)))
    result, _ = _run_worker(opts, request, "the target's answers")
    return [list(tokens) for tokens in result["tokens"]]


def _decode_request(target: str, prompts: Sequence[Sequence[int]], k: int, max_new_tokens: int, dtype: str,
                    opts: EngineOptions, context: int | None, batch: int = 1) -> dict[str, Any]:
    """The offline worker's request for a greedy decode of `prompts` (k drafts a round, `batch` sequences at once),
    refused before vLLM starts where a prompt would not fit its max_model_len. A target folder is passed as an
    absolute path, a Hub id as it is."""
    opts.check()
    fitted = fitted_model_len(max((len(p) for p in prompts), default=0), max_new_tokens, k, context)
    given = opts.llm_args
    engine_args = {**DEFAULT_ENGINE_ARGS, "max_num_seqs": max(1, batch), "max_model_len": fitted, **given}
    check_model_len(prompts, max_new_tokens, k, engine_args.get("max_model_len"), "max_model_len" in given)
    return {"target": os.path.abspath(target) if os.path.isdir(target) else target,
            "prompts": [list(p) for p in prompts], "k": k,
            "max_new_tokens": max_new_tokens, "dtype": dtype, "tensor_parallel_size": opts.tensor_parallel_size,
            "engine_args": engine_args, "speculative": opts.speculative_settings}


def logged_aux_ids(aux_log: str | None) -> tuple[int, ...] | None:
    """The layer ids in vLLM's own line naming the aux layers it captures (None: no such line, or no ids in it)."""
    found = AUX_IDS_IN_LOG.search(aux_log) if aux_log else None
    if found is None:
        return None
    return tuple(sorted(int(v) for v in (found.group(1) or found.group(2)).replace(" ", "").split(",") if v))


def _per_request(result: dict[str, Any]) -> list[AcceptanceCounter] | None:
    histograms = result.get("per_request")
    return ([AcceptanceCounter.from_histogram(h) for h in histograms]
            if histograms and all(h is not None for h in histograms) else None)


@dataclass(frozen=True)
class DraftRun:
    """One draft served by vLLM over a list of prompts: its greedy tokens and its counters, prompt by prompt."""

    version: str
    tokens: list[list[int]]
    per_request: list[AcceptanceCounter]
    aux_ids: tuple[int, ...] | None  # the aux layers vLLM said it captures (None: its log did not say)


def draft_in_vllm(draft: str, target: str, prompts: Sequence[Sequence[int]], *, k: int, max_new_tokens: int,
                  dtype: str, opts: EngineOptions, context: int | None = None) -> DraftRun:
    """Target + draft in vLLM alone (no target-only run): each prompt's tokens and vLLM's own per-request counters,
    what a paired comparison of two drafts over the same prompts needs."""
    request = _decode_request(target, prompts, k, max_new_tokens, dtype, opts, context)
    result, log = _run_worker(opts, {**request, "draft": os.path.abspath(draft)}, "target + draft")
    per_request = _per_request(result)
    if per_request is None:
        raise EngineError(f"vLLM {result['vllm_version']} reports no per-request acceptance counters (vLLM 0.29 and "
                          "later do): a paired comparison needs them")
    found = AUX_LOG.findall(log)
    return DraftRun(result["vllm_version"], [list(t) for t in result["tokens"]], per_request,
                    logged_aux_ids(found[-1] if found else None))


def run_vllm(draft: str, target: str, prompts: Sequence[Sequence[int]], *, k: int, max_new_tokens: int,
             dtype: str, opts: EngineOptions, context: int | None = None) -> EngineRun:
    """Target alone, then target + draft, in vLLM; τ and per-position rates from vLLM's counters. `context`: the
    target's max_position_embeddings, the most max_model_len is fitted to. Callers run check_engine_available
    first, before any work of their own."""
    request = _decode_request(target, prompts, k, max_new_tokens, dtype, opts, context)
    plain, _ = _run_worker(opts, request, "target alone")
    spec, log = _run_worker(opts, {**request, "draft": os.path.abspath(draft)}, "target + draft")
    metrics = spec["metrics"]
    per_position = metrics.get("accepted_per_position") or [0] * k
    counter = AcceptanceCounter(k, drafts=metrics.get("drafts", 0), accepted=metrics.get("accepted", 0),
                                accepted_at=list(per_position[:k]) + [0] * max(0, k - len(per_position)))
    mismatched = [i for i, (a, b) in enumerate(zip(spec["tokens"], plain["tokens"])) if a != b]
    found = AUX_LOG.findall(log)
    def rate(run: dict) -> float:
        return sum(len(t) for t in run["tokens"]) / run["generate_s"] if run["generate_s"] else 0.0

    timings = {"target_init_s": plain["init_s"], "target_generate_s": plain["generate_s"],
               "spec_init_s": spec["init_s"], "spec_generate_s": spec["generate_s"],
               "tokens_per_s_spec": rate(spec), "tokens_per_s_target": rate(plain)}
    return EngineRun("vllm", spec["vllm_version"], counter, not mismatched, mismatched, plain["tokens"],
                     found[-1].strip() if found else None, timings, _per_request(spec), opts.speculative_settings)
