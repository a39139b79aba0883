"""P-EAGLE (parallel drafting): read, inspected, validated, upgraded and refused as vLLM serves it.

The checkpoints follow speculators 0.9.0's own P-EAGLE output (models/peagle/config.py, models/peagle/core.py as
save_pretrained writes them: speculators_model_type "peagle", mask_token_id, architectures PEagleDraftModel, the
eagle3 tensors plus embed_tokens and mask_hidden [1, 1, K·T]; tests/support/factory.py `_peagle_files`). vLLM's
reading is its update_peagle (vllm/transformers_utils/configs/speculators/algos.py, 0.22..0.33): fc_norm and
norm_output are not carried, norm_before_residual defaults to false. The engine test loads the upgraded flat output
with vLLM's own eagle3 class on CPU, every parameter from the file, and the speculators source to the error
EK330 predicts.
"""

from __future__ import annotations

import json
import os
import socket
import struct
import subprocess

import numpy as np
import pytest

from eaglekit.engines import vllm_view
from eaglekit.engines.base import parse_version
from eaglekit.errors import IncompatibleDraftError, UsageError
from eaglekit.families import load_draft
from eaglekit.rules import run_rules
from eaglekit.serving import serve_command
from eaglekit.upgrade import UpgradeOptions, upgrade
from tests.support.cli import run_cli
from tests.support.engines import REPO, VLLM_PYTHON
from tests.support.factory import MASK_TOKEN_ID, make_draft, make_target_config

SCHEMA = REPO / "eaglekit" / "schemas" / "inspect-report.schema.json"


def peagle(tmp_path, name: str = "draft", **recipe) -> str:
    return make_draft(str(tmp_path / name), "peagle", **recipe)


def peagle31(tmp_path, name: str = "draft31") -> str:
    return peagle(tmp_path, name, fc_norm=True, norm_output=True)


def codes(path: str, version: str | None = None) -> dict[str, list]:
    report = run_rules(load_draft(path), engine="vllm", engine_version=version)
    found: dict[str, list] = {}
    for f in report.findings:
        found.setdefault(f.code, []).append(f)
    return found


def header(path: str) -> dict:
    with open(os.path.join(path, "model.safetensors"), "rb") as fh:
        (n,) = struct.unpack("<Q", fh.read(8))
        return json.loads(fh.read(n))


def tensor_bytes(path: str, name: str) -> bytes:
    info = header(path)[name]
    with open(os.path.join(path, "model.safetensors"), "rb") as fh:
        (n,) = struct.unpack("<Q", fh.read(8))
        fh.seek(8 + n + info["data_offsets"][0])
        return fh.read(info["data_offsets"][1] - info["data_offsets"][0])


# ---------------------------------------------------------------- reading


def test_speculators_peagle_reads_as_peagle_with_its_mask_slots(tmp_path):
    spec = load_draft(peagle31(tmp_path))
    assert (spec.family, spec.config_layout, spec.eagle_version) == ("peagle", "speculators", "3.1")
    assert spec.facts.parallel_drafting and spec.facts.mask_token_id == MASK_TOKEN_ID
    assert spec.tensors["mask_hidden"].shape == (1, 1, 3 * 64)
    assert spec.aux.ids == (2, 6, 9) and spec.num_aux_hidden_states == 3
    plain = load_draft(make_draft(str(tmp_path / "eagle3"), "speculators"))  # the same layout, eagle3 type
    assert plain.family == "speculators" and not plain.facts.parallel_drafting


def test_flat_peagle_needs_the_mask_and_its_token(tmp_path):
    mask = {"mask_hidden": np.full((1, 192), 0.5, np.float32)}
    flat = load_draft(make_draft(str(tmp_path / "flat"), config_patch={"pard_token": 7}, add=mask))
    assert flat.family == "peagle" and flat.facts.vllm_layout and flat.facts.mask_token_id == 7
    no_token = load_draft(make_draft(str(tmp_path / "stray"), add=mask))  # a stray mask is not P-EAGLE (EK320)
    assert no_token.family == "vllm" and not no_token.facts.parallel_drafting


