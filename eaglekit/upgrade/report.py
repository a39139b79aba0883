"""The result of an upgrade, as data: what was written, from what, and how much of the function survived."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from eaglekit.findings import Finding
from eaglekit.quantization import scheme
from eaglekit.upgrade.calibrate import Fidelity
from eaglekit.upgrade.plan import TensorStep
from eaglekit.upgrade.start import StartFidelity

SERVE_K = 3  # drafts per round in the serve line printed after an upgrade (eaglekit bench's default k)

FUNCTION_SUMMARY = {
    "preserved": "function-preserving: the output computes exactly what the source computes",
    "approximate": "approximately preserving",
    "eagle3-function": "EAGLE-3.1 flags, EAGLE-3 function, not yet trained as 3.1",
    "warm-start": "warm start: the function changed and needs fine-tuning before serving",
}


@dataclass(frozen=True)
class FidelityReport:
    """fc output of the original vs the upgraded first step, on held-out calibration tokens."""

    tokens: int
    fit_tokens: int
    text: str
    relative_error: float
    cosine: float
    min_cosine: float
    ones_relative_error: float  # the same tokens with unit fc_norm weights
    ones_cosine: float
    target_quantization: dict[str, Any] | None = None  # the served numerics calibrated on (Scheme.to_dict)

    @classmethod
    def of(cls, calibrated: Fidelity, ones: Fidelity, fit_tokens: int, text: str,
           target_quantization: str | None = None) -> FidelityReport:
        served = scheme(target_quantization)
        return cls(calibrated.tokens, fit_tokens, text, calibrated.relative_error, calibrated.cosine,
                   calibrated.min_cosine, ones.relative_error, ones.cosine, served.to_dict() if served else None)


@dataclass
class UpgradeReport:
    source: dict[str, Any]  # path, family, producer, eagle_version, files, total_bytes
    output: dict[str, Any]  # path, dialect, eagle_version, files, total_bytes
    dry_run: bool
    function: str  # "preserved" | "approximate" | "eagle3-function" | "warm-start"
    summary: str
    changes: list[str]
    aux: dict[str, Any]
    vocab: dict[str, Any]
    flags: dict[str, Any]
    tensors: list[TensorStep]
    config: dict[str, Any]
    fidelity: FidelityReport | None = None
    start: StartFidelity | None = None  # the norm_output rescale and how closely the output keeps the source
    findings: list[Finding] = field(default_factory=list)
    validated: bool = False
    warnings: list[str] = field(default_factory=list)
    timings: dict[str, float] = field(default_factory=dict)
    target: str | None = None
    serve_settings: tuple[str, ...] = ()  # what the serving engine needs beside the files (P-EAGLE's switch)

    @property
    def next_command(self) -> str | None:
        """What to run next, as a command that runs when pasted: a function changed untrained needs `finetune`
        (which trains vLLM-layout drafts) against the target; a GGUF is served by llama.cpp with the target's GGUF.
        None when there is no next step or its target is not known (`next_step` then says so in words)."""
        import shlex

        from eaglekit.engines import RECORDS

        if self.target is None:
            return None
        engine = RECORDS[self._dialect().ENGINE]
        if engine.needs_conversion:
            return engine.serve(self.target, self.output["path"], SERVE_K, self.serve_settings)
        if not self._finetune_follows():
            return None
        dst = self.output["path"].rstrip("/")
        return shlex.join(["eaglekit", "finetune", dst, f"{dst}-tuned", "--target", self.target])

    @property
    def serve_command(self) -> str | None:
        """The `vllm serve` line serving the draft just written with its target, the paths as the user gave them and
        k = SERVE_K: for an output vLLM loads (its dialect's engine is vLLM); None for a dry run or without a target
        to name."""
        from eaglekit.engines import RECORDS, vllm

        if self.dry_run or self.target is None or RECORDS[self._dialect().ENGINE] is not vllm.RECORD:
            return None
        return vllm.serve_command(self.target, self.output.get("given") or self.output["path"], SERVE_K,
                                  self.serve_settings)

    @property
    def next_step(self) -> str | None:
        """The next step in words when it needs what this upgrade was not given (the target); else None."""
        if self.target is not None or not self._finetune_follows():
            return None
        return (f"fine-tune {self.output['path'].rstrip('/')} against its target with `eaglekit finetune`: give the "
                "target model (its Hub id or folder) as --target, which this upgrade was not given")

    def _dialect(self) -> Any:
        from eaglekit.upgrade.dialects import get_dialect

        return get_dialect(self.output["dialect"])

    def _finetune_follows(self) -> bool:
        return self.function == "warm-start" and bool(self._dialect().FINETUNE_READS)

    @property
    def counts(self) -> dict[str, int]:
        from eaglekit.upgrade.plan import ACTIONS

        return {a: sum(1 for s in self.tensors if s.action == a) for a in ACTIONS}

    def to_dict(self) -> dict[str, Any]:
        return {
            "source": self.source,
            "output": self.output,
            "dry_run": self.dry_run,
            "function": self.function,
            "summary": self.summary,
            "changes": list(self.changes),
            "aux": self.aux,
            "vocab": self.vocab,
            "flags": self.flags,
            "fidelity": asdict(self.fidelity) if self.fidelity else None,
            "start": self.start.to_dict() if self.start else None,
            "counts": self.counts,
            "tensors": [s.to_dict() for s in self.tensors],
            "config": self.config,
            "validated": self.validated,
            "findings": [f.to_dict() for f in self.findings],
            "warnings": list(self.warnings),
            "next_command": self.next_command,
            "serve_command": self.serve_command,
            "next_step": self.next_step,
            "timings": dict(self.timings),
        }


def summary_line(function: str, fidelity: FidelityReport | None, norm_output_added: bool,
                 changes: list[str] | tuple[str, ...] = (), start: StartFidelity | None = None) -> str:
    """The one sentence the report leads with."""
    if function == "eagle3-function" and start is not None:
        return (f"{FUNCTION_SUMMARY[function]}: top-1 agreement with the source "
                f"{' / '.join(f'{a:.3f}' for a in start.agreement)} at draft steps 1-{len(start.agreement)} "
                f"({' / '.join(f'{a:.3f}' for a in start.agreement_without_rescale)} without the rescale), fed-back "
                f"state within {start.feedback_relative_error:.1%} of EAGLE-3's, on {start.tokens} held-out tokens")
    if function == "approximate" and fidelity is not None:
        return (f"approximately preserving: first-step fc output cosine {fidelity.cosine:.4f}, relative error "
                f"{fidelity.relative_error:.4f} on {fidelity.tokens} held-out tokens")
    if function == "approximate":
        return "approximately preserving: " + "; ".join(changes)
    if function == "warm-start":
        parts = ["warm start: needs fine-tuning"]
        if fidelity is not None:
            parts.append(f"first-step fc output cosine {fidelity.cosine:.4f}, relative error "
                         f"{fidelity.relative_error:.4f} after calibration")
        if norm_output_added:
            parts.append("norm_output changes every step after the first")
        return "; ".join(parts)
    return FUNCTION_SUMMARY[function]
