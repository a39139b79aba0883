"""Streaming safetensors writer: raw byte-range copies for unchanged tensors, chunks for computed ones.

Nothing here imports torch. Unchanged tensors move file-to-file inside the kernel (`copy_file_range`, else
`sendfile`, else a bounded read/write loop), so they never pass through Python memory and keep their exact
bits. `StagedDirectory` makes a whole output directory appear at its final path only once it is complete.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import shutil
import struct
import threading
import uuid
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass

from eaglekit.errors import CheckpointError, OutputError, UsageError
from eaglekit.io.checkpoint import INDEX_NAME
from eaglekit.io.dtypes import tensor_nbytes
from eaglekit.io.header import MAX_HEADER_BYTES
from eaglekit.io.outputs import OUTPUT, Role, check_parent

COPY_CHUNK = 64 * 1024 * 1024  # bytes per copy call: bounds progress granularity, not memory
READ_CHUNK = 8 * 1024 * 1024  # buffer of the read/write fallback
PARTIAL_MARK = ".eaglekit-partial-"
OLD_MARK = ".eaglekit-old-"  # the replaced output while --force swaps in the new one
ProgressFn = Callable[[int], None]


@dataclass(frozen=True)
class ByteRange:
    """Bytes [start, end) of an existing file, copied verbatim."""

    path: str
    start: int
    end: int


ChunkSource = Callable[[], Iterable[bytes]]
"""Produces a computed tensor's bytes, in order, in chunks of any size."""


@dataclass(frozen=True)
class OutTensor:
    name: str
    dtype: str
    shape: tuple[int, ...]
    source: ByteRange | ChunkSource

    @property
    def nbytes(self) -> int:
        return tensor_nbytes(self.dtype, self.shape)


def header_bytes(tensors: list[OutTensor], metadata: dict[str, str] | None) -> bytes:
    """The 8-byte length and the JSON header, padded with spaces to a multiple of 8 bytes."""
    header: dict = {}
    if metadata:
        if not all(isinstance(k, str) and isinstance(v, str) for k, v in metadata.items()):
            raise OutputError("safetensors metadata must map strings to strings")
        header["__metadata__"] = metadata
    offset = 0
    for t in tensors:
        header[t.name] = {"dtype": t.dtype, "shape": list(t.shape), "data_offsets": [offset, offset + t.nbytes]}
        offset += t.nbytes
    raw = json.dumps(header, separators=(",", ":"), ensure_ascii=False).encode("utf-8")
    raw += b" " * (-len(raw) % 8)
    if len(raw) > MAX_HEADER_BYTES:
        raise OutputError(f"safetensors header of {len(raw)} bytes exceeds the {MAX_HEADER_BYTES}-byte bound")
    return struct.pack("<Q", len(raw)) + raw


def _copy_range(src_fd: int, dst_fd: int, start: int, count: int, progress: ProgressFn | None, where: str,
                written: Callable[[], None] = lambda: None) -> None:
    """Append `count` bytes of `src_fd` from `start` to `dst_fd` at its current position."""
    offset, left = start, count
    mode = "copy_file_range" if hasattr(os, "copy_file_range") else "sendfile"
    while left > 0:
        step = min(left, COPY_CHUNK)
        try:
            if mode == "copy_file_range":
                n = os.copy_file_range(src_fd, dst_fd, step, offset)
            elif mode == "sendfile":
                n = os.sendfile(dst_fd, src_fd, offset, step)
            else:
                data = os.pread(src_fd, min(step, READ_CHUNK), offset)
                n = len(data)
                view = memoryview(data)
                while view:
                    view = view[os.write(dst_fd, view):]
        except OSError as exc:
            if mode != "read" and exc.errno in (errno.EXDEV, errno.ENOSYS, errno.EINVAL, errno.EOPNOTSUPP, errno.EBADF):
                mode = "sendfile" if mode == "copy_file_range" else "read"
                continue
            raise
        if n == 0:
            raise CheckpointError(f"file truncated: {left} of {count} bytes missing at offset {offset}", where)
        offset += n
        left -= n
        written()
        if progress:
            progress(n)


