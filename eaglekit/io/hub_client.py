"""Every Hub request eaglekit makes has a timeout: a server that accepts and never answers cannot hang a run.

huggingface_hub builds its shared HTTP client with `timeout=None`; `bounded_hub_client()` installs a client
factory whose clients bound each exchange as a whole, not each read: a request gets EAGLEKIT_HUB_TIMEOUT seconds
(default 60) for connect, headers and the start of its body, and one more second for every MIN_RATE_BYTES_S bytes
it receives, so a large download goes on at any reasonable speed while a server that trickles a byte every few
seconds (its headers or its body) is cut off. An answer that is not a file download (the Hub's /api routes, a
file's metadata) is refused past MAX_API_ANSWER_BYTES, declared or sent. The client's own retries and backoff
stay as they are: each attempt is bounded.

An endpoint may carry credentials (`https://user:password@host`, from --endpoint or HF_ENDPOINT): every URL
eaglekit prints or returns goes through `without_credentials` first, and an endpoint that is not a plain http(s)
URL is refused without being quoted (both in eaglekit.io.urls).

`hub_snapshot` is the one way eaglekit reads files of a Hub repository it does not publish (a target, the config a
push compares a report with): the local Hugging Face cache first, then a download through the bounded client.
"""

from __future__ import annotations

import logging
import os
import re
import threading
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any

from eaglekit.io.urls import without_credentials

DEFAULT_TIMEOUT_S = 60.0
MIN_RATE_BYTES_S = 16 * 1024  # a download slower than this on average is taken for a stalled server
MAX_API_ANSWER_BYTES = 64 * 1024 * 1024  # a repository listing of tens of thousands of files fits
DOWNLOAD_PATH = re.compile(r"/resolve/")


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


class _Allowance:
    """The time one exchange may still take: `timeout_s` from its start plus a second per MIN_RATE_BYTES_S bytes
    received; `cap`: the most bytes its answer may have (None: a file download)."""

    def __init__(self, timeout_s: float, cap: int | None):
        self.started, self.timeout_s, self.cap, self.received = time.monotonic(), timeout_s, cap, 0

    def seconds_left(self) -> float:
        return self.started + self.timeout_s + self.received / MIN_RATE_BYTES_S - time.monotonic()

    def received_bytes(self, count: int) -> None:
        import httpx2

        self.received += count
        if self.cap is not None and self.received > self.cap:
            raise httpx2.ReadError(f"answer larger than {self.cap // (1024 * 1024)} MiB")


_current = threading.local()  # the allowance of the exchange this thread is in, read by its socket reads


def _bounded(timeout: float | None, what: type[Exception]) -> float:
    """A socket operation's timeout: the client's own, cut to what the current exchange has left."""
    allowance: _Allowance | None = getattr(_current, "allowance", None)
    if allowance is None:
        return timeout if timeout is not None else hub_timeout()
    left = allowance.seconds_left()
    if left <= 0:
        _out_of_time(what)
    return left if timeout is None else min(timeout, left)


def _out_of_time(what: type[Exception]) -> None:
    allowance: _Allowance = _current.allowance
    raise what(f"no complete answer within the time allowed ({allowance.timeout_s:g} s and "
               f"{MIN_RATE_BYTES_S // 1024} KiB/s)")


@contextmanager
def _said_as_out_of_time(what: type[Exception]) -> Iterator[None]:
    """A socket timeout that ran into the exchange's allowance is reported as the allowance running out."""
    try:
        yield
    except what:
        allowance: _Allowance | None = getattr(_current, "allowance", None)
        if allowance is not None and allowance.seconds_left() <= 0:
            _out_of_time(what)
        raise


