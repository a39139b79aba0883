"""A vLLM OpenAI-compatible server as bench reaches it over HTTP: one eaglekit started, or one already running.

bench asks a server only what vLLM's own routes say: the model it serves (/v1/models), its version (/version) and
its spec-decode counters (Prometheus text at /metrics), read before and after each measurement so that acceptance
covers exactly the requests between the two readings. An API key goes in an `Authorization: Bearer` header and
nowhere else: `public_url` is the URL a report may record (no credentials, query or fragment).

Every request goes through eaglekit.io.http_client (a deadline per request, a byte cap per route, credentials to
this server's origin only), and every number an answer holds is checked before use: counters are whole numbers
from 0 to 2^53, draft positions below MAX_DRAFT_POSITIONS, max_model_len a token count; anything else is one
EngineError naming the server and the route.
"""

from __future__ import annotations

import base64
import json
import math
import re
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import unquote, urlsplit, urlunsplit

from eaglekit.errors import EngineError, quoted
from eaglekit.io import http_client

REQUEST_TIMEOUT_S = 30.0  # /v1/models, /version, /metrics, whole answers: a server that takes longer is not serving
MIB = 1024 * 1024
ANSWER_BYTES = {"/v1/models": 4 * MIB, "/version": 64 * 1024, "/metrics": 32 * MIB}
"""The most each route's answer may hold: vLLM's run to a few KB (/v1/models, /version) and a few hundred KB
(/metrics: histograms per engine); far past that the server is not vLLM's, or not well."""
COMPLETION_BYTES = 64 * MIB  # a warm-up's completion: its text, at most max_tokens tokens
DRAFTS = "vllm:spec_decode_num_drafts"
DRAFT_TOKENS = "vllm:spec_decode_num_draft_tokens"
ACCEPTED = "vllm:spec_decode_num_accepted_tokens"
PER_POSITION = "vllm:spec_decode_num_accepted_tokens_per_pos"
"""vLLM's spec-decode counters (vllm/v1/spec_decode/metrics.py, SpecDecodingProm); prometheus_client exposes each
as `<name>_total`, one sample per engine (data parallelism) and, for the last, per draft position."""
_SAMPLE = re.compile(r"^(?P<name>[A-Za-z_:][A-Za-z0-9_:]*)(?:\{(?P<labels>[^}]*)\})?\s+(?P<value>\S+)")
_POSITION = re.compile(r'(?:^|,)\s*position="(\d+)"')
MAX_COUNT = 2**53  # past this a float counter is no longer an exact whole number
MAX_MODEL_LEN = 2**31 - 1  # max_model_len /v1/models may list: a context past 2^31 tokens is no model's
MAX_NAME_CHARS = 1000  # a served model's id or root (a Hub id or a path)
_VERSION = re.compile(r"[0-9A-Za-z.+_-]{1,64}")
MAX_DRAFT_POSITIONS = 128  # vLLM's EAGLE configs propose 1 to 16 tokens a round; a position past this is no drafter's


def public_url(url: str) -> str:
    """`url` as a report records it: scheme, host, port and path; no credentials, query or fragment."""
    parts = urlsplit(url)
    host = parts.hostname or ""
    if ":" in host:
        host = f"[{host}]"
    netloc = f"{host}:{parts.port}" if parts.port else host
    return urlunsplit((parts.scheme, netloc, parts.path.rstrip("/"), "", ""))


@dataclass(frozen=True)
class SpecCounters:
    """vLLM's spec-decode counters at one moment, summed over engines; a difference of two readings is what the
    requests between them drafted and accepted (and whatever other traffic the server had)."""

    drafts: int = 0
    draft_tokens: int = 0
    accepted: int = 0
    accepted_per_position: tuple[int, ...] = ()

    def __sub__(self, earlier: "SpecCounters") -> "SpecCounters":
        before = list(earlier.accepted_per_position) + [0] * len(self.accepted_per_position)
        return SpecCounters(self.drafts - earlier.drafts, self.draft_tokens - earlier.draft_tokens,
                            self.accepted - earlier.accepted,
                            tuple(a - b for a, b in zip(self.accepted_per_position, before)))

    @property
    def acceptance_length(self) -> float | None:
        """τ = 1 + accepted / drafts (None without a draft)."""
        return 1.0 + self.accepted / self.drafts if self.drafts else None

    @property
    def per_position(self) -> tuple[float, ...]:
        """The share of drafts whose token at each position was accepted."""
        return tuple(a / self.drafts for a in self.accepted_per_position) if self.drafts else ()


