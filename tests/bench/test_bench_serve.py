"""`eaglekit bench` as complete as `vllm bench serve`: --seed, SPEED-Bench by name (--dataset-name speed_bench),
--burstiness, --goodput, a k sweep (-k 1,3,5: one server per k) and input-length buckets (--input-len N,N).

The servers bench starts are loopback stand-ins for vLLM's (tests/support/loopback_vllm.py), one per side, whose
spec-decode counters grow as the measured requests are served; vLLM's benchmark client is replaced in-process and
records what it was asked. The target is the real SmolLM2 tokenizer and the draft a bundled one, read as bench reads
them. The real engine runs in tests/bench/test_bench_vllm.py."""

from __future__ import annotations

import json
import os
from types import SimpleNamespace

import jsonschema
import pytest

import eaglekit.bench.run as bench_run
from eaglekit.bench.datasets import read_subset
from eaglekit.bench.report import good_requests
from eaglekit.errors import CheckpointError, UsageError
from eaglekit.runtime.endpoint import Endpoint
from tests.support import REPO
from tests.support.cli import run_cli
from tests.support.loopback_vllm import FakeBenchClient, LoopbackVllm

ROOT = str(REPO)
DRAFT = os.path.join(ROOT, "examples", "drafters", "smollm2-135m-eagle3.1")
SPEED_BENCH = os.path.join(ROOT, "tests", "data", "speed_bench")
SCHEMA = os.path.join(ROOT, "eaglekit", "schemas", "bench-report.schema.json")
# the loopback servers stand in for vLLM, but bench reads the real target's config and tokenizer (SmolLM2)
pytestmark = pytest.mark.model


@pytest.fixture
def served(monkeypatch):
    """Every server bench starts is a loopback one (with the draft: k per-position counters, and each measurement
    drafts 40 rounds accepting 30 tokens); `started` records (side, argv) in order, `live` how many run at once."""
    started: list[tuple[str, list[str]]] = []
    servers: dict[str, LoopbackVllm] = {}
    live = {"now": 0, "most": 0}

    def start(python, work, side, *, argv, **_):
        config = json.loads(argv[argv.index("--speculative-config") + 1]) if "--speculative-config" in argv else None
        fake = LoopbackVllm(speculative=config is not None, k=config["num_speculative_tokens"] if config else 3)
        servers[fake.url] = fake
        started.append((side, argv))
        live["now"] += 1
        live["most"] = max(live["most"], live["now"])

        def stop():
            live["now"] -= 1
            fake.close()

        return SimpleNamespace(endpoint=Endpoint(fake.url, side), stop=stop, start_s=1.0, flags=argv,
                               info={"vllm_version": "0.32.0", "device_type": "cpu", "device_name": "loopback"})

    def measured(url: str) -> None:
        if servers[url].speculative:
            servers[url].serve(drafts=40, accepted=30)

    monkeypatch.setattr(bench_run, "check_engine_available", lambda engine, progress=None: "0.32.0")
    monkeypatch.setattr(bench_run, "start_server", start)
    monkeypatch.setattr(bench_run, "BenchClient", FakeBenchClient)
    monkeypatch.setattr(FakeBenchClient, "on_run", staticmethod(measured))
    monkeypatch.setattr(FakeBenchClient, "runs", [])
    return SimpleNamespace(started=started, live=live, runs=FakeBenchClient.runs, servers=servers)


def bench(smollm2_dir: str, *args: str) -> dict:
    result = run_cli(["bench", DRAFT, "--target", smollm2_dir, "--concurrency", "1,2", "--max-new-tokens", "16",
                      *args, "--format", "json"])
    assert result.exit_code == 0, result.output
    doc = json.loads(result.stdout)
    with open(SCHEMA, encoding="utf-8") as fh:
        jsonschema.validate(doc, json.load(fh))
    return doc


