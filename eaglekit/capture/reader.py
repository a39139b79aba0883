"""A store read as training data: token ids, offsets and labels in memory, aux states streamed shard by shard.

Labels are the target's greedy tokens, argmax(lm_head · final_norm(id L)), computed once per shard from the
target's head tensors alone. The aux states stay on disk: `StoreRows` fetches the rows a batch asks for from the
shards that hold them, keeping at most `max_resident` decoded shards in memory.
"""

from __future__ import annotations

import hashlib
import os
from collections import OrderedDict
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from eaglekit.capture import store as st
from eaglekit.capture.manifest import Manifest
from eaglekit.capture.plan import HELD_OUT_FRACTION
from eaglekit.capture.sequence import CalibrationRecords, CapturedSequence, LabelledStates
from eaglekit.errors import CheckpointError, UsageError
from eaglekit.runner import REFERENCE
from eaglekit.target import TargetInfo

if TYPE_CHECKING:
    import torch

IGNORE = -100


class StoreRows:
    """The rows [N, K*H] of a store's aux states (`columns` picks the aux ids wanted), read lazily: a slice or an
    index tensor gives a float32 tensor; an index tensor applied to the view gives another view (no rows read)."""

    def __init__(self, store: str, manifest: Manifest, starts: torch.Tensor, columns: list[int], max_resident: int,
                 rows: torch.Tensor | None = None):
        self.store, self.manifest, self.starts = store, manifest, starts  # starts[i]: first row of shard i
        self.shards, self.hidden = manifest.shards, manifest.target.hidden_size
        self.columns, self.max_resident = columns, max_resident
        self.rows = rows  # None: every row, in store order
        self._cache: OrderedDict[int, torch.Tensor] = OrderedDict()
        self.read: set[int] = set()  # the shards this process has read (shared by every view)
        self.loads = 0  # shards read so far (a measure of re-reading)

    @property
    def total(self) -> int:
        return int(self.starts[-1])

    @property
    def shape(self) -> tuple[int, int]:
        return (self.total if self.rows is None else int(self.rows.numel()), len(self.columns) * self.hidden)

    def _shard(self, index: int) -> torch.Tensor:
        if index in self._cache:
            self._cache.move_to_end(index)
            return self._cache[index]
        tensors = st.read_shard(self.store, self.manifest, self.shards[index])
        aux = tensors["aux"][:, self.columns].reshape(-1, self.shape[1])
        self.loads += 1
        self.read.add(index)
        self._cache[index] = aux
        while len(self._cache) > self.max_resident:
            self._cache.popitem(last=False)
        return aux

    def store_rows(self, local: torch.Tensor) -> torch.Tensor:
        return local if self.rows is None else self.rows[local]

    def shard_of(self, local: torch.Tensor) -> torch.Tensor:
        """The shard holding each of these rows of the view."""
        import torch

        return torch.searchsorted(self.starts, self.store_rows(local), right=True) - 1

    def window_of(self, local: torch.Tensor, readers: int = 1) -> torch.Tensor:
        """The window holding each of these rows of the view: training draws a batch from one window at a time, so
        each shard is read once per epoch. A window is `max_resident` consecutive shards per reader: with
        `readers` torchrun ranks each owning the shards whose index is its rank modulo `readers`, every rank keeps
        at most `max_resident` of its own shards resident."""
        import torch

        return torch.div(self.shard_of(local), self.max_resident * readers, rounding_mode="floor")

    def fetch(self, rows: torch.Tensor) -> torch.Tensor:
        """The store rows `rows` (int64 [n]), shard by shard in the order they are first needed."""
        import torch

        out = torch.empty((rows.numel(), self.shape[1]), dtype=torch.float32)
        shard_of = torch.searchsorted(self.starts, rows, right=True) - 1
        for index in dict.fromkeys(shard_of.tolist()):
            picked = (shard_of == index).nonzero().flatten()
            out[picked] = self._shard(index)[rows[picked] - self.starts[index]].to(torch.float32)
        return out

    def in_memory(self) -> torch.Tensor:
        """Every row of the view in the store's dtype (fp8 as float32), read shard by shard: for data that fits."""
        import torch

        rows = torch.cat([self._shard(i) for i in range(len(self.shards))]) if self.shards else torch.zeros(
            (0, self.shape[1]))
        return rows if self.rows is None else rows[self.rows]

    def __getitem__(self, key: Any) -> Any:
        import torch

        if isinstance(key, slice):
            start, stop, step = key.indices(self.shape[0])
            return self.fetch(self.store_rows(torch.arange(start, stop, step, dtype=torch.long)))
        if isinstance(key, torch.Tensor) and key.dtype == torch.long and key.dim() == 1:
            view = StoreRows(self.store, self.manifest, self.starts, self.columns, self.max_resident,
                             key if self.rows is None else self.rows[key])
            view._cache, view.read = self._cache, self.read
            return view
        raise TypeError(f"store rows cannot be indexed by {type(key).__name__}")


