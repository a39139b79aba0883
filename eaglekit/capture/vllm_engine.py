"""`capture --engine vllm`: the target's hidden states through the serving engine, for targets of any size vLLM serves.

vLLM runs in a child process of the Python that has it (`python`, else EAGLEKIT_VLLM_PYTHON, else this one), as
`verify --engine vllm` runs it, and captures with its own `extract_hidden_states` method through a KV connector of
eaglekit's (eaglekit/capture/vllm_capture_worker.py says why vLLM's example connector cannot be used as is). Each
sequence is one prompt of one token; its states, all of them from the prefill, come back as one safetensors file
in a spool folder that this side reads and deletes in order, so neither side holds more than about two batches.
Prefix caching is off (a cached prefix would be a prefix without states); chunked prefill changes nothing (the
states accumulate in vLLM's cache until the request is done). Under tensor parallelism the states are the
residual stream after the all-reduce, the same on every rank (vLLM's cache layer for them holds K x hidden per token
on each rank, vllm/model_executor/models/extract_hidden_states.py, 0.32.0), and rank 0 alone writes them. A size
that does not divide the target's heads is refused before vLLM starts; on vLLM's CPU build the ranks' threads are
bound by eaglekit where vLLM's own binding cannot (eaglekit.engines.vllm.cpu_threads_bind).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import tempfile
import time
from collections.abc import Generator, Iterator, Mapping, Sequence
from typing import Any

from eaglekit.capture.sequence import CapturedSequence
from eaglekit.engines.vllm import tensor_parallel_refusal
from eaglekit.errors import EngineError, UsageError
from eaglekit.progress import Progress, quiet
from eaglekit.runtime import processes
from eaglekit.runtime.engine import (
    EngineOptions,
    cpu_engine_environment,
    fitted_model_len,
    local_ranks,
    probe_engine,
    root_cause,
)

WORKER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "vllm_capture_worker.py")
SIZER = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "runtime", "vllm_worker.py")
MODULE = "eaglekit_capture_worker"
"""The name vLLM's processes import the worker by: the only module in its work folder, unlike any of vLLM's."""
BATCH = 32  # sequences per vLLM generate call; the spool holds about two batches of unread files
OWN_SETTINGS = ("speculative_config", "kv_transfer_config")
POLL_S = 0.02
STALL_S = 3600.0  # no record for this long (the engine start included): vLLM is taken to hang
STOP_S = 120.0  # for vLLM to shut down once every file is read


class VllmCapture(Iterator[CapturedSequence]):
    """The records of a vLLM capture, in input order, one at a time. `version` is vLLM's; `timings` (engine start
    and generate seconds, sequences, tokens) are filled once the last record has been read."""

    def __init__(self, version: str, python: str, request: dict[str, Any], sequences: Sequence[Sequence[int]],
                 ids: list[int], hidden: int, progress: Progress | None):
        self.version = version
        self.timings: dict[str, Any] = {}
        self._records = _records(python, request, sequences, ids, hidden, progress, self)

    def __next__(self) -> CapturedSequence:
        return next(self._records)

    def close(self) -> None:
        """Stop vLLM and remove the spool; what was not read is lost."""
        self._records.close()


def capture_with_vllm(target: str, sequences: Sequence[Sequence[int]], layer_ids: Sequence[int], *,
                      python: str | None = None, tensor_parallel_size: int = 1,
                      engine_args: Mapping[str, Any] | None = None, dtype: str = "float32",
                      progress: Progress | None = None, version: str | None = None,
                      environment: Mapping[str, str] | None = None) -> VllmCapture:
    """Sequence i's token ids through vLLM, record i its states at `layer_ids` (vLLM's convention: id i enters
    decoder layer i, 0 the embeddings, L the last layer's output before the final norm), [T, H] on the CPU in the
    engine's dtype. Arguments are checked and vLLM's presence probed before this returns; vLLM starts at the
    first record. `engine_args` are LLM(...) keyword arguments; `progress` hears of the engine start and of each
    record; `version`: vLLM's, when the caller has probed it already; `environment`: variables added to vLLM's
    (without it, those runtime.engine.cpu_engine_environment chooses)."""
    from eaglekit.target import read_target

    opts = EngineOptions(python=python, tensor_parallel_size=tensor_parallel_size, engine_args=dict(engine_args or {}))
    opts.check()
    info = read_target(target)
    ids = sorted({int(i) for i in layer_ids})
    if not ids or not all(0 <= i <= info.num_layers for i in ids):
        raise UsageError(f"layer ids {list(layer_ids)} must be given and lie in [0, {info.num_layers}] for this "
                         f"target (L={info.num_layers})", info.path)
    taken = [name for name in OWN_SETTINGS if name in opts.engine_args]
    if taken:
        raise UsageError(f"--engine-arg {taken[0]}: capture sets it itself (extract_hidden_states)")
    if opts.engine_args.get("enable_prefix_caching"):
        raise UsageError("--engine-arg enable_prefix_caching: capture needs it off (a cached prefix has no states)")
    longest = max((len(s) for s in sequences), default=0)
    if any(len(s) == 0 for s in sequences):
        raise UsageError(f"sequence {next(i for i, s in enumerate(sequences) if not s)} is empty")
    model_len = opts.engine_args.get("max_model_len") or fitted_model_len(longest, 1, 0, info.max_position_embeddings)
    if longest + 1 > int(model_len):
        raise UsageError(f"a sequence of {longest:,} tokens exceeds vLLM's max_model_len {int(model_len):,} "
                         "(the target's context, or --engine-arg max_model_len)", info.path)
    refusal = tensor_parallel_refusal(info, tensor_parallel_size)
    if refusal:
        raise UsageError(refusal, info.path)
    if version is None or environment is None:
        probe = probe_engine(opts, progress=progress)
        version = version or probe.version
        if environment is None:
            environment = cpu_engine_environment(probe.device_type, local_ranks(opts))
    request = {"target": os.path.abspath(target), "dtype": dtype, "tensor_parallel_size": tensor_parallel_size,
               "engine_args": {**opts.engine_args, "max_model_len": int(model_len)}, "layer_ids": ids,
               "batch_size": BATCH, "module": MODULE, "vllm_worker": SIZER, "environment": dict(environment)}
    return VllmCapture(version, opts.interpreter, request, sequences, ids, info.hidden_size, progress)


def _records(python: str, request: dict[str, Any], sequences: Sequence[Sequence[int]], ids: list[int], hidden: int,
             progress: Progress | None, capture: VllmCapture) -> Generator[CapturedSequence, None, None]:
    work = tempfile.mkdtemp(prefix="eaglekit-capture-")
    try:
        spool = os.path.join(work, "spool")
        os.mkdir(spool)
        script = os.path.join(work, MODULE + ".py")
        shutil.copyfile(WORKER, script)
        with open(os.path.join(work, "sequences.jsonl"), "w", encoding="utf-8") as fh:
            for seq in sequences:
                fh.write(json.dumps([int(t) for t in seq]) + "\n")
        request_path = os.path.join(work, "request.json")
        with open(request_path, "w", encoding="utf-8") as fh:
            json.dump({**request, "spool": spool, "sequences": os.path.join(work, "sequences.jsonl")}, fh)
        log_path = os.path.join(work, "vllm.log")
        env = dict(os.environ, VLLM_LOGGING_LEVEL=os.environ.get("VLLM_LOGGING_LEVEL", "INFO"),
                   PYTHONPATH=os.pathsep.join(p for p in (work, os.environ.get("PYTHONPATH")) if p),
                   **request["environment"])
        progress = quiet(progress)
        progress.stage("starting vLLM")
        with open(log_path, "wb") as log:
            proc = processes.start(python, [script, request_path], stdout=log, env=env, cwd=work)
        try:
            for index, seq in enumerate(sequences):
                path = os.path.join(spool, f"{index}.safetensors")
                _await(path, proc, log_path, index)
                record = _read(path, index, seq, ids, hidden)
                os.remove(path)
                if index == 0:
                    progress.stage("capturing target states in vLLM", len(sequences), "sequences")
                progress.advance()
                yield record
            _await(os.path.join(spool, "generated.json"), proc, log_path, len(sequences))
            with open(os.path.join(spool, "generated.json"), encoding="utf-8") as fh:
                capture.timings = json.load(fh)
            open(os.path.join(spool, "close"), "w").close()
            try:
                code = proc.wait(timeout=STOP_S)
            except subprocess.TimeoutExpired:
                code = 0  # every record is read; an engine slow to shut down is stopped below
            if code != 0:
                raise EngineError(f"vLLM failed after the last record: {_cause(log_path)}")
        finally:
            processes.stop(proc)
    finally:
        shutil.rmtree(work, ignore_errors=True)


def _await(path: str, proc: subprocess.Popen, log_path: str, index: int) -> None:
    started = time.monotonic()
    while not os.path.exists(path):
        if proc.poll() is not None and not os.path.exists(path):
            raise EngineError(f"vLLM stopped before sequence {index}: {_cause(log_path)}")
        if time.monotonic() - started > STALL_S:
            raise EngineError(f"vLLM returned no states for sequence {index} within {STALL_S:.0f} s")
        time.sleep(POLL_S)


def _read(path: str, index: int, seq: Sequence[int], ids: list[int], hidden: int) -> CapturedSequence:
    from safetensors.torch import load_file

    data = load_file(path)
    states, tokens = data.get("hidden_states"), data.get("token_ids")
    shape = (len(seq), len(ids), hidden)
    if states is None or tokens is None or tuple(states.shape) != shape or tokens.tolist() != [int(t) for t in seq]:
        got = None if states is None else tuple(states.shape)
        raise EngineError(f"vLLM's states for sequence {index} are not those asked for: shape {got}, expected "
                          f"{shape}{'' if tokens is not None and tokens.tolist() == list(seq) else ', other tokens'}")
    return CapturedSequence(index=index, token_ids=tuple(int(t) for t in seq),
                            states={i: states[:, j].clone() for j, i in enumerate(ids)})


def _cause(log_path: str) -> str:
    try:
        with open(log_path, encoding="utf-8", errors="replace") as fh:
            return root_cause(fh.read())[:300]
    except OSError:
        return "no log"
