"""Drafts of other speculative methods (DFlash, DFlash2, DSpark, XPress, MTP, PARD): each is recognised by name in
the forms its producer ships, inspect says what it is and which vLLM method serves it, validate fails it as not an
EAGLE-3 draft, and every other command refuses it in one line. The checkpoints are real files written from the
producers' own config keys and tensor names (tests/support/method_drafts.py names the sources)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import jsonschema
import pytest

from eaglekit.engines.vllm import VLLM_DRAFT_METHODS, VLLM_SPECULATORS_MODEL_TYPES
from eaglekit.errors import NotEagle3DraftError
from eaglekit.families import FAMILIES, load_draft
from eaglekit.io.checkpoint import INDEX_NAME, MAX_DRAFT_TENSORS
from tests.support import REPO
from tests.support.cli import run_cli
from tests.support.engines import VLLM_PYTHON
from tests.support.factory import edit_config, make_draft, make_target_config
from tests.support.method_drafts import BUILDERS, write_method_draft

SCHEMAS = os.path.join(str(REPO), "schemas")
INSPECT = json.load(open(os.path.join(SCHEMAS, "inspect-report.schema.json")))
VALIDATE = json.load(open(os.path.join(SCHEMAS, "validate-report.schema.json")))
# kind -> (family, the method key of VLLM_DRAFT_METHODS, the form)
EXPECTED = {
    "dflash-flat": ("dflash", "dflash", "flat"), "dflash-speculators": ("dflash", "dflash", "speculators"),
    "dflash2-flat": ("dflash2", "dflash2", "flat"), "dflash2-speculators": ("dflash2", "dflash2", "speculators"),
    "dspark-flat": ("dspark", "dspark", "flat"), "dspark-speculators": ("dspark", "dspark", "speculators"),
    "xpress-flat": ("xpress", "xpress", "flat"), "xpress-speculators": ("xpress", "xpress", "speculators"),
    "mtp-deepseek": ("mtp", "mtp", "target checkpoint"), "mtp-qwen3-next": ("mtp", "mtp", "target checkpoint"),
    "mtp-speculators": ("mtp", "mtp", "speculators"), "pard": ("pard", "pard", "flat"),
}


@pytest.fixture(scope="module")
def drafts(tmp_path_factory):
    base = tmp_path_factory.mktemp("methods")
    return {kind: write_method_draft(str(base / kind), kind) for kind in BUILDERS}


def _config(path: str) -> dict:
    with open(os.path.join(path, "config.json")) as fh:
        return json.load(fh)


def test_every_kind_built_is_checked():
    assert set(EXPECTED) == set(BUILDERS)
    assert {family for family, _, _ in EXPECTED.values()} == {n for n, f in FAMILIES.items() if not f.is_eagle3}


@pytest.mark.parametrize("kind", sorted(EXPECTED))
def test_inspect_names_the_method_and_its_vllm_method(drafts, kind):
    family, method_key, form = EXPECTED[kind]
    vllm = VLLM_DRAFT_METHODS[method_key]
    result = run_cli(["inspect", drafts[kind]])
    assert result.exit_code == 0, result.output
    first = result.stdout.splitlines()[0]
    assert "not an EAGLE-3 draft" in first and f"method '{vllm.method}'" in first and vllm.since in first

    doc = json.loads(run_cli(["inspect", drafts[kind], "--format", "json"]).stdout)
    jsonschema.validate(doc, INSPECT)
    method = doc["speculative_method"]
    assert doc["eagle3_draft"] is False and doc["family"] == family == method["family"]
    assert method["form"] == form and method["vllm"]["method"] == vllm.method
    assert method["vllm"]["speculative_config"] == {"method": vllm.method, **dict(vllm.settings)}
    assert method["num_tensors"] == len(_tensor_names(drafts[kind]))


@pytest.mark.parametrize("kind", sorted(k for k in EXPECTED if not k.startswith(("mtp", "pard"))))
def test_inspect_reads_block_size_layers_and_target_layers_as_written(drafts, kind):
    cfg = _config(drafts[kind])
    method = json.loads(run_cli(["inspect", drafts[kind], "--format", "json"]).stdout)["speculative_method"]
    inner = cfg.get("dflash_config", {})
    assert method["block_size"] == cfg.get("xpress_block_size", cfg.get("block_size", inner.get("block_size")))
    layers = cfg.get("transformer_layer_config", cfg)["num_hidden_layers"]
    assert method["num_layers"] == layers
    written = cfg.get("aux_hidden_state_layer_ids") or inner.get("target_layer_ids") or cfg.get("target_layer_ids")
    assert method["target_layer_ids"] == written
    # vLLM captures hidden_states[id + 1] for DFlash-convention ids, and the speculators ids as they are
    shift = 0 if "aux_hidden_state_layer_ids" in cfg else 1
    assert method["target_layer_ids_captured"] == [i + shift for i in written]
    assert method["mask_token_id"] == cfg.get("mask_token_id", inner.get("mask_token_id"))


@pytest.mark.parametrize("kind", sorted(EXPECTED))
def test_validate_fails_it_as_not_an_eagle3_draft(drafts, kind):
    family, method_key, _ = EXPECTED[kind]
    result = run_cli(["validate", drafts[kind]])
    assert result.exit_code == 1
    assert "FAILED" in result.stdout and "PASSED" not in result.stdout
    served = f"method '{VLLM_DRAFT_METHODS[method_key].method}'"
    assert "not an EAGLE-3 draft" in result.stdout and served in result.stdout
    json_result = run_cli(["validate", drafts[kind], "--format", "json"])
    doc = json.loads(json_result.stdout)
    jsonschema.validate(doc, VALIDATE)
    assert json_result.exit_code == 1 and doc["ok"] is False and doc["speculative_method"]["family"] == family


@pytest.mark.parametrize("kind", sorted(EXPECTED))
def test_upgrade_refuses_it_in_one_line(drafts, kind, tmp_path):
    result = run_cli(["upgrade", drafts[kind], str(tmp_path / "out")])
    assert result.exit_code == 1
    assert len(result.stderr.strip().splitlines()) == 1 and "not an EAGLE-3 draft" in result.stderr
    assert drafts[kind] in result.stderr and not (tmp_path / "out").exists()


@pytest.mark.parametrize("command", ["verify", "compare", "push", "finetune", "capture"])
def test_no_command_reads_one_as_eagle3(drafts, tmp_path, command):
    target = make_target_config(str(tmp_path / "target"))
    draft = drafts["dflash-flat"]
    args = {
        "verify": ["verify", draft, "--target", target],
        "compare": ["compare", draft, make_draft(str(tmp_path / "eagle"), "vllm"), "--target", target],
        "push": ["push", draft, "--repo-id", "org/draft", "--dry-run"],
        "finetune": ["finetune", draft, str(tmp_path / "out"), "--target", target],
        "capture": ["capture", target, str(tmp_path / "store"), "--draft", draft],
    }[command]
    result = run_cli(args)
    assert result.exit_code == 1, result.output
    assert result.stderr.strip().splitlines()[-1].endswith(f"(method since vLLM {VLLM_DRAFT_METHODS['dflash'].since})")
    assert "a DFlash block drafter" in result.stderr and "not an EAGLE-3 draft" in result.stderr


@pytest.mark.parametrize("kind", ["dflash-flat", "dflash2-flat", "dspark-flat", "xpress-flat", "mtp-qwen3-next"])
@pytest.mark.parametrize("architectures", [["Qwen3ForCausalLM"], None])
def test_flat_forms_are_recognised_without_their_architecture(drafts, tmp_path, kind, architectures):
    """An HF export that writes the base model's architecture, or none: the method's own keys and tensors tell."""
    path = edit_config(write_method_draft(str(tmp_path / "d"), kind), lambda c: c.update(architectures=architectures))
    with pytest.raises(NotEagle3DraftError) as info:
        load_draft(path)
    assert info.value.draft.family == EXPECTED[kind][0]


def test_upgrade_from_another_method_is_a_usage_error(drafts, tmp_path):
    result = run_cli(["upgrade", "--from", "dflash", drafts["dflash-flat"], str(tmp_path / "out")])
    assert result.exit_code == 2 and "expected eagle3 or one of" in result.stderr and "dflash," not in result.stderr


def test_a_forced_eagle3_family_still_refuses_it(drafts):
    with pytest.raises(NotEagle3DraftError) as info:
        load_draft(drafts["dflash2-flat"], family="vllm")
    assert info.value.draft.family == "dflash2"


def test_speculators_forms_vllm_cannot_read_are_reported(drafts):
    """vLLM 0.33.0's speculators path (algos.py) has no xpress or mtp updater: inspect says so."""
    for kind in ("xpress-speculators", "mtp-speculators", "dflash-speculators"):
        method = json.loads(run_cli(["inspect", drafts[kind], "--format", "json"]).stdout)["speculative_method"]
        readable = _config(drafts[kind])["speculators_model_type"] in VLLM_SPECULATORS_MODEL_TYPES
        assert (method["vllm"]["problem"] is None) == readable
        if not readable:
            assert "refuses this config" in method["vllm"]["problem"]


