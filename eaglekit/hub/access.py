"""What a dry run asks the Hub before anything is pushed: whose token it is, whether it may write to the namespace
of the repository, and whether the repository (and branch) exists.

A dry run that only built the card would pass, and the real push fail on its first request with a read token or a
fine-grained token scoped elsewhere. The Hub answers both questions at `/api/whoami-v2` (huggingface_hub's
`HfApi.whoami`): `name`, `orgs` (each with `roleInOrg`) and `auth.accessToken` with its `role` (`read`, `write`,
`admin` or `fineGrained`; a fine-grained token lists `fineGrained.scoped`: an entity (user, org or repo) and its
permissions, `repo.write` among them). The token is sent in the Authorization header only and never appears in
what this returns.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass, field
from typing import Any
from urllib.parse import urlsplit

from eaglekit.config_view import nested
from eaglekit.errors import quoted
from eaglekit.io.hub_client import (
    bounded_hub_client,
    quiet_hub_logging,
    transport_errors,
    transport_failure,
)
from eaglekit.io.urls import without_credentials

WRITE_ROLES = frozenset({"write", "admin"})  # classic tokens that may write wherever their account may
MEMBER_WRITE_ROLES = frozenset({"admin", "write", "contributor"})  # org roles that may create and write repos
REPO_WRITE = "repo.write"  # the fine-grained permission a commit needs


@dataclass
class HubAccess:
    """What the Hub said about this push before it was made. `checked`: the Hub was asked (a token was found and
    the network allowed); `can_write` and `repo_exists` are None when it could not tell."""

    checked: bool
    account: str | None = None
    token_role: str | None = None
    can_write: bool | None = None
    repo_exists: bool | None = None
    notes: list[str] = field(default_factory=list)  # one sentence each, in the order they were found
    blocker: str | None = None
    """Why a real push would fail, or is not known to succeed: the dry run exits 1 with it as its last line. None:
    the token may write, or --offline chose not to ask."""

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def host(endpoint: str) -> str:
    """The endpoint as a message names it: its host (and port), never its credentials."""
    return urlsplit(without_credentials(endpoint)).netloc or without_credentials(endpoint)


def write_permission(whoami: Mapping[str, Any], repo_id: str) -> tuple[bool | None, str]:
    """Whether the account and token `whoami` describes may write to `repo_id`'s namespace, and why in words."""
    namespace = repo_id.split("/", 1)[0]
    account = whoami.get("name")
    orgs = {o.get("name"): o.get("roleInOrg") for o in whoami.get("orgs") or [] if isinstance(o, Mapping)}
    if namespace != account:
        if namespace not in orgs:
            return False, f"cannot write to {namespace}: {account} is not a member of it"
        if orgs[namespace] is not None and orgs[namespace] not in MEMBER_WRITE_ROLES:
            return False, f"cannot write to {namespace}: {account} is a {orgs[namespace]} member of it"
    token = nested(nested(whoami, "auth"), "accessToken")
    role = token.get("role")
    if role in WRITE_ROLES:
        return True, f"the {role} token can write to {namespace}"
    if role == "read":
        return False, f"cannot write to {namespace}: the token is read-only (create a write token)"
    if role == "fineGrained":
        for scope in nested(token, "fineGrained").get("scoped") or []:
            if not isinstance(scope, Mapping) or REPO_WRITE not in (scope.get("permissions") or []):
                continue
            if nested(scope, "entity").get("name") in (namespace, repo_id):
                return True, f"the fine-grained token has {REPO_WRITE} on {nested(scope, 'entity')['name']}"
        return False, (f"cannot write to {namespace}: the fine-grained token has no {REPO_WRITE} permission on "
                       f"{namespace} or {repo_id}")
    return None, f"cannot tell whether the token can write to {namespace} (the Hub names its role {quoted(role)})"


