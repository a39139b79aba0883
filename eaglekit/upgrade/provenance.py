"""Where an output came from: source file hashes (computed beside the copy) and the options used.

Hashing a gigabyte costs more than copying it; it runs on its own thread (hashlib releases the GIL) while the
written files are flushed to disk. Files in the Hugging Face cache are already named by their SHA-256 (LFS
blobs), which is used as is.
"""

from __future__ import annotations

import hashlib
import os
import re
import threading

from eaglekit.errors import CheckpointError

HASH_BUFFER = 4 * 1024 * 1024
_SHA256_BLOB = re.compile(r"^[0-9a-f]{64}$")
PLACEHOLDER = "sha256:" + "0" * 64  # same length as a real digest: lets the header be patched in place


def sha256_file(path: str) -> str:
    blob = os.path.basename(os.path.realpath(path))
    if os.path.islink(path) and _SHA256_BLOB.match(blob):
        return "sha256:" + blob
    digest = hashlib.sha256()
    buf = bytearray(HASH_BUFFER)  # one buffer for the whole file: no fresh pages to fault in per chunk
    view = memoryview(buf)
    try:
        with open(path, "rb", buffering=0) as fh:
            while n := fh.readinto(buf):
                digest.update(view[:n])
        return "sha256:" + digest.hexdigest()
    except OSError as exc:
        raise CheckpointError(f"cannot read for hashing: {exc.strerror or exc}", path) from None


class SourceHashes:
    """Hash the source files on a background thread; `result()` waits and re-raises a failure."""

    def __init__(self, root: str, files: list[str]):
        self.root = root
        self.files = list(files)
        self._hashes: dict[str, str] = {}
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, name="eaglekit-hash", daemon=True)

    def start(self) -> SourceHashes:
        self._thread.start()
        return self

    def _run(self) -> None:
        try:
            for rel in self.files:
                self._hashes[rel] = sha256_file(os.path.join(self.root, rel))
        except BaseException as exc:  # re-raised on the caller's thread
            self._error = exc

    def result(self) -> dict[str, str]:
        self._thread.join()
        if self._error is not None:
            raise self._error
        return dict(self._hashes)

    @staticmethod
    def placeholders(files: list[str]) -> dict[str, str]:
        return {rel: PLACEHOLDER for rel in files}