def test_a_k_sweep_starts_the_target_alone_once_then_one_server_per_k_and_reports_each(served, smollm2_dir):
    doc = bench(smollm2_dir, "-k", "1,3,5", "--input-len", "32")
    sides = [side for side, _ in served.started]
    assert sides == ["target alone", "target + draft, k=1", "target + draft, k=3", "target + draft, k=5"]
    assert served.live["most"] == 1  # never two servers at once
    configs = [json.loads(argv[argv.index("--speculative-config") + 1]) for _, argv in served.started[1:]]
    assert [c["num_speculative_tokens"] for c in configs] == [1, 3, 5] and {c["method"] for c in configs} == {"eagle3"}
    assert doc["num_speculative_tokens_swept"] == [1, 3, 5] and doc["num_speculative_tokens"] == 5
    assert [(r["num_speculative_tokens"], r["concurrency"]) for r in doc["rows"]] == [
        (1, 1), (1, 2), (3, 1), (3, 2), (5, 1), (5, 2)]
    for row in doc["rows"]:  # each k's own counters: k positions, 40 rounds accepting 30 tokens
        assert len(row["per_position_acceptance"]) == row["num_speculative_tokens"]
        assert row["num_draft_tokens"] == 40 * row["num_speculative_tokens"]
        assert row["acceptance_length"] == pytest.approx(1 + 30 / 40)
    assert set(doc["engine"]["server_args"]) == {"baseline", "speculative_k1", "speculative_k3", "speculative_k5"}
    assert [v["num_speculative_tokens"] for v in doc["verdicts"]] == [1, 3, 5]
    assert doc["verdicts"][0]["text"].startswith("k=1, 32 input tokens: ")


def test_counters_reset_under_one_k_of_a_sweep_leave_that_k_without_tau_and_say_so(served, smollm2_dir,
                                                                                   monkeypatch):
    def measured(url: str) -> None:
        fake = served.servers[url]
        if fake.speculative and fake.k == 3:  # this server's counters start again from zero mid-measurement
            fake.counts = dict.fromkeys(fake.counts, 0)
        elif fake.speculative:
            fake.serve(drafts=40, accepted=30)

    monkeypatch.setattr(FakeBenchClient, "on_run", staticmethod(measured))
    doc = bench(smollm2_dir, "-k", "1,3", "--input-len", "32")
    taus = {(r["num_speculative_tokens"], r["concurrency"]): r["acceptance_length"] for r in doc["rows"]}
    assert taus == {(1, 1): pytest.approx(1.75), (1, 2): pytest.approx(1.75), (3, 1): None, (3, 2): None}
    unknown = [note for note in doc["notes"] if note.startswith("τ unknown")]
    assert len(unknown) == 1 and unknown[0].startswith("τ unknown at k=3, C=1, 32 input tokens: "), doc["notes"]
    assert "lower after the measurement" in unknown[0]


def test_a_sweep_reads_at_80_columns_with_every_k_and_bucket_shown(served, smollm2_dir, monkeypatch, capsys):
    """The speed-up table of a sweep over buckets keeps its k, input and C columns whole in a log 80 columns wide
    (only the per-position list folds), and the config line names every k."""
    from eaglekit.cli.bench import render
    from eaglekit.cli.output import out

    doc = bench(smollm2_dir, "-k", "1,3,5", "--input-len", "32,64", "--concurrency", "1")
    capsys.readouterr()
    monkeypatch.setattr(out, "width", 80)
    render(doc)
    lines = capsys.readouterr().out.splitlines()
    assert max(len(line) for line in lines) <= 80 and not any("…" in line for line in lines)
    top = lines.index(next(line for line in lines if line.startswith("Speed-up per concurrency")))
    cells = [[c.strip() for c in line.split("│")[1:4]] for line in lines[top:] if line.startswith("│ ")]
    firsts = [c for c in cells if c[0]][:6]  # a row's first line; a folded per-position list adds blank ones
    assert firsts == [[k, n, "1"] for k in ("1", "3", "5") for n in ("32", "64")]
    head = " ".join(" ".join(lines[:top]).split())  # the key-value panel, its wrapped lines joined
    assert '"num_speculative_tokens": 5}, num_speculative_tokens 1, 3, 5 in turn (one server each)' in head


