"""`upgrade` end to end on real checkpoints of every published layout: output validity, ids, losslessness,
idempotence, dry run, refusals, and that the source is never touched."""

from __future__ import annotations

import hashlib
import json
import os

import jsonschema
import numpy as np
import pytest
from safetensors import safe_open

from eaglekit.errors import CheckpointError, OutputError, UsageError
from eaglekit.families import load_draft
from eaglekit.io.tensors import read_array, read_bytes
from eaglekit.rules import run_rules
from eaglekit.target import read_target
from eaglekit.upgrade import UpgradeOptions, upgrade
from tests.support import REPO
from tests.support.factory import Recipe, canonical_tensors, make_draft, make_target_config


def load_json(path) -> dict:
    with open(path, encoding="utf-8") as fh:
        return json.load(fh)


SCHEMAS = os.path.join(str(REPO), "schemas")
VLLM31 = load_json(os.path.join(SCHEMAS, "vllm-eagle31-config.schema.json"))
SPECULATORS = load_json(os.path.join(SCHEMAS, "speculators-config.schema.json"))
EAGLE3 = load_json(os.path.join(SCHEMAS, "eagle3-config.schema.json"))

# (layout, recipe overrides): every published layout, each attention kind it is published with
SOURCES = [
    ("eagle", {}), ("sglang", {}), ("specforge", {}), ("specforge-hf", {"embed": True}),
    ("speculators", {}), ("speculators", {"attention": "qwen3"}), ("speculators-train", {"norm_before_residual": True}),
    ("modelopt", {"frequency_ordered": True}), ("modelopt-megatron", {"layers": 2}), ("modelopt-vllm", {}),
    ("torchspec", {}), ("torchspec", {"attention": "mla", "draft_vocab": None, "embed": True}),
    ("torchspec-vllm", {"attention": "mla", "draft_vocab": None}), ("angelslim", {}),
    ("kimi", {"attention": "mla", "draft_vocab": None}), ("vllm", {}), ("vllm", {"attention": "qwen3"}),
]
IDS = [f"{layout}-{o.get('attention', 'llama')}" + ("-nbr" if o.get("norm_before_residual") else "")
       for layout, o in SOURCES]


def tree_hash(path: str) -> str:
    digest = hashlib.sha256()
    for root, dirs, files in sorted(os.walk(path)):
        dirs.sort()
        for name in sorted(files):
            full = os.path.join(root, name)
            digest.update(os.path.relpath(full, path).encode())
            with open(full, "rb") as fh:
                digest.update(fh.read())
    return digest.hexdigest()


@pytest.fixture(scope="module")
def target(tmp_path_factory):
    return make_target_config(str(tmp_path_factory.mktemp("target") / "t"))


@pytest.fixture(scope="module")
def sources(tmp_path_factory):
    base = tmp_path_factory.mktemp("sources")
    return {key: make_draft(str(base / key), layout, **over) for key, (layout, over) in zip(IDS, SOURCES)}


def tensors_of(path: str) -> dict[str, np.ndarray]:
    spec = load_draft(path)
    return {ref.source_name: read_array(spec, name, as_float32=ref.dtype not in ("I64", "BOOL"))
            for name, ref in spec.tensors.items()}


def raw_tensors(path: str, family: str | None = None) -> dict[str, bytes]:
    spec = load_draft(path, family=family)
    return {ref.source_name: read_bytes(spec.path, ref) for ref in spec.tensors.values()}


# ---------------------------------------------------------------- every family -> vLLM EAGLE-3.1


