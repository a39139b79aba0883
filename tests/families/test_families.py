"""Every published layout is detected by its tensors and config, with the right geometry, ids and vocab facts."""

import json
import os
import shutil

import pytest

from eaglekit import load_draft
from eaglekit.errors import CheckpointError, NotEagle3DraftError, UnknownLayoutError, UsageError
from eaglekit.target import read_target
from tests.support.cli import run_cli
from tests.support.factory import Recipe, edit_config, make_draft, make_target_config, pickle_checkpoint

# layout -> (family, convention the layout writes ids in, recipe overrides)
CASES = {
    "eagle": ("eagle", None, {}),
    "sglang": ("sglang", None, {}),
    "specforge": ("specforge", "output", {}),
    "specforge-hf": ("specforge", "output", {"embed": True}),
    "speculators": ("speculators", "input", {}),
    "speculators-train": ("speculators", "input", {"norm_before_fc": True, "norm_output": True, "layers": 2}),
    "modelopt": ("modelopt", "output", {"frequency_ordered": True}),
    "modelopt-megatron": ("modelopt-megatron", "output", {"layers": 2}),
    "modelopt-vllm": ("modelopt-vllm", None, {}),
    "torchspec": ("torchspec", "output", {"embed": True}),
    "torchspec-vllm": ("torchspec", "output", {"embed": True}),
    "angelslim": ("angelslim", None, {}),
    "kimi": ("mla", "input", {"attention": "mla", "draft_vocab": None, "embed": True, "fc_norm": True,
                              "norm_output": True}),
    "vllm": ("vllm", "input", {"fc_norm": True, "norm_output": True}),
}


@pytest.fixture(scope="module")
def target(tmp_path_factory):
    return read_target(make_target_config(str(tmp_path_factory.mktemp("target")), layers=12))


@pytest.mark.parametrize("layout", sorted(CASES))
def test_layout_detected_with_facts(tmp_path, layout, target):
    family, convention, overrides = CASES[layout]
    recipe = Recipe(**overrides)
    spec = load_draft(make_draft(str(tmp_path / layout), layout, recipe))
    assert spec.family == family
    g = spec.geometry
    assert (g.hidden_size, g.intermediate_size, g.num_layers) == (recipe.hidden, recipe.intermediate, recipe.layers)
    assert spec.num_aux_hidden_states == recipe.k
    assert spec.attention == recipe.attention
    assert spec.vocab.draft_vocab_size == recipe.Vd
    assert spec.vocab.has_d2t == ("d2t" in spec.tensors) == (recipe.Vd < recipe.vocab)
    assert spec.has_embed_tokens == recipe.embed
    assert (spec.flags.fc_norm, spec.flags.norm_output, spec.flags.norm_before_fc) == \
        (recipe.fc_norm, recipe.norm_output, recipe.norm_before_fc)
    assert all(not n.startswith(("model.", "midlayer")) for n in spec.tensors)
    assert f"layers.{recipe.layers - 1}.mlp.down_proj.weight" in spec.tensors
    if convention is None:
        assert spec.aux.ids is None and spec.aux.as_written is None
        with_target = load_draft(spec.path, target=target)
        assert with_target.aux.ids == target.default_aux_ids
        assert with_target.aux.location == "default"
    else:
        assert spec.aux.ids == recipe.aux_ids
        shift = 1 if convention == "output" else 0
        assert spec.aux.as_written == tuple(i - shift for i in recipe.aux_ids)
        assert spec.aux.convention == convention


def test_torchspec_vllm_export_of_kimi_is_already_shifted(tmp_path):
    """TorchSpec --vllm adds +1 only for kimi_k2 drafts (reference §5.1)."""
    r = Recipe(attention="mla", draft_vocab=None, embed=True)
    spec = load_draft(make_draft(str(tmp_path / "k"), "torchspec-vllm", r))
    assert spec.family == "torchspec" and spec.attention == "mla"
    assert spec.aux.as_written == r.aux_ids == spec.aux.ids


def test_heuristic_convention_is_marked_as_guessed(tmp_path):
    spec = load_draft(make_draft(str(tmp_path / "k"), "kimi", attention="mla", draft_vocab=None, aux_ids=(2, 6, 9)))
    assert spec.aux.ids == (2, 6, 9) and not spec.aux.convention_known
    spec = load_draft(make_draft(str(tmp_path / "k1"), "kimi", attention="mla", draft_vocab=None, aux_ids=(1, 6, 9)))
    # first id 1 reads as output-of-layer (SGLang's DeepSeek heuristic, P47)
    assert spec.aux.as_written == (1, 6, 9) and spec.aux.ids == (2, 7, 10)