# ---------------------------------------------------------------- vLLM's reading


def test_vllm_resolves_speculators_peagle_as_update_peagle(tmp_path):
    spec = load_draft(peagle31(tmp_path))
    view = vllm_view(spec, parse_version("0.33.0"))
    assert (view.architecture, view.model_class, view.problem) == ("PeagleLlamaForCausalLM", "llama", None)
    assert spec.flags.fc_norm and spec.flags.norm_output  # as written
    assert not view.fc_norm and not view.norm_output  # as vLLM runs it
    assert view.not_carried == ("fc_norm", "norm_output")
    assert view.parallel_drafting and view.parallel_token == MASK_TOKEN_ID
    assert "fc_norm" not in view.config and view.config["pard_token"] == MASK_TOKEN_ID


def test_norm_before_residual_default_differs_between_peagle_and_eagle3(tmp_path):
    p = load_draft(peagle(tmp_path, "p", norm_before_residual=None))
    e = load_draft(make_draft(str(tmp_path / "e"), "speculators", norm_before_residual=None))
    assert "norm_before_residual" not in p.config and "norm_before_residual" not in e.config
    assert vllm_view(p).norm_before_residual is False
    assert vllm_view(e).norm_before_residual is True


@pytest.mark.parametrize(("version", "architecture"), [("0.24", "PeagleLlamaForCausalLM"),
                                                       ("0.25", "PeagleQwen3ForCausalLM")])
def test_qwen3_peagle_gets_its_class_from_025(tmp_path, version, architecture):
    view = vllm_view(load_draft(peagle(tmp_path, attention="qwen3")), parse_version(version))
    assert view.architecture == architecture


def test_vllm_before_022_has_no_peagle_type(tmp_path):
    view = vllm_view(load_draft(peagle(tmp_path)), parse_version("0.21.0"))
    assert view.model_class is None and "peagle" in (view.problem or "")
    assert "EK301" in codes(peagle(tmp_path, "old"), "0.21")


# ---------------------------------------------------------------- the rules


def test_31_flags_fire_on_speculators_peagle_and_not_on_plain(tmp_path):
    found = codes(peagle31(tmp_path))
    (dropped_norms,) = found["EK330"]
    assert dropped_norms.severity == "error" and dropped_norms.refuses_load and dropped_norms.key == "fc_norm"
    assert "update_peagle" in dropped_norms.message and "3 fc_norm" in dropped_norms.message
    (dropped_output,) = found["EK331"]
    assert dropped_output.key == "norm_output" and not dropped_output.refuses_load
    plain = codes(peagle(tmp_path, "plain"))
    assert not {"EK330", "EK331", "EK320", "EK311"} & set(plain)
    assert not [f for fs in plain.values() for f in fs if f.severity == "error"]


def test_the_same_flags_through_the_eagle3_speculators_path_are_silent(tmp_path):
    found = codes(make_draft(str(tmp_path / "eagle3"), "speculators", fc_norm=True, norm_output=True))
    assert not {"EK330", "EK331"} & set(found)


def test_peagle_serve_command_switches_parallel_drafting_on(tmp_path):
    report = run_rules(load_draft(peagle(tmp_path)), engine="vllm")
    assert report.settings["vllm"] == ('"parallel_drafting": true',)
    command = serve_command("vllm", "org/target", "./draft", 3, report.settings["vllm"])
    config = json.loads(command.split("--speculative-config ", 1)[1].strip("'"))
    assert config == {"model": "./draft", "method": "eagle3", "num_speculative_tokens": 3, "parallel_drafting": True}


# ---------------------------------------------------------------- inspect and validate