def test_the_model_card_shows_a_k_column_for_a_sweep(served, smollm2_dir, tmp_path):
    from eaglekit.hub.card_figures import speed_section
    from eaglekit.hub.evidence import load_bench_report

    saved = tmp_path / "bench.json"
    saved.write_text(json.dumps(bench(smollm2_dir, "-k", "1,3", "--input-len", "32,64")))
    report = load_bench_report(str(saved)).doc  # the card's own reading: every row checked against its k
    card = speed_section(report)
    assert "| k | Input tokens | Concurrency |" in card and "k = 1, 3" in card
    lines = [line for line in card.splitlines() if line.startswith("| 1 |") or line.startswith("| 3 |")]
    assert len(lines) == 8  # 2 k x 2 buckets x 2 concurrencies
    assert lines[0].startswith("| 1 | 32 | 1 |") and lines[-1].startswith("| 3 | 64 | 2 |")


def test_input_len_buckets_are_measured_each_on_its_own(served, smollm2_dir):
    doc = bench(smollm2_dir, "--input-len", "32,64")
    assert [(r["input_len"], r["concurrency"]) for r in doc["rows"]] == [(32, 1), (32, 2), (64, 1), (64, 2)]
    assert [r["speculative"]["mean_input_tokens"] for r in doc["rows"]] == [32.0, 32.0, 64.0, 64.0]
    asked = [run["args"][run["args"].index("--random-input-len") + 1] for run in served.runs]
    assert asked == ["32", "32", "64", "64"] * 2  # the target alone, then with the draft
    assert doc["prompts"]["input_len_buckets"] == [32, 64] and doc["prompts"]["input_len"] is None
    assert doc["prompts"]["name"] == "random"  # not the default prompt set, which random prompts replace
    assert [v["input_len"] for v in doc["verdicts"]] == [32, 64]


def test_a_bucket_past_the_targets_context_is_refused_before_any_server(served, smollm2_dir):
    result = run_cli(["bench", DRAFT, "--target", smollm2_dir, "--input-len", "64,9000", "--max-new-tokens", "16"])
    assert result.exit_code == 2 and served.started == []
    line = result.stderr.strip()
    assert "\n" not in line and "--input-len 9000" in line and "max_model_len 8,192" in line


def test_the_seed_orders_the_prompts_and_seeds_the_client_reproducibly(served, smollm2_dir):
    def prompts_sent(seed: str) -> list[list[str]]:
        served.runs.clear()
        doc = bench(smollm2_dir, "--dataset-name", "speed_bench", "--dataset-path", SPEED_BENCH, "--category",
                    "coding", "--limit", "3", "--seed", seed)
        assert doc["seed"] == int(seed) and doc["prompts"]["shuffled_with_seed"] is True
        assert {run["args"][run["args"].index("--seed") + 1] for run in served.runs} == {seed}
        return [run["prompts"] for run in served.runs]

    first, again, other = prompts_sent("7"), prompts_sent("7"), prompts_sent("8")
    assert first == again
    assert first != other
    assert first[0] == first[2]  # both servers get the same requests in the same order
    assert len({p for run in first for p in run}) == 3  # --limit 3 of the category's 4, after the shuffle


def test_without_a_seed_named_prompts_keep_their_order(served, smollm2_dir, tmp_path):
    prompts = tmp_path / "p.jsonl"
    prompts.write_text("".join(json.dumps({"prompt": f"question {i}"}) + "\n" for i in range(4)))
    doc = bench(smollm2_dir, "--prompts", str(prompts), "--concurrency", "1", "--num-prompts", "4")
    sent = served.runs[0]["prompts"]
    assert [("question 0" in p, "question 3" in p) for p in (sent[0], sent[3])] == [(True, False), (False, True)]
    assert doc["seed"] == 0 and doc["prompts"]["shuffled_with_seed"] is False