def check_access(endpoint: str, repo_id: str, token: str | None, *, revision: str | None = None,
                 offline: bool = False) -> HubAccess:
    """Ask `endpoint` who `token` is and whether `repo_id` (and `revision`) exists; never raises for what the Hub
    answers: every outcome is a note."""
    from huggingface_hub import constants

    where = host(endpoint)
    if offline:
        return HubAccess(False, notes=["--offline: the token and the repository were not checked"])
    if not token:
        return HubAccess(False, notes=["no Hugging Face token (--token, HF_TOKEN or `hf auth login`): a real push "
                                       "would fail"],
                         blocker=f"{WOULD_FAIL}no Hugging Face token (--token, HF_TOKEN or `hf auth login`)")
    if constants.HF_HUB_OFFLINE:
        return HubAccess(False, notes=["offline mode is on (HF_HUB_OFFLINE): the token and the repository were "
                                       "not checked"],
                         blocker=f"{WOULD_FAIL}offline mode is on (HF_HUB_OFFLINE); --offline builds the card "
                                 "without asking the Hub")
    from huggingface_hub import HfApi

    bounded_hub_client()
    api = HfApi(endpoint=endpoint, token=token)
    access = HubAccess(True)
    with quiet_hub_logging():
        whoami, status, problem = _ask(lambda: api.whoami(token=token), where, "the token")
        if problem:
            access.notes.append(problem)
            access.can_write = False if status == 401 else None
            access.blocker = push_blocker(access.can_write, problem)
            return access
        if not isinstance(whoami, Mapping) or not isinstance(whoami.get("name"), str):
            access.notes.append(f"{where}'s answer is not what the Hub sends: the token was not checked")
            access.blocker = push_blocker(None, access.notes[-1])
            return access
        access.account = whoami["name"]
        access.token_role = nested(nested(whoami, "auth"), "accessToken").get("role")
        access.can_write, why = write_permission(whoami, repo_id)
        access.notes.append(f"signed in as {access.account}; {why}")
        access.blocker = push_blocker(access.can_write, why)
        access.repo_exists, found = _repo_state(api, repo_id, revision, where)
        access.notes.append(found)
    return access


WOULD_FAIL = "the push would fail: "


def push_blocker(can_write: bool | None, why: str) -> str | None:
    """What stands in a real push's way, from whether the token may write and why: None when it may."""
    if can_write:
        return None
    return f"{WOULD_FAIL}{why}" if can_write is False else f"cannot tell that the push would succeed: {why}"


def _repo_state(api: Any, repo_id: str, revision: str | None, where: str) -> tuple[bool | None, str]:
    """Whether `repo_id` exists on the Hub (and `revision` in it), in words."""
    from huggingface_hub.errors import GatedRepoError, RepositoryNotFoundError, RevisionNotFoundError

    creates = f"{repo_id} does not exist yet (the push creates it)"
    try:
        _, status, problem = _ask(lambda: api.repo_info(repo_id, revision=revision), where, "the repository")
    except GatedRepoError:
        return True, f"{repo_id} exists (gated)"
    except RevisionNotFoundError:
        return True, f"{repo_id} exists; its branch {quoted(revision)} does not yet (the push creates it)"
    except RepositoryNotFoundError:
        return False, creates
    if status == 404:
        return False, creates
    if problem:
        return None, problem
    return True, f"{repo_id} exists" + (f", with a branch {quoted(revision)}" if revision else "")


def _ask(call: Callable[[], Any], where: str, what: str) -> tuple[Any, int | None, str]:
    """(answer, None, "") for one Hub request, or (None, HTTP status or None, one line saying why there is no
    answer). The client's repository errors are left to the caller, which knows what they mean."""
    from huggingface_hub.errors import HfHubHTTPError, RepositoryNotFoundError, RevisionNotFoundError

    connect_error, transport_error = transport_errors()
    try:
        return call(), None, ""
    except (RepositoryNotFoundError, RevisionNotFoundError):
        raise
    except HfHubHTTPError as exc:
        status = getattr(getattr(exc, "response", None), "status_code", None)
        if status == 401:
            return None, status, f"the token was refused by {where} (401)"
        return None, status, f"{where} answered HTTP {status}: {what} was not checked"
    except connect_error:
        return None, None, f"cannot reach {where}: {what} was not checked"
    except (transport_error, OSError) as exc:
        return None, None, f"no usable answer from {where} ({transport_failure(exc)}): {what} was not checked"
    except (ValueError, KeyError, TypeError, AttributeError):
        return None, None, f"{where}'s answer is not what the Hub sends: {what} was not checked"