def _deadline_backend(inner: Any) -> Any:
    """httpcore2's network backend with every read, write and TLS handshake bounded by `_bounded`."""
    import httpcore2

    class Stream(httpcore2.NetworkStream):
        def __init__(self, stream: Any):
            self.stream = stream

        def read(self, max_bytes: int, timeout: float | None = None) -> bytes:
            with _said_as_out_of_time(httpcore2.ReadTimeout):
                return self.stream.read(max_bytes, _bounded(timeout, httpcore2.ReadTimeout))

        def write(self, buffer: bytes, timeout: float | None = None) -> None:
            with _said_as_out_of_time(httpcore2.WriteTimeout):
                self.stream.write(buffer, _bounded(timeout, httpcore2.WriteTimeout))

        def close(self) -> None:
            self.stream.close()

        def start_tls(self, ssl_context: Any, server_hostname: str | None = None,
                      timeout: float | None = None) -> Any:
            return Stream(self.stream.start_tls(ssl_context, server_hostname,
                                                _bounded(timeout, httpcore2.ConnectTimeout)))

        def get_extra_info(self, info: str) -> Any:
            return self.stream.get_extra_info(info)

    class Backend(httpcore2.NetworkBackend):
        def connect_tcp(self, host: str, port: int, timeout: float | None = None, local_address: str | None = None,
                        socket_options: Any = None) -> Any:
            return Stream(inner.connect_tcp(host, port, _bounded(timeout, httpcore2.ConnectTimeout), local_address,
                                            socket_options))

        def connect_unix_socket(self, path: str, timeout: float | None = None, socket_options: Any = None) -> Any:
            return Stream(inner.connect_unix_socket(path, _bounded(timeout, httpcore2.ConnectTimeout),
                                                    socket_options))

        def sleep(self, seconds: float) -> None:
            inner.sleep(seconds)

    return Backend()


def _bounded_transport(seconds: float) -> Any:
    """An httpx2 transport whose exchanges each run under an `_Allowance`, for headers and body alike."""
    import httpx2

    class Body(httpx2.SyncByteStream):
        def __init__(self, stream: Any, allowance: _Allowance):
            self.stream, self.allowance = stream, allowance

        def __iter__(self) -> Iterator[bytes]:
            chunks = iter(self.stream)
            while True:
                _current.allowance = self.allowance  # the consumer may have run another exchange meanwhile
                chunk = next(chunks, None)
                if chunk is None:
                    return
                self.allowance.received_bytes(len(chunk))
                yield chunk

        def close(self) -> None:
            _current.allowance = None
            self.stream.close()

    class Transport(httpx2.HTTPTransport):
        def __init__(self) -> None:
            super().__init__()
            pool = getattr(self, "_pool", None)
            if pool is not None and hasattr(pool, "_network_backend"):
                pool._network_backend = _deadline_backend(pool._network_backend)

        def handle_request(self, request: Any) -> Any:
            cap = None if DOWNLOAD_PATH.search(request.url.path) else MAX_API_ANSWER_BYTES
            allowance = _Allowance(seconds, cap)
            _current.allowance = allowance
            try:
                response = super().handle_request(request)
                declared = response.headers.get("content-length", "")
                if cap is not None and declared.isdigit() and int(declared) > cap:
                    response.close()
                    raise httpx2.ReadError(f"answer declares more than {cap // (1024 * 1024)} MiB")
            except BaseException:
                _current.allowance = None
                raise
            response.stream = Body(response.stream, allowance)
            return response

    return Transport()


def bounded_hub_client() -> None:
    """Make huggingface_hub's shared client (re)built with bounded exchanges; call before the first Hub request."""
    from huggingface_hub import set_client_factory
    from huggingface_hub.utils._http import default_client_factory

    seconds = hub_timeout()

    def factory():
        reference = default_client_factory()  # huggingface_hub's own hooks and redirect policy, kept
        client = type(reference)(event_hooks=reference.event_hooks, follow_redirects=reference.follow_redirects,
                                 timeout=seconds, transport=_bounded_transport(seconds))
        reference.close()
        return client

    set_client_factory(factory)


def transport_failure(exc: BaseException) -> str:
    """A transport error in words that are safe to print: its class, and its message when the bound above wrote it
    (a client's own messages may quote URLs with their credentials)."""
    message = str(exc)
    own = message.startswith(("no complete answer within", "answer declares more than", "answer larger than"))
    return f"{type(exc).__name__}: {message}" if own else type(exc).__name__


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
