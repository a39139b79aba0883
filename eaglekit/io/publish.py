"""The one way eaglekit writes an output: stage it beside its destination, write, read back, then publish atomically.

Every file or folder eaglekit leaves behind (an upgraded or fine-tuned draft, a checkpoint, a GGUF, a store's
shard and manifest, a report, a plot, a data cache) goes through `publish`, so they share one set of guarantees:
no half-written output ever has the destination's name, a failed, full or interrupted write leaves nothing behind
(and is one OutputError line), an existing destination is replaced only when asked and only once the new one is
complete, and of two runs publishing one file without replacing exactly one wins. Nothing here imports torch.
"""

from __future__ import annotations

import errno
import os
import shutil
import threading
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TypeVar

from eaglekit.errors import OutputError, UsageError
from eaglekit.io.outputs import OUTPUT, Role, check_parent

PARTIAL_MARK = ".eaglekit-partial-"
OLD_MARK = ".eaglekit-old-"  # the replaced output while --force swaps in the new one
NO_HARD_LINKS = (errno.EPERM, errno.EOPNOTSUPP, errno.ENOSYS, errno.EMLINK)
"""os.link's failures on file systems without hard links (some network and FUSE ones)."""
CLOBBERED = "exists: another run wrote it first; nothing was written (--force replaces it)"
T = TypeVar("T")


@dataclass
class Staged:
    """The file or folder being built beside its destination: what `write` and `read_back` are given."""

    path: str
    folder: bool
    _syncs: list[threading.Thread] = field(default_factory=list)

    def sync_later(self, name: str) -> None:
        """Start flushing a finished file of a staged folder now, on a thread, so the disk works while the caller
        goes on (publishing waits for it)."""
        thread = threading.Thread(target=_fsync_path, args=(os.path.join(self.path, name),), daemon=True)
        thread.start()
        self._syncs.append(thread)

    def flush(self) -> None:
        """Wait for the background flushes, then fsync every file and the folder itself."""
        for thread in self._syncs:
            thread.join()
        self._syncs.clear()
        if self.folder:
            for name in os.listdir(self.path):
                full = os.path.join(self.path, name)
                if os.path.isfile(full):
                    _fsync_path(full)
        _fsync_path(self.path)

    def discard(self) -> None:
        for thread in self._syncs:
            thread.join()
        if self.folder and os.path.isdir(self.path) and not os.path.islink(self.path):
            shutil.rmtree(self.path, ignore_errors=True)
        elif os.path.lexists(self.path):
            os.unlink(self.path)


def publish(destination: str, write: Callable[[Staged], None], *, replace: bool, folder: bool = False,
            read_back: Callable[[Staged], T] | None = None, what: str | None = None,
            make_parents: bool = False) -> T | None:
    """`write` a new file (or, with `folder`, a folder) beside `destination`, let `read_back` re-open and judge it
    (it raises to refuse; its answer is returned), fsync it, then give it the destination's name.

    The staged name is created exclusively and carries this process's id, so it never overwrites anything and the
    next run for the same destination removes it once the process is gone. An existing destination is replaced
    only when `replace` (--force, or an output a command always rewrites), atomically, only after the new one is
    complete; otherwise a file that appeared there meanwhile (another run's) is never replaced, and a non-empty
    folder is refused. `make_parents` creates the destination's missing folders, and removes them again when the
    write fails and leaves them empty. Any OSError (a full, read-only or failing disk) is one OutputError line:
    "cannot write WHAT (...)", or for an output folder without `what` "writing the output failed (...)"."""
    destination = os.path.abspath(destination)
    if folder:
        check_destination(destination, replace=replace, makes_parents=make_parents)
    failure = f"cannot write {what or 'the output'}" if what or not folder else "writing the output failed"
    created = _missing_folders(os.path.dirname(destination)) if make_parents else []
    stage: Staged | None = None
    placed, old = False, ""
    try:
        try:
            if created:
                os.makedirs(os.path.dirname(destination), exist_ok=True)
            remove_stale(destination)
            stage = _stage(destination, folder, staging_error=folder and what is None)
            write(stage)
            result = read_back(stage) if read_back is not None else None
            stage.flush()
            if folder:
                check_destination(destination, replace=replace, makes_parents=make_parents)
                old = _make_way(destination)
                if old:
                    os.rename(destination, old)
                os.rename(stage.path, destination)
            else:
                _place_file(stage.path, destination, replace)
            placed = True
            _fsync_path(os.path.dirname(destination))
        except OSError as exc:
            raise OutputError(f"{failure} ({exc.strerror or exc}); nothing was written", destination) from None
    except BaseException:
        if stage is not None and not placed:
            stage.discard()
        if old and not placed and os.path.lexists(old) and not os.path.lexists(destination):
            os.rename(old, destination)  # interrupted between moving the earlier output aside and publishing
        _remove_empty(created)
        raise
    finally:
        if old and placed:
            shutil.rmtree(old, ignore_errors=True)
    return result


