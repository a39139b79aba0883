"""`capture`: plan the sequences, run them through a backend, stream the states into a resumable store.

A rerun of the same command on the same store captures only what is missing: the planned sequences are read
back from the store, intact shards are kept, and capture resumes at the first record no intact shard holds.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import json
import os
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

from eaglekit import __version__
from eaglekit.capture import store as st
from eaglekit.capture import store_writer
from eaglekit.capture.manifest import ENGINE_ENVIRONMENT as ENVIRONMENT
from eaglekit.capture.manifest import ID_CONVENTION, DataFile, Identity, Manifest, Plan
from eaglekit.capture.plan import (
    BUNDLED_DATA,
    DataOptions,
    SequencePlan,
    calibration_sequences,
    content_address,
    plan_sequences,
)
from eaglekit.capture.sequence import CapturedSequence
from eaglekit.engines.vllm import tensor_parallel_refusal
from eaglekit.errors import CaptureInterrupted, CheckpointError, EaglekitError, UsageError
from eaglekit.io.outputs import Role, read_roles, refuse_clobber, target_roles
from eaglekit.progress import Progress, quiet
from eaglekit.quantization import refuse_emulation_on_declared, scheme
from eaglekit.runner import REFERENCE, RUNNERS, Runner
from eaglekit.target import TargetInfo, read_target
from eaglekit.target_model import check_device

DEFAULT_SHARD_TOKENS = 1 << 14  # a shard of a 70B target (H 8192, 3 aux ids, bfloat16): about 1.3 GB


@dataclass(frozen=True)
class CaptureOptions:
    target: str
    data: DataOptions = DataOptions()
    draft: str | None = None  # its aux ids are captured
    aux_ids: tuple[int, ...] | None = None  # vLLM convention; default: the draft's, else the target's default
    engine: Runner = REFERENCE
    tensor_parallel_size: int = 1
    engine_args: tuple[tuple[str, Any], ...] = ()  # LLM(...) keyword arguments, sorted by name
    engine_python: str | None = None
    shard_tokens: int = DEFAULT_SHARD_TOKENS
    store_dtype: str = "bfloat16"
    device: str | None = None  # where the reference engine runs the target (None: the CPU)
    dtype: str = "auto"
    target_quantization: str | None = None  # reference engine: the served numerics it emulates
    force: bool = False  # replace a store of another capture
    calibration: bool = False  # capture upgrade's calibration text (fit and held-out parts) instead of the data
    calibration_file: str | None = None  # default: the bundled calibration text
    calibration_tokens: int = 2048
    import_dir: str | None = None  # vLLM extract_hidden_states files to import instead of running a backend
    captured_ids: tuple[int, ...] | None = None  # the eagle_aux_hidden_state_layer_ids those files hold

    def check(self) -> None:
        self.data.check()
        if self.engine not in RUNNERS:
            raise UsageError(f"--engine {self.engine!r}: use one of {', '.join(RUNNERS)}")
        if self.shard_tokens < 1:
            raise UsageError("--shard-tokens must be at least 1")
        if self.tensor_parallel_size < 1:
            raise UsageError("--tensor-parallel-size must be at least 1")
        st.check_store_dtype(self.store_dtype)
        if self.calibration and self.data != DataOptions():
            raise UsageError("--calibration captures upgrade's calibration text: it cannot be combined with --data, "
                             "--generate, --context-tokens, --code-tokens or --templates")
        if self.calibration_file and not self.calibration:
            raise UsageError("--calibration-file needs --calibration")
        if self.import_dir and (self.data != DataOptions() or self.calibration or self.engine != REFERENCE):
            raise UsageError("--import brings its own sequences and states: it cannot be combined with --data, "
                             "--generate, --templates, --calibration or --engine")
        if self.captured_ids is not None and len(set(self.captured_ids)) != len(self.captured_ids):
            raise UsageError(f"--captured-ids {list(self.captured_ids)} names a layer twice: vLLM writes one slot per "
                             "distinct id")
        self._check_unused()
        if self.import_dir and not self.captured_ids:
            raise UsageError("--import needs --captured-ids: the eagle_aux_hidden_state_layer_ids vLLM ran with (its "
                             "files do not record them)")
        if self.draft and self.aux_ids is not None:
            raise UsageError("give --draft or --aux-layer-ids, not both")
        if self.engine != REFERENCE and self.target_quantization:
            raise UsageError("--target-quantization emulates served numerics in the reference engine; vLLM serves "
                             "a quantized checkpoint as it is")
        if self.engine == REFERENCE and (self.tensor_parallel_size != 1 or self.engine_args or self.engine_python):
            raise UsageError("--tensor-parallel-size, --engine-arg and --engine-python apply to --engine vllm")

    @property
    def placed_on(self) -> str:
        """The device the reference engine runs the target on."""
        return self.device or "cpu"

    def _check_unused(self) -> None:
        """What places or computes a target that this capture does not run is refused, naming both options: the
        reference engine's --device with vLLM, and the target's --device, --dtype and numerics with --import (its
        files hold states vLLM already computed, kept in their own dtype)."""
        if self.device is not None:
            check_device(self.device)
        if self.import_dir:
            given = [flag for flag, value in (("--device", self.device is not None), ("--dtype", self.dtype != "auto"),
                                              ("--target-quantization", self.target_quantization)) if value]
            if given:
                raise UsageError(f"{given[0]} with --import: it sets how the target runs, and --import runs none (its "
                                 "files hold states vLLM computed, stored in their own dtype); drop it")
        if self.engine != REFERENCE and self.device is not None:
            raise UsageError(f"--device with --engine {self.engine}: it places the reference engine's target; vLLM "
                             "chooses its own devices (--tensor-parallel-size)")


@dataclass
class CaptureReport:
    store: str
    target: str
    engine: dict[str, Any]
    layer_ids: dict[str, Any]
    store_dtype: str
    records: int
    tokens: int
    shards: int
    bytes: int
    resumed_from: int | None  # the records already in the store when this run started (None: a new store)
    captured_records: int  # captured by this run
    complete: bool
    data: str
    seconds: float
    notes: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return {"eaglekit_version": __version__, **dataclasses.asdict(self), "seconds": round(self.seconds, 3)}


def capture_layer_ids(info: TargetInfo, opts: CaptureOptions) -> tuple[tuple[int, ...], str]:
    """(aux ids, where they came from): the draft's, --aux-layer-ids, or the target's default."""
    if opts.draft:
        from eaglekit.families import load_draft

        spec = load_draft(opts.draft, target=info)
        if spec.aux.ids is None:
            raise CheckpointError("the draft records no aux layer ids: pass --aux-layer-ids", spec.path)
        ids, where = tuple(spec.aux.ids), f"the draft {spec.path}"
    elif opts.aux_ids is not None:
        ids, where = tuple(opts.aux_ids), "--aux-layer-ids"
    elif opts.captured_ids is not None:
        ids, where = tuple(i for i in opts.captured_ids if i != info.num_layers), "--captured-ids"
    else:
        ids, where = info.default_aux_ids, "the target's default (2, L//2, L-3)"
    ids = tuple(sorted(set(int(i) for i in ids)))
    if opts.captured_ids is not None:
        L = info.num_layers
        if L not in opts.captured_ids:
            raise UsageError(f"--captured-ids {list(opts.captured_ids)} has no id L={L} (the last layer's output "
                             "before the final norm): the target's greedy labels come from it; rerun vLLM with "
                             f"{L} added to eagle_aux_hidden_state_layer_ids", opts.import_dir)
        missing = [i for i in ids if i not in opts.captured_ids]
        if missing:
            raise UsageError(f"aux ids {missing} were not captured: the files hold {sorted(opts.captured_ids)}",
                             opts.import_dir)
    bad = [i for i in ids if not 0 <= i <= info.num_layers]
    if not ids or bad:
        raise UsageError(f"aux layer ids {list(bad or ids)} are outside [0, {info.num_layers}] for this target "
                         f"(L={info.num_layers})", info.path)
    return ids, where


def engine_block(opts: CaptureOptions, progress: Progress | None = None) -> dict[str, Any]:
    """What computed the states: engine, its version, dtype and numerics (part of the store's identity); `progress`
    hears of vLLM's import when it is probed."""
    if opts.engine == REFERENCE:
        import torch
        import transformers

        from eaglekit.target_model import QUANTIZED_DTYPE, resolve_device, resolve_dtype

        served = scheme(opts.target_quantization)
        dtype = QUANTIZED_DTYPE if served is not None and opts.dtype == "auto" else opts.dtype
        resolved = str(resolve_dtype(dtype, resolve_device(opts.placed_on))).removeprefix("torch.")
        return {"name": "reference", "version": f"transformers {transformers.__version__}, torch {torch.__version__}",
                "dtype": resolved, "quantization": served.name if served else None, "tensor_parallel_size": 1,
                "engine_args": {}}
    from eaglekit.runtime.engine import EngineOptions, cpu_engine_environment, local_ranks, probe_engine

    engine = EngineOptions(python=opts.engine_python, tensor_parallel_size=opts.tensor_parallel_size,
                           engine_args=dict(opts.engine_args))
    probe = probe_engine(engine, progress=progress)
    block = {"name": opts.engine, "version": f"vllm {probe.version}", "dtype": opts.dtype, "quantization": "as served",
             "tensor_parallel_size": opts.tensor_parallel_size, "engine_args": dict(opts.engine_args)}
    environment = cpu_engine_environment(probe.device_type, local_ranks(engine))
    if environment:
        block[ENVIRONMENT] = environment  # what eaglekit set for vLLM (the user's own settings are theirs)
    return block


def store_identity(info: TargetInfo, aux_ids: Sequence[int], engine: dict[str, Any], inputs: dict[str, Any],
                   opts: CaptureOptions, store: str) -> Identity:
    """The manifest's identity blocks (checked as a manifest's are on read): a rerun resumes only when every one
    is equal."""
    from eaglekit.capture.head import config_digest, tokenizer_identity
    from eaglekit.provenance import target_weight_files, weights_fingerprint
    from eaglekit.target import head_digest

    tokenizer = tokenizer_identity(info)
    return Identity.read({
        "target": {"config_sha256": config_digest(info), "weights_fingerprint": weights_fingerprint(
                       target_weight_files(info.path)), "head_sha256": head_digest(info),
                   "num_hidden_layers": info.num_layers, "hidden_size": info.hidden_size,
                   "vocab_size": info.vocab_size, "model_type": info.model_type,
                   "tokenizer_sha256": tokenizer["sha256"], "chat_template_sha256": tokenizer["chat_template_sha256"]},
        "layer_ids": {"convention": ID_CONVENTION, "aux": list(aux_ids), "last": info.num_layers},
        "engine": engine,
        "inputs": inputs,
        "store": {"dtype": opts.store_dtype, "shard_tokens": opts.shard_tokens},
    }, store)


def _plan(tokenizer, opts: CaptureOptions, progress: Progress) -> tuple[SequencePlan, int | None]:
    """(the sequences to capture, how many of them upgrade fits on when they are its calibration text)."""
    if not opts.calibration:
        return plan_sequences(tokenizer, opts.data, progress=progress), None
    fit, held_out, where = calibration_sequences(tokenizer, text_file=opts.calibration_file,
                                                 max_tokens=opts.calibration_tokens)
    return SequencePlan(where, fit + held_out, [], opts.calibration_tokens, [],
                        f"upgrade's calibration text ({where}): {len(fit)} fit and {len(held_out)} held-out "
                        "sequences"), len(fit)


BUNDLED_CALIBRATION = "eaglekit/data/calibration.txt"


def _file_digest(path: str, what: str) -> str:
    """SHA-256 of a regular file, read in bounded chunks (a FIFO or device is refused, never waited on)."""
    from eaglekit.io.jsonfile import open_regular

    digest = hashlib.sha256()
    with open_regular(path, what) as fh:
        try:
            while chunk := fh.read(1 << 20):
                digest.update(chunk)
        except OSError as exc:
            raise CheckpointError(f"cannot read the {what} ({exc.strerror or exc})", path) from None
    return "sha256:" + digest.hexdigest()


def data_record(opts: CaptureOptions) -> tuple[DataFile | None, str]:
    """(the data the sequences are planned from, as the manifest records it: a file's name and SHA-256, never its
    folder; that data as the user named it); None for an import, whose files the import identifies."""
    from importlib import resources

    if opts.import_dir:
        return None, opts.import_dir
    if opts.calibration:
        path, what, bundled = opts.calibration_file, "calibration file", BUNDLED_CALIBRATION
    else:
        path, what, bundled = opts.data.data_file, "data file", BUNDLED_DATA
    if path is not None:
        return DataFile(os.path.basename(os.path.normpath(path)), _file_digest(path, what)), path
    data = resources.files("eaglekit").joinpath(bundled.removeprefix("eaglekit/")).read_bytes()
    return DataFile(bundled, "sha256:" + hashlib.sha256(data).hexdigest()), f"the bundled {bundled}"


@dataclass
class _Source:
    """Where a capture's records come from: what identifies them, and how to produce them."""

    engine: dict[str, Any]
    inputs: dict[str, Any]
    notes: list[str]
    sequences: Callable[[], list[list[int]]]  # the planned sequences (a new store only)
    records: Callable[[Sequence[Sequence[int]]], Iterator[CapturedSequence]]  # their states, in order


def _engine_source(info: TargetInfo, aux_ids: Sequence[int], opts: CaptureOptions, data: DataFile,
                   progress: Progress) -> _Source:
    """The target run by the reference hooks or vLLM on the planned data (or calibration text), which the store
    names by `data` (the file's name, not the local path the plan was read from)."""
    from eaglekit.target_model import load_tokenizer

    folder = os.path.dirname(os.path.abspath(info.path))
    tokenizer = load_tokenizer(folder, info)
    if tokenizer is None:
        raise CheckpointError("the target has no tokenizer; capture needs one to encode the data", folder)
    plan, fit_records = _plan(tokenizer, opts, progress)
    inputs: dict[str, Any] = {
        "sha256": content_address({"prompts": hashlib.sha256(json.dumps(plan.prompts).encode()).hexdigest(),
                                   "code": hashlib.sha256(json.dumps(plan.code).encode()).hexdigest(),
                                   "generate": opts.data.generate, "limit": plan.limit}),
        "source": plan.source.replace(plan.name, data.file), "data": data.to_dict()}
    if fit_records is not None:
        inputs["calibration_fit_records"] = fit_records
    loaded: list[Any] = []

    def target():
        """The reference target, loaded once and only when there is work for it."""
        if opts.engine != REFERENCE:
            return None
        if not loaded:
            from eaglekit.target_model import load_target

            progress.stage("loading the target")
            loaded.append(load_target(folder, device=opts.placed_on, dtype=opts.dtype,
                                      quantization=opts.target_quantization))
        return loaded[0]

    layer_ids = tuple(sorted(set(aux_ids) | {info.num_layers}))

    def records(sequences: Sequence[Sequence[int]]) -> Iterator[CapturedSequence]:
        if opts.engine == REFERENCE:
            from eaglekit.capture.reference import capture_with_reference

            return capture_with_reference(target(), sequences, layer_ids)
        from eaglekit.capture.vllm_engine import capture_with_vllm

        return capture_with_vllm(opts.target, sequences, layer_ids, python=opts.engine_python,
                                 tensor_parallel_size=opts.tensor_parallel_size, engine_args=dict(opts.engine_args),
                                 dtype=opts.dtype, version=engine["version"].removeprefix("vllm "),
                                 environment=engine.get(ENVIRONMENT, {}))

    def answer(prompts: list[list[int]], max_new_tokens: int) -> list[list[int]]:
        """--generate: the target's greedy answers, from the engine that runs the target."""
        if opts.engine == REFERENCE:
            from eaglekit.capture.reference import generate_answers

            return generate_answers(target(), prompts, max_new_tokens, progress=progress)
        from eaglekit.runtime.engine import EngineOptions, answers_with_vllm

        progress.stage(f"generating answers to {len(prompts):,} prompts in vLLM")
        return answers_with_vllm(opts.target, prompts, max_new_tokens=max_new_tokens, dtype=opts.dtype,
                                 opts=EngineOptions(python=opts.engine_python,
                                                    tensor_parallel_size=opts.tensor_parallel_size,
                                                    engine_args=dict(opts.engine_args),
                                                    environment=engine.get(ENVIRONMENT, {})),
                                 context=info.max_position_embeddings)

    engine = engine_block(opts, progress)
    return _Source(engine, inputs, list(plan.notes), lambda: plan.complete(opts.data, answer), records)


def _imported_source(info: TargetInfo, aux_ids: Sequence[int], opts: CaptureOptions) -> _Source:
    """vLLM extract_hidden_states or hs-connectors FP8 files (one per request, natural name order) read as records,
    every one checked against the target first."""
    from eaglekit.capture.imported import check_import, imported_records

    assert opts.import_dir is not None and opts.captured_ids is not None
    captured = tuple(sorted(opts.captured_ids))
    files = check_import(opts.import_dir, info, captured)
    layer_ids = tuple(sorted(set(aux_ids) | {info.num_layers}))
    listing = [(os.path.basename(p), os.path.getsize(p)) for p in files.files]
    inputs = {"sha256": content_address({"files": listing, "captured_ids": list(captured)}),
              "source": files.describe()}
    engine: dict[str, Any] = {"name": "import", "version": None, "dtype": files.dtype(), "quantization": "as served",
                              "tensor_parallel_size": 1, "engine_args": {}}
    notes = []
    if files.quantized and opts.store_dtype == "fp8":
        notes.append("the E4M3 states are kept bit for bit; each token's one scale is the scale of every aux id")
    elif files.quantized:
        notes.append(f"the files' E4M3 states are stored dequantized (float32 products) as {opts.store_dtype}; "
                     "--store-dtype fp8 keeps their bits")
    return _Source(engine, inputs, notes, lambda: files.sequences,
                   lambda planned: imported_records(files, planned, layer_ids, captured))


def _write_records(store: str, writer: store_writer.StoreWriter, source: _Source, sequences: list[list[int]],
                   progress: Progress, calibrating: str | None) -> None:
    """Capture the records the store does not hold yet, then mark it complete. A calibration capture's stage is
    named `calibrating` and counted in tokens (its text is a few long sequences), any other in sequences."""
    start = writer.next_record
    if start < len(sequences):
        left = sequences[start:]
        records = source.records(left)  # the reference target loads here, before its pass is announced
        tokens = sum(map(len, left))
        if calibrating:
            progress.stage(calibrating, tokens, "tokens")
        else:
            progress.stage(f"capturing target states on {tokens:,} tokens", len(left), "sequences")
        for record in records:
            writer.add(dataclasses.replace(record, index=record.index + start))
            progress.advance(len(record.token_ids) if calibrating else 1)
        writer.flush()
    if writer.next_record != len(sequences):
        raise CheckpointError(f"the capture backend returned {writer.next_record - start} of "
                              f"{len(sequences) - start} records", store)
    writer.write_manifest(complete=True)


def _discard(store: str, created: bool) -> None:
    """Remove what this run wrote into a store it started: its own files, its lock, the folder it made."""
    for name in [*st.own_files(store), st.LOCK]:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(os.path.join(store, name))
    if created:
        with contextlib.suppress(OSError):
            os.rmdir(store)


def capture_store(store: str, opts: CaptureOptions, *, progress: Progress | None = None,
                  purpose: str = "capturing calibration states") -> CaptureReport:
    """Capture (or complete) the hidden-state store at `store` for `opts.target` on `opts.data` (or import
    `opts.import_dir`'s vLLM files into it); `progress` hears of each long step, a calibration capture's pass
    named by `purpose` (upgrade names what it calibrates)."""
    started = time.perf_counter()
    progress = quiet(progress)
    opts.check()
    info = read_target(opts.target, decoder=not opts.import_dir)  # an import needs the target's facts only
    refusal = tensor_parallel_refusal(info, opts.tensor_parallel_size) if opts.engine != REFERENCE else None
    if refusal:
        raise UsageError(refusal, info.path)
    refuse_emulation_on_declared(opts.target_quantization, info)
    aux_ids, ids_from = capture_layer_ids(info, opts)
    refuse_clobber([Role("store", store)], [*target_roles(opts.target), *read_roles("--draft", opts.draft),
                                             *read_roles("--data", opts.data.data_file),
                                             *read_roles("--calibration-file", opts.calibration_file),
                                             *read_roles("--import", opts.import_dir)])
    data, shown = data_record(opts)
    st.check_before_capture(store, data, shown, force=opts.force)  # before any work, in the user's terms
    source = _imported_source(info, aux_ids, opts) if data is None else _engine_source(info, aux_ids, opts, data,
                                                                                      progress)
    created = not os.path.lexists(store)
    with st.store_lock(store):
        identity = store_identity(info, aux_ids, source.engine, source.inputs, opts, store)
        manifest, done = st.open_store(store, identity, force=opts.force)
        resumed_from = None
        if manifest is None:
            sequences = source.sequences()
            plan = store_writer.plan_bytes(sequences)
            manifest = Manifest(identity, Plan(st.sha256_bytes(plan), len(sequences), sum(map(len, sequences))))
            store_writer.write_manifest(store, manifest)  # first: the plan is the store's only once it names it
            store_writer.write_plan(store, plan)
        else:
            sequences = st.read_plan(store, manifest)
            resumed_from = done[-1].end_record if done else 0
        writer = store_writer.StoreWriter(store, manifest, done)
        start = writer.next_record
        try:
            _write_records(store, writer, source, sequences, progress, purpose if opts.calibration else None)
        except KeyboardInterrupt:
            kept = writer.done[-1].end_record if writer.done else 0
            raise CaptureInterrupted(f"interrupted after {kept} of {len(sequences)} records ({len(writer.done)} "
                                     "shard(s) kept); rerun the same command to resume", store) from None
        except EaglekitError:
            if opts.import_dir and resumed_from is None:  # a file that failed once fails again: no half store
                _discard(store, created)
            raise
    notes = [f"aux ids from {ids_from}; id {info.num_layers} (L) is always captured", *source.notes]
    return CaptureReport(
        store=os.path.abspath(store), target=opts.target, engine=source.engine,
        layer_ids={"aux": list(aux_ids), "last": info.num_layers}, store_dtype=opts.store_dtype,
        records=len(sequences), tokens=sum(s.tokens for s in writer.done), shards=len(writer.done),
        bytes=sum(s.bytes for s in writer.done), resumed_from=resumed_from,
        captured_records=len(sequences) - start, complete=True, data=source.inputs["source"],
        seconds=time.perf_counter() - started, notes=notes)