@pytest.mark.parametrize("key", IDS)
def test_every_family_becomes_a_vllm_ready_31_draft(sources, target, tmp_path, key):
    src = sources[key]
    before = tree_hash(src)
    report = upgrade(src, str(tmp_path / "out"), UpgradeOptions(target=target, fc_norm=True, norm_output=True))
    assert tree_hash(src) == before  # the source is never modified

    out = str(tmp_path / "out")
    cfg = load_json(os.path.join(out, "config.json"))
    jsonschema.validate(cfg, VLLM31)
    spec = load_draft(out, target=read_target(target))
    assert spec.family == "vllm" and spec.eagle_version == "3.1"
    assert spec.aux.ids == (2, 6, 9) == tuple(cfg["eagle_config"]["eagle_aux_hidden_state_layer_ids"])
    validation = run_rules(spec, target=read_target(target), engine="vllm")
    assert validation.errors == 0, [f.message for f in validation.findings if f.severity == "error"]

    weights = tensors_of(out)
    for k in range(3):  # asked for without the target's weights: ones
        np.testing.assert_array_equal(weights[f"fc_norm.{k}.weight"], np.ones(64, dtype=np.float32))
    assert not any(n.startswith(("model.", "midlayer")) for n in weights)
    assert report.function == "warm-start" and "needs fine-tuning" in report.summary
    assert cfg["eaglekit"]["function"] == "warm-start"
    assert cfg["eaglekit"]["source_files"]["model.safetensors"].startswith("sha256:")
    with safe_open(os.path.join(out, "model.safetensors"), framework="numpy") as fh:
        meta = fh.metadata()
    assert meta["format"] == "pt" and json.loads(meta["eaglekit"]) == cfg["eaglekit"]


def test_source_file_hashes_are_the_real_sha256(sources, target, tmp_path):
    src = sources["specforge-llama"]
    upgrade(src, str(tmp_path / "out"), UpgradeOptions(target=target, fc_norm=True, norm_output=True))
    block = load_json(tmp_path / "out" / "config.json")["eaglekit"]
    for rel in ("model.safetensors", "config.json"):
        with open(os.path.join(src, rel), "rb") as fh:
            expected = hashlib.sha256(fh.read()).hexdigest()
        assert block["source_files"][rel] == "sha256:" + expected


# ---------------------------------------------------------------- aux ids


@pytest.mark.parametrize("layout,written", [("specforge", [1, 5, 8]), ("modelopt", [1, 5, 8]), ("torchspec", [1, 5, 8]),
                                            ("speculators", [2, 6, 9]), ("vllm", [2, 6, 9])])
def test_ids_are_converted_from_each_producers_convention(tmp_path, layout, written):
    src = make_draft(str(tmp_path / "src"), layout)
    cfg_in = load_json(os.path.join(src, "config.json"))
    assert written in (cfg_in.get("eagle_aux_hidden_state_layer_ids"),
                       cfg_in.get("eagle_config", {}).get("eagle_aux_hidden_state_layer_ids"))
    report = upgrade(src, str(tmp_path / "out"), UpgradeOptions(fc_norm=False, norm_output=False))
    cfg = load_json(tmp_path / "out" / "config.json")
    assert cfg["eagle_aux_hidden_state_layer_ids"] == [2, 6, 9]
    assert cfg["eagle_config"]["eagle_aux_hidden_state_layer_ids"] == [2, 6, 9]
    assert report.aux["origin"] == "source"


def test_ids_absent_need_a_target_or_an_argument(tmp_path, target):
    src = make_draft(str(tmp_path / "src"), "sglang")  # F2: ids not recorded
    with pytest.raises(UsageError, match="not recorded"):
        upgrade(src, str(tmp_path / "a"))
    report = upgrade(src, str(tmp_path / "b"), UpgradeOptions(target=target))
    assert report.aux["origin"] == "default" and report.aux["ids"] == [2, 6, 9]
    assert any("engine default" in w for w in report.warnings)


@pytest.mark.parametrize("layout", ["modelopt", "modelopt-megatron"])
def test_modelopt_empty_id_list_resolves_to_its_default_ids_with_the_guess_stated(tmp_path, target, layout):
    # ModelOpt's export template writes [] when training used its default ids; vLLM reads [] as not written
    src = make_draft(str(tmp_path / "src"), layout)
    cfg = load_json(os.path.join(src, "config.json"))
    cfg["eagle_config"]["eagle_aux_hidden_state_layer_ids"] = []
    cfg.pop("eagle_aux_hidden_state_layer_ids", None)
    with open(os.path.join(src, "config.json"), "w") as fh:
        json.dump(cfg, fh)
    assert not [f for f in run_rules(load_draft(src)).findings if f.code == "EK157"]
    with pytest.raises(UsageError, match="not recorded"):
        upgrade(src, str(tmp_path / "a"))
    report = upgrade(src, str(tmp_path / "b"), UpgradeOptions(target=target, fc_norm=False, norm_output=False))
    assert report.aux["origin"] == "default" and report.aux["ids"] == [2, 6, 9]
    assert any("engine default" in w for w in report.warnings)
    assert load_json(tmp_path / "b" / "config.json")["eagle_aux_hidden_state_layer_ids"] == [2, 6, 9]
    over = upgrade(src, str(tmp_path / "c"), UpgradeOptions(target=target, fc_norm=False, norm_output=False,
                                                             aux_layer_ids=(3, 6, 9)))
    assert over.aux["origin"] == "argument"
    assert load_json(tmp_path / "c" / "config.json")["eagle_aux_hidden_state_layer_ids"] == [3, 6, 9]