def test_megatron_hidden_norm_of_later_layers_becomes_input_layernorm(tmp_path):
    spec = load_draft(make_draft(str(tmp_path / "m"), "modelopt-megatron", layers=3))
    for i in (1, 2):
        ref = spec.tensors[f"layers.{i}.input_layernorm.weight"]
        assert ref.source_name == f"midlayer.{i}.hidden_norm.weight"
        assert f"layers.{i}.hidden_norm.weight" not in spec.tensors
    assert spec.facts.renamed_hidden_norm_layers == (1, 2)


def test_tensors_win_over_config_layer_count(tmp_path):
    """P49: a config that says 36 layers while the tensors hold one."""
    spec = load_draft(make_draft(str(tmp_path / "d"), "sglang", config_patch={"num_hidden_layers": 36}))
    assert spec.geometry.num_layers == 1
    assert spec.facts.config_num_layers == 36


def test_target_fills_in_hidden_size_and_k(tmp_path):
    r = Recipe(target_hidden=96)
    path = make_draft(str(tmp_path / "d"), "eagle", r, config_patch={"target_hidden_size": None})
    bare = load_draft(path)
    assert bare.num_aux_hidden_states is None  # 3*96 is not a multiple of H=64
    tgt = read_target(make_target_config(str(tmp_path / "t"), hidden=96))
    spec = load_draft(path, target=tgt)
    assert spec.geometry.target_hidden_size == 96 and spec.num_aux_hidden_states == 3


def test_sharded_checkpoint_reads_like_single_file(tmp_path):
    single = load_draft(make_draft(str(tmp_path / "one"), "vllm"))
    sharded = load_draft(make_draft(str(tmp_path / "three"), "vllm", shards=3))
    assert len(sharded.files) == 3
    assert {n: (t.dtype, t.shape) for n, t in single.tensors.items()} == \
        {n: (t.dtype, t.shape) for n, t in sharded.tensors.items()}


def test_index_naming_missing_shard(tmp_path):
    path = make_draft(str(tmp_path / "d"), "vllm", shards=2)
    os.remove(os.path.join(path, "model-00002-of-00002.safetensors"))
    with pytest.raises(CheckpointError, match="does not exist"):
        load_draft(path)


def test_index_and_shards_disagree(tmp_path):
    path = make_draft(str(tmp_path / "d"), "vllm", shards=2)
    index_path = os.path.join(path, "model.safetensors.index.json")
    index = json.load(open(index_path))
    name = next(iter(index["weight_map"]))
    first = index["weight_map"][name].startswith("model-00001")
    index["weight_map"][name] = "model-00002-of-00002.safetensors" if first else "model-00001-of-00002.safetensors"
    json.dump(index, open(index_path, "w"))
    with pytest.raises(CheckpointError, match="does not hold it"):
        load_draft(path)
    index["weight_map"] = {k: v for k, v in index["weight_map"].items() if k != name}
    json.dump(index, open(index_path, "w"))
    with pytest.raises(CheckpointError, match="missing from the index"):
        load_draft(path)


def _linked_copy(folder, outside: str) -> str:
    """`folder` with outside's config.json copied and its weights a symbolic link to outside's."""
    folder.mkdir(parents=True)
    (folder / "config.json").write_text(open(os.path.join(outside, "config.json")).read())
    os.symlink(os.path.join(outside, "model.safetensors"), folder / "model.safetensors")
    return str(folder)


def test_weights_linked_from_shared_storage_into_a_folder_the_user_names_are_read(tmp_path):
    outside = make_draft(str(tmp_path / "shared" / "models"), "vllm")
    linked = load_draft(_linked_copy(tmp_path / "mine", outside))
    assert linked.tensors.keys() == load_draft(outside).tensors.keys()
    target = tmp_path / "target"  # a target's files too
    target.mkdir()
    os.symlink(make_target_config(str(tmp_path / "shared" / "target")) + "/config.json", target / "config.json")
    assert read_target(str(target)).num_layers == 12


def test_a_symlink_in_a_user_folder_must_reach_a_regular_file(tmp_path):
    outside = make_draft(str(tmp_path / "outside"), "vllm")
    folder = tmp_path / "mine"
    _linked_copy(folder, outside)
    os.unlink(folder / "model.safetensors")
    os.mkfifo(tmp_path / "fifo")
    for points_to, says in ((tmp_path / "gone.safetensors", "symlink points to nothing"),
                            (tmp_path / "fifo", "symlink points to a FIFO, socket or device")):
        if os.path.lexists(folder / "model.safetensors"):
            os.unlink(folder / "model.safetensors")
        os.symlink(points_to, folder / "model.safetensors")
        with pytest.raises(CheckpointError, match=f"^{folder}/model.safetensors: {says}"):
            load_draft(str(folder))


