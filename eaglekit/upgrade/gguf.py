"""The GGUF writer of `eaglekit upgrade --to gguf`: the plan's tensors as the GGUF llama.cpp loads with
`--spec-type draft-eagle3`, written beside DST, read back and checked, renamed into place.

What llama.cpp's eagle3 loader reads (src/models/eagle3.cpp, as read at build b11434) and its converter writes:
arch `eagle3`; `eagle3.target_layers` (exactly three, input-of-layer: vLLM's convention) and
`eagle3.target_hidden_size`; one decoder layer under `blk.0.` with the Llama names, `hidden_norm` as
`attn_norm_2`; q/k rows interleaved per head for its NORM rope; 1-D norms in F32; `d2t` as absolute target ids
(I64); `t2d` dropped; `input_norm` (norm_before_fc) as `enc.output_norm`; a missing token_embd / output borrowed
from the target. Unlike llama.cpp's own converter, the target layers written are the ids the draft was trained
on wherever its config records them. The target's tokenizer is copied from its GGUF, so llama.cpp's draft/target
vocabulary check passes. What it cannot write is refused by the dialect (eaglekit.upgrade.dialects.gguf).
"""

from __future__ import annotations

import json
import math
import os
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from eaglekit.engines.llamacpp import ARCH
from eaglekit.errors import CheckpointError, OutputError, UsageError
from eaglekit.io.gguf import GgufContents, GgufField, GgufTensor, gguf_module, read_gguf, write_gguf
from eaglekit.io.outputs import OUTPUT, Role, check_parent
from eaglekit.io.publish import Staged, publish
from eaglekit.io.writer import ByteRange, OutTensor, iter_file_chunks
from eaglekit.provenance import hash_files, placeholders, source_files
from eaglekit.spec import DraftSpec
from eaglekit.target import TargetInfo
from eaglekit.upgrade.decide import Decisions
from eaglekit.upgrade.encode import decode
from eaglekit.upgrade.output import OutputJob
from eaglekit.upgrade.plan import TensorStep, UpgradePlan

FLOAT_TYPES = ("F32", "F16", "BF16")
FILE_TYPES = {"F32": 0, "F16": 1, "BF16": 32}  # llama.cpp's llama_ftype of a file whose matrices are all this type


def rope_type(scaling: dict) -> str:
    return str(scaling.get("rope_type") or scaling.get("type") or "default")


def llama3_rope_factors(scaling: dict, theta: float, head_dim: int) -> np.ndarray:
    """Per-frequency divisors of Llama-3 rope scaling (the `rope_freqs` tensor llama.cpp multiplies in)."""
    factor = float(scaling.get("factor", 8.0))
    low, high = float(scaling.get("low_freq_factor", 1.0)), float(scaling.get("high_freq_factor", 4.0))
    context = float(scaling.get("original_max_position_embeddings", 8192))
    freqs = 1.0 / theta ** (np.arange(0, head_dim, 2, dtype=np.float64) / head_dim)
    out = []
    for freq in freqs:
        wavelen = 2 * math.pi / freq
        if wavelen < context / high:
            out.append(1.0)
        elif wavelen > context / low:
            out.append(factor)
        else:
            smooth = (context / wavelen - low) / (high - low)
            out.append(1.0 / ((1 - smooth) / factor + smooth))
    return np.asarray(out, dtype=np.float32)