def test_an_empty_id_list_stays_an_error_for_producers_that_never_write_one(tmp_path):
    src = make_draft(str(tmp_path / "src"), "specforge", config_patch={"eagle_config": {
        **load_json(make_draft(str(tmp_path / "probe"), "specforge") + "/config.json")["eagle_config"],
        "eagle_aux_hidden_state_layer_ids": []}})
    assert [f for f in run_rules(load_draft(src)).findings if f.code == "EK157"]


@pytest.mark.parametrize("convention,given", [("input", "3,7,10"), ("output", "2,6,9")])
def test_explicit_ids_in_either_convention(tmp_path, convention, given):
    src = make_draft(str(tmp_path / "src"), "sglang")
    ids = tuple(int(i) for i in given.split(","))
    report = upgrade(src, str(tmp_path / "out"), UpgradeOptions(aux_layer_ids=ids, aux_convention=convention))
    assert report.aux["origin"] == "argument"
    assert load_json(tmp_path / "out" / "config.json")["eagle_aux_hidden_state_layer_ids"] == [3, 7, 10]


def test_unknown_convention_is_refused_until_named(tmp_path):
    # an MLA draft with nested ids whose first id is neither 1 nor 2: the convention cannot be inferred
    src = make_draft(str(tmp_path / "src"), "kimi", attention="mla", draft_vocab=None, aux_ids=(4, 6, 9))
    with pytest.raises(UsageError, match="--aux-convention"):
        upgrade(src, str(tmp_path / "a"))
    report = upgrade(src, str(tmp_path / "b"), UpgradeOptions(aux_convention="output"))
    assert report.aux["ids"] == [5, 7, 10]


def test_argument_overriding_the_source_is_reported(tmp_path):
    src = make_draft(str(tmp_path / "src"), "specforge")
    report = upgrade(src, str(tmp_path / "out"), UpgradeOptions(aux_layer_ids=(3, 7, 10)))
    assert report.aux["ids"] == [3, 7, 10] and report.aux["source_ids"] == [2, 6, 9]
    assert any("override" in w for w in report.warnings)


def test_ids_count_must_match_k(tmp_path):
    src = make_draft(str(tmp_path / "src"), "sglang")
    with pytest.raises(UsageError, match="K=3"):
        upgrade(src, str(tmp_path / "out"), UpgradeOptions(aux_layer_ids=(2, 6)))


# ---------------------------------------------------------------- lossless mode


@pytest.mark.parametrize("key", IDS)
def test_lossless_mode_keeps_every_tensor_byte_for_byte(sources, target, tmp_path, key):
    src = sources[key]
    report = upgrade(src, str(tmp_path / "out"), UpgradeOptions(target=target, fc_norm=False, norm_output=False))
    assert report.function == "preserved" and report.summary.startswith("function-preserving")
    source_bytes = raw_tensors(src)
    out_spec = load_draft(str(tmp_path / "out"))
    for step in report.tensors:
        if step.action in ("copy", "rename"):
            ref = next(r for r in out_spec.tensors.values() if r.source_name == step.name)
            assert read_bytes(out_spec.path, ref) == source_bytes[step.source], step.name
    assert not [s for s in report.tensors if s.action == "add" and s.name.startswith("fc_norm")]
    cfg = load_json(tmp_path / "out" / "config.json")
    assert cfg["fc_norm"] is False and cfg["norm_output"] is False
    jsonschema.validate(cfg, VLLM31)


