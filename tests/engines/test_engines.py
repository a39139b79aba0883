"""TensorRT-LLM, llama.cpp and tokenspeed beside vLLM and SGLang: settings, conflicts, verdicts, serve commands."""

from __future__ import annotations

import json

from eaglekit.engines import RECORDS, format_version, output_of_layer, parse_version
from eaglekit.engines.conflicts import conflicts, id_readings
from eaglekit.engines.tokenspeed import tokenspeed_capture, tokenspeed_view
from eaglekit.engines.trtllm import default_capture
from eaglekit.families import load_draft
from eaglekit.rules import run_rules
from eaglekit.serving import AFTER_CONVERSION, AS_IS, NOT_AS_IS, WITH_SETTINGS, serve_command, serving_support
from eaglekit.target import read_target
from tests.support.factory import make_draft, make_target_config


def engine_settings(spec, engine):
    return RECORDS[engine].settings(spec, None)


def _spec(tmp_path, layout="vllm", name="d", **kw):
    return load_draft(make_draft(str(tmp_path / name), layout, **kw))


def test_llama_cpp_builds_are_versions():
    assert parse_version("b9606") == parse_version("9606") == (9606, 0, 0)
    assert format_version(parse_version(RECORDS["llamacpp"].latest)) == RECORDS["llamacpp"].latest == "b11434"
    assert format_version((0, 33, 0)) == "0.33.0"


def test_output_of_layer_cannot_name_the_embedding():
    assert output_of_layer((2, 15, 27)) == (1, 14, 26)
    assert output_of_layer((0, 15, 27)) is None


def test_trtllm_default_is_vllms_and_refused_for_shallow_targets():
    assert default_capture(30) == (2, 15, 27)  # {1, N//2-1, N-4} output-of-layer
    assert default_capture(5) is None


def test_tokenspeed_reads_eagle_config_only_when_there_is_one(tmp_path):
    # vLLM layout: ids top level and in eagle_config; tokenspeed reads the nested list and adds 1
    view = tokenspeed_view(_spec(tmp_path))
    assert view.ids_key == "eagle_config.eagle_aux_hidden_state_layer_ids" and view.shifted
    assert tokenspeed_capture(view, None) == (3, 7, 10)
    top_only = tokenspeed_view(_spec(tmp_path, name="t", config_patch={"eagle_config": None}))
    assert top_only.ids_key == "eagle_aux_hidden_state_layer_ids"
    # SpecForge writes output-of-layer ids: read right, no flag needed
    assert engine_settings(_spec(tmp_path, "specforge", name="s"), "tokenspeed") == ()


def test_settings_pin_the_trained_layers(tmp_path):
    spec = _spec(tmp_path, aux_ids=(3, 6, 9))
    assert engine_settings(spec, "trtllm") == ("eagle3_layers_to_capture: [2, 5, 8]",)
    assert engine_settings(spec, "tokenspeed") == ("--eagle3-layers-to-capture 2,5,8",)
    assert engine_settings(spec, "vllm") == engine_settings(spec, "llamacpp") == ()
    assert engine_settings(_spec(tmp_path, name="e", aux_ids=(0, 6, 9)), "trtllm") == ()  # inexpressible


def test_a_key_two_engines_read_differently_is_a_conflict(tmp_path):
    target = read_target(make_target_config(str(tmp_path / "t")))
    spec = _spec(tmp_path, config_patch={"eagle_config": None})  # ids only at the top level
    readings = {r.engine: r for r in id_readings(spec, ("vllm", "tokenspeed"), target)}
    assert readings["vllm"].captured == (2, 6, 9) and readings["tokenspeed"].captured == (3, 7, 10)
    notes = conflicts(spec, ("vllm", "tokenspeed"), target)
    assert len(notes) == 1 and "eagle_aux_hidden_state_layer_ids" in notes[0]
    assert "pin tokenspeed with --eagle3-layers-to-capture" in notes[0]
    report = run_rules(spec, target=target, engine="vllm,tokenspeed")
    assert report.conflicts == notes and report.settings["tokenspeed"] == ("--eagle3-layers-to-capture 1,5,8",)
    # SGLang and tokenspeed both shift SpecForge's eagle_config ids: one value serves both
    assert conflicts(_spec(tmp_path, "specforge", name="s"), ("sglang", "tokenspeed"), target) == []


