"""Read tensor values by byte range: numpy without torch, torch when the caller computes."""

from __future__ import annotations

import os
from functools import lru_cache

import numpy as np

from eaglekit.errors import CheckpointError
from eaglekit.io.dtypes import NUMPY_DTYPES
from eaglekit.spec import DraftSpec, TensorRef


def read_bytes(root: str, ref: TensorRef) -> bytes:
    """The exact bytes of one tensor; a short read (truncated file) is an error naming the tensor."""
    path = os.path.join(root, ref.file)
    if ref.data_start < 0:
        raise CheckpointError(f"tensor {ref.source_name!r} lives in a pickle file; no raw byte range", path)
    with open(path, "rb") as fh:
        fh.seek(ref.data_start)
        data = fh.read(ref.nbytes)
    if len(data) != ref.nbytes:
        raise CheckpointError(f"tensor {ref.source_name!r}: file truncated ({len(data)} of {ref.nbytes} bytes)", path)
    return data


def read_array(spec: DraftSpec, name: str, *, as_float32: bool = False) -> np.ndarray:
    """A tensor as a numpy array. BF16 is widened exactly to float32 (numpy has no bfloat16)."""
    ref = spec.tensors[name]
    if ref.data_start < 0:
        return load_tensor(spec, name).float().numpy() if as_float32 else load_tensor(spec, name).numpy()
    raw = read_bytes(spec.path, ref)
    if ref.dtype == "BF16":
        bits = np.frombuffer(raw, dtype="<u2").astype(np.uint32) << 16
        return bits.view(np.float32).reshape(ref.shape)
    if ref.dtype not in NUMPY_DTYPES:
        raise CheckpointError(f"tensor {name!r}: dtype {ref.dtype} cannot be read without torch", ref.file)
    arr = np.frombuffer(raw, dtype=np.dtype(NUMPY_DTYPES[ref.dtype]).newbyteorder("<")).reshape(ref.shape)
    return arr.astype(np.float32) if as_float32 else arr


@lru_cache(maxsize=2)
def _pickle_state(path: str):
    import torch

    return torch.load(path, map_location="cpu", weights_only=True)


def load_tensor(spec: DraftSpec, name: str, *, device="cpu", dtype=None):
    """A tensor as a torch tensor (private copy), optionally moved and cast."""
    import torch

    from eaglekit.io.dtypes import torch_dtype

    ref = spec.tensors[name]
    if ref.data_start < 0:
        tensor = _pickle_state(os.path.join(spec.path, ref.file))[ref.source_name].clone()
    else:
        raw = bytearray(read_bytes(spec.path, ref))
        if ref.nbytes == 0:
            tensor = torch.empty(ref.shape, dtype=torch_dtype(ref.dtype))
        else:
            tensor = torch.frombuffer(raw, dtype=torch_dtype(ref.dtype)).reshape(ref.shape)
    if dtype is not None and tensor.is_floating_point():
        tensor = tensor.to(dtype)
    return tensor.to(device)


def load_state_dict(spec: DraftSpec, *, device="cpu", dtype=None) -> dict:
    """Every tensor under its canonical name."""
    return {name: load_tensor(spec, name, device=device, dtype=dtype) for name in spec.tensors}
