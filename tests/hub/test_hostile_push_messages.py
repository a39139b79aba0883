"""Hostile input to push and to every error line: reports that would make a card lie, credentials in endpoints,
huge headers, huge names, undecodable path bytes, subfolders that leave the repository, and a card written over
what push reads. Each class runs through the real CLI on real bytes; generators vary the input."""

from __future__ import annotations

import hashlib
import json
import os
import re
import socket
from urllib.parse import quote

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from eaglekit.cli.main import MAX_LINE_CHARS, one_line
from eaglekit.decode.metrics import AcceptanceCounter
from eaglekit.errors import CheckpointError
from eaglekit.families import load_draft
from eaglekit.hub.evidence import load_report
from eaglekit.io.checkpoint import MAX_DRAFT_TENSORS
from eaglekit.io.header import read_header
from eaglekit.io.jsonfile import check_inside
from eaglekit.provenance import measured_files
from eaglekit.target import read_target
from tests.support.factory import edit_config, make_draft, make_target_config, rewrite_tensors
from tests.support.hostile import FUZZ, clean, refused, strict_json, write_header
from tests.support.hub import prefill_cache
from tests.support.reports import TAU_LABEL

HUB_TARGET = "meta-llama/Llama-3.1-8B-Instruct"
ASKING = ["--repo-id", "eagle-org/draft", "--license", "apache-2.0", "--dry-run"]  # the Hub is asked (no token: exit 1)
PUSH = [*ASKING, "--offline"]  # the card and the files, the Hub asked nothing


def figures(counter: AcceptanceCounter) -> dict:
    """The acceptance fields of a verify report, as VerifyReport.to_dict writes them."""
    return {"acceptance_length": counter.acceptance_length, "per_position_acceptance": counter.per_position,
            "conditional_acceptance": counter.conditional, "draft_acceptance_rate": counter.draft_acceptance_rate,
            "num_speculative_tokens": counter.k, "num_drafts": counter.drafts,
            "num_draft_tokens": counter.draft_tokens, "num_accepted_tokens": counter.accepted}


def write_report(path, draft: str, target: str, **fields) -> str:
    """A report bound the way verify binds it: the draft's and the target's real hashes."""
    doc = {"lossless": True, **figures(AcceptanceCounter.from_histogram([3, 2, 4, 1])),
           "measured": measured_files(load_draft(draft), read_target(target)), **fields}
    path.write_text(json.dumps(doc))
    return str(path)


# ------------------------------------------------------------------ 1. the report push puts in the card


def test_a_report_of_another_local_target_is_refused(tmp_path, monkeypatch):
    from huggingface_hub import constants

    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path / "hub"))
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    draft = make_draft(str(tmp_path / "d"), "vllm")
    measured, other = make_target_config(str(tmp_path / "t1")), make_target_config(str(tmp_path / "t2"), layers=16)
    report = write_report(tmp_path / "r.json", draft, measured)
    doc = strict_json(clean("push", draft, *PUSH, "--target", measured, "--report", report, "--format", "json",
                            codes=(0,)).stdout)
    assert f"{TAU_LABEL} | 2.30" in doc["card"] and "measured on other files" not in doc["card"]
    line = refused("push", draft, *PUSH, "--target", other, "--report", report, contains=report).stderr
    assert f"config.json is not the one in {other}" in line and "--force" in line
    refused("push", draft, *PUSH, "--target", HUB_TARGET, "--report", report,
            contains=f"cannot be compared with {HUB_TARGET}")
    prefill_cache(str(tmp_path / "hub"), "org/other", other)
    refused("push", draft, *PUSH, "--target", "org/other", "--report", report,
            contains="config.json is not org/other's")
    prefill_cache(str(tmp_path / "hub"), HUB_TARGET, measured)
    doc = strict_json(clean("push", draft, *PUSH, "--target", HUB_TARGET, "--report", report, "--format", "json",
                            codes=(0,)).stdout)
    assert f"base_model: {HUB_TARGET}" in doc["card"] and "measured on other files" not in doc["card"]
    named = write_report(tmp_path / "named.json", draft, edit_config(
        make_target_config(str(tmp_path / "t3")), lambda c: c.update(_name_or_path="other-org/Other")))
    refused("push", draft, *PUSH, "--target", HUB_TARGET, "--report", named, contains=f"not {HUB_TARGET}")