class _Writeback:
    """Hands each finished 64 MB of a file to the kernel's writeback at once (POSIX_FADV_DONTNEED starts it and
    drops the pages once clean), so the disk writes while the copy goes on and the final fsync has little left:
    0.85 GB copied + fsync'd in 0.40 s instead of 0.60 s here."""

    def __init__(self, fd: int):
        self.fd, self.done = fd, 0

    def __call__(self) -> None:
        end = os.lseek(self.fd, 0, os.SEEK_CUR)
        if end - self.done >= COPY_CHUNK and hasattr(os, "posix_fadvise"):
            os.posix_fadvise(self.fd, self.done, end - self.done, os.POSIX_FADV_DONTNEED)
            self.done = end


def _write_all(fd: int, data: bytes | memoryview) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view):]


def write_safetensors(path: str, tensors: list[OutTensor], metadata: dict[str, str] | None = None,
                      progress: ProgressFn | None = None, *, fsync: bool = True) -> None:
    """Write one safetensors file in the order given; every tensor's byte count is checked."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    writeback = _Writeback(fd)
    try:
        _write_all(fd, header_bytes(tensors, metadata))
        sources: dict[str, int] = {}
        try:
            for t in tensors:
                if isinstance(t.source, ByteRange):
                    r = t.source
                    if r.end - r.start != t.nbytes:
                        raise OutputError(f"tensor {t.name!r}: source range holds {r.end - r.start} bytes, "
                                          f"{t.dtype}{list(t.shape)} needs {t.nbytes}", path)
                    if r.path not in sources:
                        sources[r.path] = os.open(r.path, os.O_RDONLY)
                    _copy_range(sources[r.path], fd, r.start, t.nbytes, progress, r.path, writeback)
                else:
                    written = 0
                    for chunk in t.source():
                        _write_all(fd, chunk)
                        writeback()
                        written += len(chunk)
                        if progress:
                            progress(len(chunk))
                    if written != t.nbytes:
                        raise OutputError(f"tensor {t.name!r}: produced {written} bytes, "
                                          f"{t.dtype}{list(t.shape)} needs {t.nbytes}", path)
        finally:
            for sfd in sources.values():
                os.close(sfd)
        if fsync:
            os.fsync(fd)
    finally:
        os.close(fd)


def patch_header(path: str, tensors: list[OutTensor], metadata: dict[str, str] | None) -> None:
    """Rewrite the header of a written file with new metadata of the same encoded length (e.g. final hashes)."""
    new = header_bytes(tensors, metadata)
    with open(path, "r+b") as fh:
        (n,) = struct.unpack("<Q", fh.read(8))
        if 8 + n != len(new):
            raise OutputError(f"patched header would change size ({8 + n} -> {len(new)} bytes)", path)
        fh.seek(0)
        fh.write(new)


def shard_groups(tensors: list[OutTensor], max_shard_size: int | None) -> list[list[OutTensor]]:
    """Split into consecutive groups of at most `max_shard_size` bytes (a larger tensor gets its own shard)."""
    if not max_shard_size or sum(t.nbytes for t in tensors) <= max_shard_size:
        return [list(tensors)]
    groups: list[list[OutTensor]] = [[]]
    size = 0
    for t in tensors:
        if groups[-1] and size + t.nbytes > max_shard_size:
            groups.append([])
            size = 0
        groups[-1].append(t)
        size += t.nbytes
    return groups


def shard_names(count: int) -> list[str]:
    if count == 1:
        return ["model.safetensors"]
    return [f"model-{i + 1:05d}-of-{count:05d}.safetensors" for i in range(count)]


def write_checkpoint_weights(directory: str, tensors: list[OutTensor], metadata: dict[str, str] | None = None,
                             max_shard_size: int | None = None, progress: ProgressFn | None = None, *,
                             fsync: bool = True) -> dict[str, list[OutTensor]]:
    """Write `model.safetensors`, or HF-named shards plus `model.safetensors.index.json`.

    Returns each weight file's name with the tensors it holds (in file order).
    """
    groups = shard_groups(tensors, max_shard_size)
    files = dict(zip(shard_names(len(groups)), groups))
    for name, group in files.items():
        write_safetensors(os.path.join(directory, name), group, metadata, progress, fsync=fsync)
    if len(groups) > 1:
        index = {
            "metadata": {"total_size": sum(t.nbytes for t in tensors)},
            "weight_map": {t.name: name for name, group in files.items() for t in group},
        }
        write_json(os.path.join(directory, INDEX_NAME), index, fsync=fsync)
    return files


def write_json(path: str, doc: dict, *, fsync: bool = True) -> None:
    """`doc` as UTF-8 JSON; a lone surrogate (an undecodable byte of a path) is written as its \\u escape."""
    with open(path, "w", encoding="utf-8", errors="backslashreplace") as fh:
        json.dump(doc, fh, indent=2, ensure_ascii=False)
        fh.write("\n")
        fh.flush()
        if fsync:
            os.fsync(fh.fileno())


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


@contextlib.contextmanager
def writing(what: str, path: str, *, folder: str | None = None) -> Iterator[None]:
    """A write outside a StagedDirectory (files published aside, checkpoints, caches): a full, read-only or failing
    disk (any OSError) is one OutputError line naming `path`, and `folder` (created here with its missing parents
    when absent) is removed again when the write fails and leaves it empty, so a failure never leaves an empty
    folder behind. Removing what the write itself left half done is the caller's part."""
    created = _missing_folders(folder) if folder else []
    try:
        try:
            if folder:
                os.makedirs(folder, exist_ok=True)
            yield
        except OSError as exc:
            raise OutputError(f"cannot write {what} ({exc.strerror or exc}); nothing was written", path) from None
    except BaseException:
        for made in created:
            try:
                os.rmdir(made)
            except OSError:
                break  # not empty (another run wrote into it) or already gone: left as it is
        raise