def test_burstiness_and_rate_reach_vllms_client_and_the_report(served, smollm2_dir):
    doc = bench(smollm2_dir, "--input-len", "32", "--request-rate", "4", "--burstiness", "0.5", "--seed", "3")
    for run in served.runs:
        args = run["args"]
        assert [args[args.index(flag) + 1] for flag in ("--request-rate", "--burstiness", "--seed")] == [
            "4", "0.5", "3"]
    assert doc["burstiness"] == 0.5 and doc["request_rate"] == 4.0


@pytest.mark.parametrize(("args", "needle"), [
    (["--burstiness", "0.5"], "with inf every request starts at once"),
    (["--request-rate", "2", "--burstiness", "0"], "--burstiness 0: expected a positive number"),
    (["--goodput", "ttfb:100"], "--goodput ttfb: an SLO is one of ttft, tpot, e2el"),
    (["--goodput", "ttft"], "--goodput 'ttft': expected NAME:MS"),
    (["--goodput", "ttft:100", "--goodput", "ttft:200"], "--goodput names an SLO twice"),
    (["-k", "3,3"], "-k lists a value twice"),
    (["-k", "0,3"], "-k must be at least 1"),
    (["--input-len", "32,32"], "--input-len takes distinct positive token counts"),
    (["--dataset-path", SPEED_BENCH], "--dataset-path names the folder of --dataset-name speed_bench"),
    (["--dataset-name", "speed_bench", "--input-len", "32"], "--dataset-name speed_bench chooses the prompts"),
    (["--dataset-name", "speed_bench", "--speed-bench-dataset-subset", "throughput_4k"],
     "--speed-bench-dataset-subset 'throughput_4k': use one of qualitative, throughput_1k"),
])
def test_bad_load_and_sweep_options_are_usage_errors(served, args, needle):
    result = run_cli(["bench", DRAFT, "--target", DRAFT, *args])
    assert result.exit_code == 2 and needle in result.stderr, result.stderr
    assert served.started == []


def test_goodput_counts_the_requests_meeting_every_slo_as_vllm_does(served, smollm2_dir):
    # request i: TTFT 10 (i + 1) ms, 16 tokens at 10 + i tokens/s: E2EL 16000 / (10 + i) ms
    doc = bench(smollm2_dir, "--input-len", "32", "--concurrency", "1", "--goodput", "ttft:50",
                "--goodput", "e2el:1300")
    side = doc["rows"][0]["speculative"]
    ttft_ok = {i for i in range(10) if 10 * (i + 1) <= 50}
    e2el_ok = {i for i in range(10) if 16000 / (10 + i) <= 1300}
    assert side["good_requests"] == len(ttft_ok & e2el_ok) == 2  # requests 3 and 4
    assert side["request_goodput"] == pytest.approx(2 / 2.0)  # over the 2 s run
    assert doc["goodput"] == {"ttft": 50.0, "e2el": 1300.0}
    args = served.runs[0]["args"]
    assert args[args.index("--goodput"):args.index("--goodput") + 3] == ["--goodput", "ttft:50", "e2el:1300"]


def test_tpot_of_a_one_token_output_counts_as_zero_as_in_vllm():
    result = {"ttfts": [0.5, 0.5], "latencies": [0.5, 2.5], "output_lens": [1, 3]}
    assert good_requests(result, {"tpot": 10}) == 1  # 0 ms, then (2.5 - 0.5) / 2 s = 1000 ms
    assert good_requests(result, {"tpot": 1000}) == 2
    assert good_requests(result, {"tpot": 1000, "ttft": 499}) == 0


def test_speed_bench_by_name_is_measured_per_category(served, smollm2_dir):
    doc = bench(smollm2_dir, "--dataset-name", "speed_bench", "--dataset-path", SPEED_BENCH, "--limit", "2",
                "--concurrency", "1")
    assert sorted(r["category"] for r in doc["rows"]) == ["coding", "math", "writing"]
    assert sorted(v["category"] for v in doc["verdicts"]) == ["coding", "math", "writing"]
    assert doc["prompts"]["name"] == "SPEED-Bench qualitative" and doc["prompts"]["count"] == 6
    assert doc["prompts"]["dataset_name"] == "speed_bench" and doc["prompts"]["speed_bench"] is True
    assert all(r["input_len"] is None for r in doc["rows"])


