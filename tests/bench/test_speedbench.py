"""SPEED-Bench prompt files, per-category acceptance with intervals, speculation profiles and `compare`."""

from __future__ import annotations

import json
import os
import random

import jsonschema
import pytest

from eaglekit.decode.metrics import AcceptanceCounter
from eaglekit.decode.prompts import read_prompts
from eaglekit.decode.speedbench import SENTINEL
from eaglekit.decode.stats import paired_difference, tau_interval
from eaglekit.verify.acceptance_profile import length_histogram, speculation_profile, vllm_synthetic_config
from tests.support import REPO
from tests.support.cli import run_cli

pytestmark = pytest.mark.model

SCHEMAS = os.path.join(str(REPO), "eaglekit", "schemas")


def schema(name: str) -> dict:
    return json.load(open(os.path.join(SCHEMAS, f"{name}.schema.json")))


ROWS = [
    {"question_id": "c1", "category": "coding", "sub_category": "python", "source": "s", "src_id": "1",
     "difficulty": "easy", "multiturn": True,
     "turns": ["Write a Python function that adds two numbers.", "Now add type hints to it."]},
    {"question_id": "c2", "category": "coding", "turns": ["Write a Python function that reverses a string."],
     "multiturn": False},
    {"question_id": "w1", "category": "writing", "turns": ["Write a haiku about the sea."], "multiturn": False},
    {"question_id": "w2", "category": "writing", "turns": ["Write a limerick about a cat."], "multiturn": False},
]


def write_jsonl(path, rows) -> str:
    with open(path, "w") as fh:
        fh.writelines(json.dumps(r) + "\n" for r in rows)
    return str(path)


def write_parquet(path, rows) -> str:
    pa = pytest.importorskip("pyarrow")
    import pyarrow.parquet as pq

    columns = {key: [r.get(key) for r in rows] for key in ("question_id", "category", "sub_category", "turns",
                                                           "source", "src_id", "difficulty", "multiturn")}
    pq.write_table(pa.table(columns), str(path))
    return str(path)


@pytest.fixture(scope="module")
def fitting(tmp_path_factory):
    """A draft and a target config that fit: prompt-file errors are reached before anything heavy loads."""
    from tests.support.factory import make_draft, make_target_config

    base = tmp_path_factory.mktemp("fitting")
    target = make_target_config(str(base / "target"))
    return ["verify", make_draft(str(base / "draft")), "--target", target]


# --- reading -------------------------------------------------------------------------------------------------


def test_rows_become_prompts_with_categories_and_follow_up_turns(tmp_path):
    path = write_jsonl(tmp_path / "speed.jsonl", ROWS)
    first = read_prompts(path)
    assert first.speed_bench and [p.name for p in first.prompts] == ["c1", "c2", "w1", "w2"]
    assert [p.category for p in first.prompts] == ["coding", "coding", "writing", "writing"]
    assert first.prompts[0].messages == ({"role": "user", "content": ROWS[0]["turns"][0]},)
    assert all(not p.follow_ups for p in first.prompts) and first.turns == 4
    every = read_prompts(path, turns="all")
    assert every.prompts[0].follow_ups == ("Now add type hints to it.",) and every.turns == 5
    second = every.prompts[0].next_turn("def add(a, b): return a + b")
    assert second.name == "c1#turn2" and second.conversation == "c1" and second.category == "coding"
    assert [m["role"] for m in second.messages] == ["user", "assistant", "user"]
    assert second.messages[1]["content"] == "def add(a, b): return a + b" and not second.follow_ups
    coding = read_prompts(path, categories=("coding",))
    assert [p.name for p in coding.prompts] == ["c1", "c2"]


def test_parquet_export_reads_like_the_jsonl(tmp_path):
    jsonl = read_prompts(write_jsonl(tmp_path / "speed.jsonl", ROWS), turns="all")
    parquet = read_prompts(write_parquet(tmp_path / "speed.parquet", ROWS), turns="all")
    assert parquet.prompts == jsonl.prompts and parquet.speed_bench


def test_placeholder_rows_are_refused_only_when_selected(tmp_path, fitting):
    rows = ROWS + [{"question_id": "m7", "category": "math", "turns": [SENTINEL]},
                   {"question_id": "m9", "category": "math", "turns": ["ok", f"{SENTINEL} (turn 2)"]}]
    for path in (write_jsonl(tmp_path / "masked.jsonl", rows), write_parquet(tmp_path / "masked.parquet", rows)):
        chosen = read_prompts(path, categories=("coding", "writing")).prompts
        assert [p.name for p in chosen] == ["c1", "c2", "w1", "w2"]
        result = run_cli([*fitting, "--prompts", path, "--category", "math"])
        assert result.exit_code == 1
        lines = result.stderr.strip().splitlines()
        assert len(lines) == 1 and path in lines[0]
        assert "2 selected row(s)" in lines[0] and "question_id m7" in lines[0] and "placeholder" in lines[0]
        assert run_cli([*fitting, "--prompts", path]).exit_code == 1


