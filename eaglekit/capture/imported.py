"""`capture --import`: request files of vLLM's extract_hidden_states (bfloat16 / float16 / float32 states) or of
speculators' hs-connectors FP8 connector (E4M3 states, one float32 scale per token) read as capture records.

Every file is checked against the target before the store is touched: its layout and header (nothing unpickled,
bounded reads), its layer count against --captured-ids, its hidden size against the target's, its token ids
against the target's vocabulary, its scales (finite and positive). Only then is a store folder made.
"""

from __future__ import annotations

import os
from collections import Counter
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

from eaglekit.capture.sequence import CapturedSequence
from eaglekit.capture.vllm_files import (
    DTYPE_NAMES,
    TOKENS,
    CaptureFileLayout,
    capture_files,
    read_capture_file,
    read_layout,
    read_token_ids,
)
from eaglekit.errors import CheckpointError
from eaglekit.target import TargetInfo


@dataclass(frozen=True)
class ImportedFiles:
    """The checked files of an import, in the order their records are read, and their token ids."""

    directory: str
    layouts: list[CaptureFileLayout]
    sequences: list[list[int]]

    @property
    def files(self) -> list[str]:
        return [layout.path for layout in self.layouts]

    @property
    def quantized(self) -> int:
        """How many files hold hs-connectors' E4M3 states."""
        return sum(layout.quantized for layout in self.layouts)

    def dtype(self) -> str:
        """The files' state dtypes, as the store's engine block records them."""
        counts = Counter(DTYPE_NAMES[layout.dtype] + (" with a float32 scale per token" if layout.quantized else "")
                         for layout in self.layouts)
        return ", ".join(name if len(counts) == 1 else f"{name} ({n} files)" for name, n in sorted(counts.items()))

    def describe(self) -> str:
        kinds = [f"{n} {what}" for n, what in ((len(self.layouts) - self.quantized, "vLLM extract_hidden_states"),
                                                (self.quantized, "hs-connectors FP8")) if n]
        # the folder's name, never its local path: a store may be published
        return f"{os.path.basename(os.path.normpath(self.directory))} ({' and '.join(kinds)} files)"


def check_import(directory: str, info: TargetInfo, captured_ids: Sequence[int]) -> ImportedFiles:
    """Every file of `directory` checked against the target and `captured_ids`, its token ids read: the first
    problem is refused in one line naming the file, before anything is written."""
    layouts, sequences = [], []
    for path in capture_files(directory):
        layout = read_layout(path)
        if layout.hidden != info.hidden_size:
            raise CheckpointError(f"holds states of hidden size {layout.hidden}; the target's hidden_size is "
                                  f"{info.hidden_size}", path)
        if layout.layers != len(captured_ids):
            raise CheckpointError(f"holds {layout.layers} captured layers, but --captured-ids names "
                                  f"{len(captured_ids)}: {sorted(captured_ids)}", path)
        token_ids, _ = read_token_ids(layout)  # the scales are checked as they are read
        outside = ((token_ids < 0) | (token_ids >= info.vocab_size)).nonzero()
        if outside.numel():
            at = int(outside[0, 0])
            raise CheckpointError(f"{TOKENS}[{at}] is {int(token_ids[at])}, outside the target's vocabulary [0, "
                                  f"{info.vocab_size})", path)
        layouts.append(layout)
        sequences.append(token_ids.tolist())
    return ImportedFiles(directory, layouts, sequences)


def imported_records(files: ImportedFiles, planned: Sequence[Sequence[int]], layer_ids: Sequence[int],
                     captured_ids: Sequence[int]) -> Iterator[CapturedSequence]:
    """The records of the last len(planned) files (a resumed import skips the ones its store holds); fp8 states
    stay E4M3 with their per-token scales, so an fp8 store keeps them bit for bit."""
    for index, (path, expected) in enumerate(zip(files.files[len(files.files) - len(planned):], planned)):
        got = read_capture_file(path, layer_ids, captured_ids)
        if got.token_ids.tolist() != list(expected):
            raise CheckpointError("changed since it was checked (its token ids differ)", path)
        yield CapturedSequence(index=index, token_ids=tuple(expected),
                               states={i: got.states[:, k] for k, i in enumerate(layer_ids)}, scale=got.scales)
