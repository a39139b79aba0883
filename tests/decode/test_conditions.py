"""Conditions of verify and compare: prompt templates (chat, system, raw) on SmolLM2's real tokenizer, sweeps over
--context-tokens and --template lists, their JSON (one chat condition keeps the report as it was; several list
the conditions) and the plot."""

from __future__ import annotations

import dataclasses
import json
import os

import jsonschema
import pytest

from eaglekit.cli.output import conditions
from eaglekit.decode.metrics import AcceptanceCounter
from eaglekit.decode.options import VerifyOptions
from eaglekit.decode.prompts import SYSTEM_MESSAGE, TEMPLATES, Prompt, encode, with_template
from eaglekit.decode.settings import Condition
from eaglekit.errors import UsageError
from eaglekit.verify.plot import lines
from tests.support.cli import run_cli

pytest.importorskip("torch")

from tests.support import REPO  # noqa: E402
from tests.support.factory import make_draft  # noqa: E402
from tests.support.smollm2 import smollm2_path  # noqa: E402
from tests.support.targets import make_tiny_target  # noqa: E402

pytestmark = pytest.mark.model

SCHEMAS = os.path.join(str(REPO), "eaglekit", "schemas")
DRAFTERS = os.path.join(REPO, "examples", "drafters")
VOCAB = 49152  # SmolLM2's tokenizer
FAST = ["--limit", "2", "--max-new-tokens", "6", "--no-progress"]
PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
COMPARE_KEYS = ["eaglekit_version", "target", "drafts", "num_speculative_tokens", "max_new_tokens", "dtype", "device",
                "sampling", "acceptance_settings", "prompts", "categories", "per_prompt"]
"""The compare report as written before sweeps existed, key for key and in order (plus how the target's tokens were
chosen, `sampling`, and the rule its acceptance was counted under, `acceptance_settings`)."""


def schema(name: str) -> dict:
    return json.load(open(os.path.join(SCHEMAS, f"{name}.schema.json")))


def user(text: str) -> Prompt:
    return Prompt("p", ({"role": "user", "content": text},), None)


@pytest.fixture(scope="module")
def tokenizer():
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(smollm2_path())


# --- templates on the real tokenizer ----------------------------------------------------------------------------


def test_chat_is_the_prompt_through_the_targets_chat_template(tokenizer):
    ids = encode(user("Reverse a list."), tokenizer)
    assert ids == encode(user("Reverse a list."), tokenizer, template="chat")
    text = tokenizer.decode(ids)
    assert text.startswith("<|im_start|>system\n") and "named SmolLM" in text  # the template's default system message
    assert text.endswith("<|im_start|>user\nReverse a list.<|im_end|>\n<|im_start|>assistant\n")


def test_system_replaces_the_default_and_the_prompts_own_system_message(tokenizer):
    text = tokenizer.decode(encode(user("Reverse a list."), tokenizer, template="system"))
    assert text.startswith(f"<|im_start|>system\n{SYSTEM_MESSAGE}<|im_end|>\n<|im_start|>user\nReverse a list.")
    assert "named SmolLM" not in text
    own = Prompt("p", ({"role": "system", "content": "Be verbose."}, {"role": "user", "content": "Hi"}), None)
    replaced = tokenizer.decode(encode(own, tokenizer, template="system"))
    assert "Be verbose." not in replaced and replaced.count("<|im_start|>system") == 1
    plain_text = with_template(Prompt("t", None, "Reverse a list."), "system")
    assert plain_text.text is None and plain_text.messages[-1] == {"role": "user", "content": "Reverse a list."}


def test_raw_is_plain_question_and_answer_text_without_the_chat_template(tokenizer):
    ids = encode(user("Reverse a list."), tokenizer, template="raw")
    assert ids == tokenizer("Q: Reverse a list.\nA:")["input_ids"]
    assert tokenizer.convert_tokens_to_ids("<|im_start|>") not in ids
    # long context goes into the question; a later turn keeps the earlier answer
    long = tokenizer.decode(encode(user("Reverse a list."), tokenizer, template="raw", context_tokens=24))
    assert long.startswith("Q: Here is some Python source code") and long.endswith("Reverse a list.\nA:")
    second = Prompt("c", ({"role": "user", "content": "Add."},), None, None, "c", ("Now subtract.",)).next_turn("a+b")
    assert with_template(second, "raw").text == "Q: Add.\nA: a+b\nQ: Now subtract.\nA:"


def test_unknown_template_is_one_line():
    with pytest.raises(UsageError, match="--template 'fancy': use one of chat, system, raw"):
        with_template(user("x"), "fancy")