def save_tensors(tensors: dict, path: str, metadata: dict[str, str] | None = None) -> None:
    """safetensors' save_file, with the I/O failures it reports as SafetensorError ("No space left on device (os
    error 28)") raised as the OSError they are, so `writing` makes them one line."""
    import re

    import safetensors.torch
    from safetensors import SafetensorError

    try:
        safetensors.torch.save_file(tensors, path, metadata=metadata)
    except SafetensorError as exc:
        code = re.search(r"\(os error (\d+)\)", str(exc))
        if code is None:
            raise
        raise OSError(int(code.group(1)), os.strerror(int(code.group(1)))) from None


NO_HARD_LINKS = (errno.EPERM, errno.EOPNOTSUPP, errno.ENOSYS, errno.EMLINK)
"""os.link's failures on file systems without hard links (some network and FUSE ones)."""


def _place(tmp: str, destination: str, replace: bool) -> None:
    """Give the finished `tmp` the name `destination`: replacing a file there atomically when `replace`, else only
    if no file has the name (a hard link, which fails when one does), so of two runs publishing one path exactly
    one wins and the other is one line."""
    if replace:
        os.replace(tmp, destination)
        return
    try:
        os.link(tmp, destination)
    except FileExistsError:
        raise OutputError("exists: another run wrote it first; nothing was written (--force replaces it)",
                          destination) from None
    except OSError as exc:
        if exc.errno not in NO_HARD_LINKS:
            raise
        if os.path.lexists(destination):  # no hard links here: the check and the rename are two steps
            raise OutputError("exists: another run wrote it first; nothing was written (--force replaces it)",
                              destination) from None
        os.rename(tmp, destination)
        return
    os.unlink(tmp)


def publish_file(destination: str, write: Callable[[str], None], *, replace: bool, what: str = "the output") -> str:
    """`write(tmp)` into a new file beside `destination`, fsync it, then give it the name: no half-written file
    ever has the name, a failed or interrupted write leaves nothing behind, and a full or read-only disk is one
    OutputError. An existing `destination` is replaced atomically only when `replace` (--force, or an output a
    command always rewrites); otherwise a file that appeared there meanwhile (another run's) is never replaced.
    The temporary name is created exclusively: no file is ever overwritten or removed but `destination` itself
    (when replaced) and the leftovers of killed runs for it. Returns the absolute path."""
    destination = os.path.abspath(destination)
    parent, base = os.path.split(destination)
    tmp = os.path.join(parent, f".{base}{PARTIAL_MARK}{os.getpid()}-{uuid.uuid4().hex[:8]}{os.path.splitext(base)[1]}")
    created = False
    try:
        with writing(what, destination):
            remove_stale(destination)
            os.close(os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644))
            created = True
            write(tmp)
            _fsync_path(tmp)
            _place(tmp, destination, replace)
            created = False
    finally:
        if created and os.path.lexists(tmp):
            os.unlink(tmp)
    return destination


