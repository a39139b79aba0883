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
    from eaglekit.capture.run import CaptureOptions
    from eaglekit.finetune.data import DataOptions

    changes.setdefault("aux_ids", AUX)
    return CaptureOptions(target=env["target"], data=DataOptions(data_file=env["data"], **changes.pop("data", {})),
                          shard_tokens=SHARD_TOKENS, store_dtype=changes.pop("store_dtype", "float32"), **changes)
