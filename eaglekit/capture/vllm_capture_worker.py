"""What `capture --engine vllm` runs inside the Python that has vLLM: the target's states at chosen layer ids, one
safetensors file per sequence, written by vLLM's own `extract_hidden_states` method.

    python eaglekit_capture_worker.py REQUEST.json

The parent copies this file into a work folder of its own under the name the request gives, runs it from there
and names it as vLLM's KV connector module (`kv_connector_module_path`), so vLLM's engine and worker processes
import the connector below by that name and nothing else from eaglekit. It imports only vLLM, its torch and
safetensors, and the standard library.

Why a connector of its own: vLLM's ExampleHiddenStatesConnector (0.32) copies each finished request's states out of
its cache through a CUDA copy stream into pinned memory (`_submit_async_write`) and reports them sent once a CUDA
event says so (`get_finished`). vLLM's CPU worker (vllm/v1/worker/cpu/shm.py) swaps torch.cuda.Stream and Event for
placeholders and makes Tensor.pin_memory() a no-op, but `torch.empty_like(..., pin_memory=True)` still asks for a
pinned allocator and raises; had it not, the placeholder event has no `query()`. The failure is out of the
caller's sight: the request is returned, with its file's path, the moment it finishes, while the copy runs in the
engine's next step, so an offline run has often returned (exit status 0, only the `.lock` file written) when that
step kills the engine. This connector copies synchronously (the states leave the cache before its blocks are
freed, on any device), writes each file from a thread under a temporary name and renames it into place, so a file
that exists is whole; a failed write stops the engine at its next step.

The request names the target, dtype, tensor parallel size, LLM(...) arguments, the layer ids (ascending, distinct),
the sequences file (one JSON list of token ids a line), the spool folder, the batch size, this module's name and
the path of eaglekit's vllm_worker.py (it sizes vLLM's memory for the job). Sequence i's file is `SPOOL/i.safetensors`:
`hidden_states` [T, K, H] in the engine's dtype, slot j the j-th layer id, and `token_ids` [T]. At most about two
batches of unread files wait in the spool: the parent reads and deletes them in order. `SPOOL/generated.json`
(vLLM's version and timings) follows the last generate call; the engine then runs until the parent writes
`SPOOL/close`, since it writes the last files after that call has returned.
"""

from __future__ import annotations

import importlib.util
import json
import os
import sys
import threading
import time

CONNECTOR = "EaglekitHiddenStatesConnector"
SUFFIX = ".safetensors"
PARTIAL = ".partial"
CLOSE = "close"  # the parent's word that it has read every file: the engine may stop
POLL_S = 0.05
LIVENESS_S = 1.0  # how often a wait asks the engine whether it is still alive
CPU_CONCURRENCY = 16  # sequences whose KV cache a CPU run reserves room for, unless the caller sizes it


def _connector_class():
    """The connector, defined only where vLLM imports (the engine's processes import this module by name)."""
    import torch
    from safetensors.torch import save_file
    from vllm.distributed.kv_transfer.kv_connector.v1.example_hidden_states_connector import (
        ExampleHiddenStatesConnector,
        ExampleHiddenStatesConnectorMetadata,
        PendingSave,
        extract_from_kv_cache,
    )

    def write(tensors: dict, filename: str) -> None:
        partial = filename + PARTIAL
        save_file(tensors, partial)
        os.replace(partial, filename)

    class EaglekitHiddenStatesConnector(ExampleHiddenStatesConnector):
        """vLLM's hidden-states connector with a synchronous copy out of the cache, on a CPU as on a GPU."""

        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            self._copied: set[str] = set()
            self._failure: BaseException | None = None
            self._failure_lock = threading.Lock()

        def _save(self, pending: PendingSave) -> None:
            assert self._kv_cache is not None
            blocks = torch.tensor(pending.block_ids, dtype=torch.long)
            slots = (blocks.reshape(-1, 1) * self._block_size + torch.arange(self._block_size)).flatten()
            states = extract_from_kv_cache(self._kv_cache, slots.to(self._kv_cache.device),
                                           int(pending.token_ids.shape[0])).to("cpu").contiguous()
            tensors = {"hidden_states": states, "token_ids": pending.token_ids.clone()}
            os.makedirs(os.path.dirname(pending.filename) or ".", exist_ok=True)
            future = self._executor.submit(write, tensors, pending.filename)
            future.add_done_callback(self._note_failure)
            self._copied.add(pending.req_id)

        def _note_failure(self, future) -> None:
            if future.exception() is not None:
                with self._failure_lock:
                    self._failure = self._failure or future.exception()

        def get_finished(self, finished_req_ids: set[str]) -> tuple[set[str] | None, set[str] | None]:
            if self._failure is not None:
                raise RuntimeError(f"writing captured hidden states failed: {self._failure!r}")
            if not self._is_tp_rank_zero:  # rank 0 alone writes; the scheduler waits for one notification
                return None, None
            meta = self._get_connector_metadata() if self.has_connector_metadata() else None
            if isinstance(meta, ExampleHiddenStatesConnectorMetadata):
                for pending in meta.pending_saves:
                    self._save(pending)
            self._accumulated_finished_req_ids.update(finished_req_ids)
            done = self._accumulated_finished_req_ids & self._copied
            self._accumulated_finished_req_ids -= done
            self._copied -= done
            return done or None, None

    return EaglekitHiddenStatesConnector