class StagedDirectory:
    """Build a directory beside `dst` and move it into place only when `publish()` is called.

    Until then `dst` is untouched; on any failure the staging directory is removed. A process killed mid-way
    leaves only a hidden `.NAME.eaglekit-partial-PID-…` folder, which the next run for the same `dst` removes.
    An existing non-empty `dst` is refused unless `force`; with `force` it is replaced only after the new
    directory is complete.
    """

    def __init__(self, dst: str, *, force: bool = False):
        self.dst = os.path.abspath(dst)
        self.force = force
        self.parent, self.base = os.path.split(self.dst)
        self.path = ""
        self.published = False
        self._old = ""  # the earlier output, moved aside while the new one takes its name
        self._syncs: list[threading.Thread] = []

    def check(self) -> None:
        """Refuse early (before any work) what `publish` would refuse."""
        if os.path.isfile(self.dst) or os.path.islink(self.dst):
            raise UsageError("output path exists and is a file or a symbolic link, not a directory", self.dst)
        if os.path.isdir(self.dst) and os.listdir(self.dst) and not self.force:
            raise UsageError("output directory exists and is not empty (pass --force to replace it)", self.dst)
        check_parent(Role(OUTPUT, self.dst))

    def __enter__(self) -> StagedDirectory:
        self.check()
        remove_stale(self.dst)
        path = os.path.join(self.parent, f".{self.base}{PARTIAL_MARK}{os.getpid()}-{uuid.uuid4().hex[:8]}")
        try:
            os.mkdir(path)
        except OSError as exc:
            raise OutputError(f"cannot create a staging directory ({exc.strerror or exc})", self.parent) from None
        try:  # an interrupt before the with-body starts never reaches __exit__: clean up here
            self.path = path
            return self
        except BaseException:
            shutil.rmtree(path, ignore_errors=True)
            raise

    def sync_later(self, name: str) -> None:
        """Start flushing a finished file now, on a thread, so the disk works while the caller goes on."""
        thread = threading.Thread(target=_fsync_path, args=(os.path.join(self.path, name),), daemon=True)
        thread.start()
        self._syncs.append(thread)

    def publish(self) -> None:
        """fsync everything, then rename into place (replacing `dst` only if allowed)."""
        self.check()
        for thread in self._syncs:
            thread.join()
        for name in os.listdir(self.path):
            full = os.path.join(self.path, name)
            if os.path.isfile(full):
                _fsync_path(full)
        _fsync_path(self.path)
        if os.path.isdir(self.dst):
            if os.listdir(self.dst):
                self._old = os.path.join(self.parent, f".{self.base}{OLD_MARK}{os.getpid()}-{uuid.uuid4().hex[:8]}")
                os.rename(self.dst, self._old)
            else:
                os.rmdir(self.dst)
        os.rename(self.path, self.dst)
        self.published = True
        _fsync_path(self.parent)
        if self._old:
            shutil.rmtree(self._old, ignore_errors=True)
            self._old = ""

    def __exit__(self, exc_type, exc, tb) -> None:
        for thread in self._syncs:
            thread.join()
        if not self.published and self.path and os.path.exists(self.path):
            shutil.rmtree(self.path, ignore_errors=True)
        if not self.published and self._old and not os.path.lexists(self.dst):
            os.rename(self._old, self.dst)  # interrupted between moving the earlier output aside and publishing
        if exc_type is not None and issubclass(exc_type, OSError):  # disk full, quota, I/O error: one line
            raise OutputError(f"writing the output failed ({exc.strerror or exc}); nothing was written",
                              self.dst) from None


def iter_file_chunks(path: str, start: int, end: int, chunk: int = READ_CHUNK) -> Iterator[bytes]:
    """Read [start, end) of a file in bounded chunks (for transforms that stream row blocks)."""
    with open(path, "rb") as fh:
        fh.seek(start)
        left = end - start
        while left > 0:
            data = fh.read(min(chunk, left))
            if not data:
                raise CheckpointError(f"file truncated: {left} bytes missing", path)
            left -= len(data)
            yield data
