"""Capture inputs: a prompts file and the CaptureOptions the capture tests (and their killed subprocess) share."""

from __future__ import annotations

import json

AUX = (1, 2)
SHARD_TOKENS = 100


def write_prompts(path: str, count: int = 12) -> str:
    with open(path, "w", encoding="utf-8") as fh:
        for i in range(count):
            body = f"def area_{i}(r):\n    return 3.14159 * r * r + {i}\n" * (1 + i % 3)
            fh.write(json.dumps({"prompt": f"Explain this code:\n{body}"}) + "\n")
    return path


def options(env, **changes):
    """CaptureOptions for `env` ({"target", "data"}): aux ids AUX, float32 shards of SHARD_TOKENS tokens."""
    from eaglekit.capture.plan import DataOptions
    from eaglekit.capture.run import CaptureOptions

    changes.setdefault("aux_ids", AUX)
    return CaptureOptions(target=env["target"], data=DataOptions(data_file=env["data"], **changes.pop("data", {})),
                          shard_tokens=SHARD_TOKENS, store_dtype=changes.pop("store_dtype", "float32"), **changes)


def synthetic_store(path: str, target: str, data: str, *, records: int = 6, shard_tokens: int = 16,
                    store_dtype: str = "float32", seed: int = 0) -> str:
    """A complete store written through eaglekit's own store writer, of random states instead of the target's
    (no model is run): its identity is `target`'s and `data`'s, as a capture's would be, so every reader takes it."""
    import dataclasses
    import os

    import torch

    from eaglekit.capture import store_writer
    from eaglekit.capture.manifest import Manifest, Plan
    from eaglekit.capture.run import data_record, store_identity
    from eaglekit.capture.sequence import CapturedSequence
    from eaglekit.capture.store import sha256_bytes
    from eaglekit.target import read_target

    info = read_target(target)
    opts = options({"target": target, "data": data}, aux_ids=AUX, store_dtype=store_dtype)
    record, _ = data_record(opts)
    engine = {"name": "reference", "version": "random states", "dtype": "float32", "quantization": None,
              "tensor_parallel_size": 1, "engine_args": {}}
    inputs = {"sha256": f"{seed:064x}", "source": f"{record.file} (random states)", "data": record.to_dict()}
    identity = store_identity(info, AUX, engine, inputs, dataclasses.replace(opts, shard_tokens=shard_tokens), path)
    generator = torch.Generator().manual_seed(seed)
    sequences = [torch.randint(0, info.vocab_size, (3 + (r * 5 + seed) % 9,), generator=generator).tolist()
                 for r in range(records)]
    os.mkdir(path)
    plan = store_writer.plan_bytes(sequences)
    manifest = Manifest(identity, Plan(sha256_bytes(plan), len(sequences), sum(map(len, sequences))))
    store_writer.write_manifest(path, manifest)
    store_writer.write_plan(path, plan)
    writer = store_writer.StoreWriter(path, manifest, [])
    for index, ids in enumerate(sequences):
        states = {i: torch.randn(len(ids), info.hidden_size, generator=generator) for i in (*AUX, info.num_layers)}
        writer.add(CapturedSequence(index=index, token_ids=tuple(ids), states=states))
    writer.flush()
    writer.write_manifest(complete=True)
    return path