@pytest.mark.parametrize("rows, expected", [
    ([{"question_id": "a", "category": "coding", "turns": "not a list"}], "non-empty list of strings"),
    ([{"question_id": "a", "category": "coding", "turns": []}], "non-empty list of strings"),
    ([{"question_id": "a", "category": "coding", "turns": ["x"]},
      {"question_id": "b", "turns": ["y"], "category": None}], "row 2: SPEED-Bench rows need category"),
    ([{"question_id": "a", "category": "coding", "turns": ["x"]}, [1, 2]], "row 2: expected a JSON object"),
])
def test_malformed_rows_are_one_line(tmp_path, fitting, rows, expected):
    path = write_jsonl(tmp_path / "bad.jsonl", rows)
    result = run_cli([*fitting, "--prompts", path])
    assert result.exit_code == 1
    assert len(result.stderr.strip().splitlines()) == 1 and expected in result.stderr and path in result.stderr


def test_bad_parquet_files_are_one_line(tmp_path, fitting):
    pa = pytest.importorskip("pyarrow")
    import pyarrow.parquet as pq

    garbage = tmp_path / "garbage.parquet"
    garbage.write_bytes(b"PAR1 not really a parquet file")
    lacking = tmp_path / "lacking.parquet"
    pq.write_table(pa.table({"question_id": ["a"], "turns": [["x"]]}), str(lacking))
    for path, expected in ((garbage, "not a readable parquet file"), (lacking, "lacks SPEED-Bench column(s) category")):
        result = run_cli([*fitting, "--prompts", str(path)])
        assert result.exit_code == 1 and len(result.stderr.strip().splitlines()) == 1
        assert expected in result.stderr


def test_selection_mistakes_are_usage_errors(tmp_path, fitting):
    speed = write_jsonl(tmp_path / "speed.jsonl", ROWS)
    plain = write_jsonl(tmp_path / "plain.jsonl", [{"prompt": "hello"}])
    cases = [
        (["--prompts", speed, "--category", "poetry"], "--category poetry: not in"),
        (["--prompts", plain, "--category", "coding"], "have no \"category\""),
        (["--prompts", plain, "--turns", "all"], "needs a SPEED-Bench file"),
        (["--category", "coding"], "the bundled prompts have neither"),
    ]
    for args, expected in cases:
        result = run_cli([*fitting, *args])
        assert result.exit_code == 2, result.stderr
        assert len(result.stderr.strip().splitlines()) == 1 and expected in result.stderr


# --- intervals and profiles ------------------------------------------------------------------------------------


def counter_from(accepted: list[int], k: int = 3) -> AcceptanceCounter:
    c = AcceptanceCounter(k)
    for a in accepted:
        c.record(a)
    return c


def random_counters(n: int, seed: int, k: int = 3, rounds: int = 20, skill: float = 0.6) -> list[AcceptanceCounter]:
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        p = min(0.95, max(0.05, rng.gauss(skill, 0.15)))  # prompts differ in difficulty
        accepted = []
        for _ in range(rounds):
            a = 0
            while a < k and rng.random() < p:
                a += 1
            accepted.append(a)
        out.append(counter_from(accepted, k))
    return out


def test_the_interval_brackets_tau_and_narrows_with_more_conversations():
    few, many = random_counters(10, 1), random_counters(128, 1)
    for counters in (few, many):
        total = AcceptanceCounter(3)
        for c in counters:
            total.merge(c)
        interval = tau_interval(counters, [str(i) for i in range(len(counters))])
        assert interval.low < total.acceptance_length < interval.high
        assert tau_interval(counters, [str(i) for i in range(len(counters))]) == interval  # seeded: reproducible
    width = lambda cs: (lambda i: i.high - i.low)(tau_interval(cs, [str(i) for i in range(len(cs))]))  # noqa: E731
    assert width(many) < width(few) / 2
    assert tau_interval(few[:1], ["only"]) is None


def test_turns_of_one_conversation_are_resampled_together():
    counters = random_counters(30, 2)
    as_turns = tau_interval(counters, [f"conv{i // 3}" for i in range(30)])  # 10 conversations of 3 turns
    assert as_turns is not None
    merged = []
    for i in range(0, 30, 3):
        m = AcceptanceCounter(3)
        for c in counters[i:i + 3]:
            m.merge(c)
        merged.append(m)
    assert tau_interval(merged, [f"conv{i}" for i in range(10)]) == as_turns


