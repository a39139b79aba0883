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
* `manifest.json` (typed in eaglekit.capture.manifest): what was captured (target, ids, engine, numerics,
  tokenizer, data: the file's name and SHA-256, never its folder) and, per published shard, its file name, byte
  size, SHA-256, record range and token count.

A folder is a store only by its manifest: one without (whatever its file names) is never resumed, and nothing in
it is removed. Every file is published atomically (written aside, fsynced, renamed: eaglekit.io.publish, by
capture.store_writer); the manifest goes first (it names the plan's digest before the plan is written) and is
rewritten after each shard, so a shard is part of the store only once the manifest lists it. A reader never uses
a shard whose size, SHA-256 or tensors differ from the manifest's; a writer resuming drops such a shard (and any
shard file the manifest does not list but that eaglekit wrote: its header says so) and captures it again. No
timestamps are stored: a resumed capture is byte-identical to an uninterrupted one.

Nothing here imports torch at module level: `inspect` reads the manifest and the shard headers only.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

from eaglekit.capture import MANIFEST
from eaglekit.capture.manifest import (
    FORMAT,
    SHARD_PREFIX,
    SHARD_SUFFIX,
    STORE_DTYPES,
    VERSION,
    DataFile,
    Identity,
    Manifest,
    Shard,
    shard_name,
)
from eaglekit.errors import CheckpointError, UsageError, quoted
from eaglekit.io.jsonfile import load_json_object, open_regular

if TYPE_CHECKING:
    import torch

    from eaglekit.io.header import SafetensorsHeader

__all__ = ["FORMAT", "MANIFEST", "Shard", "shard_name"]

LOCK = ".capture.lock"  # held (flock) by the one capture writing the store
PLAN = "sequences.safetensors"
STORED_AUX = {"float32": "F32", "bfloat16": "BF16", "fp8": "F8_E4M3"}
"""The safetensors dtype of `aux` per store dtype (id L, `last`, is always F32)."""
PLAN_HEADER_BYTES = 1 << 16  # the plan's header: two tensors and one metadata field
PLAN_BROKEN = (f"the planned sequences ({PLAN}) are missing or differ from the manifest (torn or modified): rerun "
               "the capture with --force to capture the store again")


def sha256_bytes(data: bytes | memoryview) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()


def check_store_dtype(store_dtype: str) -> str:
    if store_dtype not in STORE_DTYPES:
        raise UsageError(f"--store-dtype {store_dtype!r}: use one of {', '.join(STORE_DTYPES)}")
    return store_dtype


# ------------------------------------------------------------------ reading (no torch needed for the manifest)


def read_manifest(store: str) -> Manifest:
    """The store's manifest, every field checked; refused in one line when the folder is not a store."""
    path = os.path.join(store, MANIFEST)
    if not os.path.isdir(store):
        raise CheckpointError("is not a hidden-state store (not a folder)", store)
    if not os.path.lexists(path):
        raise CheckpointError(f"is not a hidden-state store: no {MANIFEST} (write one with `eaglekit capture`)", store)
    return Manifest.read(load_json_object(path, "store manifest"), path)


def _read_verified(path: str, size: int, sha256: str, what: str) -> bytes:
    """The bytes of a file the manifest lists, refused unless they are `size` bytes with this SHA-256 (the file is
    never read past `size` + 1 bytes)."""
    if os.path.islink(path) or not os.path.lexists(path):
        raise CheckpointError(f"{what} listed in the manifest is missing (rerun the capture to complete the store)",
                              path)
    with open_regular(path, what) as fh:
        try:
            data = fh.read(size + 1)
        except OSError as exc:
            raise CheckpointError(f"cannot read the {what} ({exc.strerror or exc})", path) from None
    if len(data) != size or sha256_bytes(data) != sha256:
        raise CheckpointError(f"{what} differs from the manifest (size or SHA-256): torn or modified after capture; "
                              "rerun the capture to replace it", path)
    return data


def _check_tensors(header: SafetensorsHeader, expected: dict[str, tuple[str, tuple[int, ...]]], what: str) -> None:
    """Refuse a file whose tensors are not exactly `expected` (name: dtype, shape): what the manifest says."""
    names = sorted(header.entries)
    if names != sorted(expected):
        raise CheckpointError(f"{what} holds tensors {quoted(names)}, not the store's {sorted(expected)}",
                              header.path)
    for name, (dtype, shape) in expected.items():
        entry = header.entries[name]
        if (entry.dtype, entry.shape) != (dtype, shape):
            raise CheckpointError(f"{what}'s {name} is {entry.dtype}{list(entry.shape)}, the manifest says "
                                  f"{dtype}{list(shape)}", header.path)


def shard_tensors(manifest: Manifest, shard: Shard) -> dict[str, tuple[str, tuple[int, ...]]]:
    """The tensors (dtype, shape) the manifest says a shard holds."""
    n, k, h = shard.tokens, len(manifest.layer_ids.aux), manifest.target.hidden_size
    out = {"aux": (STORED_AUX[manifest.store.dtype], (n, k, h)), "last": ("F32", (n, h)), "token_ids": ("I64", (n,)),
           "offsets": ("I64", (shard.records + 1,)), "loss_mask": ("U8", (n,))}
    if manifest.store.dtype == "fp8":
        out["aux_scale"] = ("F32", (n, k))
    return out


def _check_offsets(offsets: torch.Tensor, tokens: int, path: str, what: str) -> None:
    if int(offsets[0]) != 0 or int(offsets[-1]) != tokens or bool((offsets.diff() < 0).any()):
        raise CheckpointError(f"{what}'s record offsets do not run from 0 to its {tokens} tokens", path)


def _load(data: bytes, path: str, what: str) -> dict[str, torch.Tensor]:
    from safetensors import SafetensorError
    from safetensors.torch import load

    try:
        return load(data)
    except SafetensorError as exc:
        raise CheckpointError(f"{what} is not readable safetensors ({exc})", path) from None


def read_shard(store: str, manifest: Manifest, shard: Shard) -> dict[str, torch.Tensor]:
    """One shard's tensors (fp8 states dequantized to float32, others as stored); refused unless its bytes are
    exactly the ones the manifest lists and its tensors the ones the manifest describes."""
    from eaglekit.io.header import parse_header_bytes

    path = os.path.join(store, shard.file)
    data = _read_verified(path, shard.bytes, shard.sha256, "shard")
    header = parse_header_bytes(data, len(data), path, max_tensors=8)
    _check_tensors(header, shard_tensors(manifest, shard), "shard")
    if header.metadata.get("first_record") != str(shard.first_record):
        raise CheckpointError(f"shard says it starts at record {quoted(header.metadata.get('first_record'))}, the "
                              f"manifest lists it from record {shard.first_record}", path)
    tensors = _load(data, path, "shard")
    _check_offsets(tensors["offsets"], shard.tokens, path, "shard")
    return dequantized(tensors)


def dequantized(tensors: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """An fp8 shard's `aux` as float32 (its values times their per-token scales)."""
    out = dict(tensors)
    if "aux_scale" in out:
        out["aux"] = out["aux"].float() * out.pop("aux_scale")[..., None]
    return out


def plan_bytes_bound(manifest: Manifest) -> int:
    """The most bytes the planned sequences can take: their token ids and offsets, and a small header."""
    return 8 + PLAN_HEADER_BYTES + 8 * (manifest.plan.tokens + manifest.plan.records + 1)


def plan_intact(store: str, manifest: Manifest) -> bool:
    """Whether the plan file is the one the manifest names (its SHA-256, read in bounded chunks)."""
    from eaglekit.provenance import sha256_file

    path = os.path.join(store, PLAN)
    try:
        if os.path.islink(path) or not os.path.isfile(path) or os.path.getsize(path) > plan_bytes_bound(manifest):
            return False
        return sha256_file(path) == manifest.plan.sha256
    except (OSError, CheckpointError):
        return False


def read_plan(store: str, manifest: Manifest) -> list[list[int]]:
    """The planned token ids of every record, checked against the manifest's digest, records and tokens."""
    from eaglekit.io.header import parse_header_bytes

    path = os.path.join(store, PLAN)
    if not plan_intact(store, manifest):
        raise CheckpointError(PLAN_BROKEN, store)
    with open_regular(path, "planned sequences") as fh:
        data = fh.read(plan_bytes_bound(manifest) + 1)
    header = parse_header_bytes(data, len(data), path, max_tensors=2)
    _check_tensors(header, {"token_ids": ("I64", (manifest.plan.tokens,)),
                            "offsets": ("I64", (manifest.plan.records + 1,))}, "the planned sequences")
    tensors = _load(data, path, "the planned sequences")
    _check_offsets(tensors["offsets"], manifest.plan.tokens, path, "the planned sequences")
    ids, offsets = tensors["token_ids"].tolist(), tensors["offsets"].tolist()
    return [ids[a:b] for a, b in zip(offsets, offsets[1:])]


# ------------------------------------------------------------------ recognising and opening for writing


def _store_name(name: str) -> bool:
    return name in (MANIFEST, PLAN) or (name.startswith(SHARD_PREFIX) and name.endswith(SHARD_SUFFIX))


def _partial(name: str) -> bool:
    """A file eaglekit.io.publish was writing for one of the store's names when its run was killed."""
    from eaglekit.io.publish import PARTIAL_MARK

    return name.startswith(".") and PARTIAL_MARK in name and _store_name(name[1:].split(PARTIAL_MARK, 1)[0])


def own_files(store: str) -> list[str]:
    """Names in the folder that a store writes (manifest, plan, shards, and the partial files of killed runs)."""
    return [name for name in os.listdir(store) if _store_name(name) or _partial(name)]


def holds_store(store: str) -> bool:
    """Whether the existing folder `store` holds a store (its manifest); a folder that holds anything else, or a
    store's file names without a manifest (no proof eaglekit wrote them), is refused in one line."""
    names = sorted(set(os.listdir(store)) - {LOCK})
    foreign = [n for n in names if not _store_name(n) and not _partial(n)]
    if foreign:
        raise UsageError(f"the store folder holds {quoted(foreign[0])}, which is not part of a hidden-state store: "
                         "choose an empty or new folder", store)
    if MANIFEST in names:
        return True
    unproven = [n for n in names if not _partial(n)]
    if unproven:
        raise UsageError(f"the store folder holds {quoted(unproven[0])} but no {MANIFEST}, so it is no store "
                         "eaglekit wrote (a store is known by its manifest); nothing was removed: choose an empty "
                         "or new folder", store)
    return False


def _written_by_store(path: str) -> bool:
    """Whether a shard file the manifest does not list carries the store's mark in its header (a shard published
    before a killed run could list it)."""
    from eaglekit.io.header import read_header

    try:
        return not os.path.islink(path) and read_header(path, max_tensors=8).metadata.get("format") == FORMAT
    except CheckpointError:
        return False


def _removable(store: str, manifest: Manifest, keep: set[str]) -> list[str]:
    """The store's files outside `keep`, each one eaglekit provably wrote (the manifest lists it, its name is a
    killed publish's, or its header carries the store's mark); any other is refused before one is removed."""
    listed = {MANIFEST, PLAN, *(s.file for s in manifest.shards)}
    out = []
    for name in sorted(set(os.listdir(store)) - keep - {LOCK}):
        if not (name in listed or _partial(name) or _written_by_store(os.path.join(store, name))):
            raise UsageError(f"the store folder holds {quoted(name)}, which its manifest does not list and eaglekit "
                             "did not write; nothing was removed: move it away to resume", store)
        out.append(name)
    return out


def _remove(store: str, names: list[str]) -> None:
    for name in names:
        os.unlink(os.path.join(store, name))


def check_before_capture(store: str, data: DataFile | None, shown: str, *, force: bool = False) -> None:
    """Before any work: refuse a folder no capture may write (files that are no store's, or that eaglekit cannot
    show it wrote), a broken manifest, and (unless `force`, which replaces the store) a store captured from other
    data than `data` (`shown`: that data as the user named it)."""
    if not os.path.isdir(store) or not holds_store(store):
        return
    manifest = read_manifest(store)
    _removable(store, manifest, set())
    held = manifest.inputs.data
    if not force and held is not None and data is not None and held.sha256 != data.sha256:
        raise UsageError(f"this store was captured from other data: {shown} differs (the store was captured from "
                         f"{held.file}, {held.sha256.removeprefix('sha256:')[:12]}…); rerun with that data to "
                         "resume, or pass --force to replace the store", store)


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
    holds_store(store)  # before the lock file is made: a folder of other files is left as it was
    with open(os.path.join(store, LOCK), "a") as fh:
        try:
            fcntl.flock(fh.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise UsageError("another capture is writing this store now; wait for it or choose another folder",
                             store) from None
        yield


def _another_capture(changed: list[str]) -> str:
    if changed == ["inputs.sha256"]:
        return ("this store was captured from other data: the planned sequences differ (--data, --data-limit, "
                "--generate, --context-tokens, --code-tokens, --templates, --max-length or the calibration options); "
                "rerun with the same inputs to resume, or pass --force to replace it")
    return (f"the store holds another capture (it differs in {', '.join(changed[:4])}): rerun with the same inputs "
            "to resume, or pass --force to replace it")


def open_store(store: str, identity: Identity, *, force: bool = False) -> tuple[Manifest | None, list[Shard]]:
    """(the existing manifest, its intact shards) to resume from, or (None, []) for a fresh store.

    A folder is a store only by its manifest: a folder holding anything but a store's files, or a store's file
    names without a manifest, is refused and left as it was. A store of another capture (its identity differs) is
    refused unless `force`, which removes the store's own files (never anything else). Shards past the first torn
    one, and shard files eaglekit wrote that the manifest does not list, are removed: they are captured again."""
    from eaglekit.io.outputs import Role, check_parent

    if os.path.lexists(store) and not os.path.isdir(store):
        raise UsageError("the store path exists and is not a folder", store)
    if not os.path.isdir(store):
        check_parent(Role("STORE", store))
        os.mkdir(store)
        return None, []
    if not holds_store(store):
        return None, []
    manifest = read_manifest(store)
    changed = manifest.identity.differences(identity)
    if changed and not force:
        raise UsageError(_another_capture(changed), store)
    if not changed and not plan_intact(store, manifest):
        if manifest.shards and not force:  # captured shards are never thrown away unasked
            raise CheckpointError(PLAN_BROKEN, store)
        changed = ["plan"]  # killed between its manifest and its plan: nothing was captured yet
    if changed:
        _remove(store, _removable(store, manifest, set()))
        return None, []
    intact: list[Shard] = []
    for shard in manifest.shards:
        if not shard_intact(store, shard):
            break
        intact.append(shard)
    _remove(store, _removable(store, manifest, {MANIFEST, PLAN, *(s.file for s in intact)}))
    return manifest, intact


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


def describe_store(store: str) -> dict[str, Any]:
    """What a store is, from its manifest and the shards' headers only (no tensor byte, no torch): identity,
    progress, per-shard state (ok, missing, size differs, unreadable header) and the tensors a shard holds."""
    from eaglekit.io.header import read_header

    manifest = read_manifest(store)
    rows, problems, tensors = [], [], None
    for shard in manifest.shards:
        path = os.path.join(store, shard.file)
        state = "ok"
        if not os.path.isfile(path):
            state = "missing"
        elif os.path.getsize(path) != shard.bytes:
            state = "size differs"
        else:
            try:
                header = read_header(path, max_tensors=8)
                _check_tensors(header, shard_tensors(manifest, shard), "shard")
                if tensors is None:
                    tensors = {n: {"dtype": e.dtype, "shape": list(e.shape)} for n, e in sorted(header.entries.items())}
            except CheckpointError:
                state = "unreadable header"
        if state != "ok":
            problems.append(f"{shard.file}: {state} (rerun the capture to replace it)")
        rows.append({**shard.to_dict(), "state": state})
    tokens, total = manifest.tokens, manifest.total_bytes
    return {
        "kind": "hidden-state store", "path": os.path.abspath(store), "format": FORMAT,
        "version": VERSION, "complete": manifest.complete and not problems,
        "records": manifest.records, "planned_records": manifest.plan.records,
        "tokens": tokens, "planned_tokens": manifest.plan.tokens, "bytes": total,
        "bytes_per_token": round(total / tokens, 1) if tokens else None,
        **manifest.identity.to_dict(), "tensors": tensors or {}, "shards": rows, "problems": problems,
    }
