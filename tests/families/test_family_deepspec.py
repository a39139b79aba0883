"""DeepSpec Eagle3 drafters: read as written (target_layer_ids, output-of-layer, K = 5), reported as vLLM would
treat them, and upgraded into files vLLM's own eagle3 class loads completely.

The checkpoints follow what deepseek-ai/DeepSpec writes (tests/support/factory.py `_deepspec_files`, from
afdfa7c9382a3341a3e6f17756dd816da79f132c `deepspec/modeling/eagle3/qwen3/{config,modeling}.py`,
`deepspec/modeling/eagle3/common.py` and `deepspec/trainer/ckpt_manager.py`).
"""

from __future__ import annotations

import json
import os
import socket
import subprocess

import jsonschema
import numpy as np
import pytest

from eaglekit.engines import vllm_view
from eaglekit.engines.base import parse_version
from eaglekit.errors import NotEagle3DraftError
from eaglekit.families import load_draft
from eaglekit.io.checkpoint import read_checkpoint
from tests.support.cli import run_cli
from tests.support.engines import REPO, VLLM_PYTHON
from tests.support.factory import DEEPSPEC, edit_config, make_draft, make_target_config

WRITTEN = [1, 3, 5, 7, 9]  # target_layer_ids as DeepSpec writes them: hidden_states[id + 1]
VLLM_IDS = [2, 4, 6, 8, 10]
KEEP = ["--no-fc-norm", "--no-norm-output"]


def _deepspec(path, **overrides) -> str:
    return make_draft(str(path), "deepspec", **{**DEEPSPEC, **overrides})


def _qwen3_target(path) -> str:
    target = make_target_config(str(path), layers=12)
    return edit_config(target, lambda c: c.update(architectures=["Qwen3ForCausalLM"], model_type="qwen3",
                                                  head_dim=16))


def _json(args: list[str], exit_code: int = 0) -> dict:
    result = run_cli([*args, "--format", "json"])
    assert result.exit_code == exit_code, result.stderr
    return json.loads(result.stdout)


def _config(path) -> dict:
    with open(os.path.join(path, "config.json")) as fh:
        return json.load(fh)


def _findings(doc: dict, code: str) -> list[dict]:
    return [f for f in doc["findings"] if f["code"] == code]


def test_inspect_reads_what_deepspec_wrote(tmp_path):
    src = _deepspec(tmp_path / "src")
    assert _config(src)["target_layer_ids"] == WRITTEN and "eagle_aux_hidden_state_layer_ids" not in _config(src)
    doc = _json(["inspect", src])
    schema = json.loads((REPO / "eaglekit" / "schemas" / "inspect-report.schema.json").read_text())
    jsonschema.validate(doc, schema)
    assert (doc["family"], doc["producer"], doc["attention"]) == ("deepspec", "DeepSpec", "qwen3")
    assert doc["architectures"] == ["Qwen3Eagle3Model"] and doc["num_aux_hidden_states"] == 5
    assert doc["aux_layer_ids_as_written"] == WRITTEN and doc["aux_layer_ids"] == VLLM_IDS
    assert doc["aux_layer_id_convention"] == "output" and doc["aux_layer_id_convention_known"]
    assert "target_layer_ids" in doc["aux_layer_ids_source"]
    assert (doc["vocab_size"], doc["draft_vocab_size"], doc["has_d2t"], doc["has_t2d"]) == (256, 256, False, False)
    assert doc["has_embed_tokens"] and doc["has_lm_head"] and doc["target_hidden_size"] == doc["hidden_size"]
    vllm = next(s for s in doc["serving"] if s["engine"] == "vllm")
    assert vllm["verdict"] != "as is" and "EK301" in json.dumps(vllm)


