"""`upgrade`: read, decide, plan, (calibrate), then the output dialect's writer streams, checks and publishes."""

from __future__ import annotations

import os
import time
from collections.abc import Sequence
from typing import Any

import numpy as np

from eaglekit import __version__
from eaglekit.capture.sequence import CalibrationRecords
from eaglekit.engines import RECORDS
from eaglekit.errors import OutputError, UsageError
from eaglekit.families import load_draft
from eaglekit.io.outputs import Role, read_roles, refuse_clobber, target_roles
from eaglekit.io.tensors import read_array
from eaglekit.progress import Progress, quiet
from eaglekit.quantization import refuse_emulation_on_declared
from eaglekit.redact import public_path, public_report
from eaglekit.spec import DraftSpec, eagle_version
from eaglekit.target import TargetInfo, read_target
from eaglekit.upgrade.decide import Decisions, decide
from eaglekit.upgrade.dialects import get_dialect
from eaglekit.upgrade.materialize import out_tensors
from eaglekit.upgrade.options import UpgradeOptions
from eaglekit.upgrade.output import OutputJob
from eaglekit.upgrade.plan import UpgradePlan, build_plan
from eaglekit.upgrade.report import FidelityReport, UpgradeReport, summary_line
from eaglekit.upgrade.start import Start
from eaglekit.upgrade.vocab import VocabPlan, plan_vocab


def _provenance(source: str, spec: DraftSpec, opts: UpgradeOptions, d: Decisions, vocab: VocabPlan,
                hashes: dict[str, str], summary: str, fidelity: FidelityReport | None,
                start: Start | None = None) -> dict[str, Any]:
    block: dict[str, Any] = {
        "version": __version__,
        "command": "upgrade",
        "source": public_path(source),
        "source_family": spec.family,
        "source_producer": spec.producer,
        "source_eagle_version": spec.eagle_version,
        "source_files": hashes,
        "source_provenance": spec.config["eaglekit"] if isinstance(spec.config.get("eaglekit"), dict) else None,
        "target": public_path(opts.target),
        "options": {
            "from": opts.source_family, "to": opts.to, "fc_norm": d.fc_norm, "norm_output": d.norm_output,
            "fc_norm_init": d.fc_norm_init, "aux_layer_ids": list(opts.aux_layer_ids) if opts.aux_layer_ids else None,
            "aux_convention": opts.aux_convention, "dtype": opts.dtype,
            "target_quantization": opts.target_quantization,
        },
        "function": d.function,
        "summary": summary,
        "aux_layer_ids_source": f"{d.aux.origin}: {d.aux.detail}",
        "norm_before_residual_source": d.norm_before_residual_origin,
        "conversion": list(d.changes) + [vocab.detail],
    }
    if opts.revision:
        block["source_revision"] = opts.revision
    if fidelity is not None:
        block["fidelity"] = {"fc_output_cosine": round(fidelity.cosine, 6),
                             "fc_output_relative_error": round(fidelity.relative_error, 6),
                             "held_out_tokens": fidelity.tokens, "calibration_text": fidelity.text}
    if start is not None:
        block["norm_output_rescale"] = start.fidelity.to_dict()
    return public_report(block)  # written into config.json and the weights' metadata, which a push publishes


def _calibration_states(target: TargetInfo, aux_ids: Sequence[int], opts: UpgradeOptions, what: str,
                        progress: Progress) -> CalibrationRecords:
    """The target's states on the calibration text: read from --store (only the target's config and head tensors
    are read), or captured through capture/ into a store in the cache (float32 states, as the target computes
    them) and read back; the capture's pass is the stage "calibrating `what`"."""
    import dataclasses

    from eaglekit.capture.reader import calibration_from_store

    def read(store: str) -> CalibrationRecords:
        return calibration_from_store(store, target, aux_ids, max_tokens=opts.calibration_tokens,
                                      quantization=opts.target_quantization)

    if opts.store:
        progress.stage(f"calibrating {what} from the store's states")
        return read(opts.store)
    from eaglekit.capture.cache import captured
    from eaglekit.capture.run import CaptureOptions

    capture = CaptureOptions(target=os.path.dirname(os.path.abspath(target.path)), aux_ids=tuple(aux_ids),
                             device=opts.device, target_quantization=opts.target_quantization,
                             store_dtype="float32", calibration=True, calibration_file=opts.calibration_file,
                             calibration_tokens=opts.calibration_tokens)
    with captured(capture, progress=progress, purpose=f"calibrating {what}") as done:
        return dataclasses.replace(read(done.store), text_source=opts.calibration_file or "bundled")


