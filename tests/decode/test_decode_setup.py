"""The one decode setup verify, compare and finetune's evaluation start from, on a tiny real target with SmolLM2's
tokenizer and a draft that leaves its vocabulary size and aux ids to the target."""

from __future__ import annotations

import json

import pytest

pytest.importorskip("torch")

from eaglekit.decode.compare import compare_conditions  # noqa: E402
from eaglekit.decode.options import VerifyOptions  # noqa: E402
from eaglekit.decode.settings import Condition, DecodeSettings  # noqa: E402
from eaglekit.decode.setup import decode_setup  # noqa: E402
from eaglekit.finetune.evaluate import EvalOptions, held_out_prompts  # noqa: E402
from eaglekit.verify.run import verify  # noqa: E402
from tests.support.factory import make_draft  # noqa: E402
from tests.support.smollm2 import smollm2_path  # noqa: E402
from tests.support.targets import make_tiny_target  # noqa: E402

pytestmark = pytest.mark.model

VOCAB = 49152  # SmolLM2's tokenizer
FAST = {"limit": 2, "max_new_tokens": 8, "device": "cpu", "dtype": "float32"}


@pytest.fixture(scope="module")
def env(tmp_path_factory):
    base = tmp_path_factory.mktemp("decode-setup")
    target = make_tiny_target(base / "target", layers=8, vocab=VOCAB, tokenizer_from=smollm2_path())
    # SGLang's layout writes no aux ids; without vocab_size the draft leaves V to the target too
    draft = make_draft(str(base / "draft"), "sglang", hidden=64, vocab=VOCAB, draft_vocab=512, target_layers=8,
                       config_patch={"vocab_size": None})
    return {"target": target, "draft": draft, "base": base}


def test_a_draft_is_decoded_as_resolved_and_checked_as_written(env):
    setup = decode_setup([("draft", env["draft"])], env["target"], VerifyOptions(**FAST))
    (draft,) = setup.drafts
    assert draft.spec.target == setup.info and draft.spec.vocab.vocab_size == VOCAB
    assert draft.spec.as_written.target is None and draft.spec.as_written.vocab.vocab_size is None
    assert draft.aux_ids == (2, 4, 5) == tuple(setup.info.default_aux_ids)
    assert draft.aux_source.startswith("engine default") and draft.spec.as_written.aux.ids is None
    checks = {c.code: c for c in draft.checks}
    assert checks["EK291"].severity == "info" and "does not record" in checks["EK291"].message
    assert "EK294" not in checks  # the aux ids the target filled in fit it
    assert setup.settings(Condition("chat", 0)) == DecodeSettings(env["target"], 3, 8, "float32", "cpu",
                                                                  "eaglekit-coding", 0, "chat")
    assert setup.eos_ids == setup.target_model.eos_token_ids and len(setup.prompts.prompts) == 2


def test_verify_reports_the_files_reading_of_the_compatibility_checks(env):
    doc = verify(env["draft"], env["target"], VerifyOptions(**FAST, as_eaglekit_reads=True)).to_dict()
    checks = {c["code"]: c for c in doc["checks"]}
    assert checks["EK291"]["severity"] == "info"
    assert doc["aux_layer_ids"] == [2, 4, 5]  # the engine default for L=8, filled in by the target
    assert doc["lossless"] and doc["dtype"] == "float32" and doc["device"] == "cpu"


def test_an_engine_decoding_alone_needs_only_the_tokenizer(env):
    setup = decode_setup([("draft", env["draft"])], env["target"], VerifyOptions(**FAST), load_model=False)
    assert setup.model is None and setup.tokenizer is not None
    assert (setup.device, setup.dtype) == ("cpu", "float32")
    with pytest.raises(RuntimeError, match="did not load the target"):
        setup.target_model


def test_finetunes_evaluation_decodes_the_prompts_it_names(env, tmp_path):
    prompts = tmp_path / "held-out.jsonl"
    prompts.write_text("".join(json.dumps({"name": f"p{i}", "prompt": f"Write function number {i}."}) + "\n"
                               for i in range(5)))
    ev = EvalOptions(prompts_file=str(prompts), limit=3, max_new_tokens=8, context_tokens=(0,), templates=("chat",))
    name, named = held_out_prompts(ev)
    sweep = compare_conditions(env["draft"], env["draft"], env["target"], ev.decode_options("cpu", "float32"))
    (report,) = sweep.reports
    assert report.names == [p.name for p in named] == ["p0", "p1", "p2"]
    assert report.settings.prompts_name == name and report.settings.num_speculative_tokens == ev.k
    row = report.rows()["all"]
    assert row["a"] == row["b"]  # the same draft on the same captured pass
