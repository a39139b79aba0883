"""verify's `served` section is eaglekit's prediction of how vLLM will read the files as they stand, never a
measurement (vLLM does not run): its message and its JSON say so, in every case, with the figures unchanged."""

from __future__ import annotations

import json
import os

import jsonschema
import pytest

from eaglekit.decode.metrics import AcceptanceCounter
from eaglekit.decode.options import VerifyOptions
from eaglekit.decode.setup import vllm_rules
from eaglekit.families import load_draft
from eaglekit.target import read_target
from eaglekit.verify.run import served_section
from tests.support import REPO
from tests.support.factory import make_draft, make_target_config

LAYERS = 8  # vLLM's default ids (2, 4, 5) differ from the drafts' (1, 2, 3)
SCHEMA = json.load(open(os.path.join(str(REPO), "eaglekit", "schemas",
                                     "verify-report.schema.json")))
OURS = AcceptanceCounter.from_histogram([4, 3, 2, 1])
AS_VLLM_READS = AcceptanceCounter.from_histogram([8, 1, 1, 0])
FLAGS = {"fc_norm": False, "norm_output": False, "norm_before_fc": False, "norm_before_residual": False}


def section(tmp_path, layout: str, **kwargs) -> dict:
    """The served section for a draft of `layout` against a config-only target, its second decode faked."""
    info = read_target(make_target_config(str(tmp_path / "target"), layers=LAYERS))
    path = make_draft(str(tmp_path / layout), layout, hidden=64, vocab=256, draft_vocab=128, aux_ids=(1, 2, 3),
                      target_layers=LAYERS, **kwargs)
    spec = load_draft(path, target=info)
    options = VerifyOptions()
    doc = served_section(spec, info, vllm_rules(spec, info), options, FLAGS, (1, 2, 3), OURS,
                         lambda reading: AS_VLLM_READS)
    jsonschema.validate(doc, SCHEMA["properties"]["served"])
    return doc


def test_a_reading_that_differs_is_labelled_a_prediction_with_both_figures_as_decoded(tmp_path):
    doc = section(tmp_path, "specforge")  # ids in eagle_config only: vLLM's V2 runner captures its defaults
    assert doc["predicted"] is True and doc["differs"] and doc["aux_layer_ids"] == [2, 4, 5]
    message = doc["message"]
    assert message.startswith("predicted for vLLM 0.33.0 (V2 runner) from the files as they stand (aux ids ")
    assert "as served by" not in message
    assert f"τ {AS_VLLM_READS.acceptance_length:.3f}; after `eaglekit upgrade" in message
    assert message.endswith(f"`: τ {OURS.acceptance_length:.3f}")
    assert doc["acceptance_length"] == AS_VLLM_READS.acceptance_length


def test_the_same_reading_and_a_refusal_are_predictions_too(tmp_path):
    same = section(tmp_path / "same", "vllm")
    assert same["predicted"] is True and not same["differs"]
    assert same["message"] == "predicted for vLLM 0.33.0 (V2 runner) from the files as they stand: it reads them as " \
                              "eaglekit does"
    import numpy as np

    norms = {f"fc_norm.{k}.weight": np.ones(64, dtype=np.float32) for k in range(3)}
    refused = section(tmp_path / "refused", "vllm", add=norms)  # fc_norm tensors, fc_norm not set
    assert refused["predicted"] is True and not refused["loads"]
    assert refused["message"].startswith("predicted for vLLM 0.33.0 (V2 runner) from the files as they stand: it "
                                         "refuses to load them (EK111")


@pytest.mark.parametrize("flag", [False, True])
def test_the_schema_requires_the_label(tmp_path, flag):
    doc = section(tmp_path, "vllm")
    doc.pop("predicted") if flag else doc.update(predicted=False)
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(doc, SCHEMA["properties"]["served"])