def _calibrate(spec: DraftSpec, opts: UpgradeOptions, d: Decisions, progress: Progress
               ) -> tuple[np.ndarray | None, FidelityReport | None, Start | None]:
    """One target pass over the calibration text, then what it feeds: the fc_norm fit and the norm_output rescale.

    Returns the fc_norm weights to write (None: nothing added), their fidelity, and the function-preserving start
    (None unless norm_output is switched on with a rescale)."""
    if not d.calibrates:
        return (np.ones((d.num_aux, d.target_hidden)) if d.fc_norm_added else None), None, None
    from eaglekit.upgrade.calibrate import fit_fc_norm

    target = d.target
    if target is None:
        raise UsageError("calibrating fc_norm or the norm_output rescale needs --target (the model whose hidden "
                         "states it measures)")
    what = ", ".join(w for w, on in (("fc_norm", d.fc_norm_added), ("rescale", d.norm_output_rescale)) if on)
    capture = _calibration_states(target, d.aux.ids, opts, what, progress)
    progress.stage(f"fitting {what} and measuring it on held-out tokens")
    weights = fidelity = start = None
    if d.fc_norm_added:
        cal = fit_fc_norm(capture, read_array(spec, "fc.weight", as_float32=True), eps=spec.geometry.rms_norm_eps,
                          dtype=d.compute_dtype)
        if not np.all(np.isfinite(cal.weights)):
            raise OutputError("calibration produced non-finite fc_norm weights (are the target's hidden states "
                              "finite?)", target.path)
        weights = cal.weights
        fidelity = FidelityReport.of(cal.calibrated, cal.ones, cal.fit_tokens, cal.text_source,
                                     opts.target_quantization)
    if d.norm_output_rescale:
        from eaglekit.upgrade.start import function_preserving_start

        start = function_preserving_start(spec, capture, fc_norm_weights=weights, fc_norm_dtype=d.compute_dtype,
                                          norm_dtype=d.cast_to or spec.tensors["norm.weight"].dtype,
                                          head_dtype=d.cast_to or spec.tensors["lm_head.weight"].dtype)
        if not (np.isfinite(start.fidelity.scale) and start.fidelity.scale > 0):
            raise OutputError(f"the draft's pre-norm state has RMS {start.fidelity.scale} on the calibration text: "
                              "no rescale fits it", target.path)
    return weights, fidelity, start


def _report(source: str, destination: str, spec: DraftSpec, d: Decisions, vocab: VocabPlan, plan: UpgradePlan,
            config: dict[str, Any], opts: UpgradeOptions, fidelity: FidelityReport | None,
            start: Start | None = None) -> UpgradeReport:
    eagle = eagle_version(d.fc_norm, d.norm_output)
    return UpgradeReport(
        source={"path": spec.path, "given": source, "family": spec.family, "producer": spec.producer,
                "eagle_version": spec.eagle_version, "files": list(spec.files), "total_bytes": spec.total_bytes},
        output={"path": os.path.abspath(destination), "given": destination, "dialect": d.dialect,
                "eagle_version": eagle, "files": [], "total_bytes": plan.total_bytes},
        dry_run=opts.dry_run,
        function=d.function,
        summary=summary_line(d.function, fidelity, d.norm_output_added, d.changes, start.fidelity if start else None),
        changes=list(d.changes),
        aux={"ids": list(d.aux.ids), "origin": d.aux.origin, "detail": d.aux.detail,
             "convention_known": d.aux.convention_known,
             "source_ids": list(d.aux.source_ids) if d.aux.source_ids is not None else None,
             "as_written": list(spec.aux.as_written) if spec.aux.as_written is not None else None},
        vocab={"vocab_size": vocab.vocab_size, "draft_vocab_size": vocab.draft_vocab_size, "action": vocab.action,
               "detail": vocab.detail},
        flags={"fc_norm": d.fc_norm, "fc_norm_added": d.fc_norm_added, "fc_norm_init": d.fc_norm_init,
               "norm_output": d.norm_output, "norm_output_added": d.norm_output_added,
               "norm_before_fc": d.norm_before_fc, "norm_before_residual": d.norm_before_residual,
               "norm_before_residual_origin": d.norm_before_residual_origin},
        tensors=list(plan.steps),
        config=config,
        fidelity=fidelity,
        serve_settings=RECORDS[get_dialect(d.dialect).ENGINE].settings(spec, None),
        start=start.fidelity if start else None,
        warnings=list(d.warnings),
        target=opts.target,
    )


