"""eaglekit push against a loopback Hub with the real huggingface_hub client: bytes, card, errors, retries."""

from __future__ import annotations

import dataclasses
import hashlib
import http.client
import json
import os
import re
import socket
import subprocess
import sys
import types

import jsonschema
import pytest
from huggingface_hub import ModelCard, constants

from eaglekit.cli.main import main
from eaglekit.errors import EaglekitError
from eaglekit.families import load_draft
from eaglekit.findings import Finding
from eaglekit.hub import evidence, upload
from eaglekit.hub.card import build_card
from eaglekit.hub.push import push
from eaglekit.hub.upload import COMMIT_ATTEMPTS
from eaglekit.io.checkpoint import INDEX_NAME
from tests.support import REPO as CHECKOUT  # the checkout (REPO here is a Hub repository id)
from tests.support.factory import make_draft, make_target_config
from tests.support.reports import TARGET, TAU_LABEL, VERIFY_REPORT, bench_row, measured, write_bench, write_report

REPO = "eagle-org/llama-eagle3-draft"
SCHEMA = json.load(open(os.path.join(str(CHECKOUT), "schemas", "push-result.schema.json")))
SHARDS = ["model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors"]
UPLOADED = {"config.json", INDEX_NAME, *SHARDS}
TAU_ROW = f"| {TAU_LABEL} | 2.81 |"



@pytest.fixture
def draft_dir(tmp_path) -> str:
    """A sharded vLLM-layout EAGLE-3.1 Llama draft, plus the clutter a training run leaves next to it."""
    path = make_draft(str(tmp_path / "draft"), "vllm", shards=2, fc_norm=True, norm_output=True)
    for name, data in {
        "notes.txt": b"lr=3e-4\n", "optimizer.pt": os.urandom(2048), "README.md": b"# old card\n",
        "stray.safetensors": os.urandom(64), "training_args.json": b"{}",
    }.items():
        with open(os.path.join(path, name), "wb") as fh:
            fh.write(data)
    os.makedirs(os.path.join(path, "checkpoint-100"))
    with open(os.path.join(path, "checkpoint-100", "config.json"), "w") as fh:
        fh.write("{}")
    return path


@pytest.fixture
def rules(monkeypatch):
    """Push's default validation, recorded: the real rules run, with `.findings` (when set) standing in for what it
    found; `.engines` lists the engine argument of every run."""
    import eaglekit.rules

    real = eaglekit.rules.run_rules
    record = types.SimpleNamespace(findings=None, engines=[])

    def run_rules(spec, *, engine="vllm", **kw):
        record.engines.append(engine)
        report = real(spec, engine=engine, **kw)
        return report if record.findings is None else dataclasses.replace(report, findings=list(record.findings))

    monkeypatch.setattr(eaglekit.rules, "run_rules", run_rules)
    return record


def no_findings(spec):
    return []


def local_bytes(path: str) -> dict[str, bytes]:
    out = {}
    for name in UPLOADED:
        with open(os.path.join(path, name), "rb") as fh:
            out[name] = fh.read()
    return out


def snapshot(path: str) -> dict[str, tuple[str, int]]:
    state = {}
    for root, _, files in os.walk(path):
        for name in files:
            full = os.path.join(root, name)
            with open(full, "rb") as fh:
                state[os.path.relpath(full, path)] = (hashlib.sha256(fh.read()).hexdigest(), os.stat(full).st_mtime_ns)
    return state


DRY_RUN = ("--dry-run", "--offline")  # the card and the file list; what the Hub says: test_push_hub_check.py


def run_cli(capsys, *args: str) -> tuple[int, str, str]:
    capsys.readouterr()
    try:
        main(["push", *args])
        code = 0
    except SystemExit as exc:
        code = exc.code
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def card_data(text: str) -> dict:
    return ModelCard(text).data.to_dict()


# ---------------------------------------------------------------- what arrives


def test_push_commits_exactly_the_local_bytes_and_the_card(fake_hub, draft_dir):
    before = snapshot(draft_dir)
    result = push(draft_dir, REPO, target=TARGET, token=fake_hub.token, endpoint=fake_hub.endpoint,
                  commit_message="Add the 3.1 draft", validate=no_findings)

    repo = fake_hub.repo(REPO)
    stored = repo.files("main")
    local = local_bytes(draft_dir)
    assert set(stored) == UPLOADED | {"README.md", "eaglekit.json"}
    assert {name: stored[name] for name in UPLOADED} == local
    # both weight shards went through LFS: batch, PUT (bytes verified by sha256), lfsFile pointer in the commit
    assert repo.lfs_paths() == set(SHARDS)
    assert {r.body for r in fake_hub.calls("lfs_upload")} == {local[s] for s in SHARDS}
    assert set(fake_hub.lfs_objects) == {hashlib.sha256(local[s]).hexdigest() for s in SHARDS}
    (commit,) = repo.commits
    assert commit.summary == "Add the 3.1 draft"
    assert sorted(commit.ndjson_keys) == ["file"] * 4 + ["header"] + ["lfsFile"] * 2
    assert result.commit_oid == repo.heads["main"] and result.commit_url.endswith(commit.oid)
    assert {(f.path, f.size, f.sha256) for f in result.files} == {
        (name, len(data), hashlib.sha256(data).hexdigest()) for name, data in stored.items()
    }

    readme = stored["README.md"].decode()
    assert readme == result.card and readme in fake_hub.validated_cards
    meta = card_data(readme)
    assert meta["base_model"] == TARGET
    assert "pipeline_tag" not in meta and "library_name" not in meta  # no Hub snippet that cannot run a draft
    assert {"eagle3", "eagle3.1", "speculative-decoding", "draft-model", "vllm", "eaglekit",
            "arxiv:2503.01840"} <= set(meta["tags"])
    assert (f"vllm serve {TARGET} --speculative-config "
            f"'{{\"model\": \"{REPO}\", \"method\": \"eagle3\", \"num_speculative_tokens\": 3}}'") in readme
    # vLLM-convention ids in eagle_config: SGLang would shift them, so the card gives no SGLang command but its layout
    assert "launch_server" not in readme
    assert ("- **SGLang**: SGLang's Llama-target path (always adds 1) turns eagle_config ids [2, 6, 9] into layers "
            "[3, 7, 10]") in readme and f"`eaglekit upgrade {REPO} draft-sglang --to sglang`" in readme
    # TensorRT-LLM and tokenspeed are served with the setting that pins the trained layers
    assert "  eagle3_layers_to_capture: [1, 5, 8]" in readme
    assert (f"tokenspeed serve {TARGET} --speculative-algorithm EAGLE3 --speculative-draft-model-path {REPO} "
            "--speculative-num-steps 3 --speculative-eagle-topk 1 --speculative-num-draft-tokens 4 "
            "--eagle3-layers-to-capture 1,5,8") in readme
    assert "`[2, 6, 9]` (vLLM convention: input of layer i / HF `hidden_states` index)" in readme
    assert "forced despite validation errors" not in readme

    manifest = json.loads(stored["eaglekit.json"])
    assert manifest["target"] == TARGET
    assert manifest["draft"]["eagle_version"] == "3.1" and manifest["draft"]["aux_layer_ids"] == [2, 6, 9]
    assert manifest["validation"] == {"engine": "vllm", "ran": True, "errors": 0, "warnings": 0, "forced": False,
                                      "findings": []}
    assert snapshot(draft_dir) == before