def test_inspect_says_parallel_drafting_and_both_flag_readings(tmp_path):
    import jsonschema

    path = peagle31(tmp_path)
    result = run_cli(["inspect", path, "--format", "json"])
    assert result.exit_code == 0, result.stderr
    doc = json.loads(result.stdout)
    jsonschema.validate(doc, json.loads(SCHEMA.read_text()))
    assert doc["family"] == "peagle" and doc["fc_norm"] and doc["norm_output"]
    parallel = doc["parallel_drafting"]
    assert parallel["mask_token_id"] == MASK_TOKEN_ID and parallel["mask_hidden_shape"] == [1, 1, 192]
    assert parallel["vllm"]["settings"] == ['"parallel_drafting": true']
    assert (parallel["vllm"]["fc_norm"], parallel["vllm"]["norm_output"]) == (False, False)
    assert parallel["vllm"]["not_carried"] == ["fc_norm", "norm_output"]
    human = run_cli(["inspect", path]).stdout
    assert "P-EAGLE: parallel drafting" in human and "flags in vLLM 0.33.0" in human
    assert "fc_norm and norm_output written but dropped" in " ".join(human.split())
    eagle3 = json.loads(run_cli(["inspect", make_draft(str(tmp_path / "e"), "speculators"), "--format", "json"]).stdout)
    assert eagle3["parallel_drafting"] is None


def test_validate_fails_the_31_draft_with_the_upgrade_as_its_fix(tmp_path):
    path = peagle31(tmp_path)
    result = run_cli(["validate", path, "--format", "json"])
    assert result.exit_code == 1
    doc = json.loads(result.stdout)
    assert {"EK330", "EK331"} <= {f["code"] for f in doc["findings"]}
    assert doc["fix"] == "eaglekit upgrade draft31 draft31-vllm"  # JSON names a folder by its name
    plain = run_cli(["validate", peagle(tmp_path, "plain")])
    assert plain.exit_code == 0 and 'serves it with "parallel_drafting": true' in plain.stdout


# ---------------------------------------------------------------- upgrade


def test_upgrade_writes_the_flat_layout_with_flags_and_mask_kept(tmp_path):
    source = peagle31(tmp_path)
    out = str(tmp_path / "out")
    report = upgrade(source, out, UpgradeOptions())
    assert report.function == "preserved"
    assert any("parallel_drafting" in w for w in report.warnings)
    cfg = json.load(open(os.path.join(out, "config.json")))
    assert cfg["architectures"] == ["LlamaForCausalLMEagle3"] and cfg["pard_token"] == MASK_TOKEN_ID
    assert "mask_token_id" not in cfg and cfg["fc_norm"] is True and cfg["norm_output"] is True
    assert tensor_bytes(out, "mask_hidden") == tensor_bytes(source, "mask_hidden")
    spec = load_draft(out)
    assert spec.family == "peagle" and spec.facts.vllm_layout and spec.eagle_version == "3.1"
    view = vllm_view(spec)
    assert view.fc_norm and view.norm_output and view.not_carried == ()
    found = codes(out)
    assert not [c for c, fs in found.items() if any(f.severity != "info" for f in fs)], found


def test_upgrade_adds_no_31_flag_to_a_peagle_draft(tmp_path):
    source = peagle(tmp_path)
    with pytest.raises(UsageError, match="P-EAGLE"):
        upgrade(source, str(tmp_path / "out"), UpgradeOptions(fc_norm=True))
    assert not os.path.exists(tmp_path / "out")
    out = str(tmp_path / "kept")
    upgrade(source, out, UpgradeOptions())
    cfg = json.load(open(os.path.join(out, "config.json")))
    assert (cfg["fc_norm"], cfg["norm_output"]) == (False, False)
    assert not any(name.startswith("fc_norm.") for name in header(out))


