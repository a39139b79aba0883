"""Data parallel under `torchrun`: which rank this process is, the sums every rank shares, and which part of a
store's shards each rank reads (so no shard is read twice). A single process needs none of it: every helper is a
no-op for a world of one.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class Ranks:
    rank: int = 0
    world: int = 1

    @property
    def main(self) -> bool:
        return self.rank == 0


def init_distributed(device: torch.device) -> Ranks:
    """Join the process group torchrun describes (WORLD_SIZE > 1); a single process otherwise."""
    import torch.distributed as dist

    if int(os.environ.get("WORLD_SIZE", "1")) <= 1:
        return Ranks()
    if not dist.is_initialized():
        dist.init_process_group("nccl" if device.type == "cuda" else "gloo")
    return Ranks(dist.get_rank(), dist.get_world_size())


def leave_distributed(ranks: Ranks) -> None:
    """Destroy the process group before the interpreter exits: a gloo group torn down by the interpreter's own
    shutdown can abort the rank ("terminate called without an active exception") after its work is done."""
    from datetime import timedelta

    import torch.distributed as dist

    if ranks.world > 1 and dist.is_initialized():
        if dist.get_backend() == "gloo":  # every rank idle before any tears down: no work left in flight
            dist.monitored_barrier(timeout=timedelta(days=1))  # rank 0 may still be measuring its output
        dist.destroy_process_group()


def owned_sequences(data, ranks: Ranks) -> set[int] | None:
    """The sequences this rank reads when the data streams from a store under torchrun: those in the shards it
    owns (shard index modulo the world size), so no shard is read by two ranks; None where every rank holds every
    row in memory."""
    shard_of = getattr(data.aux, "shard_of", None)
    if ranks.world == 1 or shard_of is None:
        return None
    owners = (shard_of(data.offsets[:-1]) % ranks.world).tolist()
    return {i for i, owner in enumerate(owners) if owner == ranks.rank}


def reading_per_rank(data, ranks: Ranks) -> dict[str, list] | None:
    """Which shards each rank read and its peak RSS (MB): the measure that the ranks split a store's reading."""
    import resource

    read = getattr(data.aux, "read", None)
    if read is None:
        return None
    mine = {"shards": sorted(read), "peak_rss_mb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1)}
    every = [mine]
    if ranks.world > 1:
        import torch.distributed as dist

        every = [{} for _ in range(ranks.world)]
        dist.all_gather_object(every, mine)
    return {"shards_read": [r["shards"] for r in every], "peak_rss_mb": [r["peak_rss_mb"] for r in every]}


def all_reduce(tensor: torch.Tensor, ranks: Ranks) -> torch.Tensor:
    if ranks.world > 1:
        import torch.distributed as dist

        dist.all_reduce(tensor)
    return tensor


def barrier(ranks: Ranks) -> None:
    if ranks.world > 1:
        import torch.distributed as dist

        dist.barrier()