def test_pard_needs_parallel_drafting_and_names_its_mask_token(drafts):
    method = json.loads(run_cli(["inspect", drafts["pard"], "--format", "json"]).stdout)["speculative_method"]
    assert method["vllm"]["speculative_config"] == {"method": "draft_model", "parallel_drafting": True}
    assert method["mask_token_id"] == _config(drafts["pard"])["pard_token"]


def test_mtp_in_a_target_counts_its_layers_and_says_where_they_sit(drafts):
    for kind, where in (("mtp-deepseek", "model.layers.2"), ("mtp-qwen3-next", "mtp")):
        method = json.loads(run_cli(["inspect", drafts[kind], "--format", "json"]).stdout)["speculative_method"]
        assert method["num_layers"] == _config(drafts[kind])["num_nextn_predict_layers"]
        assert any(where in note for note in method["notes"]) and method["vllm"]["problem"] is None


def test_deepseek_v41_mtp_tensors_are_dspark_stages(tmp_path):
    """vLLM 0.33.0 (speculative.py): V4.1 ships DSpark stages under mtp.* and has no classic-MTP draft."""
    path = edit_config(write_method_draft(str(tmp_path / "d"), "mtp-qwen3-next"),
                       lambda c: c.update(model_type="deepseek_v41", architectures=["DeepseekV41ForCausalLM"]))
    method = json.loads(run_cli(["inspect", path, "--format", "json"]).stdout)["speculative_method"]
    assert (method["family"], method["form"], method["vllm"]["method"]) == ("dspark", "target checkpoint", "dspark")


