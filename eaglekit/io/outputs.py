"""The one rule for every path a command writes: it never is, holds or lies inside a source, a target, the output
being published, or another path the same command writes.

Every command hands all its writes (the output, plots, reports, cards, checkpoints, caches) and everything it reads
to `refuse_clobber` before it does any work. The check is on resolved paths (symlinks followed, hard links
compared by inode), and `--force` does not lift it: --force replaces an earlier output, never an input.

A side output (every write but the command's output: a report, plot, profile, card, checkpoint or cache folder)
also never lands inside a model folder nor replaces a model file, read by this command or not: a finished draft or
target elsewhere is no place for a report.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from dataclasses import dataclass
from itertools import islice

from eaglekit.errors import OutputError, UsageError

MAX_SCANNED_ENTRIES = 100_000  # a folder read is scanned for symbolic links (or weights) up to this many entries
OUTPUT = "output"  # the role of a command's own output, which --force may replace
MODEL_FILE_SUFFIXES = (".safetensors", ".gguf")
MODEL_CONFIG, MODEL_INDEX = "config.json", "model.safetensors.index.json"


@dataclass(frozen=True)
class Role:
    """A path and what it is to the command ("source", "target", "--plot", "output", ...). A written folder that
    the command creates with its missing parents (a checkpoint or cache folder) `makes_parents`."""

    name: str
    path: str
    makes_parents: bool = False


def _resolved(path: str) -> str:
    return os.path.realpath(os.path.abspath(os.path.expanduser(path)))


def _inside(inner: str, outer: str) -> bool:
    return inner == outer or inner.startswith(outer.rstrip(os.sep) + os.sep)


def _same_file(a: str, b: str) -> bool:
    """Two names of one file (a hard link): realpath cannot see it, the inode can."""
    try:
        return os.path.samefile(a, b)
    except OSError:
        return False


def overlaps(a: str, b: str) -> bool:
    """Whether writing `a` can touch `b` or the other way round: equal, one inside the other, or one file."""
    ra, rb = _resolved(a), _resolved(b)
    return _inside(ra, rb) or _inside(rb, ra) or _same_file(a, b)


def read_roles(name: str, path: str | None) -> list[Role]:
    """What reading `path` touches: the path itself and, for a folder, where each symbolic link in it really points
    (a Hub cache snapshot links its files into blobs/, which a write must not replace either)."""
    if not path:
        return []
    roles = [Role(name, path)]
    if os.path.isdir(path):
        try:
            with os.scandir(path) as entries:
                roles += [Role(name, os.path.realpath(e.path)) for e in islice(entries, MAX_SCANNED_ENTRIES)
                          if e.is_symlink()]
        except OSError:
            pass  # an unreadable folder is refused where it is read
    return roles


def target_roles(target: str | None) -> list[Role]:
    """A target is its GGUF file, or the folder of its config.json (weights and tokenizer lie beside it)."""
    from eaglekit.target import target_config_path

    if not target:
        return []
    if target.endswith(".gguf") and not os.path.isdir(target):
        return read_roles("target", target)
    return read_roles("target", os.path.dirname(os.path.abspath(target_config_path(target))))


def is_model_folder(path: str) -> bool:
    """A folder holding config.json beside weights (*.safetensors, a safetensors index or *.gguf): a checkpoint."""
    if not os.path.isfile(os.path.join(path, MODEL_CONFIG)):
        return False
    try:
        with os.scandir(path) as entries:
            return any(e.name == MODEL_INDEX or e.name.endswith(MODEL_FILE_SUFFIXES)
                       for e in islice(entries, MAX_SCANNED_ENTRIES))
    except OSError:
        return False


def _refuse_model_clobber(write: Role) -> None:
    """A side output never replaces a model file nor lands inside a model folder (its own path or any above)."""
    path = _resolved(write.path)
    name = os.path.basename(path)
    if os.path.isfile(path) and (name == MODEL_CONFIG or name.endswith(MODEL_FILE_SUFFIXES)):
        raise UsageError(f"{write.name} {write.path} is a model file: eaglekit never replaces one with a report, "
                         "plot, card or cache (--force included); choose another path")
    folder = path
    while True:
        if is_model_folder(folder):
            raise UsageError(f"{write.name} {write.path} lies inside the model folder {folder}: eaglekit writes "
                             "reports, plots, cards and caches beside checkpoints, never into one (--force included); "
                             "choose another path")
        parent = os.path.dirname(folder)
        if parent == folder:
            return
        folder = parent


def check_parent(write: Role) -> None:
    """Refuse, before any work, a written path whose folder is missing or is a file (usage error), or cannot be
    written (exit 1): found after the work, it would cost the whole run. A folder the command creates with its
    parents needs only its nearest existing ancestor to be a writable folder."""
    parent = os.path.dirname(os.path.abspath(os.path.expanduser(write.path)))
    while write.makes_parents and not os.path.lexists(parent) and os.path.dirname(parent) != parent:
        parent = os.path.dirname(parent)
    what = "the output" if write.name == OUTPUT else write.name
    if os.path.lexists(parent) and not os.path.isdir(parent):
        raise UsageError(f"the parent of {what} is a file, not a folder", parent)
    if not os.path.isdir(parent):
        raise UsageError(f"the parent directory of {what} does not exist", parent)
    if not os.access(parent, os.W_OK | os.X_OK):
        raise OutputError(f"the parent directory of {what} is not writable", parent)


def refuse_clobber(writes: Iterable[Role], reads: Iterable[Role]) -> None:
    """Refuse (usage error, before any work) a written path that overlaps anything read or any other write, a side
    output that would land in a model folder or replace a model file, and one whose folder cannot hold it."""
    written = [w for w in writes if w.path]
    read = [r for r in reads if r.path]
    for i, w in enumerate(written):
        for r in read:
            if overlaps(w.path, r.path):
                raise UsageError(f"{w.name} {w.path} overlaps the {r.name} {r.path}: eaglekit never writes into "
                                 f"what it reads (--force included); choose another path")
        for other in written[i + 1:]:
            if overlaps(w.path, other.path):
                raise UsageError(f"{w.name} {w.path} overlaps {other.name} {other.path}: each output needs its "
                                 "own path")
    for w in written:
        if w.name != OUTPUT:
            _refuse_model_clobber(w)
    for w in written:
        check_parent(w)