def test_lossless_mode_on_a_frequency_ordered_map_keeps_every_logit(tmp_path):
    recipe = Recipe(frequency_ordered=True, seed=3)
    src = make_draft(str(tmp_path / "src"), "modelopt", recipe)
    report = upgrade(src, str(tmp_path / "out"), UpgradeOptions(fc_norm=False, norm_output=False))
    assert report.vocab["action"] == "sorted"
    truth = canonical_tensors(recipe)
    out = tensors_of(str(tmp_path / "out"))
    ids_out = np.arange(128) + out["d2t"]
    assert np.all(np.diff(ids_out) > 0)
    assert np.array_equal(np.flatnonzero(out["t2d"]), ids_out)
    h = np.random.default_rng(0).standard_normal(64).astype(np.float32)

    def full_logits(head, ids):
        logits = np.full(256, -np.inf, dtype=np.float32)
        logits[ids] = head @ h
        return logits

    src_head = tensors_of(src)["lm_head.weight"]
    np.testing.assert_array_equal(full_logits(src_head, np.arange(128) + truth["d2t"]),
                                  full_logits(out["lm_head.weight"], ids_out))


def test_identity_map_with_full_vocab_is_dropped(tmp_path):
    # SpecForge writes an all-zero d2t and an all-ones t2d even when the vocabulary is not pruned (P23)
    zeros = np.zeros(256, dtype=np.int64)
    src = make_draft(str(tmp_path / "src"), "specforge", draft_vocab=None,
                     add={"d2t": zeros, "t2d": np.ones(256, bool)})
    report = upgrade(src, str(tmp_path / "out"), UpgradeOptions(fc_norm=False, norm_output=False))
    assert report.vocab["action"] == "identity-dropped"
    assert {s.source for s in report.tensors if s.action == "drop"} == {"d2t", "t2d"}
    names = set(tensors_of(str(tmp_path / "out")))
    assert "d2t" not in names and "t2d" not in names


# ---------------------------------------------------------------- idempotence, dry run, options


@pytest.mark.parametrize("key", ["modelopt-llama", "speculators-qwen3", "kimi-mla"])
def test_upgrading_an_upgraded_draft_changes_nothing_but_provenance(sources, target, tmp_path, key):
    first, second = str(tmp_path / "first"), str(tmp_path / "second")
    upgrade(sources[key], first, UpgradeOptions(target=target, fc_norm=True, norm_output=True))
    report = upgrade(first, second, UpgradeOptions(target=target, fc_norm=True, norm_output=True))
    assert report.function == "preserved"
    assert report.counts["add"] == report.counts["transform"] == report.counts["drop"] == 0
    assert raw_tensors(first) == raw_tensors(second)
    a, b = (load_json(os.path.join(p, "config.json")) for p in (first, second))
    assert a.pop("eaglekit") != b.pop("eaglekit")
    assert a == b


def test_dry_run_writes_nothing_and_lists_every_tensor(sources, target, tmp_path):
    before = sorted(os.listdir(tmp_path))
    report = upgrade(sources["modelopt-llama"], str(tmp_path / "out"),
                     UpgradeOptions(target=target, fc_norm=True, norm_output=True, dry_run=True))
    assert sorted(os.listdir(tmp_path)) == before
    assert report.dry_run and report.output["files"] == []
    source_names = set(raw_tensors(sources["modelopt-llama"]))
    assert {s.source for s in report.tensors if s.source} == source_names
    assert {s.action for s in report.tensors} == {"copy", "transform", "add"}
    assert report.config["fc_norm"] is True


def test_dry_run_reports_that_a_real_run_would_refuse(sources, tmp_path):
    dst = tmp_path / "out"
    dst.mkdir()
    (dst / "keep").write_text("x")
    report = upgrade(sources["vllm-llama"], str(dst), UpgradeOptions(dry_run=True))
    assert any("--force" in w for w in report.warnings)
    assert os.listdir(dst) == ["keep"]


def test_sharded_output_has_a_correct_index(sources, target, tmp_path):
    out = str(tmp_path / "out")
    upgrade(sources["specforge-hf-llama"], out,
            UpgradeOptions(target=target, fc_norm=True, norm_output=True, max_shard_size=20_000))
    index = load_json(os.path.join(out, "model.safetensors.index.json"))
    shards = sorted(set(index["weight_map"].values()))
    assert len(shards) > 1 and all(os.path.exists(os.path.join(out, s)) for s in shards)
    spec = load_draft(out)
    assert index["metadata"]["total_size"] == spec.total_bytes
    assert run_rules(spec, target=read_target(target)).errors == 0


