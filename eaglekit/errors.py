"""User-facing errors: each carries one line that names the file and the problem."""

from __future__ import annotations

import re


class EaglekitError(Exception):
    """An expected failure, one line that names the file (`path`) and the problem. The CLI maps each class to its
    exit status (eaglekit.cli.main.exit_status)."""

    def __init__(self, message: str, path: str | None = None):
        self.path = path
        super().__init__(f"{path}: {message}" if path else message)


class CheckpointError(EaglekitError):
    """The checkpoint cannot be read: missing, malformed, unsafe."""


class UnknownLayoutError(CheckpointError):
    """No known layout matches: the message lists what was observed."""


class NotEagle3DraftError(CheckpointError):
    """A recognised draft of another speculative method (a block drafter, an MTP head, a parallel draft model):
    `draft` says what it is and which vLLM method serves it (eaglekit.other_drafts.OtherDraft)."""

    def __init__(self, draft, path: str | None = None):
        self.draft = draft
        super().__init__(draft.summary(), path)


class UsageError(EaglekitError):
    """Arguments that contradict each other or the input."""


class OutputError(EaglekitError):
    """The output could not be produced; nothing was left behind."""


class IncompatibleDraftError(EaglekitError):
    """The draft cannot run against this target."""


class EngineError(EaglekitError):
    """A serving engine could not be started or did not finish."""


class EngineMissing(EngineError):
    """The serving engine is not installed where eaglekit looks: the command line was right, the machine lacks it
    (exit 1); the line gives the command that installs it. `found`: what was found where eaglekit looked."""

    def __init__(self, message: str, found: str):
        self.found = found
        super().__init__(message)


class TrainingInterrupted(EaglekitError):
    """Ctrl-C during training: the last finished step was saved as a resumable checkpoint."""


class CaptureInterrupted(EaglekitError):
    """Ctrl-C or SIGTERM during a capture: the published shards stay, and the same command resumes after them."""


class NoGain(EaglekitError):
    """A trained draft whose held-out gain over its source is not resolved (the paired interval does not clear
    zero): it is not written."""


MAX_QUOTED_CHARS = 80


def _middle_cut(text: str, limit: int = MAX_QUOTED_CHARS) -> str:
    if len(text) <= limit:
        return text
    keep = (limit - 1) // 2
    return f"{text[:keep]}…{text[-keep:]}"


def quoted(value: object) -> str:
    """repr() of a name or value for a message, cut in the middle past MAX_QUOTED_CHARS: a hostile file's
    200 000-character tensor name still leaves a line that names the file and the problem."""
    return _middle_cut(repr(value))


MAX_MESSAGE_CHARS = 2000


def bounded_text(text: str, word_limit: int = MAX_QUOTED_CHARS) -> str:
    """A composed message with every word past `word_limit` cut in the middle, and the whole past
    MAX_MESSAGE_CHARS: names a file supplies (tensor names, config values, id lists) are spliced in whole where
    messages are written, and cut once where they are kept."""
    words = re.sub(r"\S{%d,}" % (word_limit + 1), lambda m: _middle_cut(m.group(), word_limit), text)
    return _middle_cut(words, MAX_MESSAGE_CHARS)
