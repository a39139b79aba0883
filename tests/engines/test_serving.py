"""One serving verdict: the model card, eaglekit.json and inspect state the same minimum engine versions."""

from __future__ import annotations

import re

import pytest

from eaglekit.engines import RECORDS, VLLM_OLDEST_KNOWN
from eaglekit.families import load_draft
from eaglekit.hub.card import build_card
from eaglekit.serving import NOT_AS_IS, minimum_versions, serving_support
from tests.support.factory import LAYOUTS, edit_config, make_draft
from tests.support.rule_cases import CASES

VARIANTS = [{}, {"fc_norm": True}, {"norm_output": True}, {"fc_norm": True, "norm_output": True},
            {"k": 4, "aux_ids": (2, 4, 6, 9)}, {"attention": "mla", "fc_norm": True}]


def _fixtures(tmp_path):
    for layout in LAYOUTS:
        for n, recipe in enumerate(VARIANTS):
            if layout == "kimi" and recipe.get("attention") != "mla" and recipe:
                continue
            yield f"{layout}-{n}", make_draft(str(tmp_path / f"{layout}-{n}"), layout, **recipe)
    nested = make_draft(str(tmp_path / "nbf"), "vllm")
    yield "norm_before_fc-in-eagle_config", edit_config(nested, lambda c: c["eagle_config"].update(norm_before_fc=True))
    legacy = make_draft(str(tmp_path / "legacy"), "sglang", fc_norm=True)
    yield "use_aux_norm", edit_config(legacy, lambda c: c.update(use_aux_norm=c.pop("fc_norm", True)))
    for case in CASES:
        built = case.healthy(tmp_path / "cases" / case.id)
        yield case.id, built[0] if isinstance(built, tuple) else built


def _card_versions(card: str) -> dict[str, str | None]:
    """engine label -> the floor the card states ("any": no floor); engines without a section are absent."""
    out = {}
    for label in (r.label for r in RECORDS.values()):
        m = re.search(rf"Requires {re.escape(label)} ≥ (\S+) \(", card)
        if m:
            out[label] = m.group(1)
        elif f"Any {label} release with EAGLE-3 support serves it" in card or f"Checked against {label} " in card:
            out[label] = "any"
    return out


def test_card_and_inspect_agree_on_minimum_versions(tmp_path):
    checked = refused = 0
    for name, path in _fixtures(tmp_path):
        spec = load_draft(path)
        card_text = build_card(spec, "org/draft")
        card = _card_versions(card_text)
        floors = minimum_versions(spec)
        for support in serving_support(spec):
            label = RECORDS[support.engine].label
            if support.verdict == NOT_AS_IS and support.engine_specific:
                assert label not in card and f"- **{label}**: " in card_text, name
                refused += 1
                continue
            stated = card[label]
            assert stated == (floors[support.engine].version or "any"), name
            if support.min_version is None:
                continue  # a fault of the files alone: inspect names the rule, the card its Validation section
            if support.engine == "vllm":
                assert support.min_version == (floors["vllm"].version or VLLM_OLDEST_KNOWN), name
            else:
                assert stated in ("any", support.min_version), name
            for setting in support.settings:
                assert setting in card_text, name
            checked += 1
    assert checked > 100 and refused > 20


@pytest.mark.parametrize("edit, floor", [
    (lambda c: c["eagle_config"].update(norm_before_fc=True), "0.22.0"),  # vLLM reads it there only from 0.22.0
    (lambda c: c.update(use_aux_norm=True), None),  # SGLang's legacy key: no vLLM release reads it
])
def test_card_states_the_engine_floor_of_keys_it_used_to_miss(tmp_path, edit, floor):
    path = edit_config(make_draft(str(tmp_path / "d"), "vllm"), edit)
    assert _card_versions(build_card(load_draft(path), "org/draft")).get("vLLM") == (floor or "any")
