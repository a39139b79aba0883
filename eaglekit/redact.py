"""What may leave this machine in a report or through the Hub: no secret, and no local path beyond a folder's name.

Every JSON document eaglekit writes or prints (`--save-report`, `--format json`, the `eaglekit.json` a push
uploads) and every provenance block it records goes through here. Secrets are the token values this run knows (the
environment's HF_TOKEN / HUGGING_FACE_HUB_TOKEN, the saved login, a `--token` it was given: `remember_secret`),
anything shaped like a Hugging Face token (`hf_` and exactly 34 letters or digits), the credentials of a URL, and
the values of engine settings whose names say secret (`hf_token=`, `api_key=`). A local path is named by its Hub id
when it lies in the Hugging Face cache, else by its folder's name (a file by its folder's and its own name).
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterable, Mapping
from typing import Any

from eaglekit.io.urls import without_credentials

REDACTED = "***"
TOKEN_SHAPE = re.compile(r"(?<![A-Za-z0-9])hf_[A-Za-z0-9]{34}(?![A-Za-z0-9])|(?i:bearer)\s+\S+")
"""A Hugging Face access token (exactly 34 letters or digits after `hf_`, so words such as `hf_midlayer` stay) and
an Authorization header's value."""
SECRET_WORDS = frozenset({"token", "key", "apikey", "secret", "password", "passwd", "passphrase", "auth",
                          "authorization", "credential", "credentials", "cookie"})
MIN_SECRET_CHARS = 4  # shorter values would redact ordinary words
_ABSOLUTE_PATH = re.compile(r"(?<![\w.~/:@-])/[^\s'\"`,;()\[\]{}<>|*?]+")
"""An absolute POSIX path inside a text: starts at a `/` not preceded by a name, a URL's host or `//`."""

_remembered: set[str] = set()


def printable(value: object) -> str:
    """`value` as text that stays on the line it is printed on: every character that is not printable (a newline, a
    carriage return, an escape sequence, the Unicode line separators, a lone surrogate) written as its Python
    escape. A name from a file, a server or the command line printed through this can neither start a line of its
    own (forging `Error:` or a Markdown heading) nor move the cursor."""
    return "".join(c if c.isprintable() else ascii(c)[1:-1] for c in str(value))


def remember_secret(value: str | None) -> None:
    """A secret this process was given (a `--token`, an endpoint's password): never written from now on."""
    if value and len(value) >= MIN_SECRET_CHARS:
        _remembered.add(value)


def _saved_login() -> str | None:
    """The token `hf auth login` saved (huggingface_hub's token file), read without importing the client."""
    path = os.environ.get("HF_TOKEN_PATH") or os.path.join(
        os.environ.get("HF_HOME") or os.path.join(os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"),
                                                  "huggingface"), "token")
    try:
        with open(path, encoding="utf-8") as fh:
            return fh.read(4096).strip() or None
    except (OSError, UnicodeDecodeError):
        return None


def known_secrets() -> list[str]:
    """Every token value this run knows, longest first (a token that contains another is removed whole)."""
    found = {os.environ.get(name, "").strip() for name in ("HF_TOKEN", "HUGGING_FACE_HUB_TOKEN")}
    found.add(_saved_login() or "")
    found |= _remembered
    return sorted((s for s in found if len(s) >= MIN_SECRET_CHARS), key=len, reverse=True)


def is_secret_name(name: str) -> bool:
    """A setting whose value is a secret: one of its words (`hf_token`, `--api-key`, `auth`) says so."""
    words = re.split(r"[^a-z0-9]+", name.lower())
    return any(w in SECRET_WORDS or w.startswith("auth") for w in words)


def public_path(value: Any) -> Any:
    """A path as a report or the Hub may name it: a Hub id as is, a Hugging Face cache snapshot by its Hub id, else
    the folder's name (a file: its folder's name and its own). Anything not a string is returned as it is."""
    from eaglekit.config_view import REPO_ID
    from eaglekit.target import HUB_CACHE_SNAPSHOT

    if not isinstance(value, str) or not value:
        return value
    if REPO_ID.match(value) and not os.path.exists(value):
        return value
    path = os.path.normpath(value)
    cached = HUB_CACHE_SNAPSHOT.search(path)
    if cached:
        org, name, rest = cached.groups()
        return f"{org}/{name}" + (rest or "")
    name = os.path.basename(path)
    if os.path.isfile(path):
        return os.path.join(os.path.basename(os.path.dirname(os.path.abspath(path))), name)
    return name or path


def _local_path(match: re.Match[str]) -> str:
    found = match.group(0)
    path = found.rstrip(".:")
    top = path.split("/")[1]
    if path.count("/") < 2 or not os.path.isdir("/" + top):  # an API route (/v1/completions), not this machine's
        return found
    return str(public_path(path)) + found[len(path):]


def without_secrets(text: str, secrets: Iterable[str] | None = None) -> str:
    """`text` with every known secret and token-shaped string as *** and URL credentials removed; paths stay (an
    error line names the file as the user gave it). `secrets`: the values to remove (default: `known_secrets()`)."""
    for secret in known_secrets() if secrets is None else secrets:
        text = text.replace(secret, REDACTED)
    return without_credentials(TOKEN_SHAPE.sub(REDACTED, text))


def redact(text: str, secrets: Iterable[str] | None = None) -> str:
    """`text` without secrets (`without_secrets`) and with local paths named as `public_path` names them."""
    return _ABSOLUTE_PATH.sub(_local_path, without_secrets(text, secrets))


def public_report(doc: Any, secrets: Iterable[str] | None = None) -> Any:
    """A JSON document with every string in it (keys and values) passed through `redact`."""
    known = known_secrets() if secrets is None else list(secrets)
    if isinstance(doc, str):
        return redact(doc, known)
    if isinstance(doc, Mapping):
        return {public_report(k, known) if isinstance(k, str) else k: public_report(v, known) for k, v in doc.items()}
    if isinstance(doc, (list, tuple)):
        return [public_report(v, known) for v in doc]
    return doc


def public_engine_args(args: Mapping[str, Any]) -> dict[str, Any]:
    """Engine settings as a report records them: a secret-named one's value as ***, paths by their public names."""
    return {key: REDACTED if is_secret_name(key) else public_report(value) for key, value in args.items()}


def public_flags(flags: Iterable[str]) -> list[str]:
    """Command-line flags (`--hf-token X`, `--api-key=X`) as a report records them, secret values as ***."""
    shown: list[str] = []
    hide_next = False
    for flag in flags:
        name, eq, _ = flag.partition("=")
        if hide_next and not flag.startswith("--"):
            shown.append(REDACTED)
        elif flag.startswith("-") and eq and is_secret_name(name):
            shown.append(f"{name}={REDACTED}")
        else:
            shown.append(str(public_report(flag)))
        hide_next = flag.startswith("-") and not eq and is_secret_name(flag)
    return shown