def test_cli_json_push_with_verify_report(fake_hub, draft_dir, rules, tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("HF_TOKEN", fake_hub.token)
    report = write_report(tmp_path / "verify.json", draft_dir, measured=measured(draft_dir, name_or_path=TARGET))
    code, out, err = run_cli(capsys, draft_dir, "--repo-id", REPO, "--target", TARGET, "--report", report,
                             "--private", "--endpoint", fake_hub.endpoint, "--format", "json")
    assert code == 0, err
    doc = json.loads(out)
    jsonschema.validate(doc, SCHEMA)
    assert rules.engines == ["all"] and doc["validated"] is True  # one run: vLLM's verdict and the card's
    repo = fake_hub.repo(REPO)
    assert repo.private is True
    assert doc["commit_oid"] == repo.heads["main"] and not doc["dry_run"]
    readme = repo.files()["README.md"].decode()
    assert readme == doc["card"]
    for row in ("| Lossless (greedy output identical to the target's) | yes |", TAU_ROW,
                "| — | 1 | 0.80 | — | — | — |\n| — | 2 | 0.60 | — | — | — |\n| — | 3 | 0.41 | — | — | — |",
                "| Reference-decode speed ratio (batch 1, not a serving engine: see `eaglekit bench`) | 2.01× |",
                "| Prompts | mt-bench (80) |", "| Device | NVIDIA H200 |",
                "| Tokens/s with the draft, eaglekit's reference decode | 120.5 |"):
        assert row in readme
    assert json.loads(repo.files()["eaglekit.json"])["verify"] == {
        **VERIFY_REPORT, "measured": measured(draft_dir, name_or_path=TARGET)}
    assert f"| Target measured | {TARGET} (config.json 111111111111…) |" in readme
    assert "measured on other files" not in readme
    assert fake_hub.token not in out + err


def test_a_report_of_other_files_is_refused_unless_forced(fake_hub, draft_dir, rules, tmp_path, capsys):
    bound = json.loads(open(write_report(tmp_path / "bound.json", draft_dir)).read())
    other = dict(bound["measured"]["draft_files"])
    other["config.json"] = "sha256:" + "0" * 64
    cases = {
        "other": ({**bound, "measured": {**bound["measured"], "draft_files": other}},
                  "config.json differs from the file the report measured"),
        "unbound": ({k: v for k, v in bound.items() if k != "measured"}, "does not record which files it measured"),
        "other target": ({**bound, "measured": {**bound["measured"], "target": {
            "name_or_path": "other-org/Other-Model", "folder": "x", "config_sha256": "sha256:" + "2" * 64}}},
            "measured against other-org/Other-Model, not " + TARGET),
    }
    for name, (report, expected) in cases.items():
        path = tmp_path / f"{name}.json"
        path.write_text(json.dumps(report))
        code, out, err = run_cli(capsys, draft_dir, "--repo-id", REPO, "--target", TARGET, "--report", str(path),
                                 *DRY_RUN)
        assert code == 1 and err.count("\n") == 1 and expected in err and "--force" in err, (name, err)
        code, out, err = run_cli(capsys, draft_dir, "--repo-id", REPO, "--target", TARGET, "--report", str(path),
                                 *DRY_RUN, "--force", "--format", "json")
        assert code == 0, err
        card = json.loads(out)["card"]
        assert "Warning: these figures were measured on other files" in card and expected in card


def test_a_bench_report_is_the_cards_serving_speed_with_its_conditions(fake_hub, draft_dir, rules, tmp_path, capsys):
    bench = write_bench(tmp_path / "bench.json", draft_dir)
    code, out, err = run_cli(capsys, draft_dir, "--repo-id", REPO, "--target", TARGET, "--bench", bench,
                             *DRY_RUN, "--format", "json")
    assert code == 0, err
    doc = json.loads(out)
    card = doc["card"]
    section = card[card.index("## Serving speed"):]
    assert "vllm 0.33.0 on 1 x NVIDIA H200 (cuda, tensor parallel 1), bfloat16, k = 3, greedy" in section
    rows = json.loads(open(bench).read())["rows"]
    for row in rows:
        assert (f"| {row['concurrency']} | {row['baseline']['per_user_tokens_per_s']['mean']:.1f} | "
                f"{row['speculative']['per_user_tokens_per_s']['mean']:.1f} | {row['speed_up']:.2f}× |") in section
    # the verdict is judged again from the rows, never the report's own words (Markdown characters escaped)
    assert ("- speculation pays at C=1 x2.00 \\[1.90, 2.10\\], C=4 x1.50 \\[1.40, 1.60\\]; loses at C=16 x0.90 "
            "\\[0.80, 1.00\\]; it stops being shown to pay at C=16") in section
    assert "pays up to C=4" not in card
    assert "measured on other files" not in card


def test_with_a_bench_report_the_card_states_the_engines_speed_alone(fake_hub, draft_dir, rules, tmp_path, capsys):
    report = write_report(tmp_path / "verify.json", draft_dir, measured=measured(draft_dir, name_or_path=TARGET))
    bench = write_bench(tmp_path / "bench.json", draft_dir)
    code, out, err = run_cli(capsys, draft_dir, "--repo-id", REPO, "--target", TARGET, "--report", report,
                             "--bench", bench, *DRY_RUN, "--format", "json")
    assert code == 0, err
    card = json.loads(out)["card"]
    assert TAU_ROW in card and "## Serving speed" in card
    assert "reference decode" not in card and "Reference-decode speed ratio" not in card


def _with_side(row: dict, side: str, **figures) -> dict:
    return {**row, side: {**row[side], **figures}}


@pytest.mark.parametrize("row, expected", [
    ({**bench_row(2, 50.0, 100.0), "speed_up": 3.0}, "speed_up 3.0 is not the ratio of the means beside it"),
    ({**bench_row(2, 50.0, 100.0), "throughput_speed_up": 1.2}, "throughput_speed_up 1.2 is not the ratio"),
    ({**bench_row(2, 50.0, 100.0), "speed_up_interval": {"low": 2.1, "high": 1.9}}, "its low must be non-negative"),
    ({**bench_row(2, 50.0, 100.0), "speed_up_interval": {"low": 2.5, "high": 2.9}}, "excludes its own estimate 2.0"),
    ({**bench_row(2, 50.0, 100.0), "speed_up_interval": {"low": -0.5, "high": 2.9}}, "its low must be non-negative"),
    (_with_side(bench_row(2, 50.0, 100.0), "baseline", ttft_ms={"mean": -3.0, "p50": 1.0, "p99": 1.0}),
     "baseline.ttft_ms.mean must be a finite non-negative number"),
    (_with_side(bench_row(2, 50.0, 100.0), "speculative", per_user_tokens_per_s={"mean": -100.0, "p50": 1, "p99": 1},
                output_throughput=-200.0), "speculative.per_user_tokens_per_s.mean must be a finite non-negative"),
    (_with_side(bench_row(2, 50.0, 100.0), "baseline", output_throughput=-1.0),
     "baseline.output_throughput must be a finite non-negative number"),
    ({**bench_row(2, 50.0, 100.0), "baseline": None}, "baseline must be an object"),
])
def test_a_bench_row_whose_speeds_cannot_be_measured_is_refused(fake_hub, draft_dir, rules, tmp_path, capsys, row,
                                                                expected):
    bench = write_bench(tmp_path / "bench.json", draft_dir, rows=[row], verdicts=None)
    code, out, err = run_cli(capsys, draft_dir, "--repo-id", REPO, "--target", TARGET, "--bench", bench, *DRY_RUN)
    assert code == 1 and err.count("\n") == 1, err
    assert err.startswith(f"Error: {bench}: concurrency 2: ") and expected in err, err


def test_a_bench_verdict_its_rows_contradict_is_refused(fake_hub, draft_dir, rules, tmp_path, capsys):
    lying = [{"category": None, "pays_at": [1, 4, 16], "stops_paying_at": None,
              "text": "speculation pays at every concurrency measured"}]
    bench = write_bench(tmp_path / "bench.json", draft_dir, verdicts=lying)
    code, out, err = run_cli(capsys, draft_dir, "--repo-id", REPO, "--target", TARGET, "--bench", bench, *DRY_RUN)
    assert code == 1 and err.count("\n") == 1, err
    assert f"{bench}: its verdict says pays_at [1, 4, 16], but its rows give [1, 4]" in err
    elsewhere = write_bench(tmp_path / "other.json", draft_dir, verdicts=[{**lying[0], "category": "coding"}])
    code, out, err = run_cli(capsys, draft_dir, "--repo-id", REPO, "--target", TARGET, "--bench", elsewhere,
                             *DRY_RUN)
    assert code == 1 and "it gives a verdict for coding but measured no row for coding" in err


def test_report_strings_are_data_in_the_card(fake_hub, draft_dir, rules, tmp_path, capsys):
    hostile = "x\n## Injected\n| a | b |\n`code` <img src=x onerror=alert(1)> [link](https://evil.example)"
    rows = [{**bench_row(1, 50.0, 100.0), "category": hostile}, {**bench_row(1, 40.0, 60.0), "category": "plain"}]
    bench = write_bench(tmp_path / "bench.json", draft_dir, rows=rows, verdicts=None, dtype=hostile,
                        engine={"name": hostile, "version": hostile, "device_name": hostile, "device_type": "cuda"},
                        prompts={"name": hostile, "count": hostile})
    report = write_report(tmp_path / "report.json", draft_dir, prompts={"name": hostile, "count": 2}, device=hostile,
                          dtype=hostile, measured=measured(draft_dir, name_or_path=TARGET))
    code, out, err = run_cli(capsys, draft_dir, "--repo-id", REPO, "--target", TARGET, "--bench", bench, "--report",
                             report, *DRY_RUN, "--format", "json")
    assert code == 0, err
    card = json.loads(out)["card"]
    assert "\n## Injected" not in card and not any(line.startswith("| a") for line in card.splitlines())
    for raw in ("<img", "](https://evil.example)", "`code"):  # only ever behind a backslash
        assert not re.search(r"(?<!\\)" + re.escape(raw), card), raw
    shown = r"x\\n## Injected\\n\| a \| b \|\\n\`code\` \<img src=x onerror=alert(1)\> \[link\](https://evil.example)"
    assert card.count(shown) >= 6  # category cell and verdict, engine name, version, device, dtype, prompt set, ...
    section = card[card.index("## Serving speed"):card.index("## Verification")]
    table = [line for line in section.splitlines() if line.startswith("|")]
    assert {line.replace("\\|", "").count("|") for line in table} == {8}  # no row gained or lost a cell


@pytest.mark.parametrize("change, expected", [
    ({"rows": []}, "not an eaglekit bench report"),
    ({"schema_version": "0"}, "not an eaglekit bench report"),
    ({"num_speculative_tokens": 0}, "num_speculative_tokens must be a positive integer"),
    ({"rows": [bench_row(1, 50.0, 100.0), bench_row(1, 50.0, 90.0)]}, "concurrency 1 is measured twice"),
    ({"rows": [{**bench_row(2, 50.0, 100.0), "speed_up": float("inf")}]}, "speed_up must be a finite"),
    ({"rows": [{**bench_row(2, 50.0, 100.0), "acceptance_length": 7.0}]}, "acceptance_length 7.0 is more than"),
    ({"rows": [{**bench_row(2, 50.0, 100.0), "num_accepted_tokens": 51}]}, "does not match its counters"),
    ({"rows": [{**bench_row(2, 50.0, 100.0), "speed_up_interval": {"low": "x"}}]}, "speed_up_interval"),
])
def test_a_bench_report_that_would_make_the_card_lie_is_refused(fake_hub, draft_dir, rules, tmp_path, capsys,
                                                                change, expected):
    bench = write_bench(tmp_path / "bench.json", draft_dir, **change)
    code, out, err = run_cli(capsys, draft_dir, "--repo-id", REPO, "--target", TARGET, "--bench", bench, *DRY_RUN)
    assert code == 1 and expected in err and err.count("\n") == 1, err


def test_a_bench_report_of_other_files_is_refused_unless_forced(fake_hub, draft_dir, rules, tmp_path, capsys):
    bench = write_bench(tmp_path / "bench.json", draft_dir, measured=None)
    code, out, err = run_cli(capsys, draft_dir, "--repo-id", REPO, "--target", TARGET, "--bench", bench, *DRY_RUN)
    assert code == 1 and "refusing this bench report" in err and "does not record which files" in err
    code, out, err = run_cli(capsys, draft_dir, "--repo-id", REPO, "--target", TARGET, "--bench", bench, *DRY_RUN,
                             "--force", "--format", "json")
    assert code == 0 and "Warning: these figures were measured on other files" in json.loads(out)["card"]


def test_token_only_travels_in_the_authorization_header(fake_hub, draft_dir, rules, capsys):
    code, out, err = run_cli(capsys, draft_dir, "--repo-id", REPO, "--target", TARGET, "--token", fake_hub.token,
                             "--endpoint", fake_hub.endpoint)
    assert code == 0, err
    assert f"Pushed {fake_hub.endpoint}/{REPO}/commit/" in out
    token = fake_hub.token.encode()
    authorized = [r for r in fake_hub.requests if r.headers.get("authorization") == f"Bearer {fake_hub.token}"]
    assert len(authorized) == len(fake_hub.requests) - len(fake_hub.calls("lfs_upload")) > 0
    for request in fake_hub.requests:
        assert token not in request.body and fake_hub.token not in request.target
        assert all(fake_hub.token not in v for k, v in request.headers.items() if k != "authorization")
    assert not any(fake_hub.token in line for line in fake_hub.access_log)
    assert not any(token in data for data in fake_hub.repo(REPO).files().values())
    assert fake_hub.token not in out + err


def test_stray_files_stay_home(fake_hub, draft_dir):
    push(draft_dir, REPO, target=TARGET, token=fake_hub.token, endpoint=fake_hub.endpoint, validate=no_findings)
    stored = set(fake_hub.repo(REPO).files())
    assert stored == UPLOADED | {"README.md", "eaglekit.json"}
    assert fake_hub.repo(REPO).files()["README.md"] != b"# old card\n"
    preupload_paths = {f["path"] for r in fake_hub.calls("preupload") for f in json.loads(r.body)["files"]}
    assert preupload_paths == stored


def test_dry_run_sends_nothing(fake_hub, draft_dir, rules, capsys):
    before = snapshot(draft_dir)
    code, out, err = run_cli(capsys, draft_dir, "--repo-id", REPO, "--target", TARGET, "--endpoint",
                             fake_hub.endpoint, *DRY_RUN, "--format", "json")
    assert code == 0, err
    assert fake_hub.requests == []
    doc = json.loads(out)
    jsonschema.validate(doc, SCHEMA)
    assert doc["dry_run"] is True and doc["commit_url"] is None
    local = local_bytes(draft_dir)
    files = {f["path"]: f for f in doc["files"]}
    assert set(files) == UPLOADED | {"README.md", "eaglekit.json"}
    for name, data in local.items():
        assert files[name]["sha256"] == hashlib.sha256(data).hexdigest() and files[name]["size"] == len(data)
    assert files["README.md"]["sha256"] == hashlib.sha256(doc["card"].encode()).hexdigest()
    assert snapshot(draft_dir) == before


def test_the_card_prints_as_plain_markdown_and_card_out_writes_it(fake_hub, draft_dir, rules, capsys, tmp_path):
    card = tmp_path / "README.md"
    code, out, err = run_cli(capsys, draft_dir, "--repo-id", REPO, "--target", TARGET, "--endpoint",
                             fake_hub.endpoint, *DRY_RUN, "--card-out", str(card))
    assert code == 0, err
    text = card.read_text(encoding="utf-8")
    assert text.startswith("---\n") and text.rstrip("\n") in out  # the whole card, byte for byte, unwrapped
    serve = next(line for line in text.splitlines() if line.startswith("vllm serve "))
    assert serve in out.splitlines()  # one line to copy
    assert fake_hub.requests == [] and sorted(os.listdir(tmp_path)) == ["README.md", "draft"]


def test_a_local_target_is_named_by_its_hub_id_on_the_card(fake_hub, draft_dir, rules, capsys, tmp_path):
    local = make_target_config(str(tmp_path / "local-target"))
    args = ["--repo-id", REPO, "--target", local, "--endpoint", fake_hub.endpoint, *DRY_RUN, "--format", "json"]
    code, out, err = run_cli(capsys, draft_dir, *args)
    assert code == 0, err
    assert "<TARGET_MODEL>" in json.loads(out)["card"]  # a folder of unknown origin
    code, out, err = run_cli(capsys, draft_dir, *args, "--target-id", "my-org/Base-8B")
    card = json.loads(out)["card"]
    assert code == 0, err
    assert "<TARGET_MODEL>" not in card and "vllm serve my-org/Base-8B " in card
    config = json.loads(open(os.path.join(local, "config.json")).read())
    with open(os.path.join(local, "config.json"), "w") as fh:  # a copy that records where it came from
        json.dump({**config, "_name_or_path": "my-org/Base-8B"}, fh)
    code, out, err = run_cli(capsys, draft_dir, *args)
    assert code == 0 and "vllm serve my-org/Base-8B " in json.loads(out)["card"]
    code, out, err = run_cli(capsys, draft_dir, *args, "--target-id", "not a hub id")
    assert code == 2 and "--target-id" in err


def test_a_derived_local_copy_is_named_as_such_on_the_card():
    from eaglekit.hub.card_figures import verify_section

    measured = {"name_or_path": "org/Base", "folder": "base", "config_sha256": "sha256:" + "a" * 64,
                "derived_from": "base.Q4_1.gguf dequantised to bfloat16"}
    row = next(line for line in verify_section({"measured": {"target": measured}}).splitlines()
               if line.startswith("| Target measured"))
    assert "org/Base, as a local copy: base.Q4\\_1.gguf dequantised to bfloat16" in row


# ---------------------------------------------------------------- one clear line per failure


def test_bad_token_is_one_line_and_exit_1(fake_hub, draft_dir, rules, capsys):
    code, out, err = run_cli(capsys, draft_dir, "--repo-id", REPO, "--token", "hf_wrong",
                             "--endpoint", fake_hub.endpoint)
    assert code == 1
    assert err == f"Error: authentication failed for {fake_hub.endpoint}: check --token / HF_TOKEN\n"
    assert fake_hub.calls("create_repo")[0].status == 401 and fake_hub.repos == {}


def test_no_token_anywhere_is_one_line(fake_hub, draft_dir, rules, capsys, monkeypatch, tmp_path):
    monkeypatch.setattr(constants, "HF_TOKEN_PATH", str(tmp_path / "no-saved-token"))
    code, out, err = run_cli(capsys, draft_dir, "--repo-id", REPO, "--endpoint", fake_hub.endpoint)
    assert code == 1
    assert err == "Error: no Hugging Face token: pass --token, set HF_TOKEN, or run `hf auth login`\n"
    assert fake_hub.requests == []


def test_saved_login_token_is_used(fake_hub, draft_dir, monkeypatch, tmp_path):
    saved = tmp_path / "token"
    saved.write_text(fake_hub.token)
    monkeypatch.setattr(constants, "HF_TOKEN_PATH", str(saved))
    result = push(draft_dir, REPO, endpoint=fake_hub.endpoint, validate=no_findings)
    assert result.commit_oid == fake_hub.repo(REPO).heads["main"]


def test_unreachable_endpoint_is_one_line(fake_hub, draft_dir, rules, capsys):
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    endpoint = f"http://127.0.0.1:{port}"
    code, out, err = run_cli(capsys, draft_dir, "--repo-id", REPO, "--token", "hf_x", "--endpoint", endpoint)
    assert code == 1
    assert err == f"Error: cannot reach {endpoint}\n"


def test_invalid_repo_id_is_a_usage_error(fake_hub, draft_dir, capsys):
    code, out, err = run_cli(capsys, draft_dir, "--repo-id", "no-namespace", *DRY_RUN)
    assert code == 2 and "expected ORG/NAME" in err
    assert fake_hub.requests == []


def test_malformed_report_is_one_line(fake_hub, draft_dir, rules, tmp_path, capsys):
    report = tmp_path / "verify.json"
    report.write_text("{not json")
    code, out, err = run_cli(capsys, draft_dir, "--repo-id", REPO, "--report", str(report), *DRY_RUN)
    assert code == 1 and err.startswith(f"Error: {report}: verify report is not valid JSON") and err.count("\n") == 1


@pytest.mark.parametrize("field, value", [("lossless", "no"), ("acceptance_length", float("nan")),
                                          ("acceptance_length", 0.5), ("per_position_acceptance", [0.5, 7]),
                                          ("tokens_per_s_spec", "fast"),
                                          ("acceptance_length_interval", {"low": 2.0, "high": 1.5}),
                                          ("per_position_acceptance_interval", [{"low": 0.2, "high": 1.3}]),
                                          ("per_position_acceptance_interval", "wide")])
def test_a_report_that_would_make_the_card_lie_is_refused(fake_hub, draft_dir, rules, tmp_path, capsys, field, value):
    report = tmp_path / "verify.json"
    report.write_text(json.dumps({"lossless": True, "acceptance_length": 1.8, "measured": measured(draft_dir),
                                  field: value}))
    code, out, err = run_cli(capsys, draft_dir, "--repo-id", REPO, "--report", str(report), *DRY_RUN)
    assert code == 1 and field in err and err.count("\n") == 1


# ---------------------------------------------------------------- validation gate


def test_validation_error_refuses_before_any_request(fake_hub, draft_dir):
    def failing(spec):
        return [Finding("AUX_ORDER", "error", "aux layer ids are not ascending", pitfall="P12")]

    with pytest.raises(EaglekitError,
                       match=r"refusing to push: validation found 1 error\(s\) for vLLM, first AUX_ORDER"):
        push(draft_dir, REPO, token=fake_hub.token, endpoint=fake_hub.endpoint, validate=failing)
    assert fake_hub.requests == []


def test_cli_force_pushes_and_the_card_says_so(fake_hub, draft_dir, rules, capsys):
    rules.findings = [Finding("FC_SHAPE", "error", "fc.weight fan-in is not K*T"),
                      Finding("ROPE", "warning", "rope_theta implicit")]
    args = [draft_dir, "--repo-id", REPO, "--target", TARGET, "--token", fake_hub.token,
            "--endpoint", fake_hub.endpoint]

    code, out, err = run_cli(capsys, *args)
    assert code == 1 and err.startswith("Error: ") and "FC_SHAPE" in err and err.count("\n") == 1
    assert fake_hub.requests == []

    code, out, err = run_cli(capsys, *args, "--force", "--format", "json")
    assert code == 0, err
    doc = json.loads(out)
    jsonschema.validate(doc, SCHEMA)
    assert doc["forced"] is True and [f["code"] for f in doc["findings"]] == ["FC_SHAPE", "ROPE"]
    readme = fake_hub.repo(REPO).files()["README.md"].decode()
    assert "**Warning: forced despite validation errors.**" in readme
    assert "- **error** `FC_SHAPE`: fc.weight fan-in is not K*T" in readme
    assert json.loads(fake_hub.repo(REPO).files()["eaglekit.json"])["validation"]["forced"] is True


def test_without_a_rules_engine_the_card_says_not_validated(draft_dir, monkeypatch):
    monkeypatch.setitem(sys.modules, "eaglekit.rules", None)
    result = push(draft_dir, REPO, dry_run=True)
    assert result.validated is False and "Not validated" in result.card


# ---------------------------------------------------------------- retries, revisions, repeat pushes


@pytest.mark.parametrize("route", ["create_repo", "preupload", "lfs_batch", "lfs_upload", "commit"])
def test_one_transient_5xx_is_retried(fake_hub, draft_dir, route):
    fake_hub.fail(route, 503, times=1)
    push(draft_dir, REPO, token=fake_hub.token, endpoint=fake_hub.endpoint, validate=no_findings)
    statuses = [r.status for r in fake_hub.calls(route)]
    assert statuses.count(503) == 1 and statuses[-1] == 200
    repo = fake_hub.repo(REPO)
    assert len(repo.commits) == 1
    assert {n: repo.files()[n] for n in UPLOADED} == local_bytes(draft_dir)


def test_persistent_5xx_on_commit_gives_up_with_one_line(fake_hub, draft_dir, monkeypatch):
    monkeypatch.setattr(upload, "RETRY_BACKOFF_S", 0.01)
    fake_hub.fail("commit", 503, times=COMMIT_ATTEMPTS + 5)
    with pytest.raises(EaglekitError) as info:
        push(draft_dir, REPO, token=fake_hub.token, endpoint=fake_hub.endpoint, validate=no_findings)
    assert str(info.value) == f"push to {fake_hub.endpoint} failed: HTTP 503 (injected fault 503)"
    assert len(fake_hub.calls("commit")) == COMMIT_ATTEMPTS
    assert fake_hub.repo(REPO).commits == []


def test_revision_branch_and_pull_requests(fake_hub, draft_dir):
    common = dict(token=fake_hub.token, endpoint=fake_hub.endpoint, validate=no_findings)
    push(draft_dir, REPO, revision="v2", **common)
    repo = fake_hub.repo(REPO)
    assert set(repo.files("v2")) >= UPLOADED and repo.files("main") == {}

    to_main = push(draft_dir, REPO, create_pr=True, **common)
    assert to_main.pr_url == f"{fake_hub.endpoint}/{REPO}/discussions/1"
    assert set(repo.files("refs/pr/1")) >= UPLOADED and repo.files("main") == {}

    to_v2 = push(draft_dir, REPO, revision="v2", create_pr=True, **common)
    assert to_v2.pr_url.endswith("/discussions/2") and repo.commits[-1].parent == repo.heads["v2"]

    with pytest.raises(EaglekitError, match=r"^revision 'nope' does not exist in eagle-org/llama-eagle3-draft on "):
        push(draft_dir, REPO, revision="nope", create_pr=True, **common)


def test_second_push_reuses_stored_lfs_objects(fake_hub, draft_dir):
    common = dict(token=fake_hub.token, endpoint=fake_hub.endpoint, validate=no_findings)
    push(draft_dir, REPO, **common)
    push(draft_dir, REPO, commit_message="again", **common)
    assert [r.status for r in fake_hub.calls("create_repo")] == [200, 409]
    assert len(fake_hub.calls("lfs_upload")) == len(SHARDS)
    assert [c.summary for c in fake_hub.repo(REPO).commits][-1] == "again"


def test_non_hub_endpoint_uploads_over_lfs_even_with_xet_installed(fake_hub, draft_dir, monkeypatch):
    pytest.importorskip("hf_xet")
    monkeypatch.setattr(constants, "HF_HUB_DISABLE_XET", False)
    result = push(draft_dir, REPO, token=fake_hub.token, endpoint=fake_hub.endpoint, validate=no_findings)
    assert any("Git LFS instead of xet" in w for w in result.warnings)
    assert fake_hub.calls("unknown") == [] and len(fake_hub.calls("lfs_upload")) == len(SHARDS)
    assert constants.HF_HUB_DISABLE_XET is False


# ---------------------------------------------------------------- card contents per draft kind


@pytest.mark.parametrize("layout, options, present, absent, tags", [
    ("vllm", {}, ["Any vLLM release with EAGLE-3 support", "| lm_head | own weights |"],
     ["arXiv:2605.09992", "Requires vLLM"], {"eagle3"}),
    ("vllm", {"attention": "mla", "fc_norm": True, "norm_output": True},
     ["Requires vLLM ≥ 0.23.0", "Requires SGLang ≥ 0.5.23", "arXiv:2605.09992"], [],
     {"eagle3", "eagle3.1", "arxiv:2605.09992"}),
    ("vllm", {"fc_norm": True}, ["Requires vLLM ≥ 0.22.0", "partial 3.1 flag set"], [], {"eagle3"}),
    ("vllm", {"lm_head": False, "draft_vocab": None}, ["| lm_head | shared from the target |",
     "| embed_tokens | shared from the target |"], ["d2t"], {"eagle3"}),
    ("specforge", {}, ["`[2, 6, 9]` (vLLM convention", "written as `[1, 5, 8]` (output-of-layer)"], [], {"eagle3"}),
    ("speculators", {"fc_norm": True, "norm_output": True}, ["Requires vLLM ≥ 0.25.0", "`org/target-model`"], [],
     {"eagle3.1", "speculators"}),
])
def test_card_describes_the_draft(tmp_path, layout, options, present, absent, tags):
    spec = load_draft(make_draft(str(tmp_path / "d"), layout, **options))
    card = build_card(spec, REPO, target=None if layout == "speculators" else TARGET)
    meta = card_data(card)
    assert tags <= set(meta["tags"]) and ("eagle3.1" in meta["tags"]) == ("eagle3.1" in tags)
    assert meta["base_model"] == ("org/target-model" if layout == "speculators" else TARGET)
    for text in present:
        assert text in card
    for text in absent:
        assert text not in card


def test_card_of_a_converted_draft_names_its_source(tmp_path):
    block = {"version": "0.1.0", "source": "yuhuili/EAGLE3-LLaMA3.1-Instruct-8B", "source_family": "eagle",
             "target": TARGET, "options": {"calibrate": True}, "conversion": ["renamed midlayer.* to layers.0.*"]}
    spec = load_draft(make_draft(str(tmp_path / "d"), "vllm", config_patch={"eaglekit": block}))
    card = build_card(spec, REPO)
    meta = card_data(card)
    assert meta["base_model"] == "yuhuili/EAGLE3-LLaMA3.1-Instruct-8B" and meta["base_model_relation"] == "finetune"
    assert f"vllm serve {TARGET} " in card
    for text in ("Converted from [`yuhuili/EAGLE3-LLaMA3.1-Instruct-8B`]",
                 "from [`yuhuili/EAGLE3-LLaMA3.1-Instruct-8B`]"
                 "(https://huggingface.co/yuhuili/EAGLE3-LLaMA3.1-Instruct-8B), "
                 "eagle layout", "  - options: `calibrate=True`",
                 "  - renamed midlayer.\\* to layers.0.\\*"):  # a literal star, not emphasis
        assert text in card


def test_the_card_names_no_local_path_and_reads_provenance_as_text(tmp_path):
    inner = {"version": "0.1.0", "command": "upgrade", "source": "/home/me/ckpts/specforge-out", "source_family":
             "specforge", "summary": "EAGLE-3.1 warm start", "options": {"fc_norm": True, "dtype": None},
             "source_files": {"model.safetensors": "sha256:" + "a" * 64}}
    outer = {"version": "0.1.0", "command": "finetune", "source": "/home/me/work/upgraded", "source_provenance": inner,
             "summary": "trained 100 steps", "options": {"steps": 100, "resume": False}}
    spec = load_draft(make_draft(str(tmp_path / "d"), "vllm", config_patch={"eaglekit": outer}))
    report = {"lossless": True, "acceptance_length": 1.9, "measured": {"draft_files": {}, "target": {
        "name_or_path": "/home/me/models/llama", "folder": "llama", "config_sha256": "sha256:" + "3" * 64}}}
    card = build_card(spec, REPO, target=TARGET, license="apache-2.0", report=report)
    assert "/home/me" not in card and "```json" not in card
    assert "| Target measured | a local copy in a folder named llama (config.json 333333333333…) |" in card
    assert card_data(card)["license"] == "apache-2.0"
    assert ("- `eaglekit finetune` (eaglekit 0.1.0) from a local folder named `upgraded`: trained 100 steps"
            in card)
    assert "- `eaglekit upgrade` (eaglekit 0.1.0) from a local folder named `specforge-out`, specforge layout" in card
    assert "  - options: `steps=100`\n" in card and "  - options: `fc_norm=True`\n" in card
    assert "`model.safetensors` aaaaaaaaaaaa…" in card


def test_license_options(fake_hub, draft_dir, rules, capsys):
    code, out, err = run_cli(capsys, draft_dir, "--repo-id", REPO, "--target", TARGET, *DRY_RUN, "--format", "json",
                             "--license", "other", "--license-link", "https://example.com/LICENSE")
    assert code == 0, err
    meta = card_data(json.loads(out)["card"])
    assert (meta["license"], meta["license_link"], meta["license_name"]) == ("other", "https://example.com/LICENSE",
                                                                          "LICENSE")
    code, out, err = run_cli(capsys, draft_dir, "--repo-id", REPO, "--target", TARGET, *DRY_RUN, "--format", "json")
    assert code == 0 and any("no --license" in w for w in json.loads(out)["warnings"])
    code, out, err = run_cli(capsys, draft_dir, "--repo-id", REPO, *DRY_RUN, "--license-link", "https://x.org/L")
    assert code == 2 and "--license other" in err


# ---------------------------------------------------------------- the loopback Hub itself


def _request(hub, method, path, body=None, token=None, headers=None):
    conn = http.client.HTTPConnection("127.0.0.1", int(hub.endpoint.rsplit(":", 1)[1]), timeout=10)
    all_headers = dict(headers or {})
    if token:
        all_headers["Authorization"] = f"Bearer {token}"
    conn.request(method, path, body=body, headers=all_headers)
    response = conn.getresponse()
    data = response.read()
    conn.close()
    return response.status, data


def test_fake_hub_checks_what_the_real_one_checks(fake_hub):
    tok = fake_hub.token
    assert _request(fake_hub, "POST", "/api/repos/create", b'{"name": "x", "organization": "o"}')[0] == 401
    assert _request(fake_hub, "POST", "/api/repos/create", b'{"name": "x", "organization": "o"}', token=tok)[0] == 200
    status, body = _request(fake_hub, "POST", "/api/repos/create", b'{"name": "x", "organization": "o"}', token=tok)
    assert status == 409 and json.loads(body)["url"] == f"{fake_hub.endpoint}/o/x"

    data = os.urandom(20_000)
    oid = hashlib.sha256(data).hexdigest()
    batch = json.dumps({"operation": "upload", "objects": [{"oid": oid, "size": len(data)}], "hash_algo": "sha256"})
    status, body = _request(fake_hub, "POST", "/o/x.git/info/lfs/objects/batch", batch, token=tok)
    href = json.loads(body)["objects"][0]["actions"]["upload"]["href"]
    upload_path = href[len(fake_hub.endpoint):]
    assert _request(fake_hub, "PUT", upload_path, os.urandom(len(data)))[0] == 400  # wrong bytes for the oid
    chunks = iter([data[:7_000], data[7_000:]])  # no Content-Length: http.client sends it chunked
    assert _request(fake_hub, "PUT", upload_path, chunks)[0] == 200
    assert fake_hub.calls("lfs_upload")[-1].headers.get("transfer-encoding") == "chunked"
    assert fake_hub.lfs_objects[oid] == data

    ndjson = "\n".join(json.dumps(line) for line in [
        {"key": "header", "value": {"summary": "s"}},
        {"key": "lfsFile", "value": {"path": "w.safetensors", "algo": "sha256", "oid": "0" * 64, "size": 1}},
    ])
    status, body = _request(fake_hub, "POST", "/api/models/o/x/commit/main", ndjson, token=tok,
                            headers={"Content-Type": "application/x-ndjson"})
    assert status == 400 and b"never uploaded" in body and fake_hub.repo("o/x").commits == []

    bad_yaml = json.dumps({"content": "---\ntags: [unclosed\n---\nbody\n", "repoType": "model"})
    status, body = _request(fake_hub, "POST", "/api/validate-yaml", bad_yaml, token=tok)
    assert status == 400 and json.loads(body)["errors"][0]["message"].startswith("Invalid YAML")


def test_push_help_does_not_import_torch():
    code = ("import sys\nfrom eaglekit.cli.main import main\n"
            "try:\n    main(['push', '--help'])\nexcept SystemExit:\n    pass\n"
            "assert 'torch' not in sys.modules, 'torch imported'\n"
            "import eaglekit.hub.push\nassert 'torch' not in sys.modules, 'torch imported by eaglekit.hub.push'\n")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert "--repo-id" in proc.stdout and "--create-pr" in proc.stdout


def test_a_server_that_never_answers_times_out_with_one_line(draft_dir, rules, capsys, monkeypatch):
    """huggingface_hub's client has no timeout of its own; eaglekit's bounds every request."""
    import threading
    import time

    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(16)
    accepted = []
    stop = threading.Event()

    def accept_and_stay_silent():
        listener.settimeout(0.2)
        while not stop.is_set():
            try:
                accepted.append(listener.accept()[0])
            except OSError:
                continue

    thread = threading.Thread(target=accept_and_stay_silent, daemon=True)
    thread.start()
    monkeypatch.setenv("EAGLEKIT_HUB_TIMEOUT", "0.5")
    endpoint = f"http://127.0.0.1:{listener.getsockname()[1]}"
    started = time.perf_counter()
    try:
        code, out, err = run_cli(capsys, draft_dir, "--repo-id", REPO, "--token", "hf_x", "--endpoint", endpoint)
    finally:
        stop.set()
        thread.join()
        for conn in accepted:
            conn.close()
        listener.close()
    assert code == 1 and err.count("\n") == 1 and "Timeout" in err and endpoint in err
    assert time.perf_counter() - started < 30 and accepted


def _hostile_hub(answer):
    """A loopback endpoint whose every connection gets `answer(connection)` after its request; (endpoint, stop)."""
    import threading

    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(16)
    listener.settimeout(0.2)
    stop = threading.Event()

    def serve(conn):
        with conn:
            try:
                conn.recv(65536)
                answer(conn, stop)
            except OSError:
                pass  # the client gave up

    def accept():
        while not stop.is_set():
            try:
                conn = listener.accept()[0]
            except OSError:
                continue
            threading.Thread(target=serve, args=(conn,), daemon=True).start()

    threading.Thread(target=accept, daemon=True).start()

    def close():
        stop.set()
        listener.close()

    return f"http://127.0.0.1:{listener.getsockname()[1]}", close


def _trickle(part):
    """Sends its status line and headers, or (`part` = body) headers then a body, a byte every 0.2 s for 20 s."""
    head = b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 4096\r\n\r\n"

    def answer(conn, stop):
        if part == "body":
            conn.sendall(head)
        for _ in range(100):
            if stop.is_set():
                return
            conn.sendall(head[:1] if part == "headers" else b" ")
            stop.wait(0.2)

    return answer


@pytest.mark.parametrize("part", ["headers", "body"])
def test_a_hub_that_trickles_its_answer_is_cut_off_with_one_line(draft_dir, rules, capsys, monkeypatch, part):
    """Each read gets a byte well within the timeout: only a bound on the whole exchange ends it."""
    monkeypatch.setenv("EAGLEKIT_HUB_TIMEOUT", "0.5")
    endpoint, close = _hostile_hub(_trickle(part))
    try:
        code, out, err = run_cli(capsys, draft_dir, "--repo-id", REPO, "--token", "hf_x", "--endpoint", endpoint)
    finally:
        close()
    assert code == 1 and err.count("\n") == 1 and "no complete answer within the time allowed" in err, err


def test_a_hub_answer_declaring_gigabytes_is_refused_before_its_body(draft_dir, rules, capsys, monkeypatch):
    def answer(conn, stop):
        conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 8589934592\r\n\r\n{")
        stop.wait(20)

    endpoint, close = _hostile_hub(answer)
    try:
        code, out, err = run_cli(capsys, draft_dir, "--repo-id", REPO, "--token", "hf_x", "--endpoint", endpoint)
    finally:
        close()
    assert code == 1 and err.count("\n") == 1 and "answer declares more than 64 MiB" in err, err


@pytest.mark.parametrize("route, payload", [("create_repo", b"<html>not json"), ("create_repo", b"[1, 2]"),
                                            ("preupload", b"{\"files\": 5}"), ("commit", b"null")])
def test_garbage_answers_are_one_line(fake_hub, draft_dir, rules, capsys, monkeypatch, route, payload):
    monkeypatch.setattr(fake_hub, f"_route_{route}", lambda *a: (200, payload, "application/json"))
    code, out, err = run_cli(capsys, draft_dir, "--repo-id", REPO, "--token", fake_hub.token,
                             "--endpoint", fake_hub.endpoint)
    assert code == 1 and err.count("\n") == 1 and err.startswith("Error: ") and "internal error" not in err


def test_a_server_echoing_the_token_never_prints_it(fake_hub, draft_dir, rules, capsys, monkeypatch):
    from tests.support.hubserver import HubError

    def echo(args, query, headers, body):
        raise HubError(400, f"bad request (Authorization: {headers.get('authorization')})")

    monkeypatch.setattr(fake_hub, "_route_create_repo", echo)
    code, out, err = run_cli(capsys, draft_dir, "--repo-id", REPO, "--token", fake_hub.token,
                             "--endpoint", fake_hub.endpoint)
    assert code == 1 and fake_hub.token not in err + out and "***" in err


def test_an_untrained_warm_start_is_refused_unless_forced_and_the_card_says_so(fake_hub, tmp_path, capsys):
    from eaglekit.upgrade import UpgradeOptions, upgrade

    warm = str(tmp_path / "warm")
    # fc_norm = ones + norm_output: changes the function, untrained
    upgrade(make_draft(str(tmp_path / "eagle3"), "vllm"), warm, UpgradeOptions(fc_norm=True, norm_output=True))
    code, out, err = run_cli(capsys, warm, "--repo-id", REPO, "--token", fake_hub.token, "--endpoint",
                             fake_hub.endpoint, "--dry-run")
    assert code == 1 and "untrained warm start" in err and "eaglekit finetune" in err and err.count("\n") == 1
    result = push(warm, REPO, token=fake_hub.token, endpoint=fake_hub.endpoint, dry_run=True, force=True)
    assert result.forced and "Warning: untrained warm start" in result.card
    assert "forced despite validation errors" not in result.card


def test_targets_and_the_push_config_lookup_share_one_hub_resolver(tmp_path, monkeypatch):
    """A cached Hub id resolves the same way for `--target` and for the config push compares a report with; an
    unknown one is a failure of that one resolver, which the two callers word their own way."""
    from eaglekit.errors import CheckpointError
    from eaglekit.io.hub_client import HubFetchError, hub_snapshot
    from eaglekit.target import resolve_target
    from tests.support.factory import make_target_config
    from tests.support.hub import prefill_cache

    prefill_cache(str(tmp_path / "hub"), "org/cached", make_target_config(str(tmp_path / "target")))
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path / "hub"))
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    folder = hub_snapshot("org/cached", ["config.json"])
    assert resolve_target("org/cached") == folder
    assert evidence._hub_config("org/cached", "http://127.0.0.1:9", None) == os.path.join(folder, "config.json")
    with pytest.raises(HubFetchError) as unknown:
        hub_snapshot("org/unknown", ["config.json"])
    assert unknown.value.offline
    assert evidence._hub_config("org/unknown", "http://127.0.0.1:9", None) is None
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
    assert evidence._hub_config("org/cached", "http://127.0.0.1:9", None, offline=True) == os.path.join(folder,
                                                                                                      "config.json")
    with pytest.raises(HubFetchError, match="offline"):  # push --dry-run --offline: the cache and nothing else
        hub_snapshot("org/unknown", ["config.json"], endpoint="http://127.0.0.1:9", cache_only=True)
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    with pytest.raises(CheckpointError, match="not in the local Hugging Face cache"):
        resolve_target("org/unknown")