HISTOGRAMS = st.integers(1, 8).flatmap(lambda k: st.lists(st.integers(0, 50), min_size=k + 1, max_size=k + 1))
LIES = {
    "acceptance_length": lambda doc: doc["num_speculative_tokens"] + 1 + 0.5,
    "per_position_acceptance": lambda doc: [1.5] + doc["per_position_acceptance"][1:],
    "num_accepted_tokens": lambda doc: doc["num_draft_tokens"] + 1,
    "num_draft_tokens": lambda doc: doc["num_draft_tokens"] + 1,
    "draft_acceptance_rate": lambda doc: 1.25,
    "conditional_acceptance": lambda doc: doc["conditional_acceptance"][:-1],
}


@FUZZ
@given(histogram=HISTOGRAMS.filter(lambda h: sum(h) > 0), lie=st.sampled_from(sorted(LIES)))
def test_report_figures_must_be_possible(tmp_path_factory, histogram, lie):
    folder = tmp_path_factory.mktemp("r")
    honest = figures(AcceptanceCounter.from_histogram(histogram))
    (folder / "honest.json").write_text(json.dumps(honest))
    assert load_report(str(folder / "honest.json")).doc == honest
    path = folder / "lie.json"
    path.write_text(json.dumps({**honest, lie: LIES[lie](honest)}))
    with pytest.raises(CheckpointError, match=re.escape(lie)) as refusal:
        load_report(str(path))
    assert str(refusal.value).startswith(f"{path}: ")


def test_a_tau_beyond_k_plus_one_is_one_line_naming_the_report(tmp_path):
    draft = make_draft(str(tmp_path / "d"), "vllm")
    target = make_target_config(str(tmp_path / "t"))
    report = write_report(tmp_path / "r.json", draft, target, acceptance_length=39.9, per_position_acceptance=None)
    refused("push", draft, *PUSH, "--target", target, "--report", report, contains=f"{report}: acceptance_length 39.9")


# ------------------------------------------------------------------ 2. credentials in endpoints

USERINFO = st.text(st.characters(codec="ascii", categories=["L", "N"]) | st.sampled_from("-._~!$&'()*+,;=:@/ %"),
                   min_size=1, max_size=12)


@FUZZ
@given(user=USERINFO, password=USERINFO)
def test_endpoint_credentials_never_print(tmp_path_factory, monkeypatch, user, password):
    from huggingface_hub import constants

    user, password = "Zu8" + user, "Zq9" + password  # markers no output holds by chance
    draft = make_draft(str(tmp_path_factory.mktemp("c") / "d"), "vllm")
    host = "h.io:8443"
    endpoint = f"https://{quote(user, safe='')}:{quote(password, safe='')}@{host}/"
    secrets = {user, password, quote(user, safe=""), quote(password, safe="")}
    human = clean("push", draft, *PUSH, "--target", HUB_TARGET, "--endpoint", endpoint, codes=(0,))
    doc = strict_json(clean("push", draft, *PUSH, "--endpoint", endpoint, "--format", "json", codes=(0,)).stdout)
    monkeypatch.setattr(constants, "ENDPOINT", endpoint.rstrip("/"))  # what HF_ENDPOINT sets
    from_env = clean("push", draft, *PUSH, "--target", HUB_TARGET, codes=(0,))
    assert f"Would push 4 files to https://{host}/eagle-org/draft" in human.stdout and from_env.stdout == human.stdout
    assert doc["endpoint"] == f"https://{host}" and doc["url"] == f"https://{host}/eagle-org/draft"
    printed = human.stdout + human.stderr + json.dumps(doc) + from_env.stdout + from_env.stderr
    assert not any(secret in text for secret in secrets for text in (printed, printed.replace("\n", "")))
    assert not any(secret in one_line(f"Error: cannot reach {endpoint}x", []) for secret in secrets)


