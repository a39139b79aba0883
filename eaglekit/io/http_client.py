"""The one HTTP client eaglekit uses for the servers it measures (vLLM's routes: /v1/models, /version, /metrics,
/health, a warm-up's /v1/completions): every answer bounded in time, in bytes, and in where credentials go.

- Time: each request has a deadline for the whole exchange (connect, headers, body), not a timeout per read: a
  server that trickles a byte every few seconds is cut off at the deadline (a watchdog shuts the socket down).
- Bytes: each route has a cap; an answer that declares more is refused before its body is read, and one that sends
  more (chunked, or past its declared length) is refused at the first chunk beyond the cap.
- Credentials: the Authorization header goes to the origin (scheme, host, port) of the URL given and nowhere else.
  A redirect within that origin is followed with it (so is http -> https on the same host at the default ports,
  the one exception `requests` makes too: requests.Session.should_strip_auth); a redirect anywhere else is refused
  rather than followed without credentials, so that what is measured is the server the user named.

Messages quote URLs by origin alone (no user:password@, path or query): they are safe to print.
"""

from __future__ import annotations

import base64
import http.client
import socket
import threading
import time
import urllib.request
from dataclasses import dataclass
from urllib.parse import unquote, urljoin, urlsplit

REDIRECTS = (301, 302, 303, 307, 308)
MAX_REDIRECTS = 5
CHUNK_BYTES = 64 * 1024
DEFAULT_PORTS = {"http": 80, "https": 443}
SHOWN_ORIGIN_CHARS = 120  # a server-chosen redirect target is shown cut to this


class HttpFailure(Exception):
    """No usable answer; the message is one clause naming no credentials (the caller names the server)."""


class DeadlineExceeded(HttpFailure):
    pass


class AnswerTooLarge(HttpFailure):
    pass


class RedirectRefused(HttpFailure):
    pass


class StatusError(HttpFailure):
    """An HTTP error status; `detail`: the start of its body, for the caller to quote."""

    def __init__(self, status: int, detail: str):
        super().__init__(f"HTTP {status}")
        self.status = status
        self.detail = detail