def _few_row(concurrency: int, base: float, spec: float) -> dict:
    """A bench row over two requests, as `eaglekit bench --limit 2` writes it: no interval, no p99."""
    row = bench_row(concurrency, base, spec)
    for side in ("baseline", "speculative"):
        tails = {key: {**row[side][key], "p99": None} for key in ("per_user_tokens_per_s", "tpot_ms", "ttft_ms")}
        row[side] = {**row[side], "completed": 2, **tails}
    return {**row, "speed_up_interval": None, "identical_outputs": 2, "requests": 2, "samples": 2,
            "too_few_samples": True}


def test_a_bench_figure_over_too_few_requests_is_refused_unless_allowed(fake_hub, draft_dir, rules, tmp_path, capsys):
    bench = write_bench(tmp_path / "bench.json", draft_dir, rows=[_few_row(1, 50.0, 100.0)], verdicts=[])
    code, out, err = run_cli(capsys, draft_dir, "--repo-id", REPO, "--target", TARGET, "--bench", bench, *DRY_RUN)
    assert code == 1 and out == ""
    assert err.strip() == (f"Error: {bench}: refusing to put a figure without an interval on the card: the speed-up at "
                           "concurrency 1 rests on 2 requests, an interval needs 10 (rerun `eaglekit bench` with "
                           "--limit 10 or more, or pass --allow-few-samples: the card then says so)")
    code, out, err = run_cli(capsys, draft_dir, "--repo-id", REPO, "--target", TARGET, "--bench", bench, *DRY_RUN,
                             "--allow-few-samples", "--format", "json")
    assert code == 0, err
    section = json.loads(out)["card"].split("## Serving speed", 1)[1]
    assert "| 1 | 50.0 | 100.0 | 2.00× | n=2, too few to estimate an interval |" in section
    assert "not resolved at C=1 x2.00 too few to estimate (n=2, needs 10)" in section