def test_a_repository_fetched_from_the_hub_may_not_link_out_of_its_cache_folder(tmp_path):
    outside = make_draft(str(tmp_path / "outside"), "vllm")
    snapshot = _linked_copy(tmp_path / "hub" / "models--org--draft" / "snapshots" / "0123abc", outside)
    with pytest.raises(CheckpointError, match="symlink points outside the checkpoint directory"):
        load_draft(snapshot)
    blobs = tmp_path / "hub" / "models--org--draft" / "blobs"  # the cache's own layout: snapshots -> blobs
    blobs.mkdir()
    shutil.copy(os.path.join(outside, "model.safetensors"), blobs / "f00d")
    os.unlink(os.path.join(snapshot, "model.safetensors"))
    os.symlink("../../blobs/f00d", os.path.join(snapshot, "model.safetensors"))
    assert load_draft(snapshot).tensors.keys() == load_draft(outside).tensors.keys()


def test_pickle_weights_need_the_flag(tmp_path):
    torch = pytest.importorskip("torch")
    from eaglekit.io.tensors import load_tensor

    path = make_draft(str(tmp_path / "src"), "eagle")
    spec = load_draft(path)
    state = {t.source_name: load_tensor(spec, n) for n, t in spec.tensors.items()}
    d = pickle_checkpoint(str(tmp_path / "bin"), path, state)
    with pytest.raises(CheckpointError, match="--allow-pickle"):
        load_draft(str(d))
    loaded = load_draft(str(d), allow_pickle=True)
    assert loaded.family == "eagle" and set(loaded.tensors) == set(spec.tensors)
    assert torch.equal(load_tensor(loaded, "fc.weight"), load_tensor(spec, "fc.weight"))


def test_subfolders_must_be_chosen(tmp_path):
    make_draft(str(tmp_path / "repo" / "full"), "vllm", draft_vocab=None)
    make_draft(str(tmp_path / "repo" / "compressed"), "vllm")
    with pytest.raises(UsageError, match=r"\['compressed', 'full'\]"):
        load_draft(str(tmp_path / "repo"))
    assert load_draft(str(tmp_path / "repo"), subfolder="compressed").vocab.has_d2t


@pytest.mark.parametrize("case", ["missing-dir", "no-config", "bad-json", "no-weights"])
def test_bad_directories(tmp_path, case):
    d = tmp_path / "d"
    if case != "missing-dir":
        d.mkdir()
    if case == "bad-json":
        (d / "config.json").write_text("{oops")
    if case == "no-weights":
        (d / "config.json").write_text("{}")
    with pytest.raises(CheckpointError) as info:
        load_draft(str(d))
    assert "\n" not in str(info.value)


def test_unknown_layout_lists_what_was_found(tmp_path):
    path = make_draft(str(tmp_path / "d"), "vllm", config_patch={"architectures": ["MysteryModel"]})
    with pytest.raises(UnknownLayoutError, match=r"MysteryModel.*name forms"):
        load_draft(path)


@pytest.mark.parametrize("architecture, family", [("DFlash2DraftModel", "dflash2"), ("DSparkV41ForCausalLM", "dspark"),
                                                  ("Qwen3XPressForCausalLM", "xpress")])
def test_drafts_of_other_speculative_methods_are_refused_not_misread(tmp_path, architecture, family):
    path = edit_config(make_draft(str(tmp_path / "d"), "vllm"), lambda c: c.update(architectures=[architecture]))
    with pytest.raises(NotEagle3DraftError, match="not an EAGLE-3 draft: vLLM serves it") as info:
        load_draft(path, family="vllm")  # whatever --family says
    assert info.value.draft.family == family
    result = run_cli(["upgrade", path, str(tmp_path / "out")])
    assert result.exit_code == 1 and len(result.stderr.strip().splitlines()) == 1
    assert "not an EAGLE-3 draft" in result.stderr and not (tmp_path / "out").exists()


def test_output_of_layer_ids_that_include_L_are_read_as_hidden_state_indices(tmp_path):
    """nvidia/gpt-oss-120b-Eagle3-v3 writes [24, 30, 36] for L = 36: no layer 36 has an output, so +1 is wrong (P18)."""
    from eaglekit.rules import run_rules

    target = read_target(make_target_config(str(tmp_path / "t"), layers=12))
    path = make_draft(str(tmp_path / "d"), "modelopt", aux_ids=(3, 7, 13))  # written output-of-layer: 2, 6, 12
    spec = load_draft(path, target=target)
    assert spec.aux.as_written == (2, 6, 12) and spec.aux.ids == (2, 6, 12) and spec.aux.convention == "input"
    assert not spec.aux.convention_known
    codes = {f.code: f.severity for f in run_rules(spec, target=target).findings}
    assert codes.get("EK143") == "warning" and "error" not in {codes[c] for c in codes if c.startswith("EK2")}
    assert load_draft(path).aux.ids == (3, 7, 13)  # without the target's L the producer's convention stands