def test_mtp_of_a_model_type_vllm_has_no_mtp_draft_for_is_a_problem(drafts, tmp_path):
    path = write_method_draft(str(tmp_path / "m"), "mtp-deepseek")
    edit_config(path, lambda c: c.update(model_type="my_moe", architectures=["MyMoeForCausalLM"]))
    method = json.loads(run_cli(["inspect", path, "--format", "json"]).stdout)["speculative_method"]
    assert method["family"] == "mtp" and "builds no MTP draft for model_type 'my_moe'" in method["vllm"]["problem"]


def test_a_full_target_is_recognised_by_its_index_alone(tmp_path, drafts):
    """A real target maps tens of thousands of tensors: past the draft limit the index's names still show MTP
    layers, and the shards' headers are never read."""
    root = tmp_path / "deepseek"
    os.makedirs(root)
    cfg = _config(drafts["mtp-deepseek"])
    layers = MAX_DRAFT_TENSORS + 1  # one tensor per layer below: a model, not a draft
    cfg["num_hidden_layers"] = layers
    (root / "config.json").write_text(json.dumps(cfg))
    names = {f"model.layers.{i}.mlp.gate_proj.weight": "model-00001.safetensors" for i in range(layers)}
    names[f"model.layers.{layers}.eh_proj.weight"] = "model-00002.safetensors"
    (root / INDEX_NAME).write_text(json.dumps({"metadata": {}, "weight_map": names}))
    for shard in ("model-00001.safetensors", "model-00002.safetensors"):
        (root / shard).write_bytes(b"never read")
    result = run_cli(["inspect", str(root), "--format", "json"])
    assert result.exit_code == 0, result.output
    method = json.loads(result.stdout)["speculative_method"]
    assert method["family"] == "mtp" and method["form"] == "target checkpoint"
    assert method["num_tensors"] == len(names)

    names.pop(f"model.layers.{layers}.eh_proj.weight")  # declared, but its tensors stripped: vLLM finds none
    (root / INDEX_NAME).write_text(json.dumps({"metadata": {}, "weight_map": names}))
    method = json.loads(run_cli(["inspect", str(root), "--format", "json"]).stdout)["speculative_method"]
    assert method["family"] == "mtp" and "holds none of their tensors" in method["vllm"]["problem"]

    edit_config(str(root), lambda c: c.pop("num_nextn_predict_layers"))  # no MTP layer, no MTP count: too big
    result = run_cli(["inspect", str(root)])
    assert result.exit_code == 1 and "more than the" in result.stderr


