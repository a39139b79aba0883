"""capture's vLLM backend: its records against transformers' own hidden states, and its failures.

The engine test needs vLLM in an environment of its own (scripts/vllm-env.sh writes .vllm-env; or set
EAGLEKIT_VLLM_PYTHON): SmolLM2-135M in float32, 16 sequences of 16 to 136 tokens from the bundled calibration
text, the bundled drafter's aux ids plus id L, one engine start (about 1-2 minutes on two cores). vLLM schedules at
most 64 tokens a step, so most sequences are prefilled in chunks over several steps, beside others. The other
tests stand a small script in for vLLM's Python and run in seconds.
"""

from __future__ import annotations

import os
import tempfile

import pytest

torch = pytest.importorskip("torch")

from eaglekit.capture.vllm_engine import capture_with_vllm  # noqa: E402
from eaglekit.errors import EngineError, UsageError  # noqa: E402
from tests.support import REPO  # noqa: E402
from tests.support.engines import VLLM_PYTHON, stand_in_python  # noqa: E402
from tests.support.factory import make_target_config  # noqa: E402
from tests.support.progress import Recorder  # noqa: E402
from tests.support.smollm2 import smollm2_path  # noqa: E402

pytestmark = pytest.mark.engine

DRAFTER = REPO / "examples" / "drafters" / "smollm2-135m-eagle3"
CALIBRATION = REPO / "eaglekit" / "data" / "calibration.txt"
MIN_COSINE = 0.999


def _sequences(count: int) -> list[list[int]]:
    from transformers import AutoTokenizer

    ids = AutoTokenizer.from_pretrained(smollm2_path())(CALIBRATION.read_text(encoding="utf-8"))["input_ids"]
    lengths = [16 + 8 * i for i in range(count)]
    starts = [(97 * i) % (len(ids) - max(lengths)) for i in range(count)]
    return [ids[s:s + n] for s, n in zip(starts, lengths)]


def _reference(sequences: list[list[int]], layer_ids: list[int]) -> list[dict[int, torch.Tensor]]:
    """transformers' hidden_states (index i enters layer i) and, for id L, the final norm's input."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(smollm2_path(), torch_dtype=torch.float32).eval()
    last = model.config.num_hidden_layers
    before_norm: list[torch.Tensor] = []
    model.model.norm.register_forward_pre_hook(lambda _module, args: before_norm.append(args[0][0].clone()))
    out = []
    with torch.no_grad():
        for seq in sequences:
            hidden = model(torch.tensor([seq]), output_hidden_states=True).hidden_states
            out.append({i: before_norm.pop() if i == last else hidden[i][0] for i in layer_ids})
    return out


def test_vllm_states_are_the_targets_residual_stream(monkeypatch):
    python = VLLM_PYTHON
    if python is None:
        pytest.skip("no vLLM environment (scripts/vllm-env.sh)")
    from eaglekit.families import load_draft
    from eaglekit.target import read_target

    info = read_target(smollm2_path())
    aux = load_draft(str(DRAFTER), target=info).aux.ids
    assert aux is not None
    layer_ids = sorted({*aux, info.num_layers})
    sequences = _sequences(16)
    stages = Recorder()
    monkeypatch.delenv("VLLM_CPU_KVCACHE_SPACE", raising=False)  # eaglekit sizes vLLM's KV cache itself
    capture = capture_with_vllm(smollm2_path(), sequences, layer_ids, python=python, dtype="float32",
                                engine_args={"max_num_batched_tokens": 64},
                                progress=stages)
    records = list(capture)
    assert [r.index for r in records] == list(range(len(sequences)))
    assert [list(r.token_ids) for r in records] == sequences
    assert stages.stages == [("checking vLLM: importing it in its Python", None, ""), ("starting vLLM", None, ""),
                             ("capturing target states in vLLM", 16, "sequences")]
    assert stages.advanced == [0, 0, 16]
    reference = _reference(sequences, layer_ids)
    worst = {}
    for record, expected in zip(records, reference):
        assert sorted(record.states) == layer_ids
        for i in layer_ids:
            got = record.states[i]
            assert got.dtype == torch.float32 and got.shape == expected[i].shape
            cosine = torch.nn.functional.cosine_similarity(got, expected[i], dim=-1)
            worst[i] = min(worst.get(i, 1.0), float(cosine.min()))
    print(f"\nmin cosine per layer id: {worst}")
    assert all(c >= MIN_COSINE for c in worst.values()), worst
    # the embeddings are not what any captured id holds: the comparison can tell layers apart
    assert not torch.allclose(records[0].states[layer_ids[0]], records[0].states[layer_ids[1]])


def test_generate_takes_the_targets_answers_from_vllm_and_never_loads_the_target_here(monkeypatch, tmp_path):
    """`capture --engine vllm --generate`: vLLM answers the prompts (one engine run), then captures prompt + answer
    (a second); the answers are the reference target's greedy answers, and eaglekit's process never loads the
    target's decoder."""
    if VLLM_PYTHON is None:
        pytest.skip("no vLLM environment (scripts/vllm-env.sh)")
    import eaglekit.target_model
    from eaglekit.capture import store as st
    from eaglekit.capture.plan import DataOptions, plan_sequences
    from eaglekit.capture.reference import generate_answers
    from eaglekit.capture.run import CaptureOptions, capture_store
    from eaglekit.target import read_target
    from eaglekit.target_model import load_tokenizer
    from tests.support.capture import write_prompts
    from tests.support.smollm2 import smollm2_target

    data = DataOptions(data_file=write_prompts(str(tmp_path / "prompts.jsonl"), count=3), generate=16)
    monkeypatch.delenv("VLLM_CPU_KVCACHE_SPACE", raising=False)  # eaglekit sizes vLLM's KV cache itself
    with monkeypatch.context() as patched:
        patched.setattr(eaglekit.target_model, "load_target", lambda *a, **k: pytest.fail("the target was loaded"))
        report = capture_store(str(tmp_path / "store"), CaptureOptions(
            target=smollm2_path(), data=data, engine="vllm", engine_python=VLLM_PYTHON, dtype="float32",
            aux_ids=(1, 15)))
    assert report.complete and report.records == 3 and "target answers up to 16 tokens" in report.data
    store = str(tmp_path / "store")
    captured = st.read_plan(store, st.read_manifest(store))
    target = smollm2_target()
    plan = plan_sequences(load_tokenizer(smollm2_path(), read_target(smollm2_path())), data)
    answers = generate_answers(target, plan.prompts, 16)
    assert captured == [(p + a)[: plan.limit] for p, a in zip(plan.prompts, answers)]
    assert all(len(c) > len(p) for c, p in zip(captured, plan.prompts))


