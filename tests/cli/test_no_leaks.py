"""Nothing eaglekit writes or prints carries a token or this machine's paths: a planted token and the runs' own
absolute paths are searched for in every file under the test's folder, every JSON printed and every file a push
sends, after the commands that write reports, provenance and cards."""

from __future__ import annotations

import json
import os

import jsonschema
import pytest

pytest.importorskip("torch")

from eaglekit.bench.report import BenchReport, BenchRow, ServedRun, Spread  # noqa: E402
from eaglekit.cli.output import finish_report  # noqa: E402
from eaglekit.families import load_draft  # noqa: E402
from eaglekit.provenance import measured_files  # noqa: E402
from eaglekit.redact import (  # noqa: E402
    REDACTED,
    is_secret_name,
    public_engine_args,
    public_flags,
    public_path,
    public_report,
    redact,
    remember_secret,
)
from eaglekit.runtime.server import engine_flags  # noqa: E402
from eaglekit.target import read_target  # noqa: E402
from tests.support import REPO  # noqa: E402
from tests.support.cli import run_cli  # noqa: E402
from tests.support.factory import make_draft  # noqa: E402
from tests.support.smollm2 import smollm2_path  # noqa: E402
from tests.support.targets import make_tiny_target  # noqa: E402

pytestmark = pytest.mark.model

PLANTED = "hf_" + "Q9w8E7r6T5y4U3i2O1p0A9s8D7f6G5h4J3"  # the environment's token
SAVED = "hf_" + "Zx9Cv8Bn7Mm6Ll5Kk4Jj3Hh2Gg1Ff0Dd9Ss"  # the saved login's
VOCAB = 49152  # SmolLM2's tokenizer
FAST = ["--limit", "1", "--max-new-tokens", "4", "--no-progress"]


@pytest.fixture(scope="module")
def target(tmp_path_factory) -> str:
    return make_tiny_target(tmp_path_factory.mktemp("leak-target") / "target", vocab=VOCAB,
                            tokenizer_from=smollm2_path())


def _served(rates: tuple[float, ...], drafts: int = 0, accepted: int = 0) -> ServedRun:
    spread = Spread(10.0, 10.0, 12.0)
    return ServedRun(len(rates), 1.0, 40, sum(rates), rates, spread, spread, ("a",) * len(rates), drafts, 3 * drafts,
                     accepted, (0.5, 0.3, 0.2) if drafts else ())


def _bench_report(draft: str, target: str) -> dict:
    """A bench report as `eaglekit bench` builds it (vLLM's figures faked), with the token and the local paths in
    the server's settings as vLLM was started with them."""
    spec = load_draft(draft)
    settings = {"tokenizer": target, "dtype": "bfloat16", "hf_token": PLANTED, "api_key": "sk-not-hf-shaped"}
    report = BenchReport(spec.path, target, spec.eagle_version, 3, 4, "bfloat16",
                         {"name": "eaglekit-coding", "count": 2, "speed_bench": False, "categories": [],
                          "ignore_eos": False},
                         {"name": "vllm", "version": "0.0", "device_type": "cpu", "device_name": "cpu",
                          "tensor_parallel_size": 1, "max_model_len": 256, "max_num_seqs": 1, "memory_sizing": None,
                          "cpu_kv_cache_gib": None, "client": "vllm bench serve", "endpoint": "/v1/completions",
                          "server_args": {side: public_flags(["--model", target, *engine_flags(settings)])
                                          for side in ("baseline", "speculative")}},
                         {"method": "eagle3", "model": os.path.abspath(draft), "num_speculative_tokens": 3},
                         measured_files(spec, read_target(target)))
    report.rows = [BenchRow(1, None, _served((10.0, 11.0)), _served((15.0, 16.0), drafts=10, accepted=10))]
    return report.to_dict()


def _leaks(data: bytes, secrets: list[str], paths: list[str]) -> list[str]:
    return [s for s in secrets + paths if s.encode() in data]


