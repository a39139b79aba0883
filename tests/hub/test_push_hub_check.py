"""push --dry-run asks the Hub (a loopback one) what the real push would meet: whose token, whether it may write to
the namespace, whether the repository exists; and never shows the token."""

from __future__ import annotations

import json
import os

import jsonschema
import pytest
from huggingface_hub import constants

from eaglekit.hub.access import write_permission
from eaglekit.hub.push import push
from tests.support import REPO as CHECKOUT  # the checkout (REPO here is a Hub repository id)
from tests.support.cli import run_cli
from tests.support.factory import make_draft

REPO = "eagle-org/llama-eagle3-draft"
TARGET = "meta-llama/Llama-3.1-8B-Instruct"
SCHEMA = json.load(open(os.path.join(str(CHECKOUT), "schemas", "push-result.schema.json")))
READ_TOKEN = "hf_loopbackReadOnlyToken0000000000000"
SCOPED_TOKEN = "hf_loopbackFineGrainedToken00000000000"


@pytest.fixture
def draft_dir(tmp_path) -> str:
    return make_draft(str(tmp_path / "draft"), "vllm", fc_norm=True, norm_output=True)


def dry_run(fake_hub, draft_dir, *extra: str, token: str | None = None, repo: str = REPO) -> tuple[int, str, str]:
    args = ["push", draft_dir, "--repo-id", repo, "--target", TARGET, "--endpoint", fake_hub.endpoint, "--dry-run",
            "--license", "apache-2.0", *extra]
    result = run_cli(args + (["--token", token] if token else []))
    for secret in {fake_hub.token, READ_TOKEN, SCOPED_TOKEN, token} - {None}:
        assert secret not in result.stdout and secret not in result.stderr
    return result.exit_code, result.stdout, result.stderr


def hub_check(fake_hub, draft_dir, token: str | None = None, *extra: str, repo: str = REPO) -> dict:
    code, out, err = dry_run(fake_hub, draft_dir, "--format", "json", *extra, token=token, repo=repo)
    doc = json.loads(out)
    blocker = doc["hub_check"]["blocker"]  # a dry run that finds the push would fail exits 1, its reason last
    assert code == (1 if blocker else 0), err
    assert not blocker or err.strip().splitlines()[-1] == f"Error: {repo}: {blocker}", err
    jsonschema.validate(doc, SCHEMA)
    assert doc["card"].startswith("---\n") and doc["files"] and not fake_hub.repos
    return doc["hub_check"]


def test_a_write_token_is_named_and_may_write_and_the_repo_is_found_or_not(fake_hub, draft_dir):
    check = hub_check(fake_hub, draft_dir, fake_hub.token)
    assert check["checked"] and check["account"] == "fake-user" and check["token_role"] == "write"
    assert check["can_write"] is True and check["repo_exists"] is False
    assert f"{REPO} does not exist yet (the push creates it)" in check["notes"]
    assert [r.route for r in fake_hub.requests] == ["whoami", "repo_info"]
    assert all(r.method == "GET" for r in fake_hub.requests)  # a dry run asks, it never writes

    push(draft_dir, REPO, target=TARGET, token=fake_hub.token, endpoint=fake_hub.endpoint)
    code, out, err = dry_run(fake_hub, draft_dir, token=fake_hub.token)
    assert code == 0
    assert "Hub: signed in as fake-user; the write token can write to eagle-org" in out
    assert f"Hub: {REPO} exists" in out


def test_the_token_comes_from_the_same_lookup_as_a_push(fake_hub, draft_dir, monkeypatch, tmp_path):
    monkeypatch.setenv("HF_TOKEN", fake_hub.token)
    assert hub_check(fake_hub, draft_dir)["account"] == "fake-user"
    monkeypatch.delenv("HF_TOKEN")
    saved = tmp_path / "token"
    saved.write_text(fake_hub.token)  # what `hf auth login` saves
    monkeypatch.setattr(constants, "HF_TOKEN_PATH", str(saved))
    assert hub_check(fake_hub, draft_dir)["can_write"] is True


