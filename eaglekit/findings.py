"""Findings are data: a code, a severity, a one-line message, the pitfall it guards and where."""

from __future__ import annotations

from dataclasses import asdict, dataclass

from eaglekit.errors import bounded_text

SEVERITIES = ("error", "warning", "info")


@dataclass(frozen=True)
class Finding:
    """One rule's hit on a draft: its code, severity, message, pitfall, and the tensor or config key it names."""

    code: str
    severity: str  # "error" | "warning" | "info"
    message: str
    pitfall: str | None = None  # e.g. "P16"
    tensor: str | None = None
    key: str | None = None
    refuses_load: bool = False  # vLLM's loader raises on the files (what verify's served reading needs)

    def __post_init__(self):
        # every finding passes here: a hostile name in the message is cut; `tensor` and `key` keep it whole
        object.__setattr__(self, "message", bounded_text(self.message))

    def to_dict(self) -> dict:
        return {k: v for k, v in asdict(self).items() if v is not None and k != "refuses_load"}