def test_upgrade_refuses_a_peagle_draft_without_its_mask_slots(tmp_path):
    result = run_cli(["upgrade", peagle(tmp_path, drop=("mask_hidden",)), str(tmp_path / "out")])
    assert result.exit_code == 1 and "without mask_hidden" in result.stderr
    assert not os.path.exists(tmp_path / "out")


def test_the_serve_line_after_an_upgrade_switches_parallel_drafting_on(tmp_path, monkeypatch):
    """The draft's config cannot switch P-EAGLE on, so the printed `vllm serve` line must carry the setting."""
    import shlex

    make_target_config(str(tmp_path / "target"))
    source = peagle31(tmp_path)
    monkeypatch.chdir(tmp_path)  # relative paths, named as given (a JSON report names absolute ones by their names)
    result = run_cli(["upgrade", source, "out", "--target", "target", "--format", "json"])
    assert result.exit_code == 0, result.stderr
    argv = shlex.split(json.loads(result.stdout)["serve_command"])
    assert argv[:3] == ["vllm", "serve", "target"] and json.loads(argv[argv.index("--speculative-config") + 1]) == {
        "model": "out", "method": "eagle3", "num_speculative_tokens": 3, "parallel_drafting": True}


@pytest.mark.parametrize("dialect", ["sglang", "speculators", "trtllm"])
def test_other_dialects_refuse_a_peagle_draft_in_one_line(tmp_path, dialect):
    target = make_target_config(str(tmp_path / "target"))
    result = run_cli(["upgrade", peagle31(tmp_path), str(tmp_path / "out"), "--to", dialect, "--target", target])
    assert result.exit_code == 2 and "P-EAGLE" in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1
    assert not os.path.exists(tmp_path / "out")


# ---------------------------------------------------------------- decodes


def test_decodes_refuse_a_peagle_draft_naming_what_is_missing(tmp_path):
    from eaglekit.decode.options import VerifyOptions
    from eaglekit.decode.setup import decode_setup

    target = make_target_config(str(tmp_path / "target"))
    with pytest.raises(IncompatibleDraftError, match="missing: a parallel-drafting decode"):
        decode_setup([("draft", peagle(tmp_path))], target, VerifyOptions())
    result = run_cli(["verify", peagle(tmp_path, "cli"), "--target", target])
    assert result.exit_code == 1 and len(result.stderr.strip().splitlines()) == 1
    assert "P-EAGLE" in result.stderr and "parallel_drafting" in result.stderr


def test_finetune_refuses_a_peagle_draft_before_any_work(tmp_path):
    target = make_target_config(str(tmp_path / "target"))
    flat = str(tmp_path / "flat")
    upgrade(peagle(tmp_path), flat, UpgradeOptions())
    result = run_cli(["finetune", flat, str(tmp_path / "tuned"), "--target", target])
    assert result.exit_code == 2 and "P-EAGLE" in result.stderr and "sequential" in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1 and not os.path.exists(tmp_path / "tuned")


# ---------------------------------------------------------------- vLLM's own class on CPU

