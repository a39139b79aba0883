"""Read the aux hidden states that vLLM's `extract_hidden_states` speculative method writes to disk (as vLLM's
connector writes them, or quantized to FP8 by speculators' hs-connectors).

For targets too large for one process, vLLM itself captures the states: `speculative_config={"method":
"extract_hidden_states", "num_speculative_tokens": 1, "draft_model_config": {"hf_config":
{"eagle_aux_hidden_state_layer_ids": [...]}}}` together with `kv_transfer_config={"kv_connector":
"ExampleHiddenStatesConnector", "kv_role": "kv_producer", "kv_connector_extra_config": {"shared_storage_path":
DIR}}`. A dummy draft model stores the stacked target states in its KV cache, and the connector writes them
out when each request finishes. The layout, as the vLLM source writes it (since vLLM 0.18.0, PR #33736):

* one file per request, `DIR/<request id>.safetensors` (a client may give another path through
  `kv_transfer_params["hidden_states_path"]`), next to an empty `<file>.lock` used as a write lock;
  speculators' data generation renames the files to `hs_<sample index>.safetensors`;
* exactly two tensors and no `__metadata__`:
  `hidden_states` [num_tokens, num_layers, hidden_size], the model dtype (bf16 / fp16 / fp32), and
  `token_ids` [num_tokens] int64: the prompt's token ids, or, when the request sets
  `kv_transfer_params["include_output_tokens"]`, prompt plus generated tokens without the last generated one
  (it was never fed to the model, so it has no state);
* layer slot j holds the j-th smallest id of `eagle_aux_hidden_state_layer_ids`: the target appends a state
  while it walks its layers, so the slots follow layer order, not the order of the list. Id i is the residual
  stream entering decoder layer i (0: the embeddings); id `num_hidden_layers` is the last layer's output,
  before the final norm. The ids themselves are not written anywhere, so the caller names them
  (`captured_ids`);
* no logits and no predicted tokens are saved.

speculators' hs-connectors (0.9.0, `FP8HiddenStatesConnector`, loaded with `kv_connector_module_path:
"hs_connectors.fp8_hidden_states_connector"`) writes the same files with the states quantized: `hidden_states`
F8_E4M3 [num_tokens, num_layers, hidden_size], a third tensor `hidden_states_scales` F32 [num_tokens, 1, 1] (one
scale per token over all its layers: max(amax / 448, 1e-12)), and `token_ids` as vLLM's; a state's value is its
E4M3 value times its token's scale (read from hs_connectors/src/hs_connectors/fp8_hidden_states_connector.py
`_write_tensors` and fp8_utils.py `quantize_tensor_to_fp8`; its reader, transfer.py `FP8Transfer`, dequantizes
to bfloat16 by default, rounding the scale to bfloat16 first; eaglekit multiplies in float32).

Read from vllm-project/vllm: vllm/distributed/kv_transfer/kv_connector/v1/example_hidden_states_connector.py
(`_submit_async_write`, `request_finished`, `build_connector_meta`), vllm/model_executor/models/
extract_hidden_states.py, vllm/v1/spec_decode/extract_hidden_states.py (`propose` stacks the states on dim 1),
vllm/model_executor/models/interfaces.py (`EagleModelMixin._maybe_add_hidden_state`) and
docs/features/speculative_decoding/extract_hidden_states.md. The consumer checked against is
vllm-project/speculators (src/speculators/train/data.py, hs_connectors/src/hs_connectors/transfer.py,
scripts/launch_vllm.py): it treats `hidden_states[:, :-1]` as the aux states, and treats `hidden_states[:, -1]`
(id `num_hidden_layers`, which its launcher appends) as the state it turns into the target's logits at
training time.
"""

from __future__ import annotations

import operator
import os
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from eaglekit.capture.sequence import LabelledStates
from eaglekit.errors import CheckpointError, UsageError
from eaglekit.io.header import read_header
from eaglekit.io.jsonfile import open_regular

if TYPE_CHECKING:
    import torch

STATES = "hidden_states"
TOKENS = "token_ids"
SCALES = "hidden_states_scales"
"""hs-connectors' FP8 layout: the states as float8 E4M3 and one float32 scale per token, [num_tokens, 1, 1]."""
SUFFIX = ".safetensors"
IGNORE_INDEX = -100
"""The label of a position nothing in the files predicts (the last one of each sequence)."""
STATE_DTYPES = ("BF16", "F16", "F32")
FP8_DTYPE = "F8_E4M3"
TOKEN_DTYPES = ("I64", "I32")
MAX_HEADER_BYTES = 1 << 16
"""A capture file's header names three tensors in a few hundred bytes; a longer one is not such a file."""
MAX_TOKENS = 1 << 24
"""Tokens of one request's file: above any served context (10M), so a header cannot make a reader allocate more
than a real request holds."""
DTYPE_NAMES = {"BF16": "bfloat16", "F16": "float16", "F32": "float32", FP8_DTYPE: "float8_e4m3fn"}


