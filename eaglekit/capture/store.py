"""The hidden-state store: a folder of safetensors shards plus `manifest.json`, written so a killed capture resumes.

Layout of STORE:

* `sequences.safetensors`: the planned token ids of every record (`token_ids` [N] int64, `offsets` [S+1] int64),
  written once before any state is captured, so a resumed run captures the very same sequences (a `--generate`
  answer is never generated twice);
* `shard-NNNNNN.safetensors`: consecutive whole records, cut after the record that brings the shard to
  `shard_tokens` tokens (so the cut depends on record order and lengths only). Tensors: `aux` [n, K, H] (the K aux
  ids in ascending order) in the store dtype (fp8: float8 E4M3 with a float32 scale per token and id, `aux_scale`
  [n, K]), `last` [n, H] float32 (id L: the last decoder layer's output before the final norm; the target's greedy
  labels are argmax(lm_head · norm(id L)), and rounding it to bfloat16 flips the near-ties: 19 of 1,334 labels of a
  small random Llama), `token_ids` [n] int64, `offsets` [r+1] int64 (record boundaries inside the shard),
  `loss_mask` [n] uint8;
* `manifest.json`: what was captured (target, ids, engine, numerics, tokenizer, data; see `identity`) and, per
  published shard, its file name, byte size, SHA-256, record range and token count.

Every file is published atomically (written aside, fsynced, renamed: eaglekit.io.publish, by capture.store_writer)
and the manifest is rewritten after each shard, so a shard is part of the store only once the manifest lists it. A
reader never uses a shard whose size or SHA-256 differs from the manifest's; a writer resuming drops such a shard
(and any file the manifest does not list) and captures it again. No timestamps are stored: a resumed capture is
byte-identical to an uninterrupted one.

Nothing here imports torch at module level: `inspect` reads the manifest and the shard headers only.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from eaglekit.errors import CheckpointError, UsageError
from eaglekit.io.jsonfile import load_json_object

if TYPE_CHECKING:
    import torch


FORMAT = "eaglekit-hidden-states"
VERSION = 1
MANIFEST = "manifest.json"
LOCK = ".capture.lock"  # held (flock) by the one capture writing the store
PLAN = "sequences.safetensors"
SHARD_PREFIX, SHARD_SUFFIX = "shard-", ".safetensors"
STORE_DTYPES = ("bfloat16", "float32", "fp8")
IDENTITY_KEYS = ("target", "layer_ids", "engine", "inputs", "store")
"""The manifest blocks a rerun must match to resume (the rest says how far the capture got)."""


@dataclass(frozen=True)
class Shard:
    file: str
    bytes: int
    sha256: str
    first_record: int
    end_record: int  # exclusive
    tokens: int

    def to_dict(self) -> dict[str, Any]:
        return {"file": self.file, "bytes": self.bytes, "sha256": self.sha256,
                "records": [self.first_record, self.end_record], "tokens": self.tokens}

    @classmethod
    def of(cls, entry: Any, where: str) -> Shard:
        try:
            first, end = entry["records"]
            shard = cls(str(entry["file"]), int(entry["bytes"]), str(entry["sha256"]), int(first), int(end),
                        int(entry["tokens"]))
        except (KeyError, TypeError, ValueError):
            raise CheckpointError("manifest lists a shard without file, bytes, sha256, records and tokens",
                                  where) from None
        if os.path.basename(shard.file) != shard.file or not shard.file.startswith(SHARD_PREFIX):
            raise CheckpointError(f"manifest names a shard outside the store: {shard.file[:80]!r}", where)
        return shard


def shard_name(index: int) -> str:
    return f"{SHARD_PREFIX}{index:06d}{SHARD_SUFFIX}"


def sha256_bytes(data: bytes | memoryview) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()


def check_store_dtype(store_dtype: str) -> str:
    if store_dtype not in STORE_DTYPES:
        raise UsageError(f"--store-dtype {store_dtype!r}: use one of {', '.join(STORE_DTYPES)}")
    return store_dtype


# ------------------------------------------------------------------ reading (no torch needed for the manifest)


def read_manifest(store: str) -> dict[str, Any]:
    """The store's manifest, refused in one line when the folder is not a store."""
    path = os.path.join(store, MANIFEST)
    if not os.path.isdir(store):
        raise CheckpointError("is not a hidden-state store (not a folder)", store)
    if not os.path.isfile(path):
        raise CheckpointError(f"is not a hidden-state store: no {MANIFEST} (write one with `eaglekit capture`)", store)
    manifest = load_json_object(path, "store manifest")
    if manifest.get("format") != FORMAT:
        raise CheckpointError(f"is not a hidden-state store (format {str(manifest.get('format'))[:40]!r})", path)
    if manifest.get("version") != VERSION:
        raise CheckpointError(f"store format version {manifest.get('version')!r}; this eaglekit reads version "
                              f"{VERSION}", path)
    for key in IDENTITY_KEYS:
        if not isinstance(manifest.get(key), dict):
            raise CheckpointError(f"manifest has no {key!r} block", path)
    if not isinstance(manifest.get("shards"), list):
        raise CheckpointError("manifest has no shard list", path)
    return manifest


