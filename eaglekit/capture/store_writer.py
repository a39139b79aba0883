"""Writing a hidden-state store (layout: eaglekit.capture.store): each shard, the plan and the manifest is one file
published atomically through eaglekit.io.publish, the manifest last, so a shard is part of the store only once the
manifest that lists it is in place. The bytes depend on the records alone (no timestamps, tensors and metadata in
a fixed order): a resumed capture is byte-identical to an uninterrupted one.
"""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from eaglekit.capture.store import FORMAT, MANIFEST, PLAN, Shard, sha256_bytes, shard_name
from eaglekit.errors import CheckpointError

if TYPE_CHECKING:
    import torch

    from eaglekit.capture.sequence import CapturedSequence

FP8_MAX = 448.0  # the largest finite float8 E4M3 (fn) value


def quantize_fp8(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """float8 E4M3 values and float32 scales, one scale per row of the last dimension (amax / 448)."""
    import torch

    x = x.float()
    amax = x.abs().amax(dim=-1)
    scale = torch.where(amax > 0, amax / FP8_MAX, torch.ones_like(amax))
    return (x / scale[..., None]).to(torch.float8_e4m3fn), scale


def _safetensors_bytes(tensors: dict[str, torch.Tensor], metadata: dict[str, str]) -> bytes:
    """A safetensors file's bytes, tensors in name order and the header written by io.writer: the same tensors
    always give the same bytes (the safetensors library orders metadata by a per-process hash)."""
    import torch

    from eaglekit.io.writer import OutTensor, header_bytes

    names = {torch.float32: "F32", torch.bfloat16: "BF16", torch.float8_e4m3fn: "F8_E4M3", torch.int64: "I64",
             torch.uint8: "U8"}
    ordered = sorted(tensors.items())
    head = header_bytes([OutTensor(n, names[t.dtype], tuple(t.shape), lambda: ()) for n, t in ordered], metadata)
    return head + b"".join(t.contiguous().view(torch.uint8).numpy().tobytes() for _, t in ordered)


class StoreWriter:
    """Appends captured records to a store, shard by shard; holds at most one shard's records in memory."""

    def __init__(self, store: str, manifest: dict[str, Any], done: list[Shard], *, aux_ids: Sequence[int],
                 last_id: int, shard_tokens: int, store_dtype: str):
        self.store = store
        self.manifest = manifest
        self.done = list(done)
        self.aux_ids = tuple(aux_ids)
        self.last_id = last_id
        self.shard_tokens = shard_tokens
        self.store_dtype = store_dtype
        self.pending: list[CapturedSequence] = []
        self.pending_tokens = 0

    @property
    def next_record(self) -> int:
        return (self.done[-1].end_record if self.done else 0) + len(self.pending)

    def add(self, record: CapturedSequence) -> Shard | None:
        """Take one record (the next in order); returns the shard it completed, if any."""
        if record.index != self.next_record:
            raise CheckpointError(f"the capture backend returned record {record.index}, expected "
                                  f"{self.next_record}", self.store)
        missing = [i for i in (*self.aux_ids, self.last_id) if i not in record.states]
        if missing:
            raise CheckpointError(f"the capture backend returned no state for layer ids {missing}", self.store)
        self.pending.append(record)
        self.pending_tokens += len(record.token_ids)
        return self.flush() if self.pending_tokens >= self.shard_tokens else None

    def flush(self) -> Shard | None:
        """Publish the pending records as the next shard, then the manifest that lists it."""
        import torch

        if not self.pending:
            return None
        first = self.done[-1].end_record if self.done else 0
        lengths = [len(r.token_ids) for r in self.pending]
        last = torch.cat([r.float_state(self.last_id) for r in self.pending])
        tensors: dict[str, torch.Tensor] = {
            "token_ids": torch.tensor([t for r in self.pending for t in r.token_ids], dtype=torch.int64),
            "offsets": torch.tensor([0, *lengths], dtype=torch.int64).cumsum(0),
            "loss_mask": torch.ones(sum(lengths), dtype=torch.uint8),
        }
        tensors["last"] = last
        tensors.update(self._aux())
        data = _safetensors_bytes(tensors, {"format": FORMAT, "first_record": str(first)})
        shard = Shard(shard_name(len(self.done)), len(data), sha256_bytes(data), first, first + len(lengths),
                      sum(lengths))
        publish_bytes(os.path.join(self.store, shard.file), data, "a store shard")
        self.done.append(shard)
        self.pending, self.pending_tokens = [], 0
        self.write_manifest()
        return shard

    def _aux(self) -> dict[str, torch.Tensor]:
        """The pending records' aux states in the store dtype. An fp8 store keeps the E4M3 values and scales of a
        record that brings them bit for bit (its token's one scale becomes the scale of each id); other records are
        quantized here. Quantizing is per row, so record by record gives the bytes of the whole shard at once."""
        import torch

        if self.store_dtype != "fp8":
            aux = torch.cat([torch.stack([r.float_state(i) for i in self.aux_ids], dim=1) for r in self.pending])
            return {"aux": aux.to(torch.float32 if self.store_dtype == "float32" else torch.bfloat16)}
        values, scales = [], []
        for r in self.pending:
            if r.scale is not None:
                values.append(torch.stack([r.states[i] for i in self.aux_ids], dim=1))
                scales.append(r.scale.to(torch.float32)[:, None].expand(-1, len(self.aux_ids)))
            else:
                value, scale = quantize_fp8(torch.stack([r.float_state(i) for i in self.aux_ids], dim=1))
                values.append(value)
                scales.append(scale)
        return {"aux": torch.cat(values), "aux_scale": torch.cat(scales).contiguous()}

    def write_manifest(self, *, complete: bool = False) -> None:
        self.manifest.update({
            "complete": complete,
            "records": self.done[-1].end_record if self.done else 0,
            "tokens": sum(s.tokens for s in self.done),
            "shards": [s.to_dict() for s in self.done],
        })
        write_manifest(self.store, self.manifest)


def write_manifest(store: str, manifest: dict[str, Any]) -> None:
    text = json.dumps(manifest, indent=1, sort_keys=True) + "\n"
    publish_bytes(os.path.join(store, MANIFEST), text.encode("utf-8"), "the store manifest")


def write_plan(store: str, sequences: Sequence[Sequence[int]]) -> str:
    """Publish the planned sequences; returns their file's SHA-256 (the manifest's `plan.sha256`)."""
    import torch

    lengths = [len(s) for s in sequences]
    data = _safetensors_bytes({
        "token_ids": torch.tensor([t for s in sequences for t in s], dtype=torch.int64),
        "offsets": torch.tensor([0, *lengths], dtype=torch.int64).cumsum(0),
    }, {"format": FORMAT})
    publish_bytes(os.path.join(store, PLAN), data, "the planned sequences")
    return sha256_bytes(data)


def publish_bytes(path: str, data: bytes, what: str) -> None:
    """One file of the store, replaced whole: a rerun that writes it again writes the same bytes."""
    from eaglekit.io.publish import Staged, publish

    def write(stage: Staged) -> None:
        with open(stage.path, "wb") as fh:
            fh.write(data)

    publish(path, write, replace=True, what=what)