@dataclass(frozen=True)
class CaptureFileLayout:
    """What one request's file holds, read from its header alone."""

    path: str
    tokens: int
    layers: int
    hidden: int
    dtype: str  # the states' safetensors dtype; F8_E4M3 only with per-token scales (hs-connectors)

    @property
    def quantized(self) -> bool:
        return self.dtype == FP8_DTYPE


@dataclass(frozen=True)
class CaptureFileStates:
    """One request's token ids and the states of the requested layers, as the file holds them."""

    token_ids: torch.Tensor  # int64 [n]
    states: torch.Tensor  # [n, K, T] in the file's dtype (float8 E4M3 for an hs-connectors FP8 file)
    scales: torch.Tensor | None  # float32 [n]: an E4M3 state times its token's scale is its value

    def dequantized(self) -> torch.Tensor:
        """float32 [n, K, T]: E4M3 values times their token's scale in float32 (hs-connectors' formula, without its
        default rounding of the scale and the product to bfloat16), or the float states as they are."""
        import torch

        if self.scales is None:
            return self.states.to(torch.float32)
        return self.states.to(torch.float32) * self.scales[:, None, None]


def read_captured_states(directory: str, aux_ids: Sequence[int], *, captured_ids: Sequence[int] | None = None,
                         max_files: int | None = None) -> dict[str, torch.Tensor]:
    """Read a directory of vLLM extract_hidden_states files into eaglekit's training layout.

    `aux_ids` are the states the draft reads (vLLM's ids). `captured_ids` are the
    `eagle_aux_hidden_state_layer_ids` vLLM was started with. The files do not record them, so without this
    argument the files must hold exactly `aux_ids`. `max_files` reads only the first files. Files are read
    in natural name order (`hs_2` before `hs_10`), so the same directory always gives the same rows.

    Returns one row per captured token, all sequences concatenated:
    "tokens" int64 [N]; "aux" bf16 [N, K*T], the K requested states in ascending id order; "offsets" int64
    [S+1], where each sequence starts and ends; "labels" int64 [N], the sequence's own next token, and
    IGNORE_INDEX at the last position of each sequence.

    What the labels lose: the files hold no target predictions. Where the target wrote the text itself
    (tokens it generated greedily with `include_output_tokens`, or data regenerated by the target), the next
    token is the target's greedy token. Over prompt text it is the data's token, which the target may not have
    predicted. The target's prediction after the last position is lost (vLLM leaves out the last generated
    token). To get true greedy labels, capture id `num_hidden_layers` as well and apply the target's final
    norm and lm_head to that state, as speculators does at training time.
    """
    import torch

    wanted = _ids(aux_ids, "aux ids")
    held = _ids(captured_ids, "captured ids") if captured_ids is not None else None
    tokens, labels, aux, offsets = [], [], [], [0]
    first: tuple[str, tuple[int, int]] | None = None  # (file, (layers, hidden)) every later file must match
    for path in _capture_files(directory, max_files):
        got, layout = _read_file(path, wanted, held)
        ids, shape = got.token_ids, (layout.layers, layout.hidden)
        states = got.dequantized().reshape(layout.tokens, -1).to(torch.bfloat16)
        if first is None:
            first = (path, shape)
        elif shape != first[1]:
            raise CheckpointError(f"holds {shape[0]} layers of hidden size {shape[1]}, but "
                                  f"{os.path.basename(first[0])} holds {first[1][0]} of size {first[1][1]}", path)
        tokens.append(ids)
        labels.append(torch.cat([ids[1:], torch.tensor([IGNORE_INDEX], dtype=torch.int64)]))
        aux.append(states)
        offsets.append(offsets[-1] + len(ids))
    return {"tokens": torch.cat(tokens), "labels": torch.cat(labels), "aux": torch.cat(aux),
            "offsets": torch.tensor(offsets, dtype=torch.int64)}


def read_labelled_files(directory: str, aux_ids: Sequence[int], *, captured_ids: Sequence[int] | None = None
                        ) -> LabelledStates:
    """read_captured_states as labelled rows, named by the SHA-256 of their tokens, labels and boundaries."""
    import hashlib

    rows = read_captured_states(directory, aux_ids, captured_ids=captured_ids)
    digest = hashlib.sha256()
    for key in ("tokens", "labels", "offsets"):
        digest.update(rows[key].contiguous().numpy().tobytes())
    return LabelledStates(tokens=rows["tokens"], labels=rows["labels"], aux=rows["aux"], offsets=rows["offsets"],
                          digest=digest.hexdigest(), source=os.path.abspath(directory))