def test_a_read_token_cannot_write(fake_hub, draft_dir):
    fake_hub.add_token(READ_TOKEN, "read")
    check = hub_check(fake_hub, draft_dir, READ_TOKEN)
    assert check["token_role"] == "read" and check["can_write"] is False
    assert "cannot write to eagle-org: the token is read-only" in check["notes"][0]
    code, out, err = dry_run(fake_hub, draft_dir, token=READ_TOKEN)
    assert code == 1 and "Hub: signed in as fake-user; cannot write to eagle-org: the token is read-only" in out
    assert err.strip() == (f"Error: {REPO}: the push would fail: cannot write to eagle-org: the token is read-only "
                           "(create a write token)")


@pytest.mark.parametrize("scoped, writes", [
    ({"fake-user": ["repo.content.read", "repo.write"]}, False),  # its own namespace only
    ({"eagle-org": ["repo.content.read"]}, False),  # reads the org, may not write
    ({"eagle-org": ["repo.content.read", "repo.write"]}, True),
    ({REPO: ["repo.write"]}, True),  # that one repository
])
def test_a_fine_grained_token_writes_where_its_scope_says(fake_hub, draft_dir, tmp_path, scoped, writes):
    fake_hub.add_token(SCOPED_TOKEN, "fineGrained", scoped)
    check = hub_check(fake_hub, draft_dir, SCOPED_TOKEN)
    assert check["token_role"] == "fineGrained" and check["can_write"] is writes
    if not writes:
        assert "cannot write to eagle-org: the fine-grained token has no repo.write permission" in check["notes"][0]
    # what the dry run predicts is what the push meets
    result = run_cli(["push", draft_dir, "--repo-id", REPO, "--target", TARGET, "--endpoint", fake_hub.endpoint,
                      "--token", SCOPED_TOKEN, "--license", "apache-2.0"])
    assert (result.exit_code == 0) is writes, result.stderr
    assert SCOPED_TOKEN not in result.stdout + result.stderr


def test_membership_of_the_namespace_decides_first(fake_hub, draft_dir):
    fake_hub.orgs["viewers-org"] = "read"
    check = hub_check(fake_hub, draft_dir, fake_hub.token, repo="viewers-org/draft")
    assert check["can_write"] is False and "fake-user is a read member of it" in check["notes"][0]
    check = hub_check(fake_hub, draft_dir, fake_hub.token, repo="strangers/draft")
    assert check["can_write"] is False and "cannot write to strangers: fake-user is not a member of it" in check[
        "notes"][0]
    check = hub_check(fake_hub, draft_dir, fake_hub.token, repo="fake-user/draft")
    assert check["can_write"] is True


def test_a_refused_token_is_one_line(fake_hub, draft_dir):
    unknown = "hf_loopbackUnknownToken000000000000000"
    code, out, err = dry_run(fake_hub, draft_dir, token=unknown)
    host = fake_hub.endpoint.split("://", 1)[1]
    assert code == 1 and f"the push would fail: the token was refused by {host} (401)" in err
    hub_lines = [line for line in out.splitlines() if line.startswith("Hub:")]
    assert hub_lines == [f"Hub: the token was refused by {host} (401)"]
    assert unknown not in out + err
    check = hub_check(fake_hub, draft_dir, unknown)
    assert check["checked"] and check["can_write"] is False and check["account"] is None


