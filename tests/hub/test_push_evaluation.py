"""push uploads the reports its card quotes and the plots eaglekit drew under eval/ (a loopback Hub), redacted, and
the card links them."""

from __future__ import annotations

import json
import re
import struct
import zlib

import pytest

from tests.support.cli import run_cli
from tests.support.factory import make_draft
from tests.support.reports import TARGET, measured, write_bench, write_report

REPO = "eagle-org/llama-eagle3-draft"
SECRET = "hf_" + "S3cr3t" * 5 + "abcd"  # token-shaped: 34 letters or digits after hf_


def png(*text: bytes) -> bytes:
    """A 1x1 PNG with `text` as tEXt chunks before its image data, as a plotting library may write."""
    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))

    header = chunk(b"IHDR", struct.pack(">IIBBBBB", 1, 1, 8, 0, 0, 0, 0))
    notes = b"".join(chunk(b"tEXt", t) for t in text)
    return b"\x89PNG\r\n\x1a\n" + header + notes + chunk(b"IDAT", zlib.compress(b"\x00\x80")) + chunk(b"IEND", b"")


@pytest.fixture
def draft_dir(tmp_path) -> str:
    return make_draft(str(tmp_path / "draft"), "vllm", fc_norm=True, norm_output=True)


@pytest.fixture
def evidence(tmp_path, draft_dir):
    """A verify and a bench report of the draft that carry a local path and a secret, and a plot whose metadata
    names a local path."""
    prompts = tmp_path / "private-data" / "prompts.jsonl"
    prompts.parent.mkdir()
    prompts.write_text("{}\n")
    verify = write_report(tmp_path / "verify.json", draft_dir, measured=measured(draft_dir, name_or_path=TARGET),
                          prompts={"name": str(prompts), "count": 80}, device=f"cuda ({SECRET})")
    bench = write_bench(tmp_path / "bench.json", draft_dir,
                        prompts={"name": str(prompts), "count": 80})
    plot = tmp_path / "speedup.png"
    plot.write_bytes(png(f"Source\x00{tmp_path}/bench.json".encode(), b"Software\x00matplotlib"))
    return str(tmp_path), verify, bench, str(plot)


def test_the_reports_and_plots_go_to_eval_redacted_and_the_card_links_them(fake_hub, draft_dir, evidence):
    local, verify, bench, plot = evidence
    result = run_cli(["push", draft_dir, "--repo-id", REPO, "--target", TARGET, "--report", verify, "--bench", bench,
                      "--plot", plot, "--token", fake_hub.token, "--endpoint", fake_hub.endpoint,
                      "--license", "apache-2.0", "--format", "json"])
    assert result.exit_code == 0, result.stderr
    stored = fake_hub.repo(REPO).files("main")
    evaluation = {"eval/verify-report.json", "eval/bench-report.json", "eval/speedup.png"}
    assert evaluation <= set(stored)
    assert {f["path"] for f in json.loads(result.stdout)["files"]} >= evaluation

    for name in ("eval/verify-report.json", "eval/bench-report.json"):
        text = stored[name].decode()
        assert local not in text and SECRET not in text and fake_hub.token not in text
        doc = json.loads(text)
        assert doc["prompts"] == {"name": "private-data/prompts.jsonl", "count": 80}  # the folder's name, no more
    verify_doc = json.loads(stored["eval/verify-report.json"])
    assert verify_doc["acceptance_length"] == 2.81 and verify_doc["device"] == "cuda (***)"
    assert verify_doc["measured"] == json.loads(open(verify).read())["measured"]  # the binding, kept as it was
    bench_doc = json.loads(stored["eval/bench-report.json"])
    assert [r["speed_up"] for r in bench_doc["rows"]] == [r["speed_up"] for r in json.load(open(bench))["rows"]]

    image = stored["eval/speedup.png"]
    assert image.startswith(b"\x89PNG\r\n\x1a\n") and b"tEXt" not in image and local.encode() not in image
    assert image == png()  # the image chunks byte for byte, the text chunks gone

    card = stored["README.md"].decode()
    assert "[`eval/verify-report.json`](eval/verify-report.json): the `eaglekit verify` report" in card
    assert "[`eval/bench-report.json`](eval/bench-report.json): the `eaglekit bench` report" in card
    assert "![speedup.png](eval/speedup.png)" in card
    linked = set(re.findall(r"\]\((eval/[^)]+)\)", card))
    assert linked == evaluation and linked <= set(stored)  # every link resolves in the repository
    manifest = json.loads(stored["eaglekit.json"])
    assert sorted(manifest["evaluation_files"]) == sorted(evaluation)


def test_without_reports_or_plots_nothing_goes_to_eval(fake_hub, draft_dir):
    result = run_cli(["push", draft_dir, "--repo-id", REPO, "--target", TARGET, "--token", fake_hub.token,
                      "--endpoint", fake_hub.endpoint, "--license", "apache-2.0"])
    assert result.exit_code == 0, result.stderr
    stored = fake_hub.repo(REPO).files("main")
    assert not [p for p in stored if p.startswith("eval/")]
    assert "## Evaluation files" not in stored["README.md"].decode()


def test_a_dry_run_lists_the_evaluation_files(draft_dir, evidence):
    _, verify, _, plot = evidence
    result = run_cli(["push", draft_dir, "--repo-id", REPO, "--target", TARGET, "--report", verify, "--plot", plot,
                      "--dry-run", "--offline", "--format", "json"])
    assert result.exit_code == 0, result.stderr
    doc = json.loads(result.stdout)
    assert [f["path"] for f in doc["files"]][-2:] == ["eval/verify-report.json", "eval/speedup.png"]
    assert "![speedup.png](eval/speedup.png)" in doc["card"] and "eval/bench-report.json" not in doc["card"]


@pytest.mark.parametrize("name, data, message", [
    ("speedup.png", b"GIF89a not a png", "not a PNG file"),
    ("speedup.png", png()[:-8], "a truncated PNG file"),
    ("my plot.png", png(), "a plot's file name must end in .png"),
])
def test_a_plot_that_is_not_one_is_refused_in_one_line(draft_dir, tmp_path, name, data, message):
    plot = tmp_path / name
    plot.write_bytes(data)
    result = run_cli(["push", draft_dir, "--repo-id", REPO, "--plot", str(plot), "--dry-run"])
    assert result.exit_code != 0 and message in result.stderr and len(result.stderr.strip().splitlines()) == 1


def test_two_plots_of_one_name_are_refused(draft_dir, tmp_path):
    for folder in ("a", "b"):
        (tmp_path / folder).mkdir()
        (tmp_path / folder / "plot.png").write_bytes(png())
    result = run_cli(["push", draft_dir, "--repo-id", REPO, "--plot", str(tmp_path / "a" / "plot.png"),
                      "--plot", str(tmp_path / "b" / "plot.png"), "--dry-run"])
    assert result.exit_code == 2 and "two --plot files are named 'plot.png'" in result.stderr