@pytest.mark.parametrize("layout", ["vllm", "speculators", "specforge", "kimi"])
def test_eagle3_drafts_that_carry_method_keys_stay_eagle3(tmp_path, layout):
    """A copied target config (num_nextn_predict_layers) or a parallel-drafting token on an EAGLE-3 draft does not
    make it another method's draft."""
    path = make_draft(str(tmp_path / layout), layout, attention="mla" if layout == "kimi" else "llama",
                      draft_vocab=None if layout == "kimi" else 128, embed=layout == "kimi")
    before = load_draft(path).family
    edit_config(path, lambda c: c.update(num_nextn_predict_layers=1, pard_token=5))
    assert load_draft(path).family == before and FAMILIES[before].is_eagle3


@pytest.mark.parametrize("kind, edit", [
    ("dflash-flat", {"dflash_config": [1, 2], "block_size": "16"}),
    ("dflash-flat", {"dflash_config": {"target_layer_ids": [True, -1, "x"], "mask_token_id": 1e300}}),
    ("dspark-flat", {"architectures": ["DSpark" + "x" * 100_000, 5, None]}),
    ("mtp-deepseek", {"model_type": "m" * 5000, "num_nextn_predict_layers": True}),
    ("xpress-speculators", {"speculators_version": "v" * 1000, "transformer_layer_config": []}),
])
def test_odd_config_values_still_give_a_report_and_one_line(tmp_path, kind, edit):
    path = edit_config(write_method_draft(str(tmp_path / "d"), kind), lambda c: c.update(edit))
    result = run_cli(["inspect", path, "--format", "json"])
    assert result.exit_code == 0
    jsonschema.validate(json.loads(result.stdout), INSPECT)
    refused = run_cli(["upgrade", path, str(tmp_path / "out")])
    line = refused.stderr.strip()
    assert refused.exit_code == 1 and "\n" not in line and len(line) <= 420 and "not an EAGLE-3 draft" in line


def test_inspect_of_another_method_never_imports_torch(drafts):
    code = (
        "import sys\n"
        "from eaglekit.cli.main import main\n"
        "try:\n"
        "    main(['inspect', sys.argv[1]])\n"
        "except SystemExit as exc:\n"
        "    assert not exc.code, exc.code\n"
        "heavy = sorted({'torch', 'numpy'} & set(sys.modules))\n"
        "assert not heavy, f'{heavy} imported'\n"
    )
    proc = subprocess.run([sys.executable, "-c", code, drafts["dspark-speculators"]], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr


PROBE = """
import json, typing
import vllm
from vllm.config.speculative import SpeculativeMethod
from vllm.model_executor.models.registry import _SPECULATIVE_DECODING_MODELS
from vllm.transformers_utils.configs.speculators.algos import SUPPORTED_SPECULATORS_TYPES

def flat(t):
    return [x for a in typing.get_args(t) for x in (flat(a) if typing.get_args(a) else [a])]

print(json.dumps({"version": vllm.__version__, "methods": flat(SpeculativeMethod),
                  "speculators": sorted(SUPPORTED_SPECULATORS_TYPES),
                  "registry": sorted(_SPECULATIVE_DECODING_MODELS)}))
"""


@pytest.mark.engine
@pytest.mark.skipif(VLLM_PYTHON is None, reason="no vLLM environment (scripts/vllm-env.sh)")
def test_the_vllm_facts_hold_in_the_installed_vllm():
    """In the vLLM installed beside eaglekit: each method whose 'since' it reaches is one of its methods and has
    registered draft architectures; a method it predates has none; its speculators path reads exactly the
    speculators_model_type values eaglekit says."""
    from eaglekit.engines.base import parse_version

    proc = subprocess.run([VLLM_PYTHON, "-c", PROBE], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    found = json.loads(proc.stdout.strip().splitlines()[-1])
    version = parse_version(found["version"])
    for key, method in VLLM_DRAFT_METHODS.items():
        registered = method.architectures & set(found["registry"])
        if parse_version(method.since) <= version:
            assert method.method in found["methods"], key
            assert registered or not method.architectures, key
        else:
            assert not registered, key
    if version >= (0, 29, 0):
        assert set(found["speculators"]) == VLLM_SPECULATORS_MODEL_TYPES


def _tensor_names(path: str) -> list[str]:
    from eaglekit.io.header import read_header

    return sorted(read_header(os.path.join(path, "model.safetensors")).entries)