def check_store_target(manifest: Manifest, info: TargetInfo, where: str, *,
                       quantization: str | None = None) -> None:
    """Refuse, in one line, a store captured from another target, tokenizer or numerics than this run's."""
    from eaglekit.capture.head import config_digest, tokenizer_identity
    from eaglekit.target import head_digest

    held = manifest.target.to_dict()
    tokenizer = tokenizer_identity(info)
    run = {"config_sha256": config_digest(info), "head_sha256": head_digest(info),
           "tokenizer_sha256": tokenizer["sha256"], "chat_template_sha256": tokenizer["chat_template_sha256"]}
    changed = [k for k, v in run.items() if held.get(k) != v]
    if changed:
        names = {"config_sha256": "config.json", "head_sha256": "final norm / lm_head weights",
                 "tokenizer_sha256": "tokenizer", "chat_template_sha256": "chat template"}
        raise UsageError(f"the store was captured from another target: its {', '.join(names[k] for k in changed)} "
                         f"differ from {os.path.dirname(info.path)}'s", where)
    stored = manifest.engine.quantization if manifest.engine.name == REFERENCE else None
    if stored != quantization:
        raise UsageError(f"the store holds states of the target computed with {stored or 'full precision'} "
                         f"numerics, this run asks for {quantization or 'full precision'}", where)


def store_columns(manifest: Manifest, aux_ids: Sequence[int], where: str) -> list[int]:
    """The store's aux slot of each wanted id (ascending)."""
    held = list(manifest.layer_ids.aux)
    missing = [i for i in sorted(aux_ids) if i not in held]
    if missing:
        raise UsageError(f"the store holds aux ids {held}, not {missing} that the draft reads: capture them "
                         f"(eaglekit capture --aux-layer-ids {','.join(map(str, sorted(aux_ids)))})", where)
    return [held.index(i) for i in sorted(aux_ids)]


def open_complete_store(store: str) -> Manifest:
    """The manifest of a store whose capture finished."""
    manifest = st.read_manifest(store)
    if not manifest.complete:
        raise UsageError("the store is incomplete (its capture was interrupted): rerun the same `eaglekit capture` "
                         "command to finish it", store)
    return manifest