def test_sharded_source(tmp_path, target):
    src = make_draft(str(tmp_path / "src"), "speculators", shards=3)
    upgrade(src, str(tmp_path / "out"), UpgradeOptions(target=target, fc_norm=False, norm_output=False))
    assert raw_tensors(src) == raw_tensors(str(tmp_path / "out"))


def test_dtype_widening_is_exact_and_narrowing_is_reported(sources, tmp_path):
    src = sources["vllm-llama"]
    wide = upgrade(src, str(tmp_path / "f32"), UpgradeOptions(fc_norm=False, norm_output=False, dtype="F32"))
    assert wide.function == "preserved"
    a, b = tensors_of(src), tensors_of(str(tmp_path / "f32"))
    assert all(np.array_equal(a[n], b[n]) for n in a)
    assert load_draft(str(tmp_path / "f32")).dtype == "F32"
    assert load_json(tmp_path / "f32" / "config.json")["torch_dtype"] == "float32"
    narrow = upgrade(str(tmp_path / "f32"), str(tmp_path / "f16"),
                     UpgradeOptions(fc_norm=False, norm_output=False, dtype="F16"))
    assert narrow.function == "approximate"
    assert "--dtype F16 rounds F32 weights; magnitudes below 6e-8 become 0" in narrow.summary
    c = tensors_of(str(tmp_path / "f16"))
    assert np.allclose(c["fc.weight"], a["fc.weight"], rtol=1e-2, atol=1e-3)


def test_sglang_dialect_writes_output_of_layer_ids_and_midlayer_names(sources, target, tmp_path):
    out = str(tmp_path / "out")
    upgrade(sources["specforge-llama"], out, UpgradeOptions(target=target, fc_norm=True, norm_output=True, to="sglang"))
    cfg = load_json(os.path.join(out, "config.json"))
    jsonschema.validate(cfg, EAGLE3)
    assert cfg["eagle_config"]["eagle_aux_hidden_state_layer_ids"] == [1, 5, 8]
    assert "eagle_aux_hidden_state_layer_ids" not in cfg
    assert any(n.startswith("midlayer.") for n in raw_tensors(out))
    spec = load_draft(out)  # detected as an SGLang-convention layout: the ids read back right
    assert spec.aux.ids == (2, 6, 9)
    assert run_rules(spec, target=read_target(target), engine="sglang").errors == 0


def test_sglang_dialect_keeps_vllm_ids_for_a_deepseek_target(sources, tmp_path):
    kimi_target = make_target_config(str(tmp_path / "kimi"))
    cfg = load_json(os.path.join(kimi_target, "config.json"))
    cfg.update(model_type="kimi_k2", architectures=["DeepseekV3ForCausalLM"])
    with open(os.path.join(kimi_target, "config.json"), "w") as fh:
        json.dump(cfg, fh)
    out = str(tmp_path / "out")
    upgrade(sources["kimi-mla"], out, UpgradeOptions(target=kimi_target, fc_norm=True, norm_output=True, to="sglang"))
    assert load_json(os.path.join(out, "config.json"))["eagle_config"]["eagle_aux_hidden_state_layer_ids"] == [2, 6, 9]


@pytest.mark.parametrize("key", ["speculators-llama", "speculators-qwen3", "specforge-llama",
                                 "modelopt-megatron-llama"])
def test_speculators_dialect(sources, target, tmp_path, key):
    out = str(tmp_path / "out")
    upgrade(sources[key], out, UpgradeOptions(target=target, fc_norm=True, norm_output=True, to="speculators"))
    cfg = load_json(os.path.join(out, "config.json"))
    jsonschema.validate(cfg, SPECULATORS)
    assert cfg["transformer_layer_config"]["num_aux_hidden_states"] == 3  # P11
    assert isinstance(cfg["norm_before_residual"], bool)  # P12
    spec = load_draft(out)
    assert spec.family == "speculators" and spec.aux.ids == (2, 6, 9) and spec.eagle_version == "3.1"