def interleave_rotary_rows(w: np.ndarray, heads: int) -> np.ndarray:
    """q/k rows from Hugging Face's half-split rotary layout to the pairwise layout of llama.cpp's NORM rope."""
    return w.reshape(heads, 2, w.shape[0] // heads // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def _raw(t: OutTensor) -> bytes:
    chunks = (iter_file_chunks(t.source.path, t.source.start, t.source.end) if isinstance(t.source, ByteRange)
              else t.source())
    return b"".join(chunks)


def _maker(t: OutTensor, ggml_type: str, heads: int | None) -> Callable[[], np.ndarray]:
    def make() -> np.ndarray:
        raw = _raw(t)
        if t.name == "d2t":
            offsets = np.frombuffer(raw, dtype="<i8")
            return offsets + np.arange(offsets.size, dtype=np.int64)  # llama.cpp wants absolute target ids
        if ggml_type == "F32":
            values = decode(raw, t.dtype).reshape(t.shape)
        else:
            values = np.frombuffer(raw, dtype={"F16": "<f2", "BF16": "<u2"}[ggml_type]).reshape(t.shape)
        return interleave_rotary_rows(values, heads) if heads else values
    return make


@dataclass
class GgufPlan:
    tensors: list[GgufTensor]
    steps: list[TensorStep]
    fields: list[GgufField]


def plan_gguf(spec: DraftSpec, d: Decisions, plan: UpgradePlan, out: list[OutTensor], target_gguf: GgufContents,
              provenance: dict) -> GgufPlan:
    """The plan's tensors in llama.cpp's encodings (in canonical-name order), and the metadata fields."""
    gguf = gguf_module()
    V = gguf.GGUFValueType
    g = spec.geometry
    tensors, steps = [], []
    heads = {"layers.0.self_attn.q_proj.weight": g.num_heads, "layers.0.self_attn.k_proj.weight": g.num_kv_heads}
    by_name = {t.name: t for t in out}
    for step in sorted(plan.steps, key=lambda s: s.canonical):
        if step.action == "drop":
            steps.append(step)
            continue
        t = by_name[step.name]
        if step.canonical == "d2t":
            ggml, note = "I64", "absolute target ids (d2t[i] + i)"
        elif t.dtype not in FLOAT_TYPES:
            raise UsageError(f"tensor {step.canonical} is {t.dtype}: GGUF output takes F32, F16 or BF16 weights")
        elif len(t.shape) == 1:
            ggml, note = "F32", "norm in F32, as llama.cpp keeps 1-D tensors"
        else:
            ggml, note = t.dtype, ""
        if step.canonical in heads:
            note = f"rows interleaved per head ({heads[step.canonical]} heads) for llama.cpp's rope"
        tensors.append(GgufTensor(t.name, t.shape, ggml, _maker(t, ggml, heads.get(step.canonical))))
        if note:
            step = replace(step, action="transform", dtype=ggml, note=note)
        elif step.action == "rename":
            step = replace(step, note="")  # to llama.cpp's name, not the canonical one
        steps.append(step)
    if g.rope_scaling and rope_type(g.rope_scaling) == "llama3":
        factors = llama3_rope_factors(g.rope_scaling, g.rope_theta, g.head_dim)
        tensors.append(GgufTensor("rope_freqs.weight", factors.shape, "F32", lambda: factors))
        steps.append(TensorStep("rope_freqs.weight", "add", "F32", factors.shape, None, None,
                                "llama3 rope factors, as llama.cpp's converter computes them"))
    if "fc.weight" not in by_name:
        raise CheckpointError("no fc.weight", spec.path)

    a = ARCH
    matrices = {t.ggml_type for t in tensors if len(t.shape) == 2}
    scalars = [
        ("general.type", "model", V.STRING), ("general.name", os.path.basename(spec.path.rstrip("/")), V.STRING),
        (f"{a}.block_count", 1, V.UINT32), (f"{a}.embedding_length", g.hidden_size, V.UINT32),
        (f"{a}.feed_forward_length", g.intermediate_size, V.UINT32),
        (f"{a}.attention.head_count", g.num_heads, V.UINT32),
        (f"{a}.attention.head_count_kv", g.num_kv_heads, V.UINT32),
        (f"{a}.attention.key_length", g.head_dim, V.UINT32), (f"{a}.attention.value_length", g.head_dim, V.UINT32),
        (f"{a}.attention.layer_norm_rms_epsilon", float(g.rms_norm_eps), V.FLOAT32),
        (f"{a}.rope.freq_base", float(g.rope_theta), V.FLOAT32), (f"{a}.rope.dimension_count", g.head_dim, V.UINT32),
        (f"{a}.vocab_size", d.vocab_size, V.UINT32), (f"{a}.target_hidden_size", d.target_hidden, V.UINT32),
        (f"{a}.norm_before_residual", d.norm_before_residual, V.BOOL),
        (f"{a}.norm_before_fc", d.norm_before_fc, V.BOOL),
        ("eaglekit.provenance", json.dumps(provenance, sort_keys=True), V.STRING),
        ("general.quantization_version", gguf.GGML_QUANT_VERSION, V.UINT32),
    ]
    if len(matrices) == 1:
        scalars.append(("general.file_type", FILE_TYPES[matrices.pop()], V.UINT32))
    context = g.max_position_embeddings or (d.target.max_position_embeddings if d.target else None)
    if context:
        scalars.append((f"{a}.context_length", context, V.UINT32))
    fields = [GgufField(k, v, t) for k, v, t in scalars]
    fields.append(GgufField(f"{a}.target_layers", list(d.aux.ids), V.ARRAY, V.INT32))
    fields += [f for k, f in target_gguf.fields.items() if k.startswith("tokenizer.")]
    return GgufPlan(tensors, steps, fields)


def check_gguf(path: str, spec: DraftSpec, d: Decisions, target: TargetInfo) -> None:
    """Read the written file back with gguf-py and check what llama.cpp's loader requires of it."""
    contents, arrays = read_gguf(path, tensor_data=lambda n: n == "d2t")
    g, H, T = spec.geometry, spec.geometry.hidden_size, d.target_hidden
    problems = []
    if contents.value("general.architecture") != ARCH:
        problems.append(f"general.architecture is {contents.value('general.architecture')!r}")
    if contents.value(f"{ARCH}.target_layers") != list(d.aux.ids):
        problems.append(f"target_layers {contents.value(f'{ARCH}.target_layers')} != {list(d.aux.ids)}")
    expected = {
        "fc.weight": (H, d.num_aux * T), "output_norm.weight": (H,), "blk.0.attn_norm.weight": (H,),
        "blk.0.attn_norm_2.weight": (H,), "blk.0.attn_q.weight": (g.num_heads * g.head_dim, 2 * H),
        "blk.0.attn_k.weight": (g.num_kv_heads * g.head_dim, 2 * H),
        "blk.0.attn_v.weight": (g.num_kv_heads * g.head_dim, 2 * H),
        "blk.0.attn_output.weight": (H, g.num_heads * g.head_dim), "blk.0.ffn_norm.weight": (H,),
        "blk.0.ffn_gate.weight": (g.intermediate_size, H), "blk.0.ffn_up.weight": (g.intermediate_size, H),
        "blk.0.ffn_down.weight": (H, g.intermediate_size),
    }
    if d.norm_before_fc:
        expected["enc.output_norm.weight"] = (d.num_aux * T,)
    for name, shape in expected.items():
        if contents.tensors.get(name) != shape:
            problems.append(f"{name} has shape {contents.tensors.get(name)}, the loader wants {shape}")
    rows = contents.tensors.get("output.weight", (target.vocab_size,))[0]
    if "d2t" in arrays:
        ids = arrays["d2t"]
        if contents.tensor_types["d2t"] != "I64" or ids.shape != (rows,):
            problems.append(f"d2t is {contents.tensor_types['d2t']} {ids.shape}, the loader wants I64 ({rows},)")
        elif ids.min() < 0 or ids.max() >= target.vocab_size or np.unique(ids).size != ids.size:
            problems.append("d2t holds ids outside the target vocabulary or repeats one")
    elif rows != target.vocab_size:
        problems.append(f"output.weight has {rows} rows but there is no d2t")
    tokens = contents.fields.get("tokenizer.ggml.tokens")
    if tokens is None or len(tokens.value) != target.vocab_size:
        problems.append("the tokenizer copied from the target does not have the target's vocabulary size")
    if problems:
        raise OutputError(f"the GGUF written fails its read-back check, nothing was written: {problems[0]}"
                          + (f" (and {len(problems) - 1} more)" if len(problems) > 1 else ""), path)


def destination_problem(destination: str, force: bool) -> str | None:
    """Why DST cannot receive the GGUF (None: it can)."""
    if not destination.endswith(".gguf"):
        return f"--to gguf writes one file: name DST *.gguf, not {destination}"
    if os.path.isdir(destination):
        return f"{destination} is a folder: --to gguf writes one file"
    if os.path.lexists(destination) and not force:
        return f"{destination} exists (pass --force to replace it once the new file is complete)"
    return None


def check_destination(destination: str, force: bool) -> None:
    problem = destination_problem(destination, force)
    if problem:
        raise UsageError(problem)
    check_parent(Role(OUTPUT, destination))


def _target(job: OutputJob) -> TargetInfo:
    """The target GGUF whose tokenizer goes into the draft (the gguf dialect refuses a job without one)."""
    if job.target is None:
        raise UsageError("--to gguf needs --target, the target's GGUF file")
    return job.target


def _gguf_plan(job: OutputJob, digests: dict[str, str]) -> GgufPlan:
    target_gguf, _ = read_gguf(_target(job).path)
    return plan_gguf(job.spec, job.d, job.plan, job.tensors(), target_gguf, job.provenance(digests))


def contents(job: OutputJob) -> tuple[list[TensorStep], dict[str, Any], int]:
    """What the report lists as written: the GGUF's tensors, its metadata (less the tokenizer) and their size."""
    draft = _gguf_plan(job, placeholders(source_files(job.spec)))
    fields = {f.key: f.value for f in draft.fields if not f.key.startswith(("tokenizer.", "eaglekit."))}
    return draft.steps, fields, sum(t.nbytes for t in draft.tensors)


def write(job: OutputJob) -> list[str]:
    """One file: written beside DST, read back and checked against llama.cpp's loader, renamed into place."""
    t = time.perf_counter()
    job.progress.stage("writing the GGUF", job.report.output["total_bytes"], "bytes")
    final = _gguf_plan(job, hash_files(job.spec.path, source_files(job.spec)))

    def read_back(stage: Staged) -> None:
        job.progress.stage("reading the GGUF back and checking it as llama.cpp reads it")
        check_gguf(stage.path, job.spec, job.d, _target(job))

    publish(job.destination,
            lambda stage: write_gguf(stage.path, ARCH, final.fields, final.tensors, job.progress.advance),
            read_back=read_back, replace=job.opts.force, what="the GGUF")
    job.report.validated = True
    job.report.timings["write_s"] = time.perf_counter() - t
    return [os.path.basename(job.destination)]