def test_credentials_in_an_unreachable_endpoint_stay_out_of_the_error(fake_hub, tmp_path):
    draft = make_draft(str(tmp_path / "d"), "vllm")
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    line = refused("push", draft, "--repo-id", "eagle-org/draft", "--token", "t0ken", "--endpoint",
                   f"http://alice:plain-password@127.0.0.1:{port}").stderr
    assert line == f"Error: cannot reach http://127.0.0.1:{port}\n"


def test_credentials_in_the_endpoint_of_a_real_push(fake_hub, tmp_path):
    """The client sends an endpoint's user:password as Basic auth in place of the token: the Hub refuses it, and
    the line names the endpoint without them."""
    draft = make_draft(str(tmp_path / "d"), "vllm")
    endpoint = fake_hub.endpoint.replace("://", "://alice:plain-password@")
    result = refused("push", draft, "--repo-id", "eagle-org/draft", "--token", fake_hub.token, "--endpoint", endpoint,
                     "--format", "json")
    assert result.stderr == f"Error: authentication failed for {fake_hub.endpoint}: check --token / HF_TOKEN\n"
    assert "plain-password" not in result.stdout and "alice" not in result.stdout


# ------------------------------------------------------------------ 3. tensor count


@pytest.mark.parametrize("extra", [100_000, MAX_DRAFT_TENSORS])
def test_a_header_of_too_many_tensors_is_refused_before_any_entry_is_checked(tmp_path, monkeypatch, extra):
    """The count is refused from the header's length alone: not one of its entries is sized or checked."""
    import eaglekit.io.header as header

    checked = []
    sized = header.tensor_nbytes
    monkeypatch.setattr(header, "tensor_nbytes", lambda *args: checked.append(args) or sized(*args))
    path = rewrite_tensors(make_draft(str(tmp_path / "d"), "vllm"),
                           lambda t: t.update({f"extra.{i}.weight": ("F32", (0,), b"") for i in range(extra)}))
    for command in ("inspect", "validate"):
        result = refused(command, path, contains="a draft checkpoint may hold")
        assert not result.stdout and not checked, len(checked)