def test_deepspec_is_recognised_by_its_keys_and_before_angelslim(tmp_path):
    renamed = _deepspec(tmp_path / "renamed", config_patch={"architectures": ["Qwen3ForCausalLM"]})
    assert load_draft(renamed).family == "deepspec"  # target_layer_ids + ttt_length + step_loss_decay
    gemma = _deepspec(tmp_path / "gemma", config_patch={"architectures": ["Gemma4Eagle3Model"],
                                                         "model_type": "gemma4_text", "target_model_type": "gemma4"})
    assert load_draft(gemma).family == "deepspec"  # target_model_type alone would make it AngelSlim's
    dspark = _deepspec(tmp_path / "dspark", config_patch={"architectures": ["Qwen3DSparkModel"], "ttt_length": None})
    with pytest.raises(NotEagle3DraftError, match="a DSpark block drafter"):  # DeepSpec's DSpark drafter
        load_draft(dspark)


def test_validate_says_why_vllm_cannot_serve_it_and_names_the_upgrade(tmp_path):
    src = _deepspec(tmp_path / "src")
    target = _qwen3_target(tmp_path / "target")
    doc = _json(["validate", src, "--target", target], exit_code=1)
    assert _findings(doc, "EK301")[0]["severity"] == "error"
    (found,) = _findings(doc, "EK329")
    assert found["severity"] == "error" and found["pitfall"] == "P51" and found["key"] == "target_layer_ids"
    message = found["message"]
    assert "V2 runner reads target_layer_ids plus 1 and captures [2, 4, 6, 8, 10]" in message
    assert "V1 runner ignores it and captures [2, 6, 9] for L=12" in message  # vLLM's default, not the trained ids
    assert "K=3 from default 3" in message and "fc.weight holds K=5" in message
    assert "'Eagle3Qwen3Eagle3Model'" in message and "src src-vllm --target target --no-fc-norm --no-norm-output" \
        in message
    assert doc["fix"] == "eaglekit upgrade src src-vllm --target target --no-fc-norm --no-norm-output"

    old = _json(["validate", src, "--engine-version", "0.24"], exit_code=1)  # before V2 read target_layer_ids
    assert "V2 runner ignores target_layer_ids and captures (2, L//2, L-3)" in _findings(old, "EK329")[0]["message"]
    explained = _json(["explain", "EK329"])
    assert explained["related"][0]["code"] == "P51" and "target_layer_ids" in explained["related"][0]["detect"]


def test_a_malformed_or_wrong_length_target_layer_ids_is_reported(tmp_path):
    bad = edit_config(_deepspec(tmp_path / "bad"), lambda c: c.update(target_layer_ids=["1", 3, 5, 7, 9]))
    doc = _json(["validate", bad], exit_code=1)
    assert any(f["key"] == "target_layer_ids" for f in _findings(doc, "EK157"))
    short = edit_config(_deepspec(tmp_path / "short"), lambda c: c.update(target_layer_ids=[1, 5, 9]))
    doc = _json(["validate", short], exit_code=1)
    assert any(f["key"] == "target_layer_ids" for f in _findings(doc, "EK122"))


@pytest.mark.parametrize("to", ["vllm", "speculators"])
def test_upgrade_writes_what_vllm_reads_in_its_convention(tmp_path, to):
    src = _deepspec(tmp_path / "src")
    target = _qwen3_target(tmp_path / "target")
    out = str(tmp_path / "out")
    _json(["upgrade", "--from", "eagle3", src, out, "--to", to, "--target", target, *KEEP])
    cfg = _config(out)
    carried = {k: v for k, v in cfg.items() if k != "eaglekit"}  # the provenance names where the ids came from
    assert "target_layer_ids" not in json.dumps(carried)  # the source's key, in its convention, is not carried
    assert cfg["eagle_aux_hidden_state_layer_ids"] == VLLM_IDS
    if to == "vllm":
        assert cfg["architectures"] == ["Eagle3Qwen3ForCausalLM"] and cfg["model_type"] == "qwen3"
        assert cfg["eagle_config"]["eagle_aux_hidden_state_layer_ids"] == VLLM_IDS
        assert cfg["num_aux_hidden_states"] == 5 and cfg["norm_before_residual"] is False
    else:
        layer = cfg["transformer_layer_config"]
        assert (layer["model_type"], layer["num_aux_hidden_states"]) == ("qwen3", 5)
    for version in ("0.24.0", "0.33.0"):  # both runners, before and after V2 read target_layer_ids
        view = vllm_view(load_draft(out), parse_version(version))
        assert (view.model_class, view.k, view.top_level_ids, view.v1_ids) == ("qwen3", 5, (2, 4, 6, 8, 10),
                                                                              (2, 4, 6, 8, 10))
    written, source = read_checkpoint(out), read_checkpoint(src)
    assert sorted(written.entries) == sorted(source.entries)  # canonical names already; no d2t / t2d added
    assert _json(["validate", out, "--target", target])["errors"] == 0


