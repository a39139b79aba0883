"""Source file hashes for the provenance block.

Hashing a gigabyte costs more than copying it. Files in the Hugging Face cache are already named by their
SHA-256 (LFS blobs), which is used as is.
"""

from __future__ import annotations

import os
import re
import struct

from eaglekit.errors import CheckpointError
from eaglekit.io.checkpoint import INDEX_NAME
from eaglekit.io.header import MAX_HEADER_BYTES

HASH_BUFFER = 4 * 1024 * 1024
_SHA256_BLOB = re.compile(r"^[0-9a-f]{64}$")
PLACEHOLDER = "sha256:" + "0" * 64  # same length as a real digest: lets the header be patched in place
FINGERPRINT_LEADING_BYTES = 16 * 1024 * 1024


def sha256_file(path: str) -> str:
    blob = os.path.basename(os.path.realpath(path))
    if os.path.islink(path) and _SHA256_BLOB.match(blob):
        return "sha256:" + blob
    import hashlib  # here: the rules read this module's config checks, and OpenSSL's start-up is not free

    digest = hashlib.sha256()
    buf = bytearray(HASH_BUFFER)  # one buffer for the whole file: no fresh pages to fault in per chunk
    view = memoryview(buf)
    try:
        with open(path, "rb", buffering=0) as fh:
            while n := fh.readinto(buf):
                digest.update(view[:n])
        return "sha256:" + digest.hexdigest()
    except OSError as exc:
        raise CheckpointError(f"cannot read for hashing: {exc.strerror or exc}", path) from None


def weights_fingerprint(paths: list[str]) -> str:
    """The identity of a target's weight files, read from their headers alone (a capture store, verify and bench
    reports and push's evidence all bind to it): SHA-256 over each file's name and its safetensors header (which
    tensors, of which dtypes, shapes and byte offsets), a shard index's bytes, or for any other weight file (a GGUF)
    its size and its first FINGERPRINT_LEADING_BYTES (header, metadata and tensor table).

    Bounded reads whatever the target's size. Two checkpoints of one architecture and layout (a base model and its
    instruct tune) have equal headers: a store and a report tell them apart by the head digest beside it
    (target_identity)."""
    import hashlib  # here: the rules read this module's config checks, and OpenSSL's start-up is not free

    digest = hashlib.sha256()
    for path in sorted(paths, key=os.path.basename):
        name = os.path.basename(path)
        try:
            with open(path, "rb") as fh:
                if name == INDEX_NAME:
                    digest.update(name.encode() + b"\0" + fh.read(MAX_HEADER_BYTES))
                elif name.endswith(".safetensors"):
                    head = fh.read(8)
                    (length,) = struct.unpack("<Q", head) if len(head) == 8 else (0,)
                    digest.update(name.encode() + b"\0" + head + fh.read(min(length, MAX_HEADER_BYTES)))
                else:
                    size = os.fstat(fh.fileno()).st_size
                    digest.update(f"{name}\0{size}\0".encode() + fh.read(FINGERPRINT_LEADING_BYTES))
        except OSError as exc:
            raise CheckpointError(f"cannot read for fingerprinting: {exc.strerror or exc}", path) from None
    return "sha256:" + digest.hexdigest()


def target_weight_files(path: str) -> list[str]:
    """The weight files of a target given by its config.json (the safetensors shards beside it and their index)
    or its GGUF."""
    if path.endswith(".gguf") and os.path.isfile(path):
        return [path]
    folder = os.path.dirname(os.path.abspath(path))
    return [os.path.join(folder, name) for name in sorted(os.listdir(folder))
            if name.endswith(".safetensors") or name == INDEX_NAME]


def source_files(spec) -> list[str]:
    """The files a draft consists of (weights, config, shard index), relative to its folder."""
    files = list(spec.files) + ["config.json"]
    if os.path.exists(os.path.join(spec.path, INDEX_NAME)):
        files.append(INDEX_NAME)
    return files


def hash_files(root: str, files: list[str]) -> dict[str, str]:
    return {rel: sha256_file(os.path.join(root, rel)) for rel in files}


def placeholders(files: list[str]) -> dict[str, str]:
    """Digests of the final length, for a header written before the hashes are known."""
    return {rel: PLACEHOLDER for rel in files}