@dataclass(frozen=True)
class Origin:
    scheme: str
    host: str
    port: int

    @classmethod
    def of(cls, url: str) -> "Origin":
        try:
            parts = urlsplit(url)
            scheme = parts.scheme.lower()
            return cls(scheme, (parts.hostname or "").lower(), parts.port or DEFAULT_PORTS.get(scheme, 0))
        except ValueError:
            raise RedirectRefused("it redirects to a malformed URL") from None

    def __str__(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        text = f"{self.scheme}://{host}" + ("" if DEFAULT_PORTS.get(self.scheme) == self.port else f":{self.port}")
        return text if len(text) <= SHOWN_ORIGIN_CHARS else text[:SHOWN_ORIGIN_CHARS] + "…"

    def may_receive_credentials_of(self, first: "Origin") -> bool:
        """Whether a redirect from `first` to this origin may carry `first`'s credentials: the same origin, or the
        upgrade of http to https on the same host at the default ports."""
        upgrade = (first.scheme, first.port, self.scheme, self.port) == ("http", 80, "https", 443)
        return self.host == first.host and (self == first or upgrade)


def request(url: str, *, deadline_s: float, max_bytes: int, authorization: str | None = None,
            method: str = "GET", body: bytes | None = None, content_type: str | None = None) -> bytes:
    """The body of `method url`'s answer, following redirects within the URL's origin. Raises DeadlineExceeded
    past `deadline_s` for the whole request, AnswerTooLarge beyond `max_bytes`, RedirectRefused for a redirect to
    another origin (or too many), StatusError for an HTTP error status, and HttpFailure when the server cannot be
    reached or breaks the protocol. `url` holds no credentials: `authorization` is the header's value."""
    deadline = time.monotonic() + deadline_s
    first = Origin.of(url)
    headers = {"User-Agent": "eaglekit", "Accept-Encoding": "identity",
               **({"Authorization": authorization} if authorization else {}),
               **({"Content-Type": content_type} if content_type else {})}
    for _ in range(MAX_REDIRECTS + 1):
        status, location, data = _exchange(method, url, headers, body, deadline, deadline_s, max_bytes)
        if status not in REDIRECTS:
            if status >= 400:
                raise StatusError(status, data[:200].decode("utf-8", errors="replace"))
            return data
        if location is None:
            raise HttpFailure(f"HTTP {status} without a Location")
        target = urljoin(url, location)
        there = Origin.of(target)
        if there.scheme not in DEFAULT_PORTS or not there.may_receive_credentials_of(first):
            raise RedirectRefused(f"it redirects to another origin ({there}), where eaglekit neither follows nor sends "
                                  "credentials: give the URL of the server itself")
        if method != "GET" and status not in (307, 308):
            raise RedirectRefused(f"it answers a {method} with HTTP {status} (a redirect that drops the request body)")
        url = target
    raise RedirectRefused(f"it redirects more than {MAX_REDIRECTS} times")


class _Watchdog:
    """Shuts `connection`'s socket down at the deadline, waking whatever read waits on it."""

    def __init__(self, connection: http.client.HTTPConnection, seconds: float):
        self.connection, self.fired = connection, False
        self.timer = threading.Timer(seconds, self._cut)
        self.timer.daemon = True
        self.timer.start()

    def _cut(self) -> None:
        self.fired = True
        sock = self.connection.sock
        if sock is not None:
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass

    def stop(self) -> None:
        self.timer.cancel()


def _exchange(method: str, url: str, headers: dict[str, str], body: bytes | None, deadline: float, deadline_s: float,
              max_bytes: int) -> tuple[int, str | None, bytes]:
    """One request and its answer: (status, Location, body); a redirect's body is not read."""
    remaining = deadline - time.monotonic()
    if remaining <= 0:
        raise DeadlineExceeded(f"no answer within {deadline_s:g} s")
    # the socket timeout bounds connect and each read by the time left; the watchdog bounds them all together
    connection, target, proxy_headers = _connection(url, remaining)
    watchdog = _Watchdog(connection, remaining)
    try:
        connection.request(method, target, body=body, headers={**headers, **proxy_headers})
        response = connection.getresponse()
        if response.status in REDIRECTS:
            return response.status, response.getheader("Location"), b""
        data = _bounded_body(response, max_bytes)
        if watchdog.fired:  # the cut socket ends the body early rather than failing the read
            raise DeadlineExceeded(f"no complete answer within {deadline_s:g} s")
        return response.status, None, data
    except (OSError, http.client.HTTPException) as exc:
        if watchdog.fired or time.monotonic() >= deadline:
            raise DeadlineExceeded(f"no complete answer within {deadline_s:g} s") from None
        raise HttpFailure(_reason(exc)) from None
    finally:
        watchdog.stop()
        connection.close()


def _connection(url: str, timeout: float) -> tuple[http.client.HTTPConnection, str, dict[str, str]]:
    """The connection that reaches `url`, the request target to send on it, and the headers the proxy needs: through
    the environment's proxy (http_proxy, https_proxy, no_proxy) as urllib and vLLM's benchmark client reach it,
    an https URL through a CONNECT tunnel."""
    parts = urlsplit(url)
    host, port = parts.hostname or "", parts.port
    path = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
    https = parts.scheme == "https"
    proxy = None if urllib.request.proxy_bypass(host) else urllib.request.getproxies().get(parts.scheme)
    if not proxy:
        if https:
            return http.client.HTTPSConnection(host, port, timeout=timeout), path, {}
        return http.client.HTTPConnection(host, port, timeout=timeout), path, {}
    via = urlsplit(proxy if "://" in proxy else f"http://{proxy}")
    credentials = {}
    if via.username is not None:
        pair = f"{unquote(via.username)}:{unquote(via.password or '')}".encode()
        credentials = {"Proxy-Authorization": f"Basic {base64.b64encode(pair).decode()}"}
    if https:
        tunnel = http.client.HTTPSConnection(via.hostname or "", via.port or 80, timeout=timeout)
        tunnel.set_tunnel(host, port, headers=credentials)
        return tunnel, path, {}
    connection = http.client.HTTPConnection(via.hostname or "", via.port or 80, timeout=timeout)
    return connection, f"http://{parts.netloc.rpartition('@')[2]}{path}", credentials


def _bounded_body(response: http.client.HTTPResponse, max_bytes: int) -> bytes:
    """The answer's body, read in chunks and refused as soon as it is known to pass `max_bytes`."""
    text = (response.getheader("Content-Length") or "").strip()
    declared = int(text) if text.isdigit() and len(text) <= 18 else None  # longer: past any cap, not worth parsing
    if text.isdigit() and (declared is None or declared > max_bytes):
        size = f"{declared:,}" if declared is not None else f"a {len(text)}-digit number of"
        raise AnswerTooLarge(f"an answer of {size} bytes declared, more than the {max_bytes:,} allowed")
    chunks: list[bytes] = []
    total = 0
    while True:
        chunk = response.read(CHUNK_BYTES)
        if not chunk:
            if declared is not None and total < declared:
                raise http.client.IncompleteRead(b"", declared - total)
            return b"".join(chunks)
        total += len(chunk)
        if total > max_bytes:
            raise AnswerTooLarge(f"an answer of more than the {max_bytes:,} bytes allowed")
        chunks.append(chunk)


def _reason(exc: BaseException) -> str:
    """Why a request failed, in a few words (socket errors carry their reason; protocol errors their class)."""
    if isinstance(exc, socket.gaierror):
        return "unknown host"
    if isinstance(exc, ConnectionRefusedError):
        return "connection refused"
    if isinstance(exc, http.client.IncompleteRead):
        return "the answer ended before its declared length"
    if isinstance(exc, OSError) and exc.strerror:
        return exc.strerror.lower()
    return f"{type(exc).__name__}: the answer breaks the HTTP protocol"