class MetricsError(ValueError):
    """A spec-decode sample no vLLM writes (a count that is not a whole number, a draft position past any k)."""


def _count(name: str, text: str) -> float:
    """A counter's value: a whole number from 0 to MAX_COUNT (Prometheus writes counters as floats)."""
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not (math.isfinite(value) and 0 <= value <= MAX_COUNT and value == int(value)):
        raise MetricsError(f"{name}_total has the value {quoted(text)}: a counter is a whole number from 0 to 2^53")
    return value


def _position(labels: str) -> int | None:
    """A per-position sample's draft position (its `position` label), at most MAX_DRAFT_POSITIONS - 1."""
    found = _POSITION.search(labels)
    if found is None:
        return None
    digits = found[1]
    if len(digits) > 6 or int(digits) >= MAX_DRAFT_POSITIONS:
        raise MetricsError(f"{PER_POSITION}_total has the draft position {quoted(digits)}: no drafter proposes "
                           f"more than {MAX_DRAFT_POSITIONS} tokens a round")
    return int(digits)


def spec_counters(text: str) -> SpecCounters | None:
    """The spec-decode counters in a Prometheus text exposition (/metrics), summed over engines; None when it has
    none (a server without a speculative config exposes none). A sample no vLLM writes is a MetricsError."""
    totals = {DRAFTS: 0.0, DRAFT_TOKENS: 0.0, ACCEPTED: 0.0}
    positions: dict[int, float] = {}
    found = False
    for line in text.splitlines():
        match = _SAMPLE.match(line.strip())
        if not match or not match["name"].endswith("_total"):
            continue
        name = match["name"][: -len("_total")]
        if name not in totals and name != PER_POSITION:
            continue
        value = _count(name, match["value"])
        found = True
        if name == PER_POSITION:
            index = _position(match["labels"] or "")
            if index is not None:
                positions[index] = positions.get(index, 0.0) + value
        else:
            totals[name] += value
    if not found:
        return None
    per_position = tuple(round(positions.get(i, 0.0)) for i in range(max(positions) + 1)) if positions else ()
    return SpecCounters(round(totals[DRAFTS]), round(totals[DRAFT_TOKENS]), round(totals[ACCEPTED]), per_position)


COUNTERS_ABSENT = "absent from /metrics (vLLM exports none with --disable-log-stats)"
COUNTERS_RESET = "lower after the measurement than before it (the server restarted?)"
COUNTERS_CONTRADICT = "contradicting each other (more accepted than drafted)"


def counted_between(before: SpecCounters | None, after: SpecCounters | None) -> tuple[SpecCounters, str | None]:
    """What the requests between two readings drafted and accepted, and why that is unknown (one of the
    COUNTERS_* reasons; the counts are then empty, so τ is unknown rather than wrong)."""
    if before is None or after is None:
        return SpecCounters(), COUNTERS_ABSENT
    delta = after - before
    if len(after.accepted_per_position) != len(before.accepted_per_position) or min(
            delta.drafts, delta.draft_tokens, delta.accepted, *delta.accepted_per_position) < 0:
        return SpecCounters(), COUNTERS_RESET
    if delta.accepted > delta.draft_tokens or any(a > delta.drafts for a in delta.accepted_per_position):
        return SpecCounters(), COUNTERS_CONTRADICT
    return delta, None


@dataclass(frozen=True)
class ServedModel:
    """What /v1/models says the server serves: the id requests name, its root (the path or Hub id it loaded)
    and its context."""

    id: str
    root: str | None
    max_model_len: int | None