def untrained_upgrade(config: dict) -> tuple[str, str] | None:
    """(function, summary) of the newest eaglekit upgrade that changed the function (warm-start) or switched the
    3.1 flags on over the EAGLE-3 function (eagle3-function), unless a finetune followed it.

    Walks the provenance chain (each block keeps its source's block as `source_provenance`), newest first."""
    block = config.get("eaglekit")
    seen = 0
    while isinstance(block, dict) and seen < 64:
        if block.get("command") == "finetune":
            return None
        if block.get("command") == "upgrade" and block.get("function") in ("warm-start", "eagle3-function"):
            return str(block["function"]), str(block.get("summary") or block["function"])
        block, seen = block.get("source_provenance"), seen + 1
    return None


def norm_output_scale(config: dict) -> float | None:
    """c of the newest upgrade that folded the final norm into lm_head (the norm_output rescale), through any
    finetunes since: the scale the draft's head and final norm still carry."""
    block = config.get("eaglekit")
    seen = 0
    while isinstance(block, dict) and seen < 64:
        rescale = block.get("norm_output_rescale")
        if block.get("command") == "upgrade" and isinstance(rescale, dict):
            scale = rescale.get("scale")
            return float(scale) if isinstance(scale, (int, float)) and scale > 0 else None
        block, seen = block.get("source_provenance"), seen + 1
    return None


def untrained_warm_start(config: dict) -> str | None:
    """The summary of the upgrade that changed the function without training, unless a finetune followed."""
    found = untrained_upgrade(config)
    return found[1] if found and found[0] == "warm-start" else None


def finetune_without_gain(config: dict) -> str | None:
    """What the newest finetune measured when it wrote a draft without a resolved held-out gain over its source
    (--keep-unresolved), or one resolved worse (written by an older eaglekit with --keep-worse)."""
    block = config.get("eaglekit")
    if not isinstance(block, dict) or block.get("command") != "finetune":
        return None
    gain = block.get("held_out_gain")
    if isinstance(gain, dict) and str(block.get("written", "")).startswith("without"):
        found = gain.get("interval")
        span = (f"n={gain.get('samples')}, too few to estimate an interval" if gain.get("too_few_samples") is True
                else f"[{found.get('low')}, {found.get('high')}]" if isinstance(found, dict) else "no interval")
        return f"held-out τ {gain.get('acceptance_length_difference')} {span}, {gain.get('verdict')}"
    paired = block.get("paired_evaluation")
    worse = [p for p in paired if isinstance(p, dict) and p.get("verdict") == "worse"] if isinstance(paired, list) \
        else []
    return "; ".join(f"τ {p.get('acceptance_length_difference')} at +{p.get('context_tokens')} tokens of context"
                     for p in worse) or None


def target_identity(info) -> dict[str, str]:
    """A target's config hash, weights fingerprint and, where its safetensors hold them, the digest of its final
    norm and lm_head (eaglekit.target.head_digest): what its captured states, reports and provenance bind to, as a
    store's manifest does."""
    head = head_identity(info)
    return {"config_sha256": sha256_file(info.path),
            "weights_fingerprint": weights_fingerprint(target_weight_files(info.path)),
            **({"head_sha256": head} if head else {})}


def head_identity(info) -> str | None:
    """The head digest of a safetensors target; None for a GGUF or a folder whose files hold no final norm and
    lm_head (a config alone)."""
    from eaglekit.target import head_digest

    if info.path.endswith(".gguf"):
        return None
    try:
        return head_digest(info)
    except CheckpointError:
        return None


def measured_files(spec, info) -> dict:
    """Which bytes a verify or bench report describes: SHA-256 of every draft file, and the target's identity (its
    recorded origin, config hash and weights fingerprint); `push --report` refuses a report that measured other
    files."""
    return {"draft_files": hash_files(spec.path, source_files(spec)),
            "target": {"name_or_path": info.name_or_path,
                       "folder": os.path.basename(os.path.dirname(os.path.abspath(info.path))),
                       **target_identity(info),
                       **({"derived_from": info.derived_from} if info.derived_from else {})}}