def read_training_store(store: str, info: TargetInfo, aux_ids: Sequence[int], *, device: str = "cpu",
                        max_resident: int = 2, quantization: str | None = None,
                        soft_targets: int = 0) -> LabelledStates:
    """The store as LabelledStates (aux rows streamed); the target's decoder is never read. `soft_targets` k > 0 adds
    the target's top-k next-token probabilities, computed from id L like the labels."""
    import torch

    from eaglekit.capture.head import load_head

    if max_resident < 1:
        raise UsageError("--max-resident-shards must be at least 1")
    manifest = open_complete_store(store)
    shards = manifest.shards
    check_store_target(manifest, info, store, quantization=quantization)
    columns = store_columns(manifest, aux_ids, store)
    head = load_head(info, device)
    if not 0 <= soft_targets <= info.vocab_size:
        raise UsageError(f"--soft-targets {soft_targets}: expected 0 (greedy labels) to the vocabulary size")
    tokens, labels, lengths, soft_ids, soft_probs = [], [], [], [], []
    digest = hashlib.sha256()
    for shard in shards:  # one shard in memory at a time
        tensors = st.read_shard(store, manifest, shard)
        digest.update(shard.sha256.encode())
        tokens.append(tensors["token_ids"])
        greedy = head.greedy(tensors["last"])
        labels.append(torch.where(tensors["loss_mask"].bool(), greedy, torch.full_like(greedy, IGNORE)))
        lengths += tensors["offsets"].diff().tolist()
        if soft_targets:
            ids, probs = head.top_k(tensors["last"], soft_targets)
            soft_ids.append(ids)
            soft_probs.append(probs)
    starts = torch.tensor([0, *[s.tokens for s in shards]], dtype=torch.long).cumsum(0)
    rows = StoreRows(store, manifest, starts, columns, max_resident)
    del head
    if not shards:
        raise CheckpointError("the store holds no records", store)
    notes = [f"states streamed from the store, at most {max_resident} shard(s) resident"]
    if soft_targets:
        notes.append(f"soft targets: the target's top {soft_targets} next-token probabilities from id L, "
                     "renormalised over those in the draft vocabulary")
        digest.update(f"soft-targets={soft_targets}".encode())
    return LabelledStates(tokens=torch.cat(tokens), labels=torch.cat(labels), aux=rows,
                        offsets=torch.tensor([0, *lengths], dtype=torch.long).cumsum(0), digest=digest.hexdigest(),
                        source=f"{os.path.abspath(store)} ({manifest.inputs.source})", notes=notes,
                        soft_ids=torch.cat(soft_ids) if soft_targets else None,
                        soft_probs=torch.cat(soft_probs) if soft_targets else None)


def calibration_from_store(store: str, info: TargetInfo, aux_ids: Sequence[int], *, max_tokens: int = 2048,
                           quantization: str | None = None) -> CalibrationRecords:
    """upgrade's calibration records read from a store, each holding the states of `aux_ids`.

    A store of `capture --calibration` holds upgrade's own fit and held-out sequences; from any other store the
    first records up to `max_tokens` tokens are read, the last quarter of their tokens (whole records) held out."""
    import torch

    from eaglekit.capture.head import load_head

    manifest = open_complete_store(store)
    check_store_target(manifest, info, store, quantization=quantization)
    columns = store_columns(manifest, aux_ids, store)
    fit_records = manifest.inputs.calibration_fit_records
    records: list[CapturedSequence] = []
    count = 0
    for shard in manifest.shards:
        tensors = st.read_shard(store, manifest, shard)
        aux = tensors["aux"][:, columns]
        bounds = tensors["offsets"].tolist()
        for lo, hi in zip(bounds, bounds[1:]):
            records.append(CapturedSequence(len(records), tuple(tensors["token_ids"][lo:hi].tolist()),
                                            {i: aux[lo:hi, k].float() for k, i in enumerate(sorted(aux_ids))}))
            count += hi - lo
            if fit_records is None and count >= max_tokens:
                break
        if fit_records is None and count >= max_tokens:
            break
    if fit_records is None:
        held, tail = 0, 0
        while held < len(records) - 1 and tail < count * HELD_OUT_FRACTION:
            held += 1
            tail += len(records[-held].token_ids)
        fit_records = len(records) - held
    if not 0 < fit_records < len(records):
        raise UsageError(f"the store holds {len(records)} record(s): calibration needs some to fit and some held "
                         "out", store)
    embed = load_head(info).embed_tokens.to(torch.float32)
    where = f"the store {os.path.abspath(store)}: {manifest.inputs.source}"
    return CalibrationRecords(records[:fit_records], records[fit_records:], where, embed)