if __name__ != "__main__" and __name__ != "__mp_main__":
    globals()[CONNECTOR] = _connector_class()


def _load_sizer(path: str):
    spec = importlib.util.spec_from_file_location("eaglekit_vllm_worker", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _batches(path: str, size: int):
    batch: list[list[int]] = []
    with open(path, encoding="utf-8") as fh:
        for line in fh:
            batch.append(json.loads(line))
            if len(batch) == size:
                yield batch
                batch = []
    if batch:
        yield batch


def _unread(spool: str) -> int:
    return sum(1 for name in os.listdir(spool) if name.endswith(SUFFIX))


def _wait(llm, ready) -> None:
    """Until `ready()`. vLLM writes a request's file in a step after it has returned the request, so while waiting
    the engine is asked whether it is alive (it raises once it has died), and a parent that has gone ends the wait."""
    parent, checked = os.getppid(), time.monotonic()
    while not ready():
        if time.monotonic() - checked >= LIVENESS_S:
            llm.llm_engine.is_sleeping()
            if os.getppid() != parent:
                raise SystemExit("the capture's parent process has gone")
            checked = time.monotonic()
        time.sleep(POLL_S)


def main(request_path: str) -> None:
    with open(request_path, encoding="utf-8") as fh:
        request = json.load(fh)
    import vllm
    from vllm import LLM, SamplingParams
    from vllm.inputs import TokensPrompt
    from vllm.platforms import current_platform

    spool, layer_ids, batch_size = request["spool"], request["layer_ids"], int(request["batch_size"])
    given = set(request["engine_args"])
    kwargs = dict(model=request["target"], tokenizer=request["target"], dtype=request["dtype"], seed=0,
                  tensor_parallel_size=request["tensor_parallel_size"], enable_prefix_caching=False)
    if current_platform.is_cpu():
        kwargs["enforce_eager"] = True  # graph capture and compilation cost minutes on a CPU and capture no faster
    kwargs.update(request["engine_args"])
    kwargs["speculative_config"] = {"method": "extract_hidden_states", "num_speculative_tokens": 1,
                                    "draft_model_config": {"hf_config": {
                                        "eagle_aux_hidden_state_layer_ids": layer_ids}}}
    kwargs["kv_transfer_config"] = {"kv_connector": CONNECTOR, "kv_connector_module_path": request["module"],
                                    "kv_role": "kv_producer",
                                    "kv_connector_extra_config": {"shared_storage_path": spool,
                                                                  "allow_custom_save_path": True,
                                                                  "use_synchronization_lock": False}}
    concurrency = int(kwargs.get("max_num_seqs") or CPU_CONCURRENCY)
    # on a GPU vLLM keeps its own KV cache (all that is free): capture batches as many sequences as fit
    kwargs.update(_load_sizer(request["vllm_worker"]).size_for_job(
        request["target"], request["dtype"], int(kwargs["max_model_len"]) * concurrency,
        given | {"kv_cache_memory_bytes"}))
    started = time.perf_counter()
    llm = LLM(**kwargs)
    ready = time.perf_counter()
    with open(os.path.join(spool, "ready.json"), "w", encoding="utf-8") as fh:
        json.dump({"vllm_version": vllm.__version__, "init_s": ready - started}, fh)
    index = tokens = 0
    for batch in _batches(request["sequences"], batch_size):
        _wait(llm, lambda: _unread(spool) < batch_size)
        params = [SamplingParams(max_tokens=1, temperature=0.0, extra_args={"kv_transfer_params": {
            "hidden_states_path": os.path.join(spool, f"{index + i}{SUFFIX}")}}) for i in range(len(batch))]
        llm.generate([TokensPrompt(prompt_token_ids=ids) for ids in batch], params, use_tqdm=False)
        index += len(batch)
        tokens += sum(map(len, batch))
    with open(os.path.join(spool, "generated.json"), "w", encoding="utf-8") as fh:
        json.dump({"vllm_version": vllm.__version__, "init_s": ready - started,
                   "generate_s": time.perf_counter() - ready, "sequences": index, "tokens": tokens}, fh)
    _wait(llm, lambda: os.path.exists(os.path.join(spool, CLOSE)))


if __name__ == "__main__":
    main(sys.argv[1])