def test_the_throughput_split_is_a_bucket_of_its_named_length(served, smollm2_dir):
    doc = bench(smollm2_dir, "--dataset-name", "speed_bench", "--dataset-path", SPEED_BENCH,
                "--speed-bench-dataset-subset", "throughput_1k", "--concurrency", "1")
    assert {(r["input_len"], r["category"]) for r in doc["rows"]} == {(1024, "low_entropy"), (1024, "high_entropy")}
    assert all(r["speculative"]["mean_input_tokens"] > 0 for r in doc["rows"])


def test_both_speed_bench_schemas_are_read_first_turns_only(tmp_path):
    qualitative = read_subset(SPEED_BENCH, "qualitative", ("math",), seed=0)
    assert len(qualitative.prompts) == 4 and {p.category for p in qualitative.prompts} == {"math"}
    assert qualitative.input_len is None
    prepared = read_subset(SPEED_BENCH, "throughput_1k", (), seed=0)
    assert {p.category for p in prepared.prompts} == {"low_entropy", "high_entropy"} and prepared.input_len == 1024
    assert all(len(p.messages) == 1 and p.messages[0]["role"] == "user" for p in prepared.prompts)
    # the order is vLLM's client's: shuffled with the seed
    assert [p.name for p in read_subset(SPEED_BENCH, "qualitative", (), 5).prompts] == [
        p.name for p in read_subset(SPEED_BENCH, "qualitative", (), 5).prompts]
    assert [p.name for p in read_subset(SPEED_BENCH, "qualitative", (), 5).prompts] != [
        p.name for p in read_subset(SPEED_BENCH, "qualitative", (), 6).prompts]


def test_speed_bench_is_found_in_the_hugging_face_cache(tmp_path, monkeypatch):
    import pyarrow as pa
    import pyarrow.parquet as pq

    snapshot = tmp_path / "hub" / "datasets--nvidia--SPEED-Bench" / "snapshots" / "abc123" / "qualitative"
    snapshot.mkdir(parents=True)
    rows = [{"question_id": "q1", "category": "coding", "turns": ["Write a loop.", "Now in C."]},
            {"question_id": "q2", "category": "math", "turns": ["Add 2 and 3."]}]
    pq.write_table(pa.Table.from_pylist(rows), snapshot / "test-00000-of-00001.parquet")
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))
    found = read_subset(None, "qualitative", (), 0)
    assert sorted(p.messages[0]["content"] for p in found.prompts) == ["Add 2 and 3.", "Write a loop."]


def test_a_missing_dataset_is_one_line_naming_what_to_pass(served, smollm2_dir, tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "empty-cache"))
    for extra in ([], ["--dataset-path", str(tmp_path)]):
        result = run_cli(["bench", DRAFT, "--target", smollm2_dir, "--dataset-name", "speed_bench", *extra])
        assert result.exit_code == 1 and served.started == []
        line = result.stderr.strip()
        assert "\n" not in line and "--dataset-path" in line and "qualitative.jsonl" in line


def test_a_placeholder_row_or_a_row_of_neither_schema_is_refused(tmp_path):
    (tmp_path / "qualitative.jsonl").write_text(json.dumps({"messages": [{"role": "user", "content": (
        "FULL BENCHMARK DATA SHOULD BE FETCHED FROM THE SOURCE USING SPECDEC_BENCH")}], "category": "qa"}) + "\n")
    with pytest.raises(CheckpointError, match="placeholder"):
        read_subset(str(tmp_path), "qualitative", (), 0)
    (tmp_path / "qualitative.jsonl").write_text(json.dumps({"prompt": "hello"}) + "\n")
    with pytest.raises(CheckpointError, match="need \"messages\""):
        read_subset(str(tmp_path), "qualitative", (), 0)
    with pytest.raises(UsageError, match="--category nope: not in SPEED-Bench qualitative"):
        read_subset(SPEED_BENCH, "qualitative", ("nope",), 0)