def test_no_token_or_local_path_in_any_report_card_or_upload(target, tmp_path, monkeypatch, capsys, fake_hub):
    monkeypatch.setenv("HF_TOKEN", PLANTED)
    login = os.path.join(os.environ["HF_HOME"], "token")
    os.makedirs(os.environ["HF_HOME"], exist_ok=True)
    with open(login, "w") as fh:
        fh.write(SAVED)
    draft = make_draft(str(tmp_path / "modelopt_hf_midlayer_llama33_70b"), "specforge", hidden=64, vocab=VOCAB,
                       draft_vocab=512, aux_ids=(1, 2, 3), target_layers=4)
    up, tuned = str(tmp_path / "up"), str(tmp_path / "up-vllm")
    printed = []

    def ok(args: list[str]) -> dict:
        result = run_cli(args)
        assert result.exit_code == 0, result.output
        printed.append(result.stdout)
        return json.loads(result.stdout)

    ok(["upgrade", draft, up, "--target", target, "--format", "json"])
    ok(["upgrade", up, tuned, "--to", "vllm", "--target", target, "--format", "json"])
    verify = ok(["verify", tuned, "--target", target, "--format", "json", "--save-report", str(tmp_path / "v.json"),
                 *FAST])
    refused = run_cli(["verify", tuned, "--target", target, "--engine-arg", f"hf_token={PLANTED}"])
    assert refused.exit_code == 2 and "--engine-arg with --engine reference" in refused.stderr, refused.output
    printed.append(refused.output)
    ok(["compare", draft, tuned, "--target", target, "--format", "json", "--save-report", str(tmp_path / "c.json"),
        *FAST])
    finish_report(_bench_report(tuned, target), "json", lambda doc: None, save_report=str(tmp_path / "b.json"))
    printed.append(capsys.readouterr().out)
    bench = json.loads(printed[-1])
    common = ["--target", target, "--report", str(tmp_path / "v.json"), "--bench", str(tmp_path / "b.json"),
              "--force", "--allow-few-samples", "--format", "json"]
    ok(["push", tuned, "--repo-id", "org/draft", "--dry-run", "--offline", "--card-out", str(tmp_path / "card.md"),
        *common])
    ok(["push", tuned, "--repo-id", "org/draft", "--endpoint", fake_hub.endpoint, "--token", fake_hub.token, *common])

    secrets = [PLANTED, SAVED, fake_hub.token, "sk-not-hf-shaped"]
    paths = sorted({str(tmp_path), os.path.realpath(tmp_path), os.path.dirname(target),
                    os.path.realpath(os.path.dirname(target))})
    written = [os.path.join(root, name) for root, _, names in os.walk(tmp_path) for name in names]
    assert {"v.json", "c.json", "b.json", "card.md", "up/config.json", "up-vllm/config.json",
            "up-vllm/model.safetensors"} <= {os.path.relpath(p, tmp_path) for p in written}
    for path in written:
        with open(path, "rb") as fh:
            assert not _leaks(fh.read(), secrets, paths), path
    for doc in printed:
        assert not _leaks(doc.encode(), secrets, paths), doc[:2000]
    uploaded = fake_hub.repo("org/draft").files()
    assert {"README.md", "eaglekit.json", "config.json"} <= set(uploaded)
    for name, data in uploaded.items():
        assert not _leaks(data, secrets, paths), name
    # named, not dropped: folders by their names, the folder whose name merely contains `hf_` intact
    assert verify["draft"] == "up-vllm" and verify["target"] == "target"
    assert bench["engine"]["server_args"]["baseline"][:2] == ["--model", "target"]
    assert {"--hf-token", "--api-key"} <= set(bench["engine"]["server_args"]["baseline"])
    assert bench["speculative_config"]["model"] == "up-vllm" and bench["engine"]["endpoint"] == "/v1/completions"
    provenance = json.loads(uploaded["config.json"])["eaglekit"]
    assert provenance["source"] == "up" and provenance["source_provenance"]["source"] == os.path.basename(draft)
    assert provenance["target"] == "target"
    assert b"a local folder named `modelopt_hf_midlayer_llama33_70b`" in uploaded["README.md"]
    schemas = os.path.join(str(REPO), "eaglekit", "schemas")
    for saved, schema in (("v.json", "verify-report"), ("c.json", "compare-report"), ("b.json", "bench-report")):
        with open(tmp_path / saved) as fh, open(os.path.join(schemas, f"{schema}.schema.json")) as sh:
            jsonschema.validate(json.load(fh), json.load(sh))


def test_token_shapes_and_known_secrets():
    token = "hf_" + "a" * 34
    assert redact(f"x {token}.", secrets=[]) == f"x {REDACTED}."
    for word in ("hf_" + "a" * 33, "hf_" + "a" * 35, "modelopt_hf_midlayer_llama33_70b", "hf_transfer"):
        assert redact(word, secrets=[]) == word
    remember_secret("s3cr3t-value")
    assert redact("--token s3cr3t-value") == f"--token {REDACTED}"
    assert redact("https://user:pw@hub.example/org/x", secrets=[]) == "https://hub.example/org/x"


def test_secret_named_settings_are_hidden_and_the_rest_kept(tmp_path):
    assert [is_secret_name(n) for n in ("hf_token", "--api-key", "authorization", "auth_header", "password")] == \
        [True] * 5
    harmless = ("max_num_batched_tokens", "tokenizer", "tokenizer_mode", "kv_cache_dtype", "max_model_len", "monkey")
    assert not any(is_secret_name(n) for n in harmless)
    shown = public_engine_args({"hf_token": "anything", "max_model_len": 4096,
                                "tokenizer": str(tmp_path / "tok"), "hf_overrides": {"api_key": "x"}})
    assert shown == {"hf_token": REDACTED, "max_model_len": 4096, "tokenizer": "tok",
                     "hf_overrides": {"api_key": "x"}}  # nested values are kept: vLLM has no secret inside one
    assert public_flags(["--api-key", "k1", "--secret=k2", "--max-model-len", "256", "--enforce-eager",
                         "--model", str(tmp_path / "m")]) == \
        ["--api-key", REDACTED, f"--secret={REDACTED}", "--max-model-len", "256", "--enforce-eager", "--model", "m"]


def test_paths_are_named_by_hub_id_or_folder(tmp_path):
    (tmp_path / "target").mkdir()
    (tmp_path / "target" / "config.json").write_text("{}")
    snapshot = "/home/me/.cache/huggingface/hub/models--org--name/snapshots/" + "0" * 40
    assert public_path("org/name") == "org/name"
    assert public_path(snapshot) == "org/name"
    assert public_path(snapshot + "/config.json") == "org/name/config.json"
    assert public_path(str(tmp_path / "target")) == "target"
    assert public_path(str(tmp_path / "target" / "config.json")) == "target/config.json"
    text = f"eaglekit upgrade {tmp_path}/draft {tmp_path}/draft-vllm --target {tmp_path}/target/config.json."
    assert redact(text, secrets=[]) == "eaglekit upgrade draft draft-vllm --target target/config.json."
    kept = "POST /v1/completions to https://huggingface.co/org/x at 12/34 tokens/s"
    assert redact(kept, secrets=[]) == kept  # routes, URLs and fractions are not this machine's paths
    assert public_report({"a": [f"{tmp_path}/x", 1, None]}, secrets=[]) == {"a": ["x", 1, None]}