# --- options and CLI parsing -------------------------------------------------------------------------------------


def test_one_value_each_is_one_condition_as_before_lists_are_a_sweep():
    assert conditions("1024", "chat") == {"context_tokens": 1024, "template": "chat"}
    assert conditions("0,1024 2048", "chat, raw") == {"context_tokens": (0, 1024, 2048), "template": ("chat", "raw")}
    options = VerifyOptions(**conditions("0,1024", "chat,system,raw"))
    assert options.conditions == tuple(Condition(t, c) for t in ("chat", "system", "raw") for c in (0, 1024))
    assert options.at(Condition("raw", 1024)).context_tokens == 1024
    assert VerifyOptions(context_tokens=512).conditions == (Condition("chat", 512),)
    for bad, message in ((dict(context_tokens=(0, 0)), "each value once"),
                         (dict(template=("chat", "nope")), "--template 'nope'"),
                         (dict(context_tokens=-1), "must not be negative"),
                         (dict(context_tokens=()), "at least one value")):
        with pytest.raises(UsageError, match=message):
            VerifyOptions(**bad).check()


def test_a_sweep_needs_the_sweep_functions():
    from eaglekit.decode.compare import compare
    from eaglekit.verify.run import verify

    sweep = VerifyOptions(context_tokens=(0, 64))
    with pytest.raises(UsageError, match="compare_conditions"):
        compare("a", "b", "t", sweep)
    with pytest.raises(UsageError, match="verify_conditions"):
        verify("a", "t", sweep)


def test_plot_lines_follow_the_templates_with_contexts_ascending():
    def counter(accepted: int) -> AcceptanceCounter:
        c = AcceptanceCounter(2)
        c.record(accepted)
        return c

    conds = [Condition("chat", 1024), Condition("chat", 0), Condition("raw", 1024), Condition("raw", 0)]
    drawn = lines(conds, {"A": [counter(2), counter(0), counter(1), counter(0)],
                          "B": [counter(1), counter(1), counter(2), counter(2)]})
    assert [(line.label, line.contexts) for line in drawn] == [
        ("chat, A", [0, 1024]), ("chat, B", [0, 1024]), ("raw, A", [0, 1024]), ("raw, B", [0, 1024])]
    assert drawn[0].acceptance_length == [1.0, 3.0] and drawn[0].per_position == [[0.0, 0.0], [1.0, 1.0]]


def test_schemas_name_every_template_and_keep_the_two_shapes_apart():
    for name in ("compare-report", "verify-report"):
        assert schema(name)["$defs"]["condition"]["properties"]["template"]["enum"] == list(TEMPLATES)
    doc = {"eaglekit_version": "0", "target": "t", "num_speculative_tokens": 3, "max_new_tokens": 8, "dtype": "float32",
           "device": "cpu", "prompts": {"name": "p", "count": 1},
           "drafts": {key: {"draft": key, "eagle_version": "3", "aux_layer_ids": [1]} for key in "ab"},
           "conditions": [{"template": "raw", "context_tokens": 0, "categories": {}, "per_prompt": []}]}
    with pytest.raises(jsonschema.ValidationError):  # "all" is missing from the condition's categories
        jsonschema.validate(doc, schema("compare-report"))
    with pytest.raises(jsonschema.ValidationError):  # both shapes at once
        jsonschema.validate({**doc, "categories": {}, "per_prompt": []}, schema("compare-report"))


# --- verify and compare on a tiny target with SmolLM2's tokenizer ------------------------------------------------


@pytest.fixture(scope="module")
def env(tmp_path_factory):
    base = tmp_path_factory.mktemp("conditions")
    target = make_tiny_target(base / "target", vocab=VOCAB, tokenizer_from=smollm2_path())
    a = make_draft(str(base / "a"), "vllm", hidden=64, vocab=VOCAB, draft_vocab=512, aux_ids=(1, 2, 3), target_layers=4)
    b = make_draft(str(base / "b"), "vllm", hidden=64, vocab=VOCAB, draft_vocab=512, aux_ids=(1, 2, 3),
                   target_layers=4, seed=7)
    return {"target": target, "a": a, "b": b}


def test_one_chat_condition_writes_the_compare_report_as_before(env):
    result = run_cli(["compare", env["a"], env["b"], "--target", env["target"], "--context-tokens", "16",
                      "--format", "json", *FAST])
    assert result.exit_code == 0, result.stderr
    doc = json.loads(result.stdout)
    jsonschema.validate(doc, schema("compare-report"))
    assert list(doc) == COMPARE_KEYS
    assert doc["prompts"] == {"name": "eaglekit-coding", "count": 2, "context_tokens": 16}