def test_serving_verdicts(tmp_path):
    eagle3 = {s.engine: s for s in serving_support(_spec(tmp_path, "specforge"))}
    # SpecForge's output-of-layer ids only in eagle_config: SGLang's layout, which vLLM does not read there
    assert eagle3["vllm"].verdict == NOT_AS_IS and eagle3["vllm"].reason.startswith("EK307")
    assert eagle3["sglang"].verdict == AS_IS
    assert eagle3["tokenspeed"].verdict == AS_IS and eagle3["trtllm"].verdict == WITH_SETTINGS
    assert eagle3["llamacpp"].verdict == AFTER_CONVERSION and not eagle3["llamacpp"].as_is
    assert eagle3["llamacpp"].fix is None  # the conversion needs the target's GGUF file, which is not known here
    v31 = {s.engine: s for s in serving_support(_spec(tmp_path, "specforge", name="x", fc_norm=True,
                                                           norm_output=True))}
    assert v31["llamacpp"].verdict == NOT_AS_IS and v31["llamacpp"].engine_specific and v31["llamacpp"].fix is None
    assert v31["llamacpp"].reason.startswith("EK371")


def test_serve_commands_carry_the_settings():
    assert serve_command("tokenspeed", "T", "D", 3, ("--eagle3-layers-to-capture 1,5,8",)).endswith(
        "--speculative-num-draft-tokens 4 --eagle3-layers-to-capture 1,5,8")
    trt = serve_command("trtllm", "T", "D", 3, ("eagle3_layers_to_capture: [1, 5, 8]",)).splitlines()
    assert trt[1:6] == ["speculative_config:", "  decoding_type: Eagle3", "  max_draft_len: 3",
                        "  speculative_model: D", "  eagle3_layers_to_capture: [1, 5, 8]"]
    assert trt[-1] == "trtllm-serve T --extra_llm_api_options eagle3.yaml"
    assert serve_command("llamacpp", "T.gguf", "D.gguf", 3) == (
        "llama-server -m T.gguf -md D.gguf --spec-type draft-eagle3 --spec-draft-n-max 3")
    config = serve_command("vllm", "T", "D", 3).split("--speculative-config ", 1)[1].strip("'")
    assert json.loads(config) == {"model": "D", "method": "eagle3", "num_speculative_tokens": 3}


def test_a_new_engine_is_one_record(tmp_path, monkeypatch):
    """An engine eaglekit has never heard of, added as a record alone, reaches validate, inspect's serving verdicts,
    conflicts and the model card: no other code names engines."""
    from dataclasses import replace

    from eaglekit.engines.base import IdReading, single_release_requirements
    from eaglekit.hub.card import build_card
    from tests.support.cli import run_cli

    def read_ids(spec, target):
        return IdReading("toyserve", "eagle_aux_hidden_state_layer_ids", 1, None, "--toy-layers")

    toy = replace(RECORDS["tokenspeed"], name="toyserve", label="ToyServe", latest="2.0", oldest="2.0",
                  requirements=single_release_requirements("2.0", "EAGLE-3.1 as ToyServe 2.0 reads it"),
                  serve=lambda target, draft, k, settings: f"toyserve {target} --draft {draft} --k {k}",
                  settings=lambda spec, target: ("--toy-layers 1,5,8",), read_ids=read_ids)
    monkeypatch.setitem(RECORDS, "toyserve", toy)
    draft = make_draft(str(tmp_path / "d"), "vllm", fc_norm=True, norm_output=True)

    result = run_cli(["validate", draft, "--engine", "all", "--format", "json"])
    doc = json.loads(result.stdout)
    toy_doc = next(e for e in doc["engines"] if e["engine"] == "toyserve")
    assert toy_doc["version"] == "2.0.0" and toy_doc["settings"] == ["--toy-layers 1,5,8"]
    assert any(note.startswith("vLLM reads eagle_aux_hidden_state_layer_ids as written") and "ToyServe plus 1" in note
               and "pin ToyServe with --toy-layers" in note for note in doc["conflicts"]), doc["conflicts"]

    spec = load_draft(draft)
    support = {s.engine: s for s in serving_support(spec)}
    assert support["toyserve"].min_version == "2.0.0" and support["toyserve"].verdict == WITH_SETTINGS
    card = build_card(spec, "org/draft")
    assert "## Use with ToyServe" in card and "toyserve <TARGET_MODEL> --draft org/draft --k" in card
    assert "Requires ToyServe ≥ 2.0.0 (EAGLE-3.1 as ToyServe 2.0 reads it)" in card
