"""vLLM runs in a child process: a failure reaches the user as the one line of its log that says why, and the
engine is sized for the job so that it starts beside other processes."""

from __future__ import annotations

import json
import stat

import pytest

from eaglekit.errors import EngineError
from eaglekit.runtime.engine import EngineOptions, root_cause, run_vllm
from eaglekit.runtime.vllm_worker import FALLBACK_KV_CACHE_GIB, cpu_kv_cache_gib

MEMORY = ("ValueError: Available memory on node 0 (6.95/8.84 GiB) on the node is less than desired CPU memory "
          "utilization 0.92")
ENGINE_LOG = f"""INFO 12-02 10:00:00 [core.py:93] Initializing a V1 LLM engine (v0.32.0) with config: model='t'
(EngineCore_DP0 pid=4242) ERROR 12-02 10:00:01 [core.py:708] EngineCore failed to start.
(EngineCore_DP0 pid=4242) ERROR 12-02 10:00:01 [core.py:708] Traceback (most recent call last):
(EngineCore_DP0 pid=4242) ERROR 12-02 10:00:01 [core.py:708]   File "cpu_worker.py", line 80, in init_device
(EngineCore_DP0 pid=4242) ERROR 12-02 10:00:01 [core.py:708] {MEMORY}
Traceback (most recent call last):
  File "vllm_worker.py", line 60, in main
RuntimeError: Engine core initialization failed. See root cause above. Failed core proc(s): {{}}
"""
PYDANTIC_LOG = (
    "Traceback (most recent call last):\n"
    "pydantic_core._pydantic_core.ValidationError: 1 validation error for SpeculativeConfig\n"
    "  Value error, num_speculative_tokens must be positive [type=value_error, input_value=ArgsKwargs((), {}), "
    "input_type=ArgsKwargs]\n"
    "    For further information visit https://errors.pydantic.dev/2.11/v/value_error\n"
)


def _failing_engine(tmp_path, log: str) -> str:
    """An interpreter that prints `log` the way a failing vLLM worker does and exits 1."""
    (tmp_path / "log.txt").write_text(log, encoding="utf-8")
    script = tmp_path / "python"
    script.write_text(f"#!/bin/sh\ncat '{tmp_path / 'log.txt'}' >&2\nexit 1\n", encoding="utf-8")
    script.chmod(script.stat().st_mode | stat.S_IEXEC)
    return str(script)


@pytest.mark.parametrize("log, cause", [
    (ENGINE_LOG, MEMORY),
    (PYDANTIC_LOG, "1 validation error for SpeculativeConfig: num_speculative_tokens must be positive"),
])
def test_a_failing_engine_is_reported_by_its_root_cause(tmp_path, log, cause):
    opts = EngineOptions(python=_failing_engine(tmp_path, log))
    with pytest.raises(EngineError) as failure:
        run_vllm(str(tmp_path / "draft"), str(tmp_path / "target"), [[1, 2, 3]], k=3, max_new_tokens=8,
                 dtype="float32", opts=opts)
    assert str(failure.value) == f"vLLM (target alone) failed: {cause}"
    assert "See root cause above" not in str(failure.value)


def test_without_an_exception_the_last_error_line_or_last_line_is_the_cause():
    assert root_cause("loading\nCUDA error: out of memory\nshutting down\n") == "CUDA error: out of memory"
    assert root_cause("loading\nkilled\n") == "killed"
    assert root_cause("") == "no output"


def _target(folder, **config) -> str:
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps(config), encoding="utf-8")
    return str(folder)


def test_the_cpu_kv_cache_is_sized_from_the_target_and_the_positions(tmp_path):
    # SmolLM2-135M's attention: 30 layers, 3 KV heads of 64; 2048 positions in float32 are 94 MiB, doubled
    small = _target(tmp_path / "small", num_hidden_layers=30, num_attention_heads=9, num_key_value_heads=3,
                    hidden_size=576)
    assert cpu_kv_cache_gib(small, "float32", 2048) == 1
    # an 8B Llama's (32 layers, 8 KV heads of 128) at 32k positions in bfloat16: 4 GiB, doubled to 8
    big = _target(tmp_path / "big", num_hidden_layers=32, num_attention_heads=32, num_key_value_heads=8,
                  head_dim=128, hidden_size=4096)
    assert cpu_kv_cache_gib(big, "bfloat16", 32768) == 8
    assert cpu_kv_cache_gib(big, "float32", 32768) == 16
    assert cpu_kv_cache_gib(str(tmp_path / "nowhere"), "float32", 2048) == FALLBACK_KV_CACHE_GIB


def test_an_engine_started_from_a_torchrun_rank_is_not_told_it_is_one(monkeypatch):
    """vLLM reads LOCAL_RANK and friends as its own place in a process group: launched from a fine-tune's rank for
    the held-out check, its environment carries none of torchrun's variables, and everything else."""
    from eaglekit.runtime.engine import engine_environment

    for name, value in (("RANK", "3"), ("LOCAL_RANK", "3"), ("WORLD_SIZE", "8"), ("MASTER_PORT", "29500"),
                        ("TORCHELASTIC_RUN_ID", "x"), ("HF_HOME", "/models")):
        monkeypatch.setenv(name, value)
    monkeypatch.delenv("VLLM_LOGGING_LEVEL", raising=False)
    env = engine_environment()
    assert not {"RANK", "LOCAL_RANK", "WORLD_SIZE", "MASTER_PORT", "TORCHELASTIC_RUN_ID"} & set(env)
    assert env["HF_HOME"] == "/models" and env["VLLM_LOGGING_LEVEL"] == "INFO"