def shards(store: str, manifest: dict[str, Any]) -> list[Shard]:
    where = os.path.join(store, MANIFEST)
    listed = [Shard.of(entry, where) for entry in manifest["shards"]]
    expected = 0
    for shard in listed:
        if shard.first_record != expected or shard.end_record <= shard.first_record:
            raise CheckpointError(f"manifest's shards do not follow each other ({shard.file} starts at record "
                                  f"{shard.first_record}, expected {expected})", where)
        expected = shard.end_record
    return listed


def shard_intact(store: str, shard: Shard) -> bool:
    """Whether the file is the shard the manifest lists: its size, then its SHA-256 (read in bounded chunks)."""
    from eaglekit.provenance import sha256_file

    path = os.path.join(store, shard.file)
    try:
        if os.path.islink(path) or not os.path.isfile(path) or os.path.getsize(path) != shard.bytes:
            return False
        return sha256_file(path) == shard.sha256
    except (OSError, CheckpointError):
        return False


def read_shard(store: str, shard: Shard) -> dict[str, torch.Tensor]:
    """One shard's tensors (fp8 states dequantized to float32, others as stored); refused unless its bytes are
    exactly the ones the manifest lists."""
    from safetensors import SafetensorError
    from safetensors.torch import load

    path = os.path.join(store, shard.file)
    try:
        if os.path.islink(path) or not os.path.isfile(path):
            raise CheckpointError("shard listed in the manifest is missing (rerun the capture to complete the store)",
                                  path)
        with open(path, "rb") as fh:
            data = fh.read(shard.bytes + 1)
    except OSError as exc:
        raise CheckpointError(f"cannot read the shard ({exc.strerror or exc})", path) from None
    if len(data) != shard.bytes or sha256_bytes(data) != shard.sha256:
        raise CheckpointError("shard differs from the manifest (size or SHA-256): torn or modified; rerun the "
                              "capture to replace it", path)
    try:
        tensors = load(data)
    except SafetensorError as exc:
        raise CheckpointError(f"shard is not readable safetensors ({exc})", path) from None
    return dequantized(tensors)


