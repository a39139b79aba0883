"""The store's `manifest.json`, typed: the one place it is read and written.

A manifest is what makes a folder a store (eaglekit.capture.store): it says what was captured (the identity blocks
a rerun must match), the planned sequences' digest, and per published shard its name, size, SHA-256, records and
tokens. Every field is checked on read (type, finiteness, range, and the shard list against the totals and the
plan), so whatever a manifest holds, a reader gets a `Manifest` or one CheckpointError line that names the file and
the field. The JSON a manifest is written as depends on its content alone (sorted keys, no timestamps).

Nothing here imports torch.
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass, field, replace
from typing import Any

from eaglekit.errors import CheckpointError, quoted

FORMAT = "eaglekit-hidden-states"
VERSION = 1
ID_CONVENTION = "vllm"  # layer ids as hidden_states indices (input-of-layer), as vLLM's eagle3 runners capture them
SHARD_PREFIX, SHARD_SUFFIX = "shard-", ".safetensors"
STORE_DTYPES = ("bfloat16", "float32", "fp8")
MAX_COUNT = 1 << 48  # records, tokens, bytes: 256 TiB, far beyond any store
MAX_LAYERS = 1 << 12
MAX_HIDDEN = 1 << 18
MAX_VOCAB = 1 << 24
MAX_TEXT = 4096  # characters of a string field
INDEX_BYTES = 8  # an int64 token id or record offset: every shard holds `tokens` + `records` + 1 of them
_DIGEST = re.compile(r"(sha256:)?[0-9a-f]{64}\Z")
IDENTITY_KEYS = ("target", "layer_ids", "engine", "inputs", "store")
"""The manifest blocks a rerun must match to resume (the rest says how far the capture got)."""
ENGINE_ENVIRONMENT = "environment"
"""The engine block's record of the variables eaglekit set in the engine's environment (a CPU thread binding)."""
DESCRIPTIVE = ("inputs.source", "inputs.data", f"engine.{ENGINE_ENVIRONMENT}")
"""Identity fields that describe without deciding: the content address `inputs.sha256` decides (and `inputs.data`
is compared before any work, in the user's terms: eaglekit.capture.store.check_before_capture); how the engine's
threads were placed on a machine does not decide what it computes."""


def shard_name(index: int) -> str:
    return f"{SHARD_PREFIX}{index:06d}{SHARD_SUFFIX}"


def _kind(value: Any) -> str:
    return "missing" if value is _MISSING else quoted(value)


_MISSING = object()


class _Fields:
    """One JSON object of a manifest read field by field; a refusal names the field by its dotted path."""

    def __init__(self, doc: Any, name: str, where: str):
        if not isinstance(doc, dict):
            raise CheckpointError(f"manifest's {name} is {_kind(doc)}: expected an object", where)
        self.doc, self.name, self.where = doc, name, where

    def refuse(self, key: str, expected: str) -> CheckpointError:
        value = _kind(self.doc.get(key, _MISSING))
        return CheckpointError(f"manifest's {self.dotted(key)} is {value}: expected {expected}", self.where)

    def dotted(self, key: str) -> str:
        return f"{self.name}.{key}" if self.name else key

    def count(self, key: str, low: int = 0, high: int = MAX_COUNT) -> int:
        value = self.doc.get(key, _MISSING)
        if type(value) is not int or not low <= value <= high:
            raise self.refuse(key, f"an integer in [{low}, {high}]")
        return value

    def text(self, key: str, *, optional: bool = False) -> Any:
        value = self.doc.get(key, _MISSING)
        if value is None and optional:
            return None
        if not isinstance(value, str) or not value or len(value) > MAX_TEXT:
            raise self.refuse(key, f"a string of 1 to {MAX_TEXT} characters" + (" or null" if optional else ""))
        return value

    def digest(self, key: str, *, optional: bool = False) -> Any:
        value = self.doc.get(key, _MISSING)
        if value is None and optional:
            return None
        if not isinstance(value, str) or not _DIGEST.match(value):
            raise self.refuse(key, "a SHA-256 digest (64 hex digits)" + (" or null" if optional else ""))
        return value

    def flag(self, key: str) -> bool:
        value = self.doc.get(key, _MISSING)
        if not isinstance(value, bool):
            raise self.refuse(key, "true or false")
        return value

    def block(self, key: str) -> _Fields:
        return _Fields(self.doc.get(key, _MISSING), self.dotted(key), self.where)

    def json_value(self, key: str) -> Any:
        """A free-form value (engine arguments, fields this eaglekit does not know): JSON with finite numbers."""
        value = self.doc.get(key, _MISSING)
        bad = _non_finite(value)
        if bad is not None:
            raise self.refuse(key, f"JSON with finite numbers (it holds {bad})")
        return value


def _non_finite(value: Any) -> str | None:
    """The first non-finite number or over-long string inside a JSON value, in words; None when there is none."""
    stack = [value]
    while stack:
        item = stack.pop()
        if isinstance(item, float) and not math.isfinite(item):
            return repr(item)
        if isinstance(item, str) and len(item) > MAX_TEXT:
            return f"a string of {len(item)} characters"
        if isinstance(item, dict):
            stack += item.values()
        elif isinstance(item, list):
            stack += item
    return None


@dataclass(frozen=True)
class Shard:
    file: str
    bytes: int
    sha256: str
    first_record: int
    end_record: int  # exclusive
    tokens: int

    @property
    def records(self) -> int:
        return self.end_record - self.first_record

    def to_dict(self) -> dict[str, Any]:
        return {"file": self.file, "bytes": self.bytes, "sha256": self.sha256,
                "records": [self.first_record, self.end_record], "tokens": self.tokens}

    @classmethod
    def read(cls, fields: _Fields, index: int, first_record: int) -> Shard:
        """The shard at `index` of the list, which must start at `first_record` (the previous one's end)."""
        if fields.doc.get("file") != shard_name(index):
            raise fields.refuse("file", repr(shard_name(index)))
        bounds = fields.doc.get("records")
        if (not isinstance(bounds, list) or len(bounds) != 2 or any(type(b) is not int for b in bounds)
                or bounds[0] != first_record or not first_record < bounds[1] <= MAX_COUNT):
            raise fields.refuse("records", f"[{first_record}, end] with end > {first_record} (the shards follow "
                                           "each other)")
        shard = cls(shard_name(index), fields.count("bytes", 1), str(fields.digest("sha256")), bounds[0], bounds[1],
                    fields.count("tokens"))
        if (shard.tokens + shard.records + 1) * INDEX_BYTES > shard.bytes:
            raise fields.refuse("tokens", f"at most what {shard.bytes} bytes can hold ({shard.tokens} tokens take "
                                          f"{shard.tokens * INDEX_BYTES} bytes of token ids alone)")
        return shard


@dataclass(frozen=True)
class DataFile:
    """The data a capture planned its sequences from: the file's name (never its folder: a published store names
    no local path) or the bundled data's, and the SHA-256 of its bytes."""

    file: str
    sha256: str

    def to_dict(self) -> dict[str, Any]:
        return {"file": self.file, "sha256": self.sha256}


@dataclass(frozen=True)
class TargetIdentity:
    config_sha256: str
    weights_fingerprint: str
    head_sha256: str
    num_hidden_layers: int
    hidden_size: int
    vocab_size: int
    model_type: str | None
    tokenizer_sha256: str | None
    chat_template_sha256: str | None

    def to_dict(self) -> dict[str, Any]:
        return {"config_sha256": self.config_sha256, "weights_fingerprint": self.weights_fingerprint,
                "head_sha256": self.head_sha256, "num_hidden_layers": self.num_hidden_layers,
                "hidden_size": self.hidden_size, "vocab_size": self.vocab_size, "model_type": self.model_type,
                "tokenizer_sha256": self.tokenizer_sha256, "chat_template_sha256": self.chat_template_sha256}

    @classmethod
    def read(cls, f: _Fields) -> TargetIdentity:
        return cls(f.digest("config_sha256"), f.digest("weights_fingerprint"), f.digest("head_sha256"),
                   f.count("num_hidden_layers", 1, MAX_LAYERS), f.count("hidden_size", 1, MAX_HIDDEN),
                   f.count("vocab_size", 1, MAX_VOCAB), f.text("model_type", optional=True),
                   f.digest("tokenizer_sha256", optional=True), f.digest("chat_template_sha256", optional=True))


@dataclass(frozen=True)
class LayerIds:
    """The captured layer ids, vLLM convention: the aux ids (ascending) and id L, the last layer's output."""

    aux: tuple[int, ...]
    last: int

    def to_dict(self) -> dict[str, Any]:
        return {"convention": ID_CONVENTION, "aux": list(self.aux), "last": self.last}

    @classmethod
    def read(cls, f: _Fields, layers: int) -> LayerIds:
        if f.doc.get("convention") != ID_CONVENTION:
            raise f.refuse("convention", repr(ID_CONVENTION))
        last = f.count("last", layers, layers)
        aux = f.doc.get("aux")
        if (not isinstance(aux, list) or not aux or any(type(i) is not int or not 0 <= i <= last for i in aux)
                or aux != sorted(set(aux))):
            raise f.refuse("aux", f"a non-empty ascending list of distinct layer ids in [0, {last}]")
        return cls(tuple(aux), last)


@dataclass(frozen=True)
class EngineIdentity:
    """What computed the states: engine, version, dtype, numerics and the arguments it was started with; `extra`
    keeps fields a backend adds that this module does not type (free JSON, part of the identity all the same)."""

    name: str
    version: str | None
    dtype: str | None
    quantization: str | None
    tensor_parallel_size: int
    engine_args: dict[str, Any]
    extra: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return {**self.extra, "name": self.name, "version": self.version, "dtype": self.dtype,
                "quantization": self.quantization, "tensor_parallel_size": self.tensor_parallel_size,
                "engine_args": dict(self.engine_args)}

    @classmethod
    def read(cls, f: _Fields) -> EngineIdentity:
        args = f.json_value("engine_args")
        if not isinstance(args, dict):
            raise f.refuse("engine_args", "an object")
        known = {"name", "version", "dtype", "quantization", "tensor_parallel_size", "engine_args"}
        return cls(f.text("name"), f.text("version", optional=True), f.text("dtype", optional=True),
                   f.text("quantization", optional=True), f.count("tensor_parallel_size", 1, 1 << 16), args,
                   {key: f.json_value(key) for key in f.doc if key not in known})


@dataclass(frozen=True)
class Inputs:
    """What the records were planned from: `sha256` (the content address of the planned data) decides a resume;
    `source` says it in words; `extra` keeps fields a source adds that this module does not type (free JSON)."""

    sha256: str
    source: str
    data: DataFile | None = None  # None: imported records, or a store written before the data was recorded
    calibration_fit_records: int | None = None  # a `--calibration` store: how many records upgrade fits on
    extra: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {**self.extra, "sha256": self.sha256, "source": self.source}
        if self.data is not None:
            out["data"] = self.data.to_dict()
        if self.calibration_fit_records is not None:
            out["calibration_fit_records"] = self.calibration_fit_records
        return out

    @classmethod
    def read(cls, f: _Fields) -> Inputs:
        data = None
        if "data" in f.doc:
            block = f.block("data")
            data = DataFile(block.text("file"), block.digest("sha256"))
        fit = f.count("calibration_fit_records", 1) if "calibration_fit_records" in f.doc else None
        known = {"sha256", "source", "data", "calibration_fit_records"}
        extra = {key: f.json_value(key) for key in f.doc if key not in known}
        return cls(f.digest("sha256"), f.text("source"), data, fit, extra)


@dataclass(frozen=True)
class StoreSettings:
    dtype: str
    shard_tokens: int

    def to_dict(self) -> dict[str, Any]:
        return {"dtype": self.dtype, "shard_tokens": self.shard_tokens}

    @classmethod
    def read(cls, f: _Fields) -> StoreSettings:
        if f.doc.get("dtype") not in STORE_DTYPES:
            raise f.refuse("dtype", f"one of {', '.join(STORE_DTYPES)}")
        return cls(f.doc["dtype"], f.count("shard_tokens", 1))


@dataclass(frozen=True)
class Identity:
    """The blocks a rerun must match to resume."""

    target: TargetIdentity
    layer_ids: LayerIds
    engine: EngineIdentity
    inputs: Inputs
    store: StoreSettings

    def to_dict(self) -> dict[str, Any]:
        return {key: getattr(self, key).to_dict() for key in IDENTITY_KEYS}

    def differences(self, other: Identity) -> list[str]:
        """Dotted names of the deciding fields whose values differ."""
        return [key for key in _differences(self.to_dict(), other.to_dict()) if key not in DESCRIPTIVE]

    @classmethod
    def read(cls, doc: dict[str, Any], where: str) -> Identity:
        f = _Fields(doc, "", where)
        target = TargetIdentity.read(f.block("target"))
        return cls(target, LayerIds.read(f.block("layer_ids"), target.num_hidden_layers),
                   EngineIdentity.read(f.block("engine")), Inputs.read(f.block("inputs")),
                   StoreSettings.read(f.block("store")))


def _differences(a: dict[str, Any], b: dict[str, Any], prefix: str = "") -> list[str]:
    out = []
    for key in sorted(set(a) | set(b)):
        va, vb = a.get(key), b.get(key)
        if isinstance(va, dict) and isinstance(vb, dict):
            out += _differences(va, vb, f"{prefix}{key}.")
        elif va != vb:
            out.append(f"{prefix}{key}")
    return out


@dataclass(frozen=True)
class Plan:
    """The planned sequences (`sequences.safetensors`): its SHA-256, records and tokens."""

    sha256: str
    records: int
    tokens: int

    def to_dict(self) -> dict[str, Any]:
        return {"sha256": self.sha256, "records": self.records, "tokens": self.tokens}

    @classmethod
    def read(cls, f: _Fields) -> Plan:
        return cls(f.digest("sha256"), f.count("records"), f.count("tokens"))


@dataclass(frozen=True)
class Manifest:
    identity: Identity
    plan: Plan
    complete: bool = False
    shards: tuple[Shard, ...] = ()

    @property
    def records(self) -> int:
        return self.shards[-1].end_record if self.shards else 0

    @property
    def tokens(self) -> int:
        return sum(s.tokens for s in self.shards)

    @property
    def total_bytes(self) -> int:
        return sum(s.bytes for s in self.shards)

    @property
    def target(self) -> TargetIdentity:
        return self.identity.target

    @property
    def layer_ids(self) -> LayerIds:
        return self.identity.layer_ids

    @property
    def engine(self) -> EngineIdentity:
        return self.identity.engine

    @property
    def inputs(self) -> Inputs:
        return self.identity.inputs

    @property
    def store(self) -> StoreSettings:
        return self.identity.store

    def with_shards(self, shards: tuple[Shard, ...] | list[Shard], *, complete: bool = False) -> Manifest:
        return replace(self, shards=tuple(shards), complete=complete)

    def to_dict(self) -> dict[str, Any]:
        return {"format": FORMAT, "version": VERSION, **self.identity.to_dict(), "plan": self.plan.to_dict(),
                "complete": self.complete, "records": self.records, "tokens": self.tokens,
                "shards": [s.to_dict() for s in self.shards]}

    def to_json(self) -> bytes:
        return (json.dumps(self.to_dict(), indent=1, sort_keys=True, allow_nan=False) + "\n").encode("utf-8")

    @classmethod
    def read(cls, doc: dict[str, Any], where: str) -> Manifest:
        """The manifest `doc` (parsed from the file `where`), every field checked; one line when one is wrong."""
        if doc.get("format") != FORMAT:
            raise CheckpointError(f"is not a hidden-state store (format {str(doc.get('format'))[:40]!r})", where)
        if type(doc.get("version")) is not int or doc["version"] != VERSION:
            raise CheckpointError(f"store format version {quoted(doc.get('version'))}; this eaglekit reads version "
                                  f"{VERSION}", where)
        f = _Fields(doc, "", where)
        identity, plan = Identity.read(doc, where), Plan.read(f.block("plan"))
        listed = doc.get("shards")
        if not isinstance(listed, list):
            raise f.refuse("shards", "a list")
        shards: list[Shard] = []
        for index, entry in enumerate(listed):
            shards.append(Shard.read(_Fields(entry, f"shards[{index}]", where), index,
                                     shards[-1].end_record if shards else 0))
        manifest = cls(identity, plan, f.flag("complete"), tuple(shards))
        if f.count("records", 0, plan.records) != manifest.records:
            raise f.refuse("records", f"{manifest.records} (where the listed shards end)")
        if f.count("tokens") != manifest.tokens:
            raise f.refuse("tokens", f"{manifest.tokens} (the listed shards' tokens)")
        if manifest.complete and manifest.records != plan.records:
            raise f.refuse("complete", f"false: {manifest.records} of the {plan.records} planned records are listed")
        return manifest
