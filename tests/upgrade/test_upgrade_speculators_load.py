"""`upgrade --to speculators` output loads in speculators' own classes (speculators 0.9: `SpeculatorModel.
from_pretrained` then `load_verifier_weights`, which reads the verifier named in speculators_config)."""

from __future__ import annotations

import json
import os

import pytest

torch = pytest.importorskip("torch")

from safetensors.torch import load_file  # noqa: E402
from speculators import SpeculatorModel  # noqa: E402  (the README's test command installs speculators 0.9.0)

from eaglekit.errors import UsageError  # noqa: E402
from eaglekit.upgrade import UpgradeOptions, upgrade  # noqa: E402
from tests.support.factory import make_draft  # noqa: E402
from tests.support.targets import make_tiny_target  # noqa: E402


def test_speculators_output_loads_in_speculators_with_the_target_it_was_given(tmp_path):
    target = make_tiny_target(tmp_path / "target", layers=12)
    src = make_draft(str(tmp_path / "src"), "specforge", dtype="F32")
    out = str(tmp_path / "out")
    report = upgrade(src, out, UpgradeOptions(target=target, to="speculators", fc_norm=False, norm_output=False))
    verifier = json.load(open(os.path.join(out, "config.json")))["speculators_config"]["verifier"]
    assert verifier == {"name_or_path": os.path.abspath(target), "architectures": ["LlamaForCausalLM"]}
    assert any("local target folder" in w for w in report.warnings)

    model = SpeculatorModel.from_pretrained(out)
    written = load_file(os.path.join(out, "model.safetensors"))
    state = model.state_dict()
    for name, tensor in written.items():  # nothing the draft ships is left at its initial value
        assert torch.equal(state[name].float(), tensor.float()), name
    assert all(torch.isfinite(t).all() for t in state.values())  # speculators marks what it never loaded with NaN
    target_weights = load_file(os.path.join(target, "model.safetensors"))  # what it read from the verifier named
    kept_rows = written["t2d"].bool()
    assert torch.equal(model.verifier_lm_head.weight.float(), target_weights["lm_head.weight"][kept_rows].float())
    assert torch.equal(model.verifier_norm.weight.float(), target_weights["model.norm.weight"].float())
    assert model.config.eagle_aux_hidden_state_layer_ids == [2, 6, 9]


def test_speculators_output_without_a_verifier_is_refused(tmp_path):
    src = make_draft(str(tmp_path / "src"), "specforge")
    with pytest.raises(UsageError, match="--target"):
        upgrade(src, str(tmp_path / "out"), UpgradeOptions(to="speculators", fc_norm=False, norm_output=False))
    assert not os.path.exists(tmp_path / "out")