def test_shards_that_together_exceed_the_bound_are_refused(tmp_path):
    path = make_draft(str(tmp_path / "d"), "vllm", shards=2)
    for shard in sorted(n for n in os.listdir(path) if n.endswith(".safetensors")):
        rewrite_tensors(path, lambda t, s=shard: t.update({f"{s}.{i}": ("F32", (0,), b"")
                                                           for i in range(MAX_DRAFT_TENSORS * 2 // 3)}), shard)
    with open(os.path.join(path, "model.safetensors.index.json")) as fh:
        index = json.load(fh)
    os.remove(os.path.join(path, "model.safetensors.index.json"))
    refused("inspect", path, contains="a draft checkpoint may hold")
    with open(os.path.join(path, "model.safetensors.index.json"), "w") as fh:
        json.dump({**index, "weight_map": {f"t{i}": "x" for i in range(MAX_DRAFT_TENSORS + 1)}}, fh)
    refused("inspect", path, contains="index maps")


@settings(FUZZ, max_examples=10)
@given(extra=st.integers(50, 400))
def test_many_findings_print_a_summary_and_json_lists_them_all(tmp_path_factory, extra):
    path = rewrite_tensors(make_draft(str(tmp_path_factory.mktemp("m") / "d"), "vllm"),
                           lambda t: t.update({f"extra.{i}.weight": ("F32", (0,), b"") for i in range(extra)}))
    human = clean("validate", path, codes=(1,))
    assert f"and {extra - 10:,} more EK104 findings" in human.stdout and len(human.stdout) < 20_000
    doc = strict_json(clean("validate", path, "--format", "json", codes=(1,)).stdout)
    assert sum(f["code"] == "EK104" for f in doc["findings"]) == extra


# ------------------------------------------------------------------ 4. every error line is bounded


@settings(FUZZ, max_examples=10)
@given(length=st.integers(1_000, 250_000), problem=st.sampled_from(["dtype", "offsets", "entry"]))
def test_a_huge_tensor_name_leaves_a_short_line(tmp_path_factory, length, problem):
    name = "n" * length
    entry = {"dtype": {"dtype": "ZZ", "shape": [1], "data_offsets": [0, 4]},
             "offsets": {"dtype": "F32", "shape": [1], "data_offsets": [0, 8]}, "entry": [1]}[problem]
    path = write_header(str(tmp_path_factory.mktemp("n")), json.dumps({name: entry}), b"\0" * 4)
    with pytest.raises(CheckpointError) as refusal:
        read_header(os.path.join(path, "model.safetensors"))
    assert len(str(refusal.value)) < len(path) + 200  # the name is shortened where the message is built
    for command in ("inspect", "validate"):
        line = refused(command, path).stderr.rstrip("\n")
        assert len(line) <= MAX_LINE_CHARS and line.startswith(f"Error: {path}/model.safetensors: tensor 'nnn")
        assert {"dtype": "unknown dtype 'ZZ'", "offsets": "needs 4 bytes", "entry": "not an object"}[problem] in line


PRINTABLE = st.characters(codec="utf-8", categories=["L", "N", "P", "S", "Zs"])


@FUZZ
@given(message=st.text(max_size=3000), printable=st.text(PRINTABLE, max_size=3000),
       token=st.text(st.characters(codec="ascii", categories=["L", "N"]), min_size=4, max_size=40))
def test_one_line_is_bounded_keeps_its_start_and_hides_the_token(message, printable, token):
    line = one_line("Error: /the/file: " + message, [])
    assert len(line) <= MAX_LINE_CHARS and "\n" not in line and line.startswith("Error: /the/file: ")
    line = one_line(f"Error: /the/file: {printable}{token}{printable}", ["push", "--token", token])
    assert token not in line and len(line) <= MAX_LINE_CHARS


def test_words_with_hf_in_a_path_print_intact(tmp_path):
    draft = tmp_path / "modelopt_hf_midlayer_llama33_70b"
    draft.mkdir()
    (draft / "config.json").write_text("{")
    line = refused("inspect", str(draft)).stderr
    assert f"{draft}/config.json" in line and "***" not in line


def test_token_shapes_the_saved_login_and_known_tokens_are_redacted(tmp_path, monkeypatch):
    shaped = "hf_" + "aB3" * 11 + "z"  # hf_ and 34 letters or digits
    saved = tmp_path / "token"
    saved.write_text("saved-login-secret\n")
    monkeypatch.setenv("HF_TOKEN_PATH", str(saved))
    monkeypatch.setenv("HF_TOKEN", "env-token-secret")
    line = one_line(f"Error: /a/hf_folder_name: {shaped} saved-login-secret env-token-secret given-secret",
                    ["push", "--token=given-secret"])
    assert line == "Error: /a/hf_folder_name: *** *** *** ***"


# ------------------------------------------------------------------ 5. undecodable path bytes

UNDECODABLE = st.binary(min_size=1, max_size=6).map(lambda b: b.replace(b"/", b"_").replace(b"\0", b"_") + b"\xff")


@settings(FUZZ, max_examples=4)
@given(raw=UNDECODABLE)
def test_undecodable_path_bytes_in_every_command(tmp_path_factory, raw):
    base = str(tmp_path_factory.mktemp("u"))
    draft = make_draft(os.path.join(base, os.fsdecode(b"d-" + raw)), "vllm")
    edit_config(draft, lambda c: c.update(eaglekit={"target": "a\ud800b", "source": os.fsdecode(b"s-" + raw)}))
    out = os.path.join(base, os.fsdecode(b"out-" + raw))
    for command in (["inspect", draft], ["validate", draft], ["upgrade", draft, out]):
        clean(*command, codes=(0, 1))
    for command in (["inspect", draft], ["validate", draft], ["upgrade", draft, out + "-json"]):
        strict_json(clean(*command, "--format", "json", codes=(0, 1)).stdout)
    card = os.path.join(base, os.fsdecode(b"card-" + raw + b".md"))
    doc = strict_json(clean("push", draft, *PUSH, "--card-out", card, "--format", "json", codes=(0,)).stdout)
    with open(card, encoding="utf-8", newline="") as fh:
        assert fh.read() == doc["card"]


# ------------------------------------------------------------------ 6. subfolders

ESCAPES = st.sampled_from(["..", "../x", "a/../../x", "/etc", "./../d"]) | st.lists(
    st.sampled_from(["..", "a", "."]), min_size=1, max_size=5).map("/".join).filter(
    lambda p: os.path.normpath(p).startswith(".."))


@FUZZ
@given(subfolder=ESCAPES, command=st.sampled_from(["inspect", "validate", "upgrade"]))
def test_a_subfolder_that_leaves_the_repository_says_so(tmp_path_factory, subfolder, command):
    base = tmp_path_factory.mktemp("s")
    repo = make_draft(str(base / "repo"), "vllm")
    make_draft(str(base / "x"), "vllm")
    args = [command, repo, "--subfolder", subfolder] + ([str(base / "out")] if command == "upgrade" else [])
    line = refused(*args, code=2, contains="leaves the repository").stderr
    assert "symlink" not in line and not os.path.exists(base / "out")


def test_only_a_symlink_is_called_a_symlink(tmp_path):
    outside = make_draft(str(tmp_path / "outside"), "vllm")
    repo = tmp_path / "models--org--repo" / "snapshots" / "0123abc"  # fetched from the Hub: links stay inside
    repo.mkdir(parents=True)
    os.symlink(outside, repo / "linked")
    refused("inspect", str(repo), "--subfolder", "linked", contains="symlink points outside")
    with pytest.raises(CheckpointError, match="lies outside") as refusal:
        check_inside(os.path.join(repo, "..", "outside", "config.json"), str(repo), "config.json")
    assert "symlink" not in str(refusal.value)


# ------------------------------------------------------------------ 7. --card-out never lands on what push reads


def sha(path: str) -> str:
    with open(path, "rb") as fh:
        return hashlib.sha256(fh.read()).hexdigest()


@settings(FUZZ, max_examples=10)
@given(where=st.sampled_from(["config.json", "model.safetensors", "README.md", "report", "target"]))
def test_card_out_never_overwrites_what_push_reads(tmp_path_factory, where):
    base = tmp_path_factory.mktemp("o")
    draft = make_draft(str(base / "d"), "vllm")
    target = make_target_config(str(base / "t"))
    report = write_report(base / "r.json", draft, target)
    card = {"report": report, "target": os.path.join(target, "config.json")}.get(where, os.path.join(draft, where))
    before = {p: sha(p) for p in (report, os.path.join(target, "config.json"),
                                  *(os.path.join(draft, n) for n in os.listdir(draft)))}
    refused("push", draft, *PUSH, "--target", target, "--report", report, "--card-out", card, code=2,
            contains="--card-out")
    assert {p: sha(p) for p in before} == before and not os.path.exists(os.path.join(draft, "README.md"))


# ------------------------------------------------------------------ 8. the report's target: weights, not only config


def with_weights(folder: str, norm: bytes) -> str:
    """make_target_config's target with the safetensors its config builds; `norm` is the final norm's raw F32."""
    from tests.support.factory import write_safetensors

    tensors = {"model.embed_tokens.weight": ("F32", (256, 64), bytes(256 * 64 * 4)),
               "model.norm.weight": ("F32", (64,), norm)}
    tensors.update({f"model.layers.{i}.input_layernorm.weight": ("F32", (64,), bytes(64 * 4)) for i in range(12)})
    write_safetensors(os.path.join(folder, "model.safetensors"), tensors)
    return folder


@settings(FUZZ, max_examples=6)
@given(norm=st.binary(min_size=256, max_size=256), flip=st.integers(0, 255))
def test_a_report_of_another_target_with_the_same_config_is_refused(tmp_path_factory, norm, flip):
    tmp = tmp_path_factory.mktemp("w")
    draft = make_draft(str(tmp / "d"), "vllm")
    measured = with_weights(make_target_config(str(tmp / "base")), norm)
    flipped = norm[:flip] + bytes([norm[flip] ^ 1]) + norm[flip + 1:]
    copy = with_weights(make_target_config(str(tmp / "instruct")), flipped)
    report = write_report(tmp / "r.json", draft, measured)
    clean("push", draft, *PUSH, "--target", measured, "--report", report, codes=(0,))
    refused("push", draft, *PUSH, "--target", copy, "--report", report,
            contains=f"measured against a target whose weights are not the ones in {copy}")
    doc = json.loads(open(report).read())
    del doc["measured"]["target"]["weights_fingerprint"]
    (tmp / "old.json").write_text(json.dumps(doc))
    refused("push", draft, *PUSH, "--target", measured, "--report", str(tmp / "old.json"),
            contains="does not record the target's weights")


def count_reads(monkeypatch) -> list[int]:
    """The bytes each read of a file eaglekit.provenance opens returns, appended as they are read."""
    import builtins

    import eaglekit.provenance as provenance

    read: list[int] = []

    class Counted:
        def __init__(self, fh):
            self._fh = fh

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            self._fh.close()

        def read(self, *args):
            data = self._fh.read(*args)
            read.append(len(data))
            return data

        def __getattr__(self, name):
            return getattr(self._fh, name)

    monkeypatch.setattr(provenance, "open", lambda *a, **kw: Counted(builtins.open(*a, **kw)), raising=False)
    return read


def test_the_weights_fingerprint_reads_a_bounded_part_of_a_huge_target(tmp_path, monkeypatch):
    """A 64 GiB shard: its header alone is read, counted, never the tensor bytes."""
    from eaglekit.provenance import weights_fingerprint

    shard = tmp_path / "model-00001-of-00001.safetensors"
    header = json.dumps({"w": {"dtype": "F32", "shape": [2 ** 34], "data_offsets": [0, 2 ** 36]}}).encode()
    with open(shard, "wb") as fh:  # sparse: 64 GiB of zeros after the header, a few MB on disk
        fh.write(len(header).to_bytes(8, "little") + header)
        fh.truncate(8 + len(header) + 2 ** 36)
    read = count_reads(monkeypatch)
    first = weights_fingerprint([str(shard)])
    assert sum(read) == 8 + len(header), sum(read)
    with open(shard, "r+b") as fh:
        fh.seek(8 + header.index(b"F32"))
        fh.write(b"F16")
    assert weights_fingerprint([str(shard)]) != first


@FUZZ
@given(passed=st.booleans(), lossless=st.booleans(), exact=st.booleans())
def test_a_report_whose_verdicts_contradict_each_other_is_refused(tmp_path_factory, passed, lossless, exact):
    path = tmp_path_factory.mktemp("v") / "r.json"
    path.write_text(json.dumps({"passed": passed, "lossless": lossless, "exact_match": exact,
                                **figures(AcceptanceCounter.from_histogram([1, 2]))}))
    if lossless or not (passed or exact):
        assert load_report(str(path)).doc["lossless"] is lossless
        return
    with pytest.raises(CheckpointError, match="is true but lossless is false") as refusal:
        load_report(str(path))
    assert str(refusal.value).startswith(f"{path}: ")


# ------------------------------------------------------------------ 9. the Hub lookup of a --target id


@pytest.fixture
def recording_server():
    """A loopback HTTP server answering 404 to everything, recording each request's method and path."""
    import threading
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    seen: list[tuple[str, str]] = []

    class Handler(BaseHTTPRequestHandler):
        def answer(self):
            seen.append((self.command, self.path))
            self.send_response(404)
            self.send_header("Content-Length", "0")
            self.end_headers()

        do_HEAD = do_GET = answer

        def log_message(self, *args):
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}", seen
    server.shutdown()


def test_the_target_lookup_uses_the_push_endpoint_fails_fast_and_prints_one_line(tmp_path, monkeypatch, capfd,
                                                                               recording_server):
    from huggingface_hub import constants

    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path / "hub"))
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
    draft = make_draft(str(tmp_path / "d"), "vllm")
    report = write_report(tmp_path / "r.json", draft, make_target_config(str(tmp_path / "t")))
    url, seen = recording_server
    refused("push", draft, *ASKING, "--target", HUB_TARGET, "--report", report, "--endpoint", url,
            contains=f"cannot be compared with {HUB_TARGET}")
    assert ("HEAD", f"/{HUB_TARGET}/resolve/main/config.json") in seen
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    monkeypatch.setattr(constants, "ENDPOINT", f"https://bob:pw@SECRET9@127.0.0.1:{port}")  # what HF_ENDPOINT sets
    capfd.readouterr()
    line = refused("push", draft, *ASKING, "--target", HUB_TARGET, "--report", report).stderr  # within the hang bound
    leaked = capfd.readouterr()
    assert "SECRET9" not in line + leaked.out + leaked.err and "Retrying" not in leaked.err + line


# ------------------------------------------------------------------ 10. credentials holding '@', ':', '%'

RAW_USERINFO = st.text(st.characters(codec="ascii", categories=["L", "N"]) | st.sampled_from("@:%-._~!$&'()*+,;="),
                       min_size=1, max_size=12)


@FUZZ
@given(user=RAW_USERINFO, password=RAW_USERINFO, tail=st.sampled_from(["", "/", "/mirror", "/mirror/"]))
def test_userinfo_is_stripped_up_to_its_last_at(user, password, tail):
    from eaglekit.io.urls import without_credentials

    url = f"https://Zu8{user}:Zq9{password}@h.io:8443{tail}"
    assert without_credentials(url) == f"https://h.io:8443{tail}"
    assert without_credentials(f"Error: cannot reach {url}: ConnectError") == \
        f"Error: cannot reach https://h.io:8443{tail}: ConnectError"


@settings(FUZZ, max_examples=15)
@given(user=RAW_USERINFO, password=RAW_USERINFO,
       shape=st.sampled_from(["https://{u}:{p}@h.io", "{u}:{p}@h.io:1", "https://h.io/?token={p}", "https://h.io/#{p}",
                              "ftp://{u}:{p}@h.io", "https://{u}:{p}@", "https://{u}:{p}@h.io/?q={p}"]),
       source=st.sampled_from(["--endpoint", "HF_ENDPOINT"]))
def test_an_endpoint_with_credentials_is_used_or_refused_without_printing_them(
        tmp_path_factory, monkeypatch, user, password, shape, source):
    from huggingface_hub import constants

    user, password = "Zu8" + user, "Zq9" + password
    draft = make_draft(str(tmp_path_factory.mktemp("e") / "d"), "vllm")
    endpoint = shape.format(u=user, p=password)
    args = ["--endpoint", endpoint] if source == "--endpoint" else []
    monkeypatch.setattr(constants, "ENDPOINT", endpoint if source == "HF_ENDPOINT" else "https://huggingface.co")
    human = clean("push", draft, *PUSH, *args, codes=(0, 2))
    as_json = clean("push", draft, *PUSH, *args, "--format", "json", codes=(human.exit_code,))
    if human.exit_code == 2:
        assert human.stderr.startswith(f"Error: {source} must be an http(s) URL with a host")
    else:
        doc = strict_json(as_json.stdout)
        assert doc["endpoint"] == "https://h.io" and doc["url"] == "https://h.io/eagle-org/draft"
        assert shape == "https://{u}:{p}@h.io"
    printed = human.stdout + human.stderr + as_json.stdout + as_json.stderr
    assert user not in printed and password not in printed
