"""A vLLM OpenAI-compatible server as bench reaches it over HTTP: one eaglekit started, or one already running.

bench asks a server only what vLLM's own routes say: the model it serves (/v1/models), its version (/version) and
its spec-decode counters (Prometheus text at /metrics), read before and after each measurement so that acceptance
covers exactly the requests between the two readings. An API key goes in an `Authorization: Bearer` header and
nowhere else: `public_url` is the URL a report may record (no credentials, query or fragment).
"""

from __future__ import annotations

import base64
import json
import re
import urllib.error
import urllib.request
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import unquote, urlsplit, urlunsplit

from eaglekit.errors import EngineError

REQUEST_TIMEOUT_S = 30.0  # /v1/models, /version, /metrics: a server that takes longer is not serving
DRAFTS = "vllm:spec_decode_num_drafts"
DRAFT_TOKENS = "vllm:spec_decode_num_draft_tokens"
ACCEPTED = "vllm:spec_decode_num_accepted_tokens"
PER_POSITION = "vllm:spec_decode_num_accepted_tokens_per_pos"
"""vLLM's spec-decode counters (vllm/v1/spec_decode/metrics.py, SpecDecodingProm); prometheus_client exposes each
as `<name>_total`, one sample per engine (data parallelism) and, for the last, per draft position."""
_SAMPLE = re.compile(r"^(?P<name>[A-Za-z_:][A-Za-z0-9_:]*)(?:\{(?P<labels>[^}]*)\})?\s+(?P<value>\S+)")
_POSITION = re.compile(r'(?:^|,)\s*position="(\d+)"')


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


def spec_counters(text: str) -> SpecCounters | None:
    """The spec-decode counters in a Prometheus text exposition (/metrics), summed over engines; None when it has
    none (a server without a speculative config exposes none)."""
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
        try:
            value = float(match["value"])
        except ValueError:
            continue
        found = True
        if name == PER_POSITION:
            position = _POSITION.search(match["labels"] or "")
            if position:
                index = int(position[1])
                positions[index] = positions.get(index, 0.0) + value
        else:
            totals[name] += value
    if not found:
        return None
    per_position = tuple(round(positions.get(i, 0.0)) for i in range(max(positions) + 1)) if positions else ()
    return SpecCounters(round(totals[DRAFTS]), round(totals[DRAFT_TOKENS]), round(totals[ACCEPTED]), per_position)


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

    def _headers(self) -> dict[str, str]:
        """The API key as a bearer token; else the URL's own `user:password@`, as basic authentication (urllib
        would take it for part of the host)."""
        if self.api_key:
            return {"Authorization": f"Bearer {self.api_key}"}
        parts = urlsplit(self.url)
        if parts.username is None:
            return {}
        pair = f"{unquote(parts.username)}:{unquote(parts.password or '')}".encode()
        return {"Authorization": f"Basic {base64.b64encode(pair).decode()}"}

    def _route(self, route: str) -> str:
        parts = urlsplit(self.url)
        return urlunsplit((parts.scheme, parts.netloc.rpartition("@")[2], parts.path, "", "")) + route

    def _get(self, route: str) -> bytes:
        request = urllib.request.Request(self._route(route), headers=self._headers())
        try:
            with urllib.request.urlopen(request, timeout=REQUEST_TIMEOUT_S) as response:
                return response.read()
        except urllib.error.HTTPError as exc:
            hint = " (pass --api-key or set OPENAI_API_KEY)" if exc.code in (401, 403) else ""
            raise EngineError(f"the {self.what} at {self.public_url} answered {route} with HTTP {exc.code}{hint}") \
                from None
        except (urllib.error.URLError, OSError) as exc:
            reason = getattr(exc, "reason", exc)
            raise EngineError(f"cannot reach the {self.what} at {self.public_url} ({route}: {reason})") from None

    def served_model(self) -> ServedModel:
        """The first model /v1/models lists (the one vLLM's client benchmarks by default)."""
        try:
            models = json.loads(self._get("/v1/models"))["data"]
            first = models[0]
            served = ServedModel(str(first["id"]), first.get("root"), first.get("max_model_len"))
        except (ValueError, KeyError, IndexError, TypeError):
            raise EngineError(f"the {self.what} at {self.public_url} lists no model at /v1/models: is it vLLM's "
                              "OpenAI-compatible server?") from None
        return served

    def version(self) -> str | None:
        """vLLM's version (/version); None when the server does not say."""
        try:
            found = json.loads(self._get("/version")).get("version")
        except (EngineError, ValueError, AttributeError):
            return None
        return found if isinstance(found, str) else None

    def counters(self) -> SpecCounters | None:
        """The server's spec-decode counters now (None: it exposes none, it does not speculate)."""
        return spec_counters(self._get("/metrics").decode("utf-8", errors="replace"))

    def warm_up(self, model: str, prompt: str | Sequence[int], requests: int, concurrency: int,
                body: dict[str, Any], *, timeout_s: float) -> None:
        """`requests` completions of `prompt`, `concurrency` at a time, outside any measurement (what vLLM's client
        does before its own: its first request, repeated); a failed one is an EngineError."""
        payload = json.dumps({"model": model, "prompt": prompt, **body}).encode()

        def one(_: int) -> None:
            request = urllib.request.Request(self._route("/v1/completions"), data=payload, method="POST",
                                             headers={"Content-Type": "application/json", **self._headers()})
            try:
                with urllib.request.urlopen(request, timeout=timeout_s) as response:
                    response.read()
            except urllib.error.HTTPError as exc:
                detail = exc.read()[:200].decode("utf-8", errors="replace")
                raise EngineError(f"the {self.what} at {self.public_url} refused a warm-up request with HTTP "
                                  f"{exc.code}: {detail}") from None
            except (urllib.error.URLError, OSError) as exc:
                raise EngineError(f"cannot reach the {self.what} at {self.public_url} (warm-up: "
                                  f"{getattr(exc, 'reason', exc)})") from None

        if requests:
            with ThreadPoolExecutor(max_workers=max(1, min(concurrency, requests))) as pool:
                list(pool.map(one, range(requests)))
