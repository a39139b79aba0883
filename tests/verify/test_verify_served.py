"""verify reads a draft's files as vLLM will: both τ when vLLM's reading differs, a refusal when it will not load."""

from __future__ import annotations

import json
import os

import jsonschema
import pytest

pytest.importorskip("torch")

from tests.support import REPO  # noqa: E402
from tests.support.cli import run_cli  # noqa: E402
from tests.support.factory import make_draft  # noqa: E402
from tests.support.smollm2 import smollm2_path  # noqa: E402
from tests.support.targets import make_tiny_target  # noqa: E402

pytestmark = pytest.mark.model

VOCAB = 49152
LAYERS = 8  # vLLM's default ids (2, L//2, L-3) = (2, 4, 5) are distinct and differ from the drafts' (1, 2, 3)
SCHEMA = json.load(open(os.path.join(str(REPO), "eaglekit", "schemas",
                                     "verify-report.schema.json")))
FAST = ["--limit", "2", "--max-new-tokens", "6", "--no-progress", "--format", "json"]


@pytest.fixture(scope="module")
def target(tmp_path_factory):
    return make_tiny_target(tmp_path_factory.mktemp("served") / "target", layers=LAYERS, vocab=VOCAB,
                            tokenizer_from=smollm2_path())


def draft(tmp_path, layout="specforge", **kwargs) -> str:
    return make_draft(str(tmp_path / layout), layout, hidden=64, vocab=VOCAB, draft_vocab=512, aux_ids=(1, 2, 3),
                      target_layers=LAYERS, **kwargs)


def verify(*args) -> dict:
    result = run_cli(["verify", *args, *FAST])
    assert result.exit_code == 0, result.stderr
    doc = json.loads(result.stdout)
    jsonschema.validate(doc, SCHEMA)
    return doc


def test_ids_only_in_eagle_config_are_decoded_as_each_runner_captures_them(tmp_path, target):
    path = draft(tmp_path)  # SpecForge: ids in eagle_config only, output-of-layer [0, 1, 2]
    v2 = verify(path, "--target", target)
    assert v2["aux_layer_ids"] == [1, 2, 3]
    served = v2["served"]
    assert served["engine"] == "vLLM 0.33.0 (V2 runner)" and served["loads"] and served["differs"]
    assert served["aux_layer_ids"] == [2, 4, 5] and "default" in served["aux_layer_ids_source"]
    assert served["message"].startswith("predicted for vLLM 0.33.0 (V2 runner) from the files as they stand (")
    assert served["predicted"] is True and "as served by" not in served["message"]
    assert "after `eaglekit upgrade" in served["message"]
    # the second decode is exactly a decode with the engine's ids
    pinned = verify(path, "--target", target, "--aux-layer-ids", "2,4,5")
    assert pinned["served"] is None
    assert served["acceptance_length"] == pinned["acceptance_length"]
    assert served["per_position_acceptance"] == pinned["per_position_acceptance"]
    v1 = verify(path, "--target", target, "--vllm-runner", "v1", "--engine-version", "0.32")
    assert v1["served"]["engine"] == "vLLM 0.32 (V1 runner)" and v1["served"]["aux_layer_ids"] == [0, 1, 2]
    assert verify(path, "--target", target, "--as-eaglekit-reads")["served"] is None


def test_an_upgraded_draft_is_read_the_same_by_both_runners(tmp_path, target):
    path = draft(tmp_path, layout="vllm")
    for runner in ("v1", "v2"):
        served = verify(path, "--target", target, "--vllm-runner", runner)["served"]
        assert not served["differs"] and served["acceptance_length"] is None
        assert served["message"].endswith("from the files as they stand: it reads them as eaglekit does")


def test_files_vllm_will_not_load_are_reported_as_a_refusal(tmp_path, target):
    import numpy as np

    norms = {f"fc_norm.{k}.weight": np.ones(64, dtype=np.float32) for k in range(3)}
    path = draft(tmp_path, layout="vllm", add=norms)  # fc_norm tensors, fc_norm not set
    doc = verify(path, "--target", target)
    served = doc["served"]
    assert not served["loads"] and served["differs"] and served["acceptance_length"] is None
    assert served["refusal"].startswith("EK111") and "refuses to load" in served["message"]


def test_a_missing_fc_norm_is_named_as_what_vllm_does_silently(tmp_path, target):
    path = draft(tmp_path, layout="vllm", fc_norm=True, drop=tuple(f"fc_norm.{k}.weight" for k in range(3)))
    with open(os.path.join(path, "config.json")) as fh:
        assert json.load(fh)["fc_norm"] is True
    served = verify(path, "--target", target)["served"]
    assert served["loads"] and any("all-ones" in note for note in served["silent"])


def test_bad_runner_and_version_are_usage_errors(tmp_path, target):
    path = draft(tmp_path, layout="vllm")
    for args, expected in ((["--vllm-runner", "v3"], "v3"), (["--engine-version", "0.1"], "0.1")):
        result = run_cli(["verify", path, "--target", target, *args])
        assert result.exit_code == 2 and expected in result.stderr


def test_a_missing_d2t_is_decoded_as_vllm_maps_it(tmp_path, target):
    path = draft(tmp_path, layout="vllm", drop=("d2t", "t2d"))
    doc = verify(path, "--target", target)
    check = next(c for c in doc["checks"] if c["code"] == "EK297")
    assert check["severity"] == "warning" and "target id i" in check["message"]
    assert any("no d2t" in note for note in doc["served"]["silent"])
