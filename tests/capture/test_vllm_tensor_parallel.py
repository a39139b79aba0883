"""Tensor parallel vLLM runs, decided before vLLM starts: a size that does not divide the target's heads is refused
in one line, and on vLLM's CPU build the OpenMP threads are bound per rank where vLLM's own binding cannot (fewer
memory nodes than ranks), unless the user has chosen. No engine runs here."""

from __future__ import annotations

import os

import pytest

from eaglekit.engines.vllm import CPU_THREADS_BIND, cpu_threads_bind
from eaglekit.runtime import engine as runtime_engine
from eaglekit.runtime.engine import cpu_engine_environment, id_list, memory_nodes
from tests.support.cli import run_cli
from tests.support.factory import edit_config, make_target_config


@pytest.mark.parametrize("cpus, nodes, ranks, environ, bind", [
    ([0, 1], 1, 3, {}, "0|1|0"),  # 3 ranks on 2 cores: vLLM's "auto" asserts one memory node per rank
    ([0, 1], 1, 2, {}, "0|1"),
    ([0, 1, 2, 3, 4, 5, 6, 7], 1, 3, {}, "0-2|3-5|6-7"),
    ([4, 2, 3, 9], 2, 3, {}, "2-3|4|9"),  # ids as the affinity mask gives them, in any order
    ([0, 1], 1, 1, {}, None),  # one rank: "auto" binds it to node 0
    (list(range(16)), 4, 3, {}, None),  # a memory node per rank: vLLM's own binding is kept
    ([0, 1], 1, 3, {CPU_THREADS_BIND: "0-1|0-1|0-1"}, None),  # the user's choice
    ([0, 1], 1, 3, {CPU_THREADS_BIND: "auto"}, None),
    ([0, 1], 1, 3, {"VLLM_CPU_SIM_MULTI_NUMA": "1"}, None),  # vLLM splits the CPUs itself, and asserts "auto"
    ([0, 1], 1, 3, {"VLLM_CPU_SIM_MULTI_NUMA": "0"}, "0|1|0"),
])
def test_the_thread_binding_is_a_function_of_cpus_memory_nodes_ranks_and_the_users_settings(cpus, nodes, ranks,
                                                                                           environ, bind):
    assert cpu_threads_bind(cpus, nodes, ranks, environ) == bind


def test_the_binding_is_set_for_vllms_cpu_build_only(monkeypatch):
    monkeypatch.delenv(CPU_THREADS_BIND, raising=False)
    monkeypatch.delenv("VLLM_CPU_SIM_MULTI_NUMA", raising=False)
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0, 1}, raising=False)
    monkeypatch.setattr(runtime_engine, "memory_nodes", lambda environ: [0])
    assert cpu_engine_environment("cpu", 3) == {CPU_THREADS_BIND: "0|1|0"}
    assert cpu_engine_environment("cuda", 3) == {} and cpu_engine_environment(None, 3) == {}
    monkeypatch.setenv(CPU_THREADS_BIND, "nobind")
    assert cpu_engine_environment("cpu", 3) == {}


def test_memory_nodes_are_counted_as_vllm_counts_them(monkeypatch):
    assert id_list("0-2,4\n") == [0, 1, 2, 4] and id_list("3,1,1") == [1, 3]
    allowed = memory_nodes({})
    assert allowed and memory_nodes({"CPU_VISIBLE_MEMORY_NODES": ",".join(map(str, allowed[:1]))}) == allowed[:1]
    assert memory_nodes({"CPU_VISIBLE_MEMORY_NODES": "4095"}) == ([4095] if 4095 in allowed else [])


def test_a_size_that_does_not_divide_the_heads_is_refused_before_vllm_is_looked_for(tmp_path):
    target = edit_config(make_target_config(str(tmp_path / "target")), lambda c: c.update(num_attention_heads=9))
    store = tmp_path / "store"
    result = run_cli(["capture", target, str(store), "--engine", "vllm", "--tensor-parallel-size", "2",
                      "--engine-python", str(tmp_path / "no-python")])
    assert result.exit_code == 2
    assert result.stderr.strip().splitlines() == [
        f"Error: {target}/config.json: --tensor-parallel-size 2: the target has 9 attention heads, which vLLM "
        "splits evenly over the ranks; sizes that divide them: 1, 3, 9"]
    assert not store.exists()