def _spools() -> set[str]:
    return {n for n in os.listdir(tempfile.gettempdir()) if n.startswith("eaglekit-capture-")}


def test_an_engine_that_dies_is_one_line_naming_its_error(tmp_path):
    target = make_target_config(str(tmp_path / "target"))
    python = stand_in_python(tmp_path, "import sys\nprint('(EngineCore pid=1) ERROR [core.py:1] ValueError: "
                                 "the model does not support aux hidden states', file=sys.stderr)\nsys.exit(1)\n")
    before = _spools()
    capture = capture_with_vllm(target, [[1, 2, 3]], [1, 12], python=python)
    with pytest.raises(EngineError, match="before sequence 0: ValueError: the model does not support aux"):
        next(capture)
    assert _spools() == before


WRONG_STATES = """
import json, sys
import torch
from safetensors.torch import save_file
request = json.load(open(sys.argv[-1]))
seqs = [json.loads(line) for line in open(request["sequences"])]
for i, seq in enumerate(seqs):
    save_file({"hidden_states": torch.zeros(len(seq), len(request["layer_ids"]) + 1, 64),
               "token_ids": torch.tensor(seq)}, f"{request['spool']}/{i}.safetensors")
"""


def test_states_of_another_shape_are_refused_and_the_spool_removed(tmp_path):
    target = make_target_config(str(tmp_path / "target"))
    python = stand_in_python(tmp_path, WRONG_STATES)
    before = _spools()
    capture = capture_with_vllm(target, [[5, 6, 7, 8]], [2, 12], python=python)
    with pytest.raises(EngineError, match=r"shape \(4, 3, 64\), expected \(4, 2, 64\)"):
        list(capture)
    assert _spools() == before


OUT_OF_ORDER = """
import json, os, sys, time
import torch
from safetensors.torch import save_file
request = json.load(open(sys.argv[-1]))
spool, ids = request["spool"], request["layer_ids"]
seqs = [json.loads(line) for line in open(request["sequences"])]
for i in reversed(range(len(seqs))):  # vLLM finishes requests in any order
    states = torch.stack([torch.full((len(seqs[i]), 64), 100.0 * i + k) for k in ids], dim=1)
    save_file({"hidden_states": states, "token_ids": torch.tensor(seqs[i])}, f"{spool}/{i}.safetensors.partial")
    os.replace(f"{spool}/{i}.safetensors.partial", f"{spool}/{i}.safetensors")
json.dump({"init_s": 1.0, "generate_s": 2.0, "sequences": len(seqs)}, open(f"{spool}/generated.json", "w"))
while not os.path.exists(f"{spool}/close"):
    time.sleep(0.01)
"""


