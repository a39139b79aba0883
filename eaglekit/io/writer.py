"""Streaming safetensors writer: raw byte-range copies for unchanged tensors, chunks for computed ones.

Nothing here imports torch. Unchanged tensors move file-to-file inside the kernel (`copy_file_range`, else
`sendfile`, else a bounded read/write loop), so they never pass through Python memory and keep their exact
bits. Where the files land is eaglekit.io.publish's part: they are written into what it stages.
"""

from __future__ import annotations

import errno
import json
import os
import struct
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass

from eaglekit.errors import CheckpointError, OutputError
from eaglekit.io.checkpoint import INDEX_NAME
from eaglekit.io.dtypes import tensor_nbytes
from eaglekit.io.header import MAX_HEADER_BYTES

COPY_CHUNK = 64 * 1024 * 1024  # bytes per copy call: bounds progress granularity, not memory
READ_CHUNK = 8 * 1024 * 1024  # buffer of the read/write fallback
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


def save_tensors(tensors: dict, path: str, metadata: dict[str, str] | None = None) -> None:
    """safetensors' save_file, with the I/O failures it reports as SafetensorError ("No space left on device (os
    error 28)") raised as the OSError they are, so eaglekit.io.publish makes them one line."""
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
