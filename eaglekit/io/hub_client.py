"""Every Hub request eaglekit makes has a timeout: a server that accepts and never answers cannot hang a run.

huggingface_hub builds its shared HTTP client with `timeout=None`; `bounded_hub_client()` installs a client
factory whose clients give up after EAGLEKIT_HUB_TIMEOUT seconds (default 60) of silence on any read, write
or connect. The client's own retries and backoff stay as they are.

An endpoint may carry credentials (`https://user:password@host`, from --endpoint or HF_ENDPOINT): every URL
eaglekit prints or returns goes through `without_credentials` first, and an endpoint that is not a plain http(s)
URL is refused (eaglekit.io.urls) without being quoted.

`hub_snapshot` is the one way eaglekit reads files of a Hub repository it does not publish (a target, the config a
push compares a report with): the local Hugging Face cache first, then a download through the bounded client.
"""

from __future__ import annotations

import logging
import os
import re
from collections.abc import Iterator, Sequence
from contextlib import contextmanager

DEFAULT_TIMEOUT_S = 60.0
# userinfo: everything up to the LAST '@' of the authority (a password may hold '@'), as urllib splits it
_USERINFO = re.compile(r"(?<=://)[^\s/?#]*@")


def without_credentials(text: str) -> str:
    """`text` (a URL, or a message that quotes URLs) with the `user:password@` of every URL in it removed."""
    return _USERINFO.sub("", text)


@contextmanager
def quiet_hub_logging() -> Iterator[None]:
    """huggingface_hub's own log lines (retries, failed requests) silenced: they quote URLs with their credentials,
    and eaglekit says what failed in its one line."""
    hub_logger = logging.getLogger("huggingface_hub")
    level = hub_logger.level
    hub_logger.setLevel(logging.CRITICAL + 1)
    try:
        yield
    finally:
        hub_logger.setLevel(level)


def hub_timeout() -> float:
    try:
        value = float(os.environ.get("EAGLEKIT_HUB_TIMEOUT", DEFAULT_TIMEOUT_S))
    except ValueError:
        return DEFAULT_TIMEOUT_S
    return value if value > 0 else DEFAULT_TIMEOUT_S


def bounded_hub_client() -> None:
    """Make huggingface_hub's shared client (re)built with timeouts; call before the first Hub request."""
    from huggingface_hub import set_client_factory
    from huggingface_hub.utils._http import default_client_factory

    seconds = hub_timeout()

    def factory():
        client = default_client_factory()
        client.timeout = seconds
        return client

    set_client_factory(factory)


class HubFetchError(Exception):
    """A Hub repository's files are neither in the local cache nor fetched; `offline`: the Hub could not be reached
    (as opposed to it answering with an error). The message quotes no URL."""

    def __init__(self, message: str, offline: bool):
        super().__init__(message)
        self.offline = offline


def transport_errors() -> tuple[type[Exception], type[Exception]]:
    """(connect error, any transport error) of the HTTP client huggingface_hub uses (httpx2 from 2.0, httpx before)."""
    try:
        import httpx2

        return httpx2.ConnectError, httpx2.TransportError
    except ImportError:
        import httpx

        return httpx.ConnectError, httpx.TransportError


def hub_snapshot(repo_id: str, patterns: Sequence[str], *, endpoint: str | None = None, token: str | None = None,
                 probe: str | None = None, cache_only: bool = False) -> str:
    """The local folder holding the files of Hub repository `repo_id` that match `patterns`: the cached snapshot when
    there is one, else downloaded from `endpoint` (huggingface_hub's default when None) with the client's log lines
    silenced. `probe`: a file whose metadata is asked for first, without the client's retries, so that an
    unreachable endpoint fails in one attempt rather than after the download's backoff; `cache_only`: no download
(push --dry-run --offline). Raises HubFetchError."""
    from huggingface_hub import get_hf_file_metadata, hf_hub_url, snapshot_download
    from huggingface_hub.errors import HfHubHTTPError, LocalEntryNotFoundError

    try:
        return snapshot_download(repo_id, allow_patterns=list(patterns), local_files_only=True)
    except (LocalEntryNotFoundError, HfHubHTTPError, OSError, ValueError):
        if cache_only:
            raise HubFetchError("not in the local Hugging Face cache (offline)", offline=True) from None
    bounded_hub_client()
    with quiet_hub_logging():
        try:
            if probe is not None:
                get_hf_file_metadata(hf_hub_url(repo_id, probe, endpoint=endpoint), token=token)
            return snapshot_download(repo_id, allow_patterns=list(patterns), endpoint=endpoint, token=token)
        except LocalEntryNotFoundError:
            raise HubFetchError("not in the local Hugging Face cache and the Hub is unreachable (offline?)",
                                offline=True) from None
        except (HfHubHTTPError, OSError, ValueError, *transport_errors()) as exc:
            first = without_credentials(str(exc).splitlines()[0][:200] if str(exc) else type(exc).__name__)
            raise HubFetchError(first, offline=False) from None