def test_upgrade_keeps_every_tensor_byte_for_byte(tmp_path):
    src = _deepspec(tmp_path / "src")
    out = str(tmp_path / "out")
    report = _json(["upgrade", src, out, *KEEP])
    assert report["function"] == "preserved"
    for name in read_checkpoint(src).entries:
        a, b = (np.frombuffer(_raw(path, name), np.uint8) for path in (src, out))
        assert np.array_equal(a, b), name


def _raw(path: str, name: str) -> bytes:
    files = read_checkpoint(path)
    rel, entry = files.entries[name]
    with open(os.path.join(path, rel), "rb") as fh:
        fh.seek(entry.start)
        return fh.read(entry.end - entry.start)


def test_upgrades_vllm_cannot_serve_are_refused_with_nothing_written(tmp_path):
    src = _deepspec(tmp_path / "src")
    target = _qwen3_target(tmp_path / "target")
    result = run_cli(["upgrade", src, str(tmp_path / "sglang"), "--to", "sglang", "--target", target, *KEEP])
    assert result.exit_code == 2 and "Qwen3 q/k norms" in result.stderr
    # every DeepSpec layer re-reads the embeddings (2·H attention input); vLLM's layers >= 1 take H
    deep = _deepspec(tmp_path / "deep", layers=2)
    result = run_cli(["upgrade", deep, str(tmp_path / "deep-out"), *KEEP])
    assert result.exit_code == 1 and "layers.1.self_attn.q_proj.weight" in result.stderr
    gemma = _deepspec(tmp_path / "gemma", config_patch={"architectures": ["Gemma4Eagle3Model"]},
                      add={"layers.0.pre_feedforward_layernorm.weight": np.ones(64, np.float32),
                           "layers.0.post_feedforward_layernorm.weight": np.ones(64, np.float32)})
    doc = _json(["validate", gemma], exit_code=1)
    assert "no upgrade serves it" in _findings(doc, "EK329")[0]["message"]
    result = run_cli(["upgrade", gemma, str(tmp_path / "gemma-out"), *KEEP])
    assert result.exit_code == 1 and "pre_feedforward_layernorm" in result.stderr
    assert sorted(os.listdir(tmp_path)) == ["deep", "gemma", "src", "target"]


