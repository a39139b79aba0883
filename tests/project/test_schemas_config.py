"""The config schemas accept what each producer publishes (the fixtures model the real configs) and what the
dialects write, and reject the broken configs behind the pitfalls."""

from __future__ import annotations

import copy
import json
import os

import jsonschema
import pytest

from eaglekit.families import load_draft
from eaglekit.target import read_target
from eaglekit.upgrade.decide import decide
from eaglekit.upgrade.dialects import get_dialect
from eaglekit.upgrade.options import UpgradeOptions
from eaglekit.upgrade.vocab import plan_vocab
from tests.support import REPO
from tests.support.factory import Recipe, layout_files, make_draft, make_target_config


def load_json(path) -> dict:
    with open(path, encoding="utf-8") as fh:
        return json.load(fh)


SCHEMAS = os.path.join(str(REPO), "schemas")


def schema(name: str) -> dict:
    doc = load_json(os.path.join(SCHEMAS, f"{name}.schema.json"))
    jsonschema.Draft202012Validator.check_schema(doc)
    return doc


EAGLE3, VLLM31, SPECULATORS = schema("eagle3-config"), schema("vllm-eagle31-config"), schema("speculators-config")
FLAT = ["eagle", "sglang", "specforge", "specforge-hf", "modelopt", "modelopt-megatron", "torchspec", "torchspec-vllm",
        "angelslim", "vllm"]
SPECULATORS_LAYOUTS = ["speculators", "speculators-train", "modelopt-vllm"]


def valid(doc: dict, against: dict) -> bool:
    return jsonschema.Draft202012Validator(against).is_valid(doc)


def errors(doc: dict, against: dict) -> list[str]:
    return [e.message for e in jsonschema.Draft202012Validator(against).iter_errors(doc)]


def config(layout: str, **overrides) -> dict:
    return layout_files(layout, Recipe(**overrides))[0]


@pytest.mark.parametrize("layout", FLAT)
def test_published_flat_configs_are_eagle3_configs(layout):
    assert valid(config(layout), EAGLE3)
    assert not valid(config(layout), SPECULATORS)


@pytest.mark.parametrize("attention", ["mla"])
@pytest.mark.parametrize("layout", ["kimi", "torchspec", "torchspec-vllm"])
def test_published_mla_configs_are_eagle3_configs(layout, attention):
    assert valid(config(layout, attention=attention, draft_vocab=None), EAGLE3)


@pytest.mark.parametrize("layout", SPECULATORS_LAYOUTS)
@pytest.mark.parametrize("attention", ["llama", "qwen3"])
def test_published_speculators_configs(layout, attention):
    cfg = config(layout, attention=attention)
    assert valid(cfg, SPECULATORS)
    assert not valid(cfg, EAGLE3) and not valid(cfg, VLLM31)


@pytest.mark.parametrize("attention", ["llama", "qwen3", "mla"])
@pytest.mark.parametrize("flags", [(True, True), (False, False)])
def test_vllm_ready_configs(attention, flags):
    cfg = config("vllm", attention=attention, fc_norm=flags[0], norm_output=flags[1],
                 draft_vocab=None if attention == "mla" else 128)
    assert valid(cfg, VLLM31), errors(cfg, VLLM31)
    assert valid(cfg, EAGLE3)


def test_published_but_not_vllm_ready_configs_are_rejected():
    # ids only nested and in output convention, no num_aux_hidden_states, no explicit norm_before_residual
    assert not valid(config("specforge"), VLLM31)
    assert not valid(config("eagle"), VLLM31)  # LlamaForCausalLM, no ids, no rope_theta
    assert not valid(config("modelopt"), VLLM31)


def _vllm31() -> dict:
    return config("vllm", fc_norm=True, norm_output=True)


def _mla31() -> dict:
    return config("vllm", attention="mla", draft_vocab=None, fc_norm=True, norm_output=True)


def _set(path: str, value):
    def apply(cfg):
        *parents, last = path.split(".")
        node = cfg
        for p in parents:
            node = node[p]
        if value is KeyError:
            del node[last]
        else:
            node[last] = value
    return apply


BROKEN_VLLM31 = {
    "no K": (_vllm31, _set("num_aux_hidden_states", KeyError)),
    "model_type eagle (P14)": (_vllm31, _set("model_type", "eagle")),
    "unregistered architecture (P14)": (_vllm31, _set("architectures", ["Qwen3ForCausalLMEagle3"])),
    "qwen3 type with the Llama class (P13)": (_vllm31, _set("model_type", "qwen3")),
    "tied embeddings (P28)": (_vllm31, _set("tie_word_embeddings", True)),
    "duplicate ids (P20)": (_vllm31, _set("eagle_aux_hidden_state_layer_ids", [2, 2, 9])),
    "negative id": (_vllm31, _set("eagle_aux_hidden_state_layer_ids", [-1, 6, 9])),
    "ids only nested (P17)": (_vllm31, _set("eagle_aux_hidden_state_layer_ids", KeyError)),
    "use_aux_hidden_state false": (_vllm31, _set("eagle_config.use_aux_hidden_state", False)),
    "norm_before_residual implicit (P12)": (_vllm31, _set("norm_before_residual", KeyError)),
    "fc_norm implicit": (_vllm31, _set("fc_norm", KeyError)),
    "flag as a string": (_vllm31, _set("norm_output", "true")),
    "fc_norm with norm_before_fc (P37)": (_vllm31, _set("norm_before_fc", True)),
    "fc_norm with nested norm_before_fc (P37)": (_vllm31, _set("eagle_config.norm_before_fc", True)),
    "no max_position_embeddings": (_vllm31, _set("max_position_embeddings", KeyError)),
    "speculators layout": (_vllm31, _set("speculators_config", {})),
    "MLA without q_lora_rank (P31)": (_mla31, _set("q_lora_rank", None)),
    "MLA with an indexer key (P31)": (_mla31, _set("index_topk", 2048)),
    "MLA with the Llama class": (_mla31, _set("architectures", ["LlamaForCausalLMEagle3"])),
    "MLA with norm_before_fc": (lambda: config("vllm", attention="mla", draft_vocab=None),
                                _set("norm_before_fc", True)),
}