VLLM_LOAD = r"""
import json, os, sys
import torch
from safetensors.torch import load_file
from vllm.config import ModelConfig, ParallelConfig, SpeculativeConfig, VllmConfig, set_current_vllm_config
from vllm.distributed import init_distributed_environment, initialize_model_parallel
from vllm.model_executor.models.registry import ModelRegistry

target, draft, port = sys.argv[1], sys.argv[2], sys.argv[3]
model_config = ModelConfig(model=target, skip_tokenizer_init=True, dtype="float32")
parallel = ParallelConfig()
speculative = SpeculativeConfig(model=draft, method="eagle3", num_speculative_tokens=3, parallel_drafting=True,
                                target_model_config=model_config, target_parallel_config=parallel)
config = VllmConfig(model_config=model_config, speculative_config=speculative, parallel_config=parallel)
hf = speculative.draft_model_config.hf_config
report = {"architecture": speculative.draft_model_config.architectures[0],
          "read": {k: getattr(hf, k, None) for k in ("fc_norm", "norm_output", "norm_before_residual", "pard_token")}}
with set_current_vllm_config(config):
    init_distributed_environment(world_size=1, rank=0, local_rank=0, backend="gloo",
                                 distributed_init_method=f"tcp://127.0.0.1:{port}")
    initialize_model_parallel(1, 1)
    cls, _ = ModelRegistry.resolve_model_cls(speculative.draft_model_config.architectures,
                                             speculative.draft_model_config)
    model = cls(vllm_config=config)
weights = load_file(os.path.join(draft, "model.safetensors"))
try:
    model.load_weights(weights.items())
except ValueError as exc:
    report["error"] = str(exc).split(". ")[0]
    print(json.dumps(report))
    sys.exit(0)
stacked = {"qkv_proj": ("q_proj", "k_proj", "v_proj"), "gate_up_proj": ("gate_proj", "up_proj")}
expected = {}
for name, tensor in weights.items():
    if name == "t2d":  # vLLM skips it
        continue
    key = {"d2t": "draft_id_to_target_id", "mask_hidden": "mask_hidden", "lm_head.weight": "lm_head.weight"}.get(
        name, "model." + name)
    expected[key] = tensor
for fused, parts in stacked.items():
    for key in [k for k in list(expected) if f".{parts[0]}." in k]:
        expected[key.replace(parts[0], fused)] = torch.cat([expected.pop(key.replace(parts[0], p)) for p in parts])
held = dict(model.named_parameters())
held["mask_hidden"] = model.mask_hidden
report["unloaded"] = sorted(set(held) - set(expected))
report["not_held"] = sorted(set(expected) - set(held))
report["differ"] = sorted(k for k in set(held) & set(expected)
                          if not torch.equal(held[k].detach().reshape(-1).double(), expected[k].reshape(-1).double()))
report["checked"] = sorted(set(held) & set(expected))
print(json.dumps(report))
"""


def _load_in_vllm(target: str, draft: str) -> dict:
    with socket.socket() as probe:  # a free port for vLLM's one-process group
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    done = subprocess.run([VLLM_PYTHON or "", "-c", VLLM_LOAD, target, draft, str(port)], capture_output=True,
                          text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


@pytest.mark.engine
@pytest.mark.skipif(VLLM_PYTHON is None, reason="no vLLM environment (scripts/vllm-env.sh)")
def test_vllm_loads_the_upgraded_peagle_with_every_parameter_and_refuses_the_source(tmp_path):
    target = make_target_config(str(tmp_path / "target"))
    source = make_draft(str(tmp_path / "source"), "peagle", fc_norm=True, norm_output=True, dtype="F32")
    out = str(tmp_path / "out")
    upgrade(source, out, UpgradeOptions())

    served = _load_in_vllm(target, out)
    assert "error" not in served, served
    assert served["architecture"] == "LlamaForCausalLMEagle3"
    assert served["read"] == {"fc_norm": True, "norm_output": True, "norm_before_residual": False,
                              "pard_token": MASK_TOKEN_ID}
    assert served["unloaded"] == [] and served["not_held"] == [] and served["differ"] == []
    assert {"mask_hidden", "model.fc_norm.2.weight", "draft_id_to_target_id"} <= set(served["checked"])

    refused = _load_in_vllm(target, source)  # EK330: the P-EAGLE path leaves fc_norm out
    assert refused["read"]["fc_norm"] is None and refused["read"]["pard_token"] == MASK_TOKEN_ID
    assert refused["error"] == "There is no module or parameter named 'fc_norm' in LlamaModel"
    assert load_draft(source).facts.fc_norm_tensor_ids == (0, 1, 2)

    plain = make_draft(str(tmp_path / "plain"), "peagle", dtype="F32")  # EK330 silent: it loads
    assert "error" not in _load_in_vllm(target, plain)