def _arrays(d: Decisions, vocab: VocabPlan, weights: np.ndarray | None, start: Start | None = None
            ) -> dict[str, np.ndarray]:
    """The computed tensors' values, by the names the plan's recipes use."""
    arrays: dict[str, np.ndarray] = {}
    if weights is not None:
        arrays.update({f"fc_norm.{k}.weight": weights[k] for k in range(d.num_aux)})
    if start is not None:
        arrays.update({"norm.weight": start.norm_weight, "lm_head.column_scale": start.column_scale})
    if vocab.d2t is not None:
        arrays["d2t"] = vocab.d2t
    if vocab.t2d is not None:
        arrays["t2d"] = vocab.t2d
    return arrays


def upgrade(source: str, destination: str, options: UpgradeOptions | None = None, *,
            progress: Progress | None = None) -> UpgradeReport:
    """Write `source` as a vLLM-ready (or SGLang / speculators / TensorRT-LLM / llama.cpp GGUF) EAGLE-3.1 or EAGLE-3
    draft at `destination`: decide, plan, (calibrate), then the dialect's writer writes, checks and publishes.

    `progress` hears of the long steps: the target's load and calibration pass, the write (in bytes), the read-back.
    """
    opts = options or UpgradeOptions()
    opts.check()
    progress = quiet(progress)
    started = time.perf_counter()
    target = read_target(opts.target, decoder=not opts.store) if opts.target else None
    if target is not None:
        refuse_emulation_on_declared(opts.target_quantization, target)
    family = None if opts.source_family == "eagle3" else opts.source_family
    spec = load_draft(source, subfolder=opts.subfolder, revision=opts.revision, allow_pickle=opts.allow_pickle,
                      family=family, target=target)
    refuse_clobber([Role("output", destination)], [*read_roles("source", spec.path), *target_roles(opts.target),
                                                   *read_roles("--calibration-file", opts.calibration_file),
                                                   *read_roles("--store", opts.store)])
    dialect = get_dialect(opts.to)
    refusal = None
    try:
        dialect.WRITER.check_destination(destination, opts.force)
    except UsageError as exc:
        if not opts.dry_run:
            raise
        refusal = str(exc)

    d = decide(spec, opts, target)
    vocab = plan_vocab(spec, d.vocab_size)
    plan = build_plan(spec, d, vocab, dialect)
    config = dialect.config(spec, d, vocab)
    weights = fidelity = start = None
    calibrate_s = 0.0
    if not opts.dry_run:
        t = time.perf_counter()
        weights, fidelity, start = _calibrate(spec, opts, d, progress)
        calibrate_s = time.perf_counter() - t
    report = _report(source, destination, spec, d, vocab, plan, config, opts, fidelity, start)
    job = OutputJob(
        dialect, destination, spec, opts, d, plan, config,
        tensors=lambda: out_tensors(spec, plan, _arrays(d, vocab, weights, start), vocab.row_order),
        provenance=lambda digests: _provenance(source, spec, opts, d, vocab, digests, report.summary, fidelity,
                                               start),
        report=report, target=target, progress=progress)
    report.tensors, report.config, report.output["total_bytes"] = dialect.WRITER.contents(job)
    if opts.dry_run:
        if refusal:
            report.warnings.append(f"a real run would stop here: {refusal}")
        report.timings["total_s"] = time.perf_counter() - started
        return report

    report.timings["calibrate_s"] = calibrate_s
    report.output["files"] = dialect.WRITER.write(job)
    report.timings["total_s"] = time.perf_counter() - started
    return report
