"""Where an output came from: source file hashes (computed beside the copy) and the options used.

Hashing a gigabyte costs about as long as copying it, so it runs on its own thread while the main thread
copies (hashlib releases the GIL on large buffers). Files in the Hugging Face cache are already named by
their SHA-256 (LFS blobs), which is used as is.
"""

from __future__ import annotations

import hashlib
import os
import re
import threading

from eaglekit.errors import CheckpointError

HASH_CHUNK = 8 * 1024 * 1024
_SHA256_BLOB = re.compile(r"^[0-9a-f]{64}$")
PLACEHOLDER = "sha256:" + "0" * 64  # same length as a real digest: lets the header be patched in place


def sha256_file(path: str) -> str:
    blob = os.path.basename(os.path.realpath(path))
    if os.path.islink(path) and _SHA256_BLOB.match(blob):
        return "sha256:" + blob
    digest = hashlib.sha256()
    try:
        with open(path, "rb") as fh:
            while chunk := fh.read(HASH_CHUNK):
                digest.update(chunk)
    except OSError as exc:
        raise CheckpointError(f"cannot read for hashing: {exc.strerror or exc}", path) from None
    return "sha256:" + digest.hexdigest()


class SourceHashes:
    """Hash the source files on a background thread; `result()` waits and re-raises a failure."""

    def __init__(self, root: str, files: list[str]):
        self.root = root
        self.files = list(files)
        self._hashes: dict[str, str] = {}
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, name="eaglekit-hash", daemon=True)

    def start(self) -> "SourceHashes":
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