def _ids(ids: Sequence[int], what: str) -> tuple[int, ...]:
    """Ascending, distinct layer ids. vLLM stores one slot per distinct id, in ascending order."""
    ids = list(ids) if ids is not None else []
    try:
        values = [operator.index(i) for i in ids if not isinstance(i, bool)]
    except TypeError:
        values = []
    if not values or len(values) != len(ids) or min(values) < 0:
        raise UsageError(f"{what} must be a non-empty list of layer indices >= 0, got {ids}")
    if len(set(values)) != len(values):
        raise UsageError(f"{what} must not repeat a layer: {values}")
    return tuple(sorted(values))


def _natural_key(name: str) -> list:
    """Sort `hs_2` before `hs_10`: digit runs compare as numbers."""
    return [int(part) if part.isdigit() else part for part in re.split(r"(\d+)", name)]


def _capture_files(directory: str, max_files: int | None) -> list[str]:
    if max_files is not None and max_files < 1:
        raise UsageError(f"max_files must be at least 1, got {max_files}")
    if not os.path.isdir(directory):
        raise CheckpointError("is not a directory (vLLM's shared_storage_path, one <request id>.safetensors "
                              "per request)", directory)
    names = sorted((n for n in os.listdir(directory)
                    if n.endswith(SUFFIX) and os.path.isfile(os.path.join(directory, n))), key=_natural_key)
    if not names:
        raise CheckpointError("holds no *.safetensors files (vLLM's ExampleHiddenStatesConnector writes one "
                              "<request id>.safetensors per request)", directory)
    return [os.path.join(directory, n) for n in names[:max_files]]


def _slots(path: str, layers: int, wanted: tuple[int, ...], held: tuple[int, ...] | None) -> list[int]:
    """The file's layer slot of each requested id."""
    if held is None:
        if layers != len(wanted):
            raise CheckpointError(f"holds {layers} captured layers but {len(wanted)} aux ids {list(wanted)} were "
                                  "requested; the files do not record their layer ids, so pass captured_ids "
                                  "(the eagle_aux_hidden_state_layer_ids vLLM ran with)", path)
        held = wanted
    elif layers != len(held):
        raise CheckpointError(f"holds {layers} captured layers, but captured_ids names {len(held)}: {list(held)}",
                              path)
    missing = [i for i in wanted if i not in held]
    if missing:
        raise CheckpointError(f"aux ids {missing} were not captured: the file holds layer ids {list(held)}", path)
    return [held.index(i) for i in wanted]


def capture_files(directory: str) -> list[str]:
    """The directory's capture files in natural name order (the order their records are read in)."""
    return _capture_files(directory, None)


def _refuse_other_formats(path: str) -> None:
    """Refuse a pickle, a torch.save archive or any file whose first 8 bytes declare no small header, reading
    nothing past them: nothing is ever unpickled."""
    with open_regular(path, "capture file") as fh:
        try:
            head = fh.read(8)
        except OSError as exc:
            raise CheckpointError(f"cannot read: {exc.strerror or exc}", path) from None
    if head.startswith(b"PK\x03\x04"):
        raise CheckpointError("is not a readable safetensors file: it is a zip archive (torch.save writes one), "
                              "which eaglekit never unpickles", path)
    if len(head) >= 2 and head[0] == 0x80 and 2 <= head[1] <= 5:
        raise CheckpointError("is not a readable safetensors file: it is a Python pickle, which eaglekit never "
                              "unpickles", path)
    if len(head) == 8 and int.from_bytes(head, "little") > MAX_HEADER_BYTES:
        raise CheckpointError(f"is not a readable safetensors file: its first 8 bytes declare a header of "
                              f"{int.from_bytes(head, 'little')} bytes (a capture file's has a few hundred)", path)