@pytest.mark.parametrize("case", sorted(BROKEN_VLLM31))
def test_broken_vllm_configs_are_rejected(case):
    make, mutate = BROKEN_VLLM31[case]
    cfg = make()
    assert valid(cfg, VLLM31)
    mutate(cfg)
    assert not valid(cfg, VLLM31)


BROKEN_EAGLE3 = {
    "no hidden_size": _set("hidden_size", KeyError),
    "string ids": _set("eagle_config", {"eagle_aux_hidden_state_layer_ids": ["1", "5", "8"]}),
    "negative id": _set("eagle_config", {"eagle_aux_hidden_state_layer_ids": [-1, 5, 8]}),
    "flag as a string": _set("fc_norm", "yes"),
    "EAGLE-1 model_type (P14)": _set("model_type", "eagle"),
    "zero layers": _set("num_hidden_layers", 0),
}


@pytest.mark.parametrize("case", sorted(BROKEN_EAGLE3))
def test_broken_flat_configs_are_rejected(case):
    cfg = config("specforge")
    BROKEN_EAGLE3[case](cfg)
    assert not valid(cfg, EAGLE3)


BROKEN_SPECULATORS = {
    "top-level model_type hides the layout from vLLM": _set("model_type", "llama"),
    "MLA layer config (P31)": _set("transformer_layer_config.model_type", "deepseek_v3"),
    "fc_norm with norm_before_fc (P37)": lambda c: c.update(fc_norm=True, norm_before_fc=True),
    "no verifier (P34)": _set("speculators_config.verifier", KeyError),
    "no speculative tokens (P34)": _set("speculators_config.proposal_methods", [{"proposal_type": "greedy"}]),
    "another algorithm": _set("speculators_config.algorithm", "mlp_speculator"),
    "no transformer_layer_config": _set("transformer_layer_config", KeyError),
}


@pytest.mark.parametrize("case", sorted(BROKEN_SPECULATORS))
def test_broken_speculators_configs_are_rejected(case):
    cfg = config("speculators")
    BROKEN_SPECULATORS[case](cfg)
    assert not valid(cfg, SPECULATORS)


# ---------------------------------------------------------------- what the dialects write


@pytest.fixture(scope="module")
def written(tmp_path_factory):
    """Every dialect's config for every source layout, from the real decision path (nothing is written)."""
    base = tmp_path_factory.mktemp("dialects")
    target = read_target(make_target_config(str(base / "target")))
    out = {}
    for layout in FLAT + SPECULATORS_LAYOUTS + ["kimi"]:
        over = {"attention": "mla", "draft_vocab": None} if layout == "kimi" else {}
        spec = load_draft(make_draft(str(base / layout), layout, **over), target=target)
        for to in ("vllm", "sglang", "speculators"):
            unsupported = (to == "speculators" and spec.attention == "mla") or (
                to == "sglang" and spec.flags.norm_before_residual)
            if unsupported:
                continue
            for lossless in (False, True):
                opts = UpgradeOptions(to=to, fc_norm=not lossless, norm_output=not lossless)
                d = decide(spec, opts, target)
                out[(layout, to, lossless)] = get_dialect(to).config(spec, d, plan_vocab(spec, d.vocab_size))
    return out


def test_vllm_dialect_configs_are_vllm_ready(written):
    cases = [k for k in written if k[1] == "vllm"]
    assert len(cases) == 2 * (len(FLAT) + len(SPECULATORS_LAYOUTS) + 1)
    for key in cases:
        assert valid(written[key], VLLM31), (key, errors(written[key], VLLM31))


def test_sglang_dialect_configs_are_flat_eagle3_configs(written):
    for key in (k for k in written if k[1] == "sglang"):
        assert valid(written[key], EAGLE3), key
        assert not valid(written[key], VLLM31), key  # ids only where SGLang reads them


def test_speculators_dialect_configs(written):
    for key in (k for k in written if k[1] == "speculators"):
        assert valid(written[key], SPECULATORS), (key, errors(written[key], SPECULATORS))


def test_dialect_configs_do_not_mutate_the_source(tmp_path):
    spec = load_draft(make_draft(str(tmp_path / "s"), "speculators-train"))
    before = copy.deepcopy(spec.config)
    for opts in (UpgradeOptions(to="vllm"), UpgradeOptions(to="vllm", fc_norm=True, norm_output=True)):
        d = decide(spec, opts, None)
        get_dialect("vllm").config(spec, d, plan_vocab(spec, d.vocab_size))
        assert spec.config == before