def test_compare_sweep_at_k8_lists_each_condition_with_per_position_acceptance_and_a_plot(env, tmp_path):
    plot = tmp_path / "compare.png"
    result = run_cli(["compare", env["a"], env["b"], "--target", env["target"], "-k", "8", "--context-tokens", "0,24",
                      "--template", "chat,raw", "--plot", str(plot), "--save-report", str(tmp_path / "r.json"),
                      "--format", "json", *FAST])
    assert result.exit_code == 0, result.stderr
    doc = json.loads(result.stdout)
    jsonschema.validate(doc, schema("compare-report"))
    assert "categories" not in doc and doc["prompts"] == {"name": "eaglekit-coding", "count": 2}
    assert [(c["template"], c["context_tokens"]) for c in doc["conditions"]] == [
        ("chat", 0), ("chat", 24), ("raw", 0), ("raw", 24)]
    for condition in doc["conditions"]:
        row = condition["categories"]["all"]
        for key in "ab":
            assert len(row[key]["per_position_acceptance"]) == 8
            assert row[key]["acceptance_length"] == pytest.approx(1 + sum(row[key]["per_position_acceptance"]))
        assert row["b_minus_a"]["acceptance_length_difference"] == pytest.approx(
            row["b"]["acceptance_length"] - row["a"]["acceptance_length"])
        assert [p["name"] for p in condition["per_prompt"]] == ["fizzbuzz", "palindrome"]
    assert json.loads((tmp_path / "r.json").read_text()) == doc
    assert plot.read_bytes().startswith(PNG_SIGNATURE) and plot.stat().st_size > 10_000


def test_verify_sweep_has_one_table_per_condition_and_its_json_lists_them(env, tmp_path):
    args = ["verify", env["a"], "--target", env["target"], "--context-tokens", "0 24", "--template", "system", *FAST]
    human = run_cli([*args, "--plot", str(tmp_path / "verify.png")])
    assert human.exit_code == 0, human.stderr
    assert "Result: system (" in human.stdout and "Result: system, +24 tokens of context (" in human.stdout
    assert human.stdout.count("Compatibility") == 1
    assert (tmp_path / "verify.png").read_bytes().startswith(PNG_SIGNATURE)
    doc = json.loads(run_cli([*args, "--format", "json"]).stdout)
    jsonschema.validate(doc, schema("verify-report"))
    assert doc["lossless"] and doc["passed"] and "acceptance_length" not in doc
    contexts = [(c["template"], c["context_tokens"], c["prompts"]["context_tokens"]) for c in doc["conditions"]]
    assert contexts == [("system", 0, 0), ("system", 24, 24)]
    short, long = doc["conditions"]
    assert long["prompts"]["mean_prompt_tokens"] > short["prompts"]["mean_prompt_tokens"] + 24
    assert all(c["served"] is None for c in doc["conditions"])  # a sweep decodes eaglekit's reading only
    drift = human.stdout[human.stdout.index("Drift per draft depth, by condition"):]
    rows = [[cell.strip() for cell in line.split("│")[1:-1]] for line in drift.splitlines() if line.startswith("│")]
    assert len(rows) == 3 * len(doc["conditions"])  # k rows per condition, its label on the first
    for first, condition in zip(rows[::3], doc["conditions"]):
        context = condition["context_tokens"]
        label = "system" + (f", +{context} tokens of context" if context else "")
        depth = condition["drift"][0]
        assert first[:4] == [label, "1", f"{depth['hidden_rms']:.3g}", f"{depth['sink_attention']:.3f}"]


def test_one_condition_under_another_template_is_the_whole_report(env):
    args = ["verify", env["a"], "--target", env["target"], "--template", "raw", "--diagnose", "--limit", "1",
            "--max-new-tokens", "6", "--no-progress"]
    doc = json.loads(run_cli([*args, "--format", "json"]).stdout)
    jsonschema.validate(doc, schema("verify-report"))
    (condition,) = doc["conditions"]
    assert condition["template"] == "raw" and condition["diagnosis"]["verdict"] and condition["hypotheses"]
    human = run_cli(args)
    assert human.exit_code == 0, human.stderr
    for text in ("template raw", "Drift per draft depth", "Diagnosis: one target pass"):
        assert text in human.stdout