@dataclass(frozen=True)
class Endpoint:
    """A server reached at `url`, with the API key its routes may need (never shown: see `public_url`)."""

    url: str
    what: str  # "speculative server", "baseline server", "target + draft"...
    api_key: str | None = field(default=None, repr=False)

    @property
    def public_url(self) -> str:
        return public_url(self.url)

    def _authorization(self) -> str | None:
        """The API key as a bearer token; else the URL's own `user:password@`, as basic authentication. Either goes
        to this server's origin only (eaglekit.io.http_client)."""
        if self.api_key:
            return f"Bearer {self.api_key}"
        parts = urlsplit(self.url)
        if parts.username is None:
            return None
        pair = f"{unquote(parts.username)}:{unquote(parts.password or '')}".encode()
        return f"Basic {base64.b64encode(pair).decode()}"

    def _route(self, route: str) -> str:
        parts = urlsplit(self.url)
        return urlunsplit((parts.scheme, parts.netloc.rpartition("@")[2], parts.path, "", "")) + route

    def _request(self, route: str, *, deadline_s: float, max_bytes: int, body: bytes | None = None,
                 doing: str | None = None) -> bytes:
        """`route`'s answer (a POST of `body` when given), or an EngineError naming this server and what failed;
        `doing`: the request's name in messages (the route's by default)."""
        doing = doing or route
        try:
            return http_client.request(self._route(route), deadline_s=deadline_s, max_bytes=max_bytes,
                                       authorization=self._authorization(), method="POST" if body else "GET",
                                       body=body, content_type="application/json" if body else None)
        except http_client.StatusError as exc:
            if body is not None:
                raise EngineError(f"the {self.what} at {self.public_url} refused a {doing} with HTTP {exc.status}: "
                                  f"{exc.detail}") from None
            hint = " (pass --api-key or set OPENAI_API_KEY)" if exc.status in (401, 403) else ""
            raise EngineError(f"the {self.what} at {self.public_url} answered {doing} with HTTP {exc.status}{hint}") \
                from None
        except (http_client.DeadlineExceeded, http_client.AnswerTooLarge, http_client.RedirectRefused) as exc:
            raise EngineError(f"the {self.what} at {self.public_url} gave no usable answer to {doing}: {exc}") \
                from None
        except http_client.HttpFailure as exc:
            raise EngineError(f"cannot reach the {self.what} at {self.public_url} ({doing}: {exc})") from None

    def _get(self, route: str) -> bytes:
        return self._request(route, deadline_s=REQUEST_TIMEOUT_S, max_bytes=ANSWER_BYTES[route])

    def served_model(self) -> ServedModel:
        """The first model /v1/models lists (the one vLLM's client benchmarks by default), its fields checked."""
        try:
            first = json.loads(self._get("/v1/models"))["data"][0]
            model_id, root, model_len = first["id"], first.get("root"), first.get("max_model_len")
        except (ValueError, KeyError, IndexError, TypeError, AttributeError, RecursionError):
            raise EngineError(f"the {self.what} at {self.public_url} lists no model at /v1/models: is it vLLM's "
                              "OpenAI-compatible server?") from None
        names = (model_id, *([] if root is None else [root]))
        if not all(isinstance(n, str) and 0 < len(n) <= MAX_NAME_CHARS for n in names):
            raise EngineError(f"the {self.what} at {self.public_url} lists a model at /v1/models whose id or root is "
                              f"not a name of 1 to {MAX_NAME_CHARS} characters")
        if model_len is not None and not (type(model_len) is int and 0 < model_len <= MAX_MODEL_LEN):
            raise EngineError(f"the {self.what} at {self.public_url} lists max_model_len {quoted(model_len)} at "
                              f"/v1/models: expected a whole number of tokens from 1 to {MAX_MODEL_LEN:,}")
        return ServedModel(model_id, root, model_len)

    def version(self) -> str | None:
        """vLLM's version (/version); None when the server does not say, or says something no version looks like."""
        try:
            found = json.loads(self._get("/version")).get("version")
        except (EngineError, ValueError, AttributeError, RecursionError):
            return None
        return found if isinstance(found, str) and _VERSION.fullmatch(found) else None

    def counters(self) -> SpecCounters | None:
        """The server's spec-decode counters now (None: it exposes none, it does not speculate)."""
        try:
            return spec_counters(self._get("/metrics").decode("utf-8", errors="replace"))
        except MetricsError as exc:
            raise EngineError(f"the {self.what} at {self.public_url} answered /metrics with a sample no vLLM writes: "
                              f"{exc}") from None

    def warm_up(self, model: str, prompt: str | Sequence[int], requests: int, concurrency: int,
                body: dict[str, Any], *, timeout_s: float) -> None:
        """`requests` completions of `prompt`, `concurrency` at a time, outside any measurement (what vLLM's client
        does before its own: its first request, repeated); a failed one is an EngineError."""
        payload = json.dumps({"model": model, "prompt": prompt, **body}).encode()

        def one(_: int) -> None:
            self._request("/v1/completions", deadline_s=timeout_s, max_bytes=COMPLETION_BYTES, body=payload,
                          doing="warm-up request")

        if requests:
            with ThreadPoolExecutor(max_workers=max(1, min(concurrency, requests))) as pool:
                list(pool.map(one, range(requests)))