def test_records_come_in_input_order_with_each_layers_states(tmp_path):
    target = make_target_config(str(tmp_path / "target"))
    sequences = [[3, 1, 4], [1, 5], [9, 2, 6, 5]]
    capture = capture_with_vllm(target, sequences, [12, 0, 7, 7], python=stand_in_python(tmp_path, OUT_OF_ORDER))
    records = list(capture)
    assert [(r.index, list(r.token_ids)) for r in records] == list(enumerate(sequences))
    for r in records:
        assert sorted(r.states) == [0, 7, 12]
        assert all(r.states[k].shape == (len(r.token_ids), 64) and bool((r.states[k] == 100.0 * r.index + k).all())
                   for k in r.states)
    assert capture.timings["generate_s"] == 2.0


@pytest.mark.parametrize("args, layer_ids, sequences, message", [
    ({"kv_transfer_config": {}}, [1], [[1]], "capture sets it itself"),
    ({"enable_prefix_caching": True}, [1], [[1]], "needs it off"),
    ({}, [13], [[1]], r"lie in \[0, 12\]"),
    ({}, [1], [[1], []], "sequence 1 is empty"),
    ({"max_model_len": 4}, [1], [[1, 2, 3, 4]], "exceeds vLLM's max_model_len 4"),
])
def test_arguments_vllm_would_take_wrongly_are_refused_before_it_starts(tmp_path, args, layer_ids, sequences,
                                                                         message):
    with pytest.raises(UsageError, match=message):
        capture_with_vllm(make_target_config(str(tmp_path / "target")), sequences, layer_ids,
                          python=str(tmp_path / "no-python"),
                          engine_args=args)


TP_MIN_COSINE = 0.9999  # float32 on both sides: only the order of the ranks' all-reduce sums differs


def _store_states(store: str) -> tuple[list[int], dict[int, torch.Tensor]]:
    """A store's token ids and its states by layer id, every record in order."""
    from eaglekit.capture import store as st

    manifest = st.read_manifest(store)
    shards = [st.read_shard(store, manifest, shard) for shard in manifest.shards]
    aux = torch.cat([s["aux"] for s in shards])
    states = {i: aux[:, j] for j, i in enumerate(manifest.layer_ids.aux)}
    states[manifest.layer_ids.last] = torch.cat([s["last"] for s in shards])
    return torch.cat([s["token_ids"] for s in shards]).tolist(), states


def test_tensor_parallel_capture_equals_the_reference_hooks(monkeypatch, tmp_path):
    """`capture --engine vllm --tensor-parallel-size 3` (SmolLM2's 9 heads: 3 is the smallest size vLLM splits them
    over) stores one full-width copy of the states, equal to the reference hooks' store of the same data. No
    variable is set here: eaglekit binds the CPU build's threads itself where the machine has fewer memory nodes
    than ranks, sizes its KV cache, and records the binding in the manifest."""
    if VLLM_PYTHON is None:
        pytest.skip("no vLLM environment (scripts/vllm-env.sh)")
    from eaglekit.capture import store as st
    from eaglekit.engines.vllm import CPU_THREADS_BIND, cpu_threads_bind
    from eaglekit.runtime.engine import memory_nodes
    from tests.support.capture import write_prompts
    from tests.support.cli import run_cli

    for name in (CPU_THREADS_BIND, "VLLM_CPU_KVCACHE_SPACE"):
        monkeypatch.delenv(name, raising=False)  # the user's choices, when made, are left alone: here none is
    data = write_prompts(str(tmp_path / "prompts.jsonl"), count=2)
    common = ["--data", data, "--max-length", "40", "--aux-layer-ids", "2,15,27", "--store-dtype", "float32",
              "--dtype", "float32", "--no-progress"]
    served, reference = str(tmp_path / "served"), str(tmp_path / "reference")
    result = run_cli(["capture", smollm2_path(), served, *common, "--engine", "vllm", "--tensor-parallel-size", "3",
                      "--engine-python", VLLM_PYTHON])
    assert result.exit_code == 0, result.output
    assert run_cli(["capture", smollm2_path(), reference, *common]).exit_code == 0
    engine = st.read_manifest(served).engine
    assert engine.tensor_parallel_size == 3
    bind = cpu_threads_bind(sorted(os.sched_getaffinity(0)), len(memory_nodes(os.environ)), 3, os.environ)
    assert engine.extra.get("environment") == ({CPU_THREADS_BIND: bind} if bind else None)
    served_ids, got = _store_states(served)
    reference_ids, expected = _store_states(reference)
    assert served_ids == reference_ids and sorted(got) == sorted(expected) == [2, 15, 27, 30]
    worst = {i: float(torch.nn.functional.cosine_similarity(got[i], expected[i], dim=-1).min()) for i in got}
    print(f"\nTP=3 min cosine per layer id: {worst}; threads bound {bind}")
    assert all(c >= TP_MIN_COSINE for c in worst.values()), worst
    assert all(got[i].shape == expected[i].shape for i in got)
    assert not torch.allclose(got[2], got[15])  # the comparison can tell layers apart