def test_paired_difference_of_a_draft_with_itself_is_exactly_zero_and_pairing_removes_shared_noise():
    a = random_counters(40, 3, skill=0.5)
    point, interval = paired_difference(a, a, [str(i) for i in range(40)])
    assert point == 0 and (interval.low, interval.high) == (0, 0)
    # B accepts one more draft than A in a fifth of A's rejected rounds: a small, consistent gain
    rng = random.Random(4)
    b = []
    for c in a:
        hist = length_histogram(c)
        accepted = [int(length) - 1 for length, n in hist.items() for _ in range(n)]
        b.append(counter_from([x + 1 if x < 3 and rng.random() < 0.2 else x for x in accepted]))
    groups = [str(i) for i in range(40)]
    point, paired = paired_difference(a, b, groups)
    unpaired_a, unpaired_b = tau_interval(a, groups), tau_interval(b, groups)
    assert point > 0 and paired.low > 0  # resolved when paired ...
    assert unpaired_b.low < unpaired_a.high  # ... though the two drafts' own intervals overlap


def test_profile_matches_specdec_bench_conventions():
    # 100 rounds: 40 emitted 1 token, 30 emitted 2, 30 emitted 3 (specdec_bench's worked example)
    counter = counter_from([0] * 40 + [1] * 30 + [2] * 30)
    profile = speculation_profile(counter, per_request=[1.5, 2.3], draft="/x/org/draft", target="/y/org/target",
                                  eagle_version="3.1", per_category=None, conditions={"engine": "test"})
    jsonschema.validate(profile, schema("speculation-profile"))
    assert profile["acceptance_length_histogram"] == {"1": 40, "2": 30, "3": 30}
    assert profile["marginal_accept_rates"] == pytest.approx([0.6, 0.3, 0.0])
    assert profile["conditional_accept_rates"] == pytest.approx([0.6, 0.5, 0.0])
    assert profile["mean_accept_length"] == pytest.approx(1.9)
    assert profile["mean_accept_length_per_request"] == pytest.approx(1.9)
    validation = profile["validation"]
    assert validation["mean_consistency"]["passed"] and validation["marginal_monotonicity"]["passed"]
    assert profile["draft_checkpoint"]["id"] == "org/draft" and profile["target_model"]["id"] == "org/target"
    assert vllm_synthetic_config(counter)["synthetic_acceptance_rates"] == profile["marginal_accept_rates"]


@pytest.mark.parametrize("seed", range(5))
def test_profile_invariants_hold_for_any_counters(seed):
    rng = random.Random(seed)
    k = rng.randint(1, 6)
    counter = counter_from([rng.randint(0, k) for _ in range(rng.randint(1, 300))], k)
    profile = speculation_profile(counter, per_request=[], draft="d", target="t", eagle_version="3",
                                  per_category=None, conditions={"engine": "test"})
    jsonschema.validate(profile, schema("speculation-profile"))
    hist = {int(length): n for length, n in profile["acceptance_length_histogram"].items()}
    assert sum(hist.values()) == counter.drafts
    assert sum(length * n for length, n in hist.items()) / counter.drafts == pytest.approx(counter.acceptance_length)
    marginal, conditional = profile["marginal_accept_rates"], profile["conditional_accept_rates"]
    assert len(marginal) == len(conditional) == k
    assert all(a >= b for a, b in zip(marginal, marginal[1:]))
    product = 1.0
    for m, c in zip(marginal, conditional):
        product *= c
        assert product == pytest.approx(m, abs=1e-5)
    assert profile["mean_accept_length"] == pytest.approx(1 + sum(marginal), abs=1e-5)
    assert profile["validation"]["mean_consistency"]["passed"]


# --- verify and compare on a tiny real target -------------------------------------------------------------------

torch = pytest.importorskip("torch")

from tests.support.factory import make_draft  # noqa: E402
from tests.support.smollm2 import smollm2_path  # noqa: E402
from tests.support.targets import make_tiny_target  # noqa: E402

VOCAB = 49152
FAST = ["--max-new-tokens", "6", "--no-progress"]


@pytest.fixture(scope="module")
def env(tmp_path_factory):
    base = tmp_path_factory.mktemp("speedbench")
    target = make_tiny_target(base / "target", vocab=VOCAB, tokenizer_from=smollm2_path())
    a = make_draft(str(base / "a"), "vllm", hidden=64, vocab=VOCAB, draft_vocab=512, aux_ids=(1, 2, 3), target_layers=4)
    b = make_draft(str(base / "b"), "vllm", hidden=64, vocab=VOCAB, draft_vocab=512, aux_ids=(1, 2, 3),
                   target_layers=4, seed=7)
    return {"target": target, "a": a, "b": b, "speed": write_jsonl(base / "speed.jsonl", ROWS)}


