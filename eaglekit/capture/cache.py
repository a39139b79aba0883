"""The in-process capture of `finetune --target` and `upgrade --target`: the target run by the reference backend
into a store in the cache, named by what identifies its states (the target by its config, weight headers, head and
tokenizer, the engine and its numerics, the aux ids, the data plan, the store's dtype), so a rerun on the same
inputs reads that store back, and an interrupted one resumes it, as `capture` does.

Where the cache cannot be written, the store is made in a temporary folder and removed once it was read.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import shutil
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass

from eaglekit.capture.plan import content_address
from eaglekit.capture.run import (
    CaptureOptions,
    CaptureReport,
    capture_layer_ids,
    capture_store,
    data_record,
    engine_block,
)
from eaglekit.progress import Progress
from eaglekit.runner import REFERENCE
from eaglekit.target import TargetInfo, read_target

CACHE_FOLDER = "capture"


def default_cache_dir() -> str:
    """$EAGLEKIT_CACHE/capture, else ~/.cache/eaglekit/capture."""
    root = os.environ.get("EAGLEKIT_CACHE") or os.path.join(os.path.expanduser("~"), ".cache", "eaglekit")
    return os.path.join(root, CACHE_FOLDER)


def cache_key(info: TargetInfo, opts: CaptureOptions) -> str:
    """The content address of the store `opts` captures: equal inputs, equal key (the data file by its name and
    SHA-256, never its local path)."""
    from eaglekit.capture.head import config_digest, tokenizer_identity
    from eaglekit.capture.store import FORMAT
    from eaglekit.provenance import target_weight_files, weights_fingerprint
    from eaglekit.target import head_digest

    aux_ids, _ = capture_layer_ids(info, opts)
    data, _ = data_record(opts)
    plan = ({"calibration_tokens": opts.calibration_tokens} if opts.calibration
            else {**dataclasses.asdict(opts.data), "data_file": None})
    return content_address({
        "format": FORMAT, "config": config_digest(info), "tokenizer": tokenizer_identity(info),
        "weights": weights_fingerprint(target_weight_files(info.path)), "head": head_digest(info),
        "aux_ids": list(aux_ids),
        "engine": engine_block(opts), "data": data.to_dict() if data else None, "plan": plan,
        "store": {"dtype": opts.store_dtype, "shard_tokens": opts.shard_tokens}})


@dataclass(frozen=True)
class CachedCapture:
    store: str
    report: CaptureReport
    cached: bool  # False: a temporary store (the cache could not be written), gone once the block ends

    @property
    def reused(self) -> bool:
        """Whether the cache already held every record."""
        return self.report.resumed_from is not None and self.report.captured_records == 0

    @property
    def plan_notes(self) -> list[str]:
        """The capture's notes about its data (the first says where the aux ids came from: the caller knows)."""
        return self.report.notes[1:]


def _writable(folder: str) -> str | None:
    """None when a store can be made in `folder`, else why not."""
    try:
        os.makedirs(folder, exist_ok=True)
    except OSError as exc:
        return exc.strerror or str(exc)
    return None if os.access(folder, os.W_OK | os.X_OK) else "not writable"


@contextlib.contextmanager
def captured(opts: CaptureOptions, cache_dir: str | None = None, *, progress: Progress | None = None,
             purpose: str = "capturing calibration states") -> Iterator[CachedCapture]:
    """The complete store of `opts` (reference engine only): read from the cache, resumed, or captured now;
    `progress` and `purpose` as capture_store takes them."""
    assert opts.engine == REFERENCE and not opts.import_dir
    info = read_target(opts.target, weights=True)  # its weights are checked before a cache entry is named
    folder = cache_dir or default_cache_dir()
    why = _writable(folder)
    temporary = tempfile.mkdtemp(prefix="eaglekit-capture-") if why else None
    store = os.path.join(temporary or folder, cache_key(info, opts))
    try:
        report = capture_store(store, dataclasses.replace(opts, force=True), progress=progress,
                               purpose=purpose)
        if why:
            report.notes.append(f"the captured states were not cached ({folder}: {why})")
        yield CachedCapture(store, report, cached=temporary is None)
    finally:
        if temporary:
            shutil.rmtree(temporary, ignore_errors=True)