STATES_AND_BINDING = """
import json, os, sys, time
import torch
from safetensors.torch import save_file
request = json.load(open(sys.argv[-1]))
spool, ids = request["spool"], request["layer_ids"]
with open(os.path.join(os.path.dirname(os.path.abspath(__file__)), "bind.txt"), "w") as fh:
    fh.write(os.environ.get("VLLM_CPU_OMP_THREADS_BIND", "unset"))
seqs = [json.loads(line) for line in open(request["sequences"])]
for i, seq in enumerate(seqs):
    states = torch.stack([torch.full((len(seq), 64), 1.0 + k) for k in ids], dim=1)
    save_file({"hidden_states": states, "token_ids": torch.tensor(seq)}, f"{spool}/{i}.safetensors.partial")
    os.replace(f"{spool}/{i}.safetensors.partial", f"{spool}/{i}.safetensors")
json.dump({"init_s": 1.0, "generate_s": 1.0, "sequences": len(seqs)}, open(f"{spool}/generated.json", "w"))
while not os.path.exists(f"{spool}/close"):
    time.sleep(0.01)
"""


def test_the_cpu_thread_binding_reaches_vllm_and_the_manifest_and_the_users_own_is_kept(monkeypatch, tmp_path):
    """vLLM's CPU build (as its probe says) at 2 ranks on 2 CPUs of one memory node: eaglekit binds a CPU per rank,
    passes the binding to vLLM's environment and records it in the manifest; a user's own binding reaches vLLM
    untouched, is not recorded as eaglekit's, and does not make a finished store another capture."""
    from eaglekit.capture import store as st
    from eaglekit.capture.plan import DataOptions
    from eaglekit.capture.run import CaptureOptions, capture_store
    from eaglekit.engines.vllm import CPU_THREADS_BIND
    from eaglekit.runtime import engine as runtime_engine
    from tests.support.capture import write_prompts
    from tests.support.targets import make_target_with_tokenizer

    target = make_target_with_tokenizer(str(tmp_path / "target"))  # 4 attention heads
    monkeypatch.delenv(CPU_THREADS_BIND, raising=False)
    monkeypatch.delenv("VLLM_CPU_SIM_MULTI_NUMA", raising=False)
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0, 1}, raising=False)
    monkeypatch.setattr(runtime_engine, "memory_nodes", lambda environ: [0])
    opts = CaptureOptions(target=target, data=DataOptions(data_file=write_prompts(str(tmp_path / "p.jsonl"), 2)),
                          engine="vllm", engine_python=stand_in_python(tmp_path, STATES_AND_BINDING, device="cpu"),
                          tensor_parallel_size=2, aux_ids=(1, 2), store_dtype="float32", dtype="float32")
    bound = tmp_path / "bind.txt"
    assert capture_store(str(tmp_path / "ours"), opts).complete
    assert bound.read_text() == "0|1"
    assert st.read_manifest(str(tmp_path / "ours")).engine.extra == {"environment": {CPU_THREADS_BIND: "0|1"}}
    monkeypatch.setenv(CPU_THREADS_BIND, "0-1|0-1")
    assert capture_store(str(tmp_path / "theirs"), opts).complete
    assert bound.read_text() == "0-1|0-1"
    assert st.read_manifest(str(tmp_path / "theirs")).engine.extra == {}
    rerun = capture_store(str(tmp_path / "ours"), opts)  # the binding describes the run; it does not decide a resume
    assert rerun.complete and rerun.captured_records == 0