def test_norm_before_residual_is_always_explicit(sources, target, tmp_path):
    upgrade(sources["modelopt-vllm-llama"], str(tmp_path / "a"),
            UpgradeOptions(target=target, fc_norm=True, norm_output=True))
    assert load_json(tmp_path / "a" / "config.json")["norm_before_residual"] is True  # F6c is served with it
    upgrade(sources["eagle-llama"], str(tmp_path / "b"), UpgradeOptions(target=target, fc_norm=True, norm_output=True))
    assert load_json(tmp_path / "b" / "config.json")["norm_before_residual"] is False


# ---------------------------------------------------------------- refusals


def test_existing_output_is_refused_and_untouched(sources, tmp_path):
    dst = tmp_path / "out"
    dst.mkdir()
    (dst / "precious").write_text("x")
    with pytest.raises(UsageError, match="--force"):
        upgrade(sources["vllm-llama"], str(dst))
    assert os.listdir(dst) == ["precious"]
    upgrade(sources["vllm-llama"], str(dst), UpgradeOptions(force=True))
    assert sorted(os.listdir(dst)) == ["config.json", "model.safetensors"]


def test_output_inside_the_source_is_refused(sources):
    with pytest.raises(UsageError, match="overlaps"):
        upgrade(sources["vllm-llama"], os.path.join(sources["vllm-llama"], "sub"))
    with pytest.raises(UsageError, match="overlaps"):
        upgrade(sources["vllm-llama"], sources["vllm-llama"], UpgradeOptions(force=True))


def test_unknown_tensors_are_refused(tmp_path):
    src = make_draft(str(tmp_path / "src"), "vllm", add={"parallel_draft_heads.0.weight": np.zeros((4, 4), np.float32)})
    with pytest.raises(CheckpointError, match="P30"):
        upgrade(src, str(tmp_path / "out"))


def test_fc_norm_flag_without_its_tensors_is_refused(tmp_path):
    src = make_draft(str(tmp_path / "src"), "vllm", fc_norm=True,
                     drop=("fc_norm.0.weight", "fc_norm.1.weight", "fc_norm.2.weight"))
    with pytest.raises(CheckpointError, match="P3"):
        upgrade(src, str(tmp_path / "out"))


def test_removing_trained_31_parts_is_refused(tmp_path):
    src = make_draft(str(tmp_path / "src"), "vllm", fc_norm=True, norm_output=True)
    with pytest.raises(UsageError, match="fc_norm"):
        upgrade(src, str(tmp_path / "a"), UpgradeOptions(fc_norm=False))
    with pytest.raises(UsageError, match="norm_output"):
        upgrade(src, str(tmp_path / "b"), UpgradeOptions(norm_output=False))


def test_norm_before_fc_cannot_gain_fc_norm(tmp_path):
    src = make_draft(str(tmp_path / "src"), "speculators-train", norm_before_fc=True)
    with pytest.raises(UsageError, match="P37"):
        upgrade(src, str(tmp_path / "a"), UpgradeOptions(fc_norm=True))
    report = upgrade(src, str(tmp_path / "b"), UpgradeOptions(fc_norm=False))
    assert load_json(tmp_path / "b" / "config.json")["eagle_config"]["norm_before_fc"] is True
    assert report.flags["norm_before_fc"]


def test_vd_smaller_than_v_without_d2t_is_refused(tmp_path):
    src = make_draft(str(tmp_path / "src"), "vllm", drop=("d2t", "t2d"))
    with pytest.raises(CheckpointError, match="P4"):
        upgrade(src, str(tmp_path / "out"))


def test_absolute_ids_in_d2t_are_recognised(tmp_path):
    ids = np.sort(np.random.default_rng(1).choice(256, size=128, replace=False)).astype(np.int64)
    src = make_draft(str(tmp_path / "src"), "vllm", add={"d2t": ids})
    with pytest.raises(CheckpointError, match="absolute ids"):
        upgrade(src, str(tmp_path / "out"))