def check_destination(destination: str, *, replace: bool, makes_parents: bool = False) -> None:
    """Refuse, before any work, a folder output `publish` would refuse: a file or link in the way, a non-empty
    folder without `replace` (--force), a parent that is missing or cannot be written."""
    destination = os.path.abspath(destination)
    if os.path.isfile(destination) or os.path.islink(destination):
        raise UsageError("output path exists and is a file or a symbolic link, not a directory", destination)
    if os.path.isdir(destination) and os.listdir(destination) and not replace:
        raise UsageError("output directory exists and is not empty (pass --force to replace it)", destination)
    check_parent(Role(OUTPUT, destination, makes_parents=makes_parents))


def _stage(destination: str, folder: bool, *, staging_error: bool) -> Staged:
    """The staged file or folder, created exclusively beside `destination` (a file keeps its extension, so a
    writer that goes by it writes the right format); `staging_error`: a folder that cannot be made is said as
    such, at the parent."""
    parent, base = os.path.split(destination)
    name = f".{base}{PARTIAL_MARK}{os.getpid()}-{uuid.uuid4().hex[:8]}"
    if not folder:
        path = os.path.join(parent, name + os.path.splitext(base)[1])
        os.close(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644))
        return Staged(path, folder=False)
    path = os.path.join(parent, name)
    try:
        os.mkdir(path)
    except OSError as exc:
        if not staging_error:
            raise
        raise OutputError(f"cannot create a staging directory ({exc.strerror or exc})", parent) from None
    return Staged(path, folder=True)


def _place_file(tmp: str, destination: str, replace: bool) -> None:
    """Give the finished `tmp` the name `destination`: replacing a file there atomically when `replace`, else only
    if no file has the name (a hard link, which fails when one does), so of two runs publishing one path exactly
    one wins and the other is one line."""
    if replace:
        os.replace(tmp, destination)
        return
    try:
        os.link(tmp, destination)
    except FileExistsError:
        raise OutputError(CLOBBERED, destination) from None
    except OSError as exc:
        if exc.errno not in NO_HARD_LINKS:
            raise
        if os.path.lexists(destination):  # no hard links here: the check and the rename are two steps
            raise OutputError(CLOBBERED, destination) from None
        os.rename(tmp, destination)
        return
    os.unlink(tmp)


def _make_way(destination: str) -> str:
    """Clear the way for a new folder: an empty one at `destination` is removed; for a non-empty one the name it
    is to be moved aside to is returned (removed once the new one is in place, put back if interrupted)."""
    if not os.path.isdir(destination):
        return ""
    if not os.listdir(destination):
        os.rmdir(destination)
        return ""
    parent, base = os.path.split(destination)
    return os.path.join(parent, f".{base}{OLD_MARK}{os.getpid()}-{uuid.uuid4().hex[:8]}")


def _fsync_path(path: str) -> None:
    """fsync a file or a directory by path."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def remove_stale(destination: str) -> None:
    """Leftovers of killed runs for `destination`, named by eaglekit's marks with the dead run's process id: staging
    folders and partial files go; a replaced output whose run died before the new one took its place is put back
    (so --force never loses the old output), otherwise removed."""
    parent, base = os.path.split(os.path.abspath(destination))
    for name in sorted(os.listdir(parent)):
        for mark in (PARTIAL_MARK, OLD_MARK):
            prefix = f".{base}{mark}"
            if not name.startswith(prefix):
                continue
            pid = name[len(prefix):].split("-", 1)[0]
            if not pid.isdigit() or _pid_alive(int(pid)):
                continue
            full = os.path.join(parent, name)
            if mark == OLD_MARK and not os.path.lexists(destination):
                os.rename(full, destination)
            elif os.path.isdir(full) and not os.path.islink(full):
                shutil.rmtree(full, ignore_errors=True)
            else:
                os.unlink(full)


def _missing_folders(folder: str) -> list[str]:
    """`folder` and those of its parents that do not exist yet, innermost first."""
    missing = []
    folder = os.path.abspath(folder)
    while not os.path.lexists(folder):
        missing.append(folder)
        parent = os.path.dirname(folder)
        if parent == folder:
            break
        folder = parent
    return missing


def _remove_empty(folders: list[str]) -> None:
    """The folders a failed write created, innermost first, as long as they are empty: a failure never leaves an
    empty folder behind, and a folder another run wrote into stays."""
    for made in folders:
        try:
            os.rmdir(made)
        except OSError:
            break