def test_plot_and_sweep_refusals_are_one_line_before_any_decode(env, tmp_path):
    base = ["--target", env["target"], *FAST]
    cases = [
        (["compare", env["a"], env["b"], *base, "--plot", os.path.join(env["b"], "p.png")], "overlaps the draft B"),
        (["verify", env["a"], *base, "--plot", os.path.join(env["target"], "config.json")], "overlaps the target"),
        (["compare", env["a"], env["b"], *base, "--template", "chat,fancy"], "--template 'fancy'"),
        (["verify", env["a"], *base, "--context-tokens", "0,1k"], "--context-tokens '0,1k'"),
        (["verify", env["a"], *base, "--context-tokens", "0,64", "--diagnose"], "--diagnose and --engine measure one"),
        (["verify", env["a"], *base, "--template", "raw", "--profile-out", str(tmp_path / "p.json")],
         "--profile-out describes the chat template"),
    ]
    for args, message in cases:
        result = run_cli(args)
        assert result.exit_code == 2, (args, result.stdout)
        assert message in result.stderr and len(result.stderr.strip().splitlines()) == 1, result.stderr
    assert not os.path.exists(os.path.join(env["b"], "p.png"))


# --- the bundled drafters on SmolLM2 -----------------------------------------------------------------------------


def test_each_condition_replays_what_verify_measures_live(tmp_path):
    """The raw template through compare's replay gives each prompt the τ verify's live decode gives it, and the
    trained drafters accept drafts under every condition."""
    drafts = [os.path.join(DRAFTERS, name) for name in ("smollm2-135m-eagle3", "smollm2-135m-eagle3.1")]
    args = ["--target", smollm2_path(), "--limit", "1", "--max-new-tokens", "12", "--no-progress", "--format", "json",
            "--dtype", "float32", "--context-tokens", "64"]
    compared = json.loads(run_cli(["compare", *drafts, *args, "--template", "chat,raw"]).stdout)
    jsonschema.validate(compared, schema("compare-report"))
    raw = next(c for c in compared["conditions"] if (c["template"], c["context_tokens"]) == ("raw", 64))
    live = json.loads(run_cli(["verify", drafts[1], *args, "--template", "raw"]).stdout)
    jsonschema.validate(live, schema("verify-report"))
    assert [p["b_acceptance_length"] for p in raw["per_prompt"]] == pytest.approx(
        [p["acceptance_length"] for p in live["conditions"][0]["per_prompt"]])
    for condition in compared["conditions"]:
        assert condition["categories"]["all"]["a"]["acceptance_length"] > 1.2, condition["template"]


def test_one_target_pass_for_many_drafts_measures_what_pairs_measure(tmp_path):
    """compare_against replays every draft on one target decode: each result equals its own pairwise compare."""
    from eaglekit.decode.compare import compare_against, compare_conditions
    from eaglekit.decode.options import VerifyOptions

    drafters = os.path.join(REPO, "examples", "drafters")
    e3, e31 = os.path.join(drafters, "smollm2-135m-eagle3"), os.path.join(drafters, "smollm2-135m-eagle3.1")
    options = VerifyOptions(limit=2, max_new_tokens=12, context_tokens=(0, 32), template=("chat", "raw"),
                            device="cpu", dtype="float32")
    together = compare_against(e3, [e31, e3], smollm2_path(), options)
    alone = compare_conditions(e3, e31, smollm2_path(), options)
    assert together[0].to_dict() == alone.to_dict()
    for report in together[1].reports:  # the reference against itself: identical counters, difference 0
        assert report.rows()["all"]["b_minus_a"]["acceptance_length_difference"] == 0


def test_one_target_pass_for_every_k_measures_what_each_k_alone_measures():
    """compare_across_k replays every k on the same target passes: each k's sweep equals compare_against at that k
    alone (same counters prompt for prompt, same settings), so a k grid costs one target decode per condition."""
    from eaglekit.decode.compare import compare_across_k, compare_against
    from eaglekit.decode.options import VerifyOptions

    drafters = os.path.join(REPO, "examples", "drafters")
    e3, e31 = os.path.join(drafters, "smollm2-135m-eagle3"), os.path.join(drafters, "smollm2-135m-eagle3.1")
    options = VerifyOptions(limit=2, max_new_tokens=12, context_tokens=(0, 32), template=("chat", "raw"),
                            device="cpu", dtype="float32")
    shared = compare_across_k(e3, [e31], smollm2_path(), options, (6, 1, 3))
    assert sorted(shared) == [1, 3, 6]
    for k, sweeps in shared.items():
        alone = compare_against(e3, [e31], smollm2_path(), dataclasses.replace(options, num_speculative_tokens=k))
        assert sweeps[0].to_dict() == alone[0].to_dict(), k
    assert shared[1][0].reports[0].b.counters != shared[6][0].reports[0].b.counters
