"""Writing a hidden-state store (layout: eaglekit.capture.store): each shard, the plan and the manifest is one file
published atomically through eaglekit.io.publish; a new store's manifest before its plan, and a shard before the
manifest that lists it, so a shard is part of the store only once that manifest is in place. The bytes depend on
the records alone (no timestamps, tensors and metadata in a fixed order): a resumed capture is byte-identical to an
uninterrupted one.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import TYPE_CHECKING

from eaglekit.capture.manifest import Manifest
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
    """Appends captured records to a store, shard by shard, as its manifest describes them (aux ids, id L, shard
    size, store dtype); holds at most one shard's records in memory."""

    def __init__(self, store: str, manifest: Manifest, done: list[Shard]):
        self.store = store
        self.manifest = manifest
        self.done = list(done)
        self.aux_ids = manifest.layer_ids.aux
        self.last_id = manifest.layer_ids.last
        self.shard_tokens = manifest.store.shard_tokens
        self.store_dtype = manifest.store.dtype
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
        write_manifest(self.store, self.manifest.with_shards(self.done, complete=complete))


def write_manifest(store: str, manifest: Manifest) -> None:
    publish_bytes(os.path.join(store, MANIFEST), manifest.to_json(), "the store manifest")


def plan_bytes(sequences: Sequence[Sequence[int]]) -> bytes:
    """The planned sequences' file (the manifest's `plan.sha256` is its digest, written before it)."""
    import torch

    lengths = [len(s) for s in sequences]
    return _safetensors_bytes({
        "token_ids": torch.tensor([t for s in sequences for t in s], dtype=torch.int64),
        "offsets": torch.tensor([0, *lengths], dtype=torch.int64).cumsum(0),
    }, {"format": FORMAT})


def write_plan(store: str, data: bytes) -> None:
    publish_bytes(os.path.join(store, PLAN), data, "the planned sequences")


def publish_bytes(path: str, data: bytes, what: str) -> None:
    """One file of the store, replaced whole: a rerun that writes it again writes the same bytes."""
    from eaglekit.io.publish import Staged, publish

    def write(stage: Staged) -> None:
        with open(stage.path, "wb") as fh:
            fh.write(data)

    publish(path, write, replace=True, what=what)