def read_layout(path: str) -> CaptureFileLayout:
    """A capture file's layout from its header alone (bounded reads; no tensor byte): vLLM's two tensors, or
    hs-connectors' FP8 three. Anything else is refused in one line naming the file."""
    _refuse_other_formats(path)
    try:
        entries = read_header(path).entries
    except CheckpointError as exc:
        raise CheckpointError(f"is not a readable safetensors file: {str(exc).removeprefix(f'{path}: ')}",
                              path) from None
    quantized = SCALES in entries
    expected = sorted((STATES, TOKENS, SCALES) if quantized else (STATES, TOKENS))
    if sorted(entries) != expected:
        raise CheckpointError(f"holds tensors {sorted(entries)[:8]}; vLLM's extract_hidden_states files hold exactly "
                              f"{sorted((STATES, TOKENS))}, hs-connectors' FP8 files also {SCALES!r}", path)
    states, ids = entries[STATES], entries[TOKENS]
    shape, count = list(states.shape), list(ids.shape)
    if ids.dtype not in TOKEN_DTYPES or len(count) != 1:
        raise CheckpointError(f"{TOKENS} is {ids.dtype} {count}, expected int64 [num_tokens]", path)
    if states.dtype not in ((FP8_DTYPE,) if quantized else STATE_DTYPES) or len(shape) != 3:
        kind = "F8_E4M3 (it has per-token scales)" if quantized else "a float tensor"
        raise CheckpointError(f"{STATES} is {states.dtype} {shape}, expected {kind} [num_tokens, num_layers, "
                              "hidden_size]", path)
    if count[0] == 0:
        raise CheckpointError(f"{TOKENS} is empty (a prompt-embeds request has no token ids)", path)
    if shape[0] != count[0]:
        raise CheckpointError(f"{TOKENS} has {count[0]} tokens but {STATES} has {shape[0]} rows", path)
    if count[0] > MAX_TOKENS:
        raise CheckpointError(f"{TOKENS} has {count[0]} tokens, more than the {MAX_TOKENS} of any served context",
                              path)
    if 0 in shape[1:]:
        raise CheckpointError(f"{STATES} is {shape}: it holds no layer or no hidden unit", path)
    if quantized and (entries[SCALES].dtype != "F32" or list(entries[SCALES].shape) != [count[0], 1, 1]):
        raise CheckpointError(f"{SCALES} is {entries[SCALES].dtype} {list(entries[SCALES].shape)}, expected F32 "
                              f"[{count[0]}, 1, 1] (one scale per token)", path)
    return CaptureFileLayout(path, count[0], shape[1], shape[2], states.dtype)


def read_token_ids(layout: CaptureFileLayout):
    """(token ids int64 [n], the per-token scales float32 [n] or None) of a file whose layout was read; scales
    that are not finite and positive are refused (hs-connectors writes max(amax / 448, 1e-12))."""
    token_ids, scales, _ = _read_tensors(layout, None)
    return token_ids, scales


def _read_tensors(layout: CaptureFileLayout, slots: Sequence[int] | None):
    """(token ids, scales or None, the states of layer slots `slots` or None) of a file whose layout was read."""
    import torch
    from safetensors import SafetensorError, safe_open

    path = layout.path
    try:
        with safe_open(path, framework="pt") as fh:
            _check_unchanged(fh, layout)
            token_ids = fh.get_tensor(TOKENS).to(torch.int64)
            scales = fh.get_tensor(SCALES).reshape(-1) if layout.quantized else None
            states = fh.get_slice(STATES)
            picked = None if slots is None else torch.cat([states[:, s : s + 1, :] for s in slots], dim=1)
    except (SafetensorError, OSError) as exc:
        raise _unreadable(path, exc) from None
    if scales is not None and not bool((usable := torch.isfinite(scales) & (scales > 0)).all()):
        bad = int((~usable).nonzero()[0, 0])
        raise CheckpointError(f"{SCALES} of token {bad} is {scales[bad].item()}: a scale must be finite and "
                              "positive", path)
    return token_ids, scales, picked


def _check_unchanged(fh, layout: CaptureFileLayout) -> None:
    if list(fh.get_slice(STATES).get_shape()) != [layout.tokens, layout.layers, layout.hidden]:
        raise CheckpointError("changed while it was being read", layout.path)


def _unreadable(path: str, exc: Exception) -> CheckpointError:
    lock = " (its .lock is still there: vLLM may still be writing it)" if os.path.exists(path + ".lock") else ""
    return CheckpointError(f"is not a readable safetensors file{lock}: {exc}", path)


def read_capture_file(path: str, wanted: Sequence[int], captured_ids: Sequence[int]) -> CaptureFileStates:
    """One request's file: its token ids and the states of `wanted` (as the file holds them)."""
    return _read_file(path, _ids(wanted, "aux ids"), _ids(captured_ids, "captured ids"))[0]


def _read_file(path: str, wanted: tuple[int, ...], held: tuple[int, ...] | None
               ) -> tuple[CaptureFileStates, CaptureFileLayout]:
    """(the requested states of one request's file, its layout); only the requested layers are read."""
    import torch

    layout = read_layout(path)
    token_ids, scales, picked = _read_tensors(layout, _slots(path, layout.layers, wanted, held))
    if layout.quantized:  # E4M3 has no infinity; its NaN is every exponent and mantissa bit set
        finite = bool(((picked.view(torch.uint8) & 0x7F) != 0x7F).all())
    else:
        finite = bool(torch.isfinite(picked).all())
    if not finite:
        raise CheckpointError(f"{STATES} holds NaN or infinite values in the requested layers", path)
    return CaptureFileStates(token_ids, picked, scales), layout