def test_without_a_token_it_builds_the_card_and_fails_saying_the_push_would(fake_hub, draft_dir):
    code, out, err = dry_run(fake_hub, draft_dir)
    assert code == 1 and "# llama-eagle3-draft" in out
    assert "Hub: no Hugging Face token (--token, HF_TOKEN or `hf auth login`): a real push would fail" in out
    assert err.strip().splitlines()[-1] == (f"Error: {REPO}: the push would fail: no Hugging Face token (--token, "
                                             "HF_TOKEN or `hf auth login`)")
    assert not fake_hub.requests
    check = hub_check(fake_hub, draft_dir)
    assert check == {"checked": False, "account": None, "token_role": None, "can_write": None, "repo_exists": None,
                     "notes": [check["notes"][0]], "blocker": check["blocker"]}
    result = run_cli(["push", draft_dir, "--repo-id", REPO, "--endpoint", fake_hub.endpoint, "--token",
                      fake_hub.token, "--license", "apache-2.0"])
    assert result.exit_code == 0  # with the token the dry run was missing, the push goes through


def test_offline_mode_without_offline_fails_as_the_push_would(draft_dir, monkeypatch):
    monkeypatch.setenv("HF_TOKEN", "hf_" + "x" * 34)
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)  # as huggingface_hub reads HF_HUB_OFFLINE=1 at import
    result = run_cli(["push", draft_dir, "--repo-id", REPO, "--dry-run", "--license", "apache-2.0"])
    assert result.exit_code == 1 and "Hub: offline mode is on (HF_HUB_OFFLINE)" in result.stdout
    assert result.stderr.strip().splitlines()[-1].startswith(f"Error: {REPO}: the push would fail: offline mode is on")
    pushed = run_cli(["push", draft_dir, "--repo-id", REPO, "--license", "apache-2.0"])
    assert pushed.exit_code == 1 and "offline mode is on" in pushed.stderr  # what the dry run predicted


def test_offline_asks_nothing_and_goes_only_with_a_dry_run(fake_hub, draft_dir):
    check = hub_check(fake_hub, draft_dir, fake_hub.token, "--offline")
    assert not check["checked"] and check["notes"] == ["--offline: the token and the repository were not checked"]
    assert check["blocker"] is None  # not checked, as the user chose: exit 0
    code, out, err = dry_run(fake_hub, draft_dir, "--offline")  # no token either: still not checked
    assert code == 0 and "Hub: --offline: the token and the repository were not checked" in out
    assert not fake_hub.requests
    result = run_cli(["push", draft_dir, "--repo-id", REPO, "--endpoint", fake_hub.endpoint, "--offline"])
    assert result.exit_code == 2 and "--offline goes with --dry-run" in result.stderr
    assert not fake_hub.requests


def test_an_unreachable_hub_is_one_note(draft_dir, monkeypatch):
    from huggingface_hub import constants

    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
    result = push(draft_dir, REPO, target=TARGET, token="hf_" + "x" * 34, endpoint="http://127.0.0.1:9",
                  dry_run=True)
    assert result.hub_check is not None and result.hub_check.notes == [
        "cannot reach 127.0.0.1:9: the token was not checked"]
    assert result.hub_check.blocker == ("cannot tell that the push would succeed: cannot reach 127.0.0.1:9: the token "
                                        "was not checked")
    cli = run_cli(["push", draft_dir, "--repo-id", REPO, "--target", TARGET, "--token", "hf_" + "x" * 34,
                   "--endpoint", "http://127.0.0.1:9", "--dry-run", "--license", "apache-2.0"])
    assert cli.exit_code == 1 and cli.stderr.strip().splitlines()[-1] == f"Error: {REPO}: {result.hub_check.blocker}"


def test_write_permission_reads_whoami_as_the_hub_writes_it():
    whoami = {"name": "alice", "orgs": [{"name": "acme", "roleInOrg": "contributor"}],
              "auth": {"type": "access_token", "accessToken": {"role": "admin"}}}
    assert write_permission(whoami, "acme/x") == (True, "the admin token can write to acme")
    whoami["auth"]["accessToken"]["role"] = "mystery"
    assert write_permission(whoami, "alice/x")[0] is None
    del whoami["auth"]
    assert write_permission(whoami, "alice/x")[0] is None