def test_verify_reports_each_category_and_each_turn(env, tmp_path):
    profile_path = tmp_path / "profile.json"
    result = run_cli(["verify", env["a"], "--target", env["target"], "--prompts", env["speed"], "--turns", "all",
                      "--profile-out", str(profile_path), "--format", "json", *FAST])
    assert result.exit_code == 0, result.stderr
    doc = json.loads(result.stdout)
    jsonschema.validate(doc, schema("verify-report"))
    names = [p["name"] for p in doc["per_prompt"]]
    assert names == ["c1", "c1#turn2", "c2", "w1", "w2"]
    assert [p["conversation"] for p in doc["per_prompt"]] == ["c1", "c1", "c2", "w1", "w2"]
    first, second = doc["per_prompt"][0], doc["per_prompt"][1]
    assert second["prompt_tokens"] > first["prompt_tokens"] + first["generated_tokens"]  # the answer, then turn 2
    assert set(doc["categories"]) == {"coding", "writing"}
    coding = doc["categories"]["coding"]
    assert coding["prompts"] == 3 and coding["conversations"] == 2
    assert coding["num_drafts"] == sum(p["num_drafts"] for p in doc["per_prompt"] if p["category"] == "coding")
    assert sum(c["num_drafts"] for c in doc["categories"].values()) == doc["num_drafts"]
    profile = json.loads(profile_path.read_text())
    jsonschema.validate(profile, schema("speculation-profile"))
    assert profile["mean_accept_length"] == pytest.approx(doc["acceptance_length"], abs=1e-6)
    assert profile["marginal_accept_rates"] == pytest.approx(doc["per_position_acceptance"], abs=1e-6)
    assert set(profile["per_category"]) == {"coding", "writing"}
    assert env["target"] not in json.dumps(profile)  # no local paths in a file meant to be published


def test_human_output_has_the_category_table_and_the_vllm_keys(env, tmp_path):
    result = run_cli(["verify", env["a"], "--target", env["target"], "--prompts", env["speed"],
                      "--profile-out", str(tmp_path / "p.json"), *FAST])
    assert result.exit_code == 0, result.stderr
    assert "By category" in result.stdout and "coding" in result.stdout and "writing" in result.stdout
    assert '"synthetic_acceptance_rates": [' in result.stdout


def test_compare_a_draft_with_itself_and_with_another(env, tmp_path):
    same = run_cli(["compare", env["a"], env["a"], "--target", env["target"], "--prompts", env["speed"],
                    "--format", "json", *FAST])
    assert same.exit_code == 0, same.stderr
    doc = json.loads(same.stdout)
    jsonschema.validate(doc, schema("compare-report"))
    assert list(doc["categories"]) == ["all", "coding", "writing"]
    for row in doc["categories"].values():
        assert row["b_minus_a"]["acceptance_length_difference"] == 0
        assert row["b_minus_a"]["interval"] is None or (row["b_minus_a"]["interval"]["low"],
                                                        row["b_minus_a"]["interval"]["high"]) == (0, 0)
    other = run_cli(["compare", env["a"], env["b"], "--target", env["target"], "--prompts", env["speed"],
                     "--turns", "all", "--format", "json", *FAST])
    assert other.exit_code == 0, other.stderr
    doc = json.loads(other.stdout)
    jsonschema.validate(doc, schema("compare-report"))
    assert [p["name"] for p in doc["per_prompt"]] == ["c1", "c1#turn2", "c2", "w1", "w2"]
    everything = doc["categories"]["all"]
    assert everything["b_minus_a"]["acceptance_length_difference"] == pytest.approx(
        everything["b"]["acceptance_length"] - everything["a"]["acceptance_length"])


def test_compare_replays_exactly_what_verify_measures_live(tmp_path):
    """Bundled EAGLE-3 vs EAGLE-3.1 on SmolLM2: each draft's τ from the replay equals verify's live decode."""
    repo = str(REPO)
    drafts = [os.path.join(repo, "examples", "drafters", name) for name in ("smollm2-135m-eagle3",
                                                                             "smollm2-135m-eagle3.1")]
    prompts = write_jsonl(tmp_path / "speed.jsonl", ROWS)
    args = ["--target", smollm2_path(), "--prompts", prompts, "--max-new-tokens", "16", "--no-progress",
            "--format", "json", "--dtype", "float32"]
    compared = json.loads(run_cli(["compare", *drafts, *args]).stdout)
    for key, draft in zip("ab", drafts):
        live = json.loads(run_cli(["verify", draft, *args]).stdout)
        assert [p[f"{key}_acceptance_length"] for p in compared["per_prompt"]] == pytest.approx(
            [p["acceptance_length"] for p in live["per_prompt"]])
        assert compared["categories"]["all"][key]["num_drafts"] == live["num_drafts"]