def test_quantised_drafts_keep_their_scales_and_quant_config(tmp_path):
    scales = {"layers.0.self_attn.q_proj.weight_scale": np.ones(1, np.float32),
              "layers.0.self_attn.q_proj.input_scale": np.ones(1, np.float32)}
    src = make_draft(str(tmp_path / "src"), "modelopt", add=scales,
                     config_patch={"quantization_config": {"quant_method": "modelopt", "quant_algo": "FP8"}})
    (tmp_path / "src" / "hf_quant_config.json").write_text('{"quantization": {"quant_algo": "FP8"}}')
    report = upgrade(src, str(tmp_path / "out"), UpgradeOptions(fc_norm=False, norm_output=False))
    assert report.function == "preserved" and not [f for f in report.findings if f.severity == "error"]
    out, before = raw_tensors(str(tmp_path / "out")), raw_tensors(src)
    assert all(out[name] == data for name, data in before.items())  # scales included, byte for byte
    assert load_json(tmp_path / "out" / "config.json")["quantization_config"]["quant_algo"] == "FP8"
    assert (tmp_path / "out" / "hf_quant_config.json").read_text() == '{"quantization": {"quant_algo": "FP8"}}'


def test_a_draft_failing_validation_is_not_published(tmp_path):
    # T != H without its own embed_tokens: nothing in the plan is wrong, but vLLM cannot serve it (P26)
    src = make_draft(str(tmp_path / "src"), "vllm", target_hidden=32)
    target = make_target_config(str(tmp_path / "target"), hidden=32)
    with pytest.raises(OutputError, match="fails validation"):
        upgrade(src, str(tmp_path / "out"), UpgradeOptions(target=target, fc_norm=True, norm_output=True))
    assert sorted(os.listdir(tmp_path)) == ["src", "target"]


def test_pickle_sources_need_allow_pickle(tmp_path):
    torch = pytest.importorskip("torch")
    src = make_draft(str(tmp_path / "src"), "eagle")
    with safe_open(os.path.join(src, "model.safetensors"), framework="pt") as fh:
        state = {name: fh.get_tensor(name) for name in fh.keys()}
    os.remove(os.path.join(src, "model.safetensors"))
    torch.save(state, os.path.join(src, "pytorch_model.bin"))
    with pytest.raises(CheckpointError, match="--allow-pickle"):
        upgrade(src, str(tmp_path / "a"))
    upgrade(src, str(tmp_path / "b"), UpgradeOptions(allow_pickle=True, fc_norm=False, norm_output=False,
                                                     aux_layer_ids=(2, 6, 9)))
    with safe_open(str(tmp_path / "b" / "model.safetensors"), framework="pt") as fh:
        for name, tensor in state.items():
            canonical = name.replace("midlayer.", "layers.0.")
            assert torch.equal(fh.get_tensor(canonical), tensor)


def test_a_hub_cache_source_is_hashed_by_its_blob_names(tmp_path, monkeypatch):
    """A repo id read from the Hugging Face cache: LFS blobs are named by their SHA-256, which is reused."""
    from huggingface_hub import constants

    draft = make_draft(str(tmp_path / "draft"), "specforge")
    repo = tmp_path / "hub" / "models--org--some-eagle3"
    commit = "0123456789abcdef0123456789abcdef01234567"
    (repo / "blobs").mkdir(parents=True)
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text(commit)
    snapshot = repo / "snapshots" / commit
    snapshot.mkdir(parents=True)
    digests = {}
    for name in ("config.json", "model.safetensors"):
        data = (tmp_path / "draft" / name).read_bytes()
        digests[name] = hashlib.sha256(data).hexdigest()
        (repo / "blobs" / digests[name]).write_bytes(data)
        (snapshot / name).symlink_to(os.path.join("..", "..", "blobs", digests[name]))
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path / "hub"))

    report = upgrade("org/some-eagle3", str(tmp_path / "out"), UpgradeOptions(fc_norm=False, norm_output=False))
    block = load_json(tmp_path / "out" / "config.json")["eaglekit"]
    assert block["source"] == "org/some-eagle3" and report.source["family"] == "specforge"
    assert block["source_files"] == {name: "sha256:" + d for name, d in digests.items()}
    src, out = load_draft(draft), load_draft(str(tmp_path / "out"))
    assert {n: read_bytes(src.path, r) for n, r in src.tensors.items()} == {
        n: read_bytes(out.path, r) for n, r in out.tensors.items()}