def dequantized(tensors: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """An fp8 shard's `aux` as float32 (its values times their per-token scales)."""
    out = dict(tensors)
    if "aux_scale" in out:
        out["aux"] = out["aux"].float() * out.pop("aux_scale")[..., None]
    return out


def read_plan(store: str, manifest: dict[str, Any]) -> list[list[int]]:
    """The planned token ids of every record, checked against the manifest's digest."""
    from safetensors.torch import load_file

    path = os.path.join(store, PLAN)
    expected = manifest.get("plan", {}).get("sha256") if isinstance(manifest.get("plan"), dict) else None
    if not os.path.isfile(path) or expected is None:
        raise CheckpointError(f"store has no {PLAN} (the planned sequences)", store)
    with open(path, "rb") as fh:
        if sha256_bytes(fh.read()) != expected:
            raise CheckpointError("planned sequences differ from the manifest (torn or modified)", path)
    tensors = load_file(path)
    ids, offsets = tensors["token_ids"].tolist(), tensors["offsets"].tolist()
    return [ids[a:b] for a, b in zip(offsets, offsets[1:])]


# ------------------------------------------------------------------ opening for writing (store_writer writes)


def differences(a: dict[str, Any], b: dict[str, Any], prefix: str = "") -> list[str]:
    """Dotted keys whose values differ between two manifests' identity blocks."""
    out = []
    for key in sorted(set(a) | set(b)):
        va, vb = a.get(key), b.get(key)
        if isinstance(va, dict) and isinstance(vb, dict):
            out += differences(va, vb, f"{prefix}{key}.")
        elif va != vb:
            out.append(f"{prefix}{key}")
    return out


def own_files(store: str) -> list[str]:
    """Names in the folder a store writes (manifest, plan, shards, and the partial files of killed runs)."""
    from eaglekit.io.publish import PARTIAL_MARK

    names = []
    for name in os.listdir(store):
        base = name[1:].split(PARTIAL_MARK, 1)[0] if name.startswith(".") and PARTIAL_MARK in name else name
        if base in (MANIFEST, PLAN) or (base.startswith(SHARD_PREFIX) and base.endswith(SHARD_SUFFIX)):
            names.append(name)
    return names


def _refuse_foreign(store: str) -> None:
    foreign = sorted(set(os.listdir(store)) - set(own_files(store)) - {LOCK})
    if foreign:
        raise UsageError(f"the store folder holds {foreign[0][:80]!r}, which is not part of a hidden-state store: "
                         "choose an empty or new folder", store)


@contextmanager
def store_lock(store: str) -> Iterator[None]:
    """Hold the store's lock while writing it (the folder is made if missing): a second capture into the same store
    is refused instead of removing the first one's files as a killed run's leftovers."""
    import fcntl

    from eaglekit.io.outputs import Role, check_parent

    if os.path.lexists(store) and not os.path.isdir(store):
        raise UsageError("the store path exists and is not a folder", store)
    if not os.path.isdir(store):
        check_parent(Role("STORE", store))
        os.mkdir(store)
    _refuse_foreign(store)  # before the lock file is made: a folder of other files is left as it was
    with open(os.path.join(store, LOCK), "a") as fh:
        try:
            fcntl.flock(fh.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise UsageError("another capture is writing this store now; wait for it or choose another folder",
                             store) from None
        yield


def open_store(store: str, identity: dict[str, Any], *,
               force: bool = False) -> tuple[dict[str, Any] | None, list[Shard]]:
    """(the existing manifest, its intact shards) to resume from, or (None, []) for a fresh store.

    A folder holding anything but a store's own files is refused; a store of another capture (its identity blocks
    differ) is refused unless `force`, which removes the store's own files (never anything else). Shards past the
    first torn one, and files the manifest does not list, are removed: they are captured again."""
    from eaglekit.io.outputs import Role, check_parent

    if os.path.lexists(store) and not os.path.isdir(store):
        raise UsageError("the store path exists and is not a folder", store)
    if not os.path.isdir(store):
        check_parent(Role("STORE", store))
        os.mkdir(store)
        return None, []
    _refuse_foreign(store)
    manifest = read_manifest(store) if os.path.isfile(os.path.join(store, MANIFEST)) else None
    if manifest is not None:
        changed = [k for k in differences({k: manifest.get(k) for k in IDENTITY_KEYS}, identity)
                   if k != "inputs.source"]  # the inputs' content decides, not where they were read from
        if changed and not force:
            raise UsageError(f"the store holds another capture (it differs in {', '.join(changed[:4])}): rerun with "
                             "the same inputs to resume, or pass --force to replace it", store)
        if changed:
            manifest = None
    if manifest is None:
        for name in own_files(store):
            os.unlink(os.path.join(store, name))
        return None, []
    intact: list[Shard] = []
    for shard in shards(store, manifest):
        if not shard_intact(store, shard):
            break
        intact.append(shard)
    keep = {MANIFEST, PLAN, *(s.file for s in intact)}
    for name in own_files(store):
        if name not in keep:
            os.unlink(os.path.join(store, name))
    return manifest, intact


def is_store(path: str) -> bool:
    """Whether `path` is a folder holding a store's manifest (what `inspect` shows as a store)."""
    return os.path.isdir(path) and os.path.isfile(os.path.join(path, MANIFEST))


def describe_store(store: str) -> dict[str, Any]:
    """What a store is, from its manifest and the shards' headers only (no tensor byte, no torch): identity,
    progress, per-shard state (ok, missing, size differs, unreadable header) and the tensors a shard holds."""
    from eaglekit.io.header import read_header

    manifest = read_manifest(store)
    listed = shards(store, manifest)
    rows, problems, tensors = [], [], None
    for shard in listed:
        path = os.path.join(store, shard.file)
        state = "ok"
        if not os.path.isfile(path):
            state = "missing"
        elif os.path.getsize(path) != shard.bytes:
            state = "size differs"
        else:
            try:
                header = read_header(path)
                if tensors is None:
                    tensors = {n: {"dtype": e.dtype, "shape": list(e.shape)} for n, e in sorted(header.entries.items())}
            except CheckpointError:
                state = "unreadable header"
        if state != "ok":
            problems.append(f"{shard.file}: {state} (rerun the capture to replace it)")
        rows.append({**shard.to_dict(), "state": state})
    plan: dict[str, Any] = manifest["plan"] if isinstance(manifest.get("plan"), dict) else {}
    tokens = sum(s.tokens for s in listed)
    total = sum(s.bytes for s in listed)
    return {
        "kind": "hidden-state store", "path": os.path.abspath(store), "format": manifest["format"],
        "version": manifest["version"], "complete": bool(manifest.get("complete")) and not problems,
        "records": listed[-1].end_record if listed else 0, "planned_records": plan.get("records"),
        "tokens": tokens, "planned_tokens": plan.get("tokens"), "bytes": total,
        "bytes_per_token": round(total / tokens, 1) if tokens else None,
        **{key: manifest[key] for key in IDENTITY_KEYS},
        "tensors": tensors or {}, "shards": rows, "problems": problems,
    }
