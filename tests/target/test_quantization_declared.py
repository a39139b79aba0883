"""`--target-quantization` emulates served numerics on a full-precision target; a target whose config already
declares its numerics (a quantization_config) is served as it is, so every command that takes the option refuses
it in one line naming what the target declares, before anything is loaded."""

from __future__ import annotations

import json
import os

import pytest

from eaglekit.quantization import DeclaredQuantization, declared_quantization
from tests.support.factory import edit_config, make_draft, make_target_config
from tests.support.hostile import clean

LOADING = 120  # a hang bound, not a speed check: the first command of a run imports torch on a shared machine
DECLARED = {
    "fp8": ({"quant_method": "fp8", "activation_scheme": "dynamic"}, "quant_method 'fp8'"),
    "gptq": ({"quant_method": "gptq", "bits": 4, "group_size": 128}, "quant_method 'gptq', 4 bits"),
    "compressed-tensors": ({"quant_method": "compressed-tensors", "config_groups": {
        "group_0": {"weights": {"num_bits": 8, "type": "int"}, "targets": ["Linear"]}}},
        "quant_method 'compressed-tensors', 8 bits"),
}


def command(name: str, tmp_path, target: str, draft: str) -> list[str]:
    """`name` asked to emulate fp8 on `target`, with what it needs to reach its target."""
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text(json.dumps({"prompt": "Count to three."}) + "\n")
    out = str(tmp_path / f"{name}-out")
    return {
        "verify": ["verify", draft, "--prompts", str(prompts), "--limit", "1", "--no-progress", "--target", target],
        "compare": ["compare", draft, draft, "--prompts", str(prompts), "--limit", "1", "--no-progress",
                    "--target", target],
        "upgrade": ["upgrade", draft, out, "--target", target, "--fc-norm-init", "calibrated"],
        "finetune": ["finetune", draft, out, "--data", str(prompts), "--cache-dir", str(tmp_path / "cache"),
                     "--steps", "1", "--no-eval", "--no-progress", "--target", target],
        "capture": ["capture", target, out, "--data", str(prompts), "--no-progress"],
    }[name] + ["--target-quantization", "fp8"]


@pytest.mark.parametrize("declared", sorted(DECLARED))
@pytest.mark.parametrize("name", ["verify", "compare", "upgrade", "finetune", "capture"])
def test_every_command_refuses_to_emulate_numerics_on_a_target_that_declares_its_own(tmp_path, name, declared):
    """One line naming the target's config, its quant_method and bits; nothing written. The same target without
    its quantization_config gets past this check (and is refused for having no weights, which this one has not)."""
    target = make_target_config(str(tmp_path / "target"))
    draft = make_draft(str(tmp_path / "draft"))
    config, label = DECLARED[declared]
    edit_config(target, lambda c: c.update(quantization_config=config))
    line = clean(*command(name, tmp_path, target, draft), codes=(2,), seconds=LOADING).stderr
    assert line.startswith("Error: ") and "this target already declares its numerics" in line, line
    assert f"(quantization_config: {label})" in line and os.path.join(target, "config.json") in line, line
    assert not os.path.exists(tmp_path / f"{name}-out")

    edit_config(target, lambda c: c.pop("quantization_config"))
    result = clean(*command(name, tmp_path, target, draft), codes=(1, 2), seconds=LOADING)
    assert "declares its numerics" not in result.stderr, result.stderr


def test_a_hostile_quant_method_cannot_forge_a_line():
    """The refusal quotes quant_method: control characters are escaped and a huge value is cut."""
    found = declared_quantization({"quantization_config": {"quant_method": "x\nError: forged" + "y" * 10_000,
                                                           "bits": True}})
    assert found is not None and found.bits is None
    assert "\n" not in found.label and len(found.label) < 120, found.label


@pytest.mark.parametrize("config, expected", [
    ({}, None),
    ({"quantization_config": None}, None),
    ({"text_config": {"quantization_config": {"quant_method": "awq", "bits": 4}}}, DeclaredQuantization("awq", 4)),
    ({"quantization_config": "int4"}, DeclaredQuantization(None, None)),
    ({"quantization_config": {"quant_method": "compressed-tensors", "config_groups": {
        "a": {"weights": {"num_bits": 4}}, "b": {"weights": {"num_bits": 8}}}}},
     DeclaredQuantization("compressed-tensors", None)),
])
def test_what_a_config_declares_is_read_from_it_or_its_text_config(config, expected):
    assert declared_quantization(config) == expected
