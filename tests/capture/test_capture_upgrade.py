"""`upgrade --store`: fc_norm's fit and the norm_output rescale from a capture store, without the target's decoder."""

from __future__ import annotations

import json
import os
import shutil

import jsonschema
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")
from safetensors.torch import load_file, save_file  # noqa: E402

import eaglekit.target_model  # noqa: E402
from eaglekit.capture.run import CaptureOptions, capture_store  # noqa: E402
from eaglekit.errors import UsageError  # noqa: E402
from eaglekit.upgrade import UpgradeOptions, upgrade  # noqa: E402
from tests.support import REPO  # noqa: E402
from tests.support.cli import run_cli  # noqa: E402
from tests.support.factory import make_draft  # noqa: E402
from tests.support.targets import make_target_with_tokenizer  # noqa: E402

pytestmark = pytest.mark.model

AUX = (1, 2, 3)


def test_upgrade_from_a_store_equals_upgrade_from_the_target(tmp_path, monkeypatch):
    target = make_target_with_tokenizer(str(tmp_path / "target"))
    src = make_draft(str(tmp_path / "src"), "vllm", vocab=384, aux_ids=AUX, target_layers=4, dtype="F32", embed=True)
    store = str(tmp_path / "store")
    capture_store(store, CaptureOptions(target=target, aux_ids=AUX, calibration=True, store_dtype="float32"))
    direct = upgrade(src, str(tmp_path / "direct"), UpgradeOptions(target=target))

    head_only = tmp_path / "head-only"
    shutil.copytree(target, head_only, ignore=shutil.ignore_patterns("*.safetensors"))
    tensors = load_file(os.path.join(target, "model.safetensors"))
    save_file({n: t for n, t in tensors.items() if ".layers." not in n}, str(head_only / "model.safetensors"))

    def refuse(*args, **kwargs):
        raise AssertionError("the target's decoder was loaded")

    monkeypatch.setattr(eaglekit.target_model, "load_target", refuse)
    stored = upgrade(src, str(tmp_path / "stored"), UpgradeOptions(target=str(head_only), store=store))
    assert direct.function == stored.function == "eagle3-function"
    assert stored.start.scale == pytest.approx(direct.start.scale, rel=1e-6)
    a, b = (load_file(os.path.join(tmp_path, d, "model.safetensors")) for d in ("direct", "stored"))
    assert set(a) == set(b) and "fc_norm.0.weight" in a
    for name in a:
        torch.testing.assert_close(a[name], b[name], rtol=1e-6, atol=0)
    cli = run_cli(["upgrade", src, str(tmp_path / "cli"), "--target", str(head_only), "--store", store,
                   "--format", "json"])
    assert cli.exit_code == 0, cli.stderr
    doc = json.loads(cli.stdout)
    jsonschema.validate(doc, json.load(open(os.path.join(REPO, "eaglekit", "schemas", "upgrade-report.schema.json"))))
    assert doc["function"] == "eagle3-function"
    with pytest.raises(UsageError, match="--store needs --target"):
        upgrade(src, str(tmp_path / "x"), UpgradeOptions(store=store))
    with pytest.raises(UsageError, match=r"holds aux ids \[1, 2, 3\], not \[0\]"):
        upgrade(src, str(tmp_path / "y"), UpgradeOptions(target=str(head_only), store=store, aux_layer_ids=(0, 2, 3),
                                                          aux_convention="input"))