VLLM_LOAD = r"""
import json, os, sys, types
import torch
from safetensors.torch import load_file
from vllm.config import set_current_vllm_config
from vllm.distributed import init_distributed_environment, initialize_model_parallel
from vllm.engine.arg_utils import EngineArgs
from vllm.model_executor.model_loader.utils import get_model_architecture
from vllm.utils.torch_utils import set_default_torch_dtype
from vllm.v1.worker.gpu.spec_decode.eagle.eagle3_utils import get_eagle3_aux_layers_from_config
from vllm.v1.worker.gpu_model_runner import GPUModelRunner

STACKED = {"q_proj": ("qkv_proj", 0), "k_proj": ("qkv_proj", 1), "v_proj": ("qkv_proj", 2),
           "gate_proj": ("gate_up_proj", 0), "up_proj": ("gate_up_proj", 1)}
target, drafts, report, started = sys.argv[1], sys.argv[2:], {}, False
for draft in drafts:
    spec = {"model": draft, "method": "eagle3", "num_speculative_tokens": 3}
    try:
        cfg = EngineArgs(model=target, speculative_config=spec, dtype="float32", max_model_len=256,
                         enforce_eager=True, skip_tokenizer_init=True).create_engine_config()
    except Exception as e:
        report[draft] = {"refused": str(e)[:300]}
        continue
    sc = cfg.speculative_config
    with set_current_vllm_config(cfg), set_default_torch_dtype(torch.float32):
        if not started:
            init_distributed_environment(world_size=1, rank=0, local_rank=0, backend="gloo",
                                         distributed_init_method="tcp://127.0.0.1:" + os.environ["PORT"])
            initialize_model_parallel(1, 1)
            started = True
        cls, _ = get_model_architecture(sc.draft_model_config)
        model = cls(vllm_config=cfg, prefix="draft")
    params = dict(model.named_parameters())
    for p in params.values():
        p.data.fill_(float("nan"))
    weights = load_file(os.path.join(draft, "model.safetensors"))
    model.load_weights(iter(weights.items()))
    parts = {}
    for name, tensor in weights.items():
        module, _, leaf = name.rpartition(".")
        parent, _, last = module.rpartition(".")
        where = name if name.startswith("lm_head") else "model." + name
        if last in STACKED:
            fused, slot = STACKED[last]
            parts.setdefault(f"model.{parent}.{fused}.{leaf}", {})[slot] = tensor
        else:
            parts[where] = {0: tensor}
    joined = {n: torch.cat([chunks[i] for i in sorted(chunks)]).float() for n, chunks in parts.items()}
    differ = [n for n, value in joined.items() if n not in params or not torch.equal(params[n].detach(), value)]
    v1 = GPUModelRunner._get_eagle3_aux_layers_from_config(types.SimpleNamespace(speculative_config=sc))
    report[draft] = {"class": cls.__name__, "k": model.model.num_aux_layers, "fc_in": model.model.fc_input_size,
                     "unloaded": sorted(n for n, p in params.items() if torch.isnan(p).any()),
                     "differ": differ, "unplaced": sorted(set(params) - set(parts)),
                     "v2_ids": list(get_eagle3_aux_layers_from_config(sc) or []), "v1_ids": list(v1 or []),
                     "d2t": model.draft_id_to_target_id is not None}
print("REPORT " + json.dumps(report))
"""


@pytest.mark.engine
@pytest.mark.skipif(VLLM_PYTHON is None, reason="no vLLM environment (scripts/vllm-env.sh)")
def test_vllms_own_class_loads_every_parameter_of_the_upgraded_draft(tmp_path):
    """vLLM's config path and Eagle3Qwen3ForCausalLM, built on CPU outside an engine: the source is refused, each
    upgraded output resolves to the class, and load_weights fills every parameter with the file's values."""
    src = _deepspec(tmp_path / "src", dtype="F32")
    target = _qwen3_target(tmp_path / "target")
    outs = {to: str(tmp_path / to) for to in ("vllm", "speculators")}
    for to, out in outs.items():
        _json(["upgrade", src, out, "--to", to, "--target", target, *KEEP])
    with socket.socket() as free:  # gloo's rendezvous port for vLLM's one-process model-parallel group
        free.bind(("127.0.0.1", 0))
        env = {**os.environ, "PORT": str(free.getsockname()[1])}
    done = subprocess.run([VLLM_PYTHON or "", "-c", VLLM_LOAD, target, src, *outs.values()], capture_output=True,
                          text=True, timeout=900, env=env)
    assert done.returncode == 0, done.stderr[-3000:]
    report = json.loads(done.stdout.split("REPORT ", 1)[1])
    assert "Model architectures ['Qwen3Eagle3Model'] are not supported" in report[src]["refused"]
    for out in outs.values():
        loaded = report[out]
        assert loaded["class"] == "Eagle3Qwen3ForCausalLM" and (loaded["k"], loaded["fc_in"]) == (5, 5 * 64)
        assert loaded["unloaded"] == [] and loaded["differ"] == [] and loaded["unplaced"] == []
        assert loaded["v2_ids"] == VLLM_IDS and loaded["v1_ids"] == VLLM_IDS and not loaded["d2t"]
