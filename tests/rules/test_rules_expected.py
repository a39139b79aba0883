"""expected_tensors: the name/shape set for a draft's geometry and flags equals what a correct writer produced."""

from __future__ import annotations

import itertools

import pytest

from eaglekit.families import load_draft
from eaglekit.rules import expected_tensors, tensor_expectations
from tests.support.factory import LAYOUTS, Recipe, canonical_tensors, make_draft

COMBOS = [
    {"fc_norm": fc_norm, "norm_output": norm_output, "attention": attention, "draft_vocab": vocab, "layers": layers,
     "embed": embed}
    for fc_norm, norm_output, attention, vocab, layers, embed in itertools.product(
        (False, True), (False, True), ("llama", "qwen3", "mla"), (128, None), (1, 3), (False, True))
    if not (attention == "mla" and layers > 1)
]


def _truth(layout: str, **recipe) -> dict[str, tuple[int, ...]]:
    r = Recipe(**recipe)
    arrays = canonical_tensors(r)
    if layout == "vllm" and r.Vd == r.vocab:
        arrays.pop("d2t", None)
    if (layout == "vllm" and r.Vd == r.vocab) or layout.startswith("modelopt"):
        arrays.pop("t2d", None)  # ModelOpt writes d2t only
    return {name: a.shape for name, a in arrays.items()}


@pytest.mark.parametrize("recipe", COMBOS, ids=lambda r: "-".join(f"{k}={v}" for k, v in r.items()))
def test_expected_set_is_exactly_what_the_fixture_wrote(recipe, tmp_path):
    spec = load_draft(make_draft(str(tmp_path), "vllm", **recipe))
    assert expected_tensors(spec) == _truth("vllm", **recipe)


@pytest.mark.parametrize("layout", LAYOUTS)
def test_every_published_layout_reads_into_the_same_expected_set(layout, tmp_path):
    recipe = {"attention": "mla"} if layout == "kimi" else {}  # the Kimi layout is MLA-only
    spec = load_draft(make_draft(str(tmp_path), layout, **recipe))
    assert expected_tensors(spec) == _truth(layout, **recipe)


def test_required_and_optional_follow_the_vocabulary_and_hidden_sizes(tmp_path):
    full = load_draft(make_draft(str(tmp_path / "full"), "vllm", draft_vocab=None, lm_head=False))
    by_name = {e.name: e for e in tensor_expectations(full)}
    assert not by_name["lm_head.weight"].required and "lm_head.weight" not in expected_tensors(full)
    assert "d2t" not in by_name and "t2d" not in by_name

    wide = load_draft(make_draft(str(tmp_path / "wide"), "vllm", target_hidden=96, embed=True))
    by_name = {e.name: e for e in tensor_expectations(wide)}
    assert by_name["embed_tokens.weight"].required and by_name["embed_tokens.weight"].shape == (256, 64)
    assert by_name["fc.weight"].shape == (64, 3 * 96)
    assert by_name["d2t"].required and by_name["d2t"].kind == "int64" and not by_name["t2d"].required


def test_use_aux_hidden_state_false_drops_fc_for_the_llama_class(tmp_path):
    patch = {"eagle_config": {"use_aux_hidden_state": False}}
    spec = load_draft(make_draft(str(tmp_path), "vllm", config_patch=patch, drop=("fc.weight",)))
    assert "fc.weight" not in expected_tensors(spec)
