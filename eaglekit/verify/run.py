"""verify(): check compatibility, then decode every prompt twice (target alone, then speculatively) and compare."""

from __future__ import annotations

from collections.abc import Callable, Sequence

from eaglekit.decode.eagle import EagleProposer
from eaglekit.decode.metrics import AcceptanceCounter, DriftStats
from eaglekit.decode.options import VerifyOptions
from eaglekit.decode.prefix import SharedPrefix
from eaglekit.decode.prompts import encode
from eaglekit.decode.sampling import Sampling, sampler_for
from eaglekit.decode.settings import plain_report
from eaglekit.decode.setup import decode_setup, turn_label, turns
from eaglekit.decode.speculative import Clock, LiveVerifier, capture_pass, greedy_decode, speculative_decode
from eaglekit.decode.stats import by_category, sample_marker, tau_interval
from eaglekit.errors import UsageError
from eaglekit.progress import Progress, counted, quiet
from eaglekit.provenance import measured_files
from eaglekit.rules import ValidationReport
from eaglekit.runtime.engine import EngineRun, check_engine_available, logged_aux_ids, run_vllm
from eaglekit.spec import DraftSpec
from eaglekit.target_model import TargetModel
from eaglekit.verify.acceptance_profile import speculation_profile
from eaglekit.verify.diagnose import Sweep, conclude, hypotheses, needed_ids
from eaglekit.verify.report import PromptOutcome, VerifyReport, VerifySweep
from eaglekit.verify.served import ServedReading, served_reading

TIE_TOLERANCE = {"float32": 1e-2, "float16": 0.1, "bfloat16": 0.5}
"""Top-1 minus top-2 logit of the target below which a divergence is a numerical tie: verifying k+1 rows at once
and decoding one row at a time round differently, and on a near-tie either token is the target's greedy choice."""
WARMUP_TOKENS = 4


def _divergence(spec_tokens: list[int], target_tokens: list[int], margins: list[float],
                tolerance: float) -> dict | None:
    n = min(len(spec_tokens), len(target_tokens))
    first = next((i for i in range(n) if spec_tokens[i] != target_tokens[i]), n)
    if first == n and len(spec_tokens) == len(target_tokens):
        return None
    margin = margins[first] if first < len(margins) else None
    return {"position": first, "target_top2_margin": margin,
            "numerical_tie": margin is not None and margin <= tolerance}


def verify(draft: str, target: str, options: VerifyOptions = VerifyOptions(), *,
           progress: Progress | None = None) -> VerifyReport:
    """Run `draft` against `target` on every prompt under one condition; raise before decoding if the two do not
    fit."""
    options.check()
    if len(options.conditions) > 1:
        raise UsageError("verify() measures one condition: verify_conditions() runs several --context-tokens or "
                         "--template values")
    return verify_conditions(draft, target, options, progress=progress).reports[0]


def verify_conditions(draft: str, target: str, options: VerifyOptions = VerifyOptions(), *,
                      progress: Progress | None = None) -> VerifySweep:
    """verify under every condition of `options` (each template with each context length), the target and the
    drafter loaded once; a sweep of several decodes eaglekit's reading of the draft only. `progress` hears of the
    target's load and of both decodes of every prompt, token by token."""
    options.check()
    progress = quiet(progress)
    conditions = options.conditions
    several = len(conditions) > 1
    if several and (options.diagnose or options.engine != "reference"):
        raise UsageError("--diagnose and --engine measure one condition: give one --context-tokens value and one "
                         "--template")
    if options.engine == "both":
        check_engine_available(options.engine_options, progress=progress)  # before minutes of reference decoding
    setup = decode_setup([("draft", draft)], target, options, progress=progress)
    model, (checked,) = setup.target_model, setup.drafts
    spec, info, aux_ids = checked.spec, setup.info, checked.aux_ids
    tolerance = TIE_TOLERANCE.get(setup.dtype, 0.0)

    def make_drafter(overrides: dict[str, bool] | None = None):
        return setup.drafter(checked, overrides)

    drafter = make_drafter()
    prompts, k, eos = setup.prompts, setup.k, setup.eos_ids
    if options.warmup:
        progress.stage("warming up both decodes")
        _warm_up(model, drafter, aux_ids, encode(prompts.prompts[0], model.tokenizer), k)
    flags = {name: bool(getattr(drafter.config, name)) for name in ("fc_norm", "norm_output", "norm_before_fc",
                                                                     "norm_before_residual")}
    measured = measured_files(spec, info)
    reports: list[VerifyReport] = []
    for condition in conditions:
        condition_options = options.at(condition)
        readings = _diagnosis_sweep(spec, info, options, aux_ids, drafter, make_drafter, setup) \
            if options.diagnose else None
        # shared by the live decode and the diagnosis; the target-only decode pays its own prefill, as the live one
        prefix = SharedPrefix(model, needed_ids(readings.hyps) if readings else aux_ids, options.prefill_chunk)

        counter, drift, clock = AcceptanceCounter(k), DriftStats(k), Clock()
        sampler = sampler_for(options.sampling)
        target_s, spec_tokens, target_tokens, outcomes, target_outputs, encoded = 0.0, 0, 0, [], [], []
        for turn, (prompt, ids, plain) in enumerate(turns(prompts, model, condition_options, progress=progress)):
            progress.stage(f"{turn_label(turn + 1, prompts.turns)}: speculative", setup.max_new_tokens, "tokens")
            proposer = EagleProposer(drafter, aux_ids, max_len=len(ids) + setup.max_new_tokens + k + 2, drift=drift,
                                     chunk=options.prefill_chunk)
            spec_run = speculative_decode(LiveVerifier(model, aux_ids, prefix), proposer, ids, k=k,
                                          max_new_tokens=setup.max_new_tokens, eos_ids=eos, sampler=sampler,
                                          progress=progress)
            counter.merge(spec_run.counter)
            clock.merge(spec_run.clock)
            target_s += plain.seconds
            spec_tokens += len(spec_run.tokens)
            target_tokens += len(plain.tokens)
            target_outputs.append(list(plain.tokens))
            encoded.append(ids)
            divergence = _divergence(spec_run.tokens, plain.tokens, plain.margins, tolerance) if sampler is None \
                else None
            outcomes.append(PromptOutcome(prompt.name, len(ids), len(spec_run.tokens),
                                          spec_run.counter.acceptance_length,
                                          divergence is None if sampler is None else None, divergence,
                                          prompt.category, prompt.conversation or prompt.name, spec_run.counter,
                                          spec_run.clock.total_s, plain.seconds, len(plain.tokens)))
            if readings is not None:
                readings.add(capture_pass(model, ids, plain.tokens, needed_ids(readings.hyps), prefix=prefix))

        served = None
        if not options.as_eaglekit_reads and options.aux_layer_ids is None and not several:
            served = served_section(spec, info, checked.rules, options, flags, aux_ids, counter,
                                    lambda reading: _acceptance(model, make_drafter(_flips(flags, reading.flags)),
                                                                reading.aux_ids, encoded, k, setup.max_new_tokens,
                                                                eos, options.sampling, progress))
        engine = comparison = None
        if options.engine == "both":
            engine, comparison = _beside_the_engine(spec, target, info, options, setup, drafter, aux_ids, encoded,
                                                    counter, target_outputs, outcomes, progress)
        reports.append(VerifyReport(
            draft=spec.path, settings=setup.settings(condition), eagle_version=spec.eagle_version, flags=flags,
            aux_layer_ids=list(aux_ids), aux_layer_ids_source=checked.aux_source,
            chat_template=bool(getattr(model.tokenizer, "chat_template", None)), checks=checked.checks,
            counter=counter, drift=drift, spec_clock=clock, target_only_s=target_s,
            spec_tokens=spec_tokens, target_tokens=target_tokens, outcomes=outcomes, tie_tolerance=tolerance,
            diagnosis=conclude(readings.results()) if readings else None, min_acceptance=options.min_acceptance,
            engine=engine, engine_comparison=comparison, served=served, measured=measured,
        ))
    return VerifySweep(reports)


def _diagnosis_sweep(spec: DraftSpec, info, options: VerifyOptions, aux_ids, drafter, make_drafter, setup) -> Sweep:
    """--diagnose: the plausible readings of the files (ids shifted, defaults, flags flipped), replayed on the same
    target passes as the live decode."""
    written_order = spec.aux.ids if options.aux_layer_ids is None else None
    hyps = hypotheses(aux_ids, written_order, info.num_layers, info.default_aux_ids,
                      bool(drafter.config.norm_before_residual), bool(drafter.config.norm_output))
    return Sweep(hyps, make_drafter, k=setup.k, max_new_tokens=setup.max_new_tokens, eos_ids=setup.eos_ids)


def _beside_the_engine(spec: DraftSpec, target: str, info, options: VerifyOptions, setup, drafter, aux_ids,
                       encoded, counter: AcceptanceCounter, target_outputs, outcomes,
                       progress: Progress) -> tuple[dict, dict]:
    """--engine both: vLLM on the same encoded prompts, and its counters against this decode's (rerun with the ids
    vLLM captured where they differ from ours)."""
    k, model = setup.k, setup.target_model
    progress.stage("vLLM: the target alone, then with the draft")
    run = run_vllm(spec.path, target, encoded, k=k, max_new_tokens=setup.max_new_tokens, dtype=setup.dtype,
                   opts=options.engine_options, context=info.max_position_embeddings)
    engine_ids = engine_aux_ids(run, info)
    rerun = None
    if engine_ids is not None and tuple(engine_ids) != tuple(aux_ids):
        rerun = _acceptance(model, drafter, engine_ids, encoded, k, setup.max_new_tokens, setup.eos_ids,
                            progress=progress, what="with the ids vLLM captures")
    return run.to_dict(), compare_engine(counter, run, aux_ids, engine_ids, rerun, target_outputs,
                                         [o.counter or AcceptanceCounter(k) for o in outcomes])


def _flips(ours: dict[str, bool], served: dict[str, bool]) -> dict[str, bool]:
    return {name: value for name, value in served.items() if ours.get(name) != value}


def served_section(spec: DraftSpec, info, rules: ValidationReport, options: VerifyOptions, flags: dict[str, bool],
                   aux_ids: Sequence[int], counter: AcceptanceCounter,
                   decode: Callable[[ServedReading], AcceptanceCounter]) -> dict:
    """The report's `served` section: vLLM's reading of the files as they are and, where it differs from
    eaglekit's, τ decoded that way beside τ as eaglekit reads the draft (what `eaglekit upgrade` makes vLLM read).
    vLLM does not run here: the reading is eaglekit's model of its loader, and the section says it is a prediction
    (`--engine both` measures the engine itself)."""
    reading = served_reading(spec, info, rules, options.engine_version, options.vllm_runner)
    doc = {**reading.to_dict(), "predicted": True, "differs": False, "acceptance_length": None,
           "per_position_acceptance": None}
    predicted = f"predicted for {reading.engine} from the files as they stand"
    upgraded = f"after `{reading.fix}`" if reading.fix else "as eaglekit reads it"
    if reading.refusal is not None:
        doc.update(differs=True, message=f"{predicted}: it refuses to load them ({reading.refusal}); {upgraded}: "
                                         f"τ {counter.acceptance_length:.3f}")
        return doc
    differs = tuple(reading.aux_ids) != tuple(aux_ids) or bool(_flips(flags, reading.flags))
    if not differs:
        doc["message"] = f"{predicted}: it reads them as eaglekit does"
        return doc
    if len(set(reading.aux_ids)) != len(aux_ids):
        doc.update(differs=True, message=f"{predicted}: it captures {list(reading.aux_ids)}, not {len(aux_ids)} "
                                         "distinct states for this draft's fc (not decoded); "
                                         f"{upgraded}: τ {counter.acceptance_length:.3f}")
        return doc
    served = decode(reading)
    changed = [f"aux ids {list(reading.aux_ids)} (eaglekit: {list(aux_ids)})"] if tuple(reading.aux_ids) != tuple(
        aux_ids) else []
    changed += [f"{name}={value}" for name, value in _flips(flags, reading.flags).items()]
    doc.update(differs=True, acceptance_length=served.acceptance_length, per_position_acceptance=served.per_position,
               message=f"{predicted} ({', '.join(changed)}): τ {served.acceptance_length:.3f}; "
                       f"{upgraded}: τ {counter.acceptance_length:.3f}")
    return doc


def verify_in_engine(draft: str, target: str, options: VerifyOptions, *, progress: Progress | None = None) -> dict:
    """--engine vllm: the engine alone (a target of any size, with vLLM's tensor parallelism); the tokenizer is the
    only part of the target loaded here."""
    options.check()
    if not plain_report(options.conditions):
        raise UsageError("--engine vllm measures the chat template at one context length: give one "
                         "--context-tokens value and --template chat")
    options = options.at(options.conditions[0])
    check_engine_available(options.engine_options, progress=progress)
    setup = decode_setup([("draft", draft)], target, options, load_model=False)
    (checked,), prompts, dtype, info = setup.drafts, setup.prompts, setup.dtype, setup.info
    spec = checked.spec
    if prompts.turns != len(prompts.prompts):
        raise UsageError("--turns all asks each turn after the target's answer to the one before: use --engine both "
                         "(the reference decodes the answers and vLLM gets the same turns) or --turns first")
    encoded = [encode(p, setup.tokenizer, context_tokens=options.condition.context_tokens, index=i)
               for i, p in enumerate(prompts.prompts)]
    quiet(progress).stage(f"vLLM: the target alone, then with the draft, on {len(encoded)} prompts")
    run = run_vllm(spec.path, target, encoded, k=setup.k, max_new_tokens=setup.max_new_tokens, dtype=dtype,
                   opts=options.engine_options, context=info.max_position_embeddings)
    groups = [p.conversation or p.name for p in prompts.prompts]
    interval = tau_interval(run.per_request, groups) if run.per_request else None
    categories = (by_category(run.per_request, [p.category for p in prompts.prompts], groups,
                              setup.k)
                  if run.per_request and any(p.category is not None for p in prompts.prompts) else None)
    return {"draft": spec.path, "target": target, "eagle_version": spec.eagle_version,
            "num_speculative_tokens": setup.k, "max_new_tokens": setup.max_new_tokens,
            "dtype": dtype, "prompts": {"name": prompts.name, "count": len(encoded),
                                        "context_tokens": options.context_tokens},
            "eaglekit_aux_layer_ids": list(checked.aux_ids),
            "engine_aux_layer_ids": list(engine_aux_ids(run, info) or []),
            "acceptance_settings": run.acceptance_settings,
            "engine": run.to_dict(), "acceptance_length_interval": interval.to_dict() if interval else None,
            **sample_marker(len(set(groups))),
            "categories": categories,
            "speculation_profile": speculation_profile(
                run.counter, per_request=[c.acceptance_length for c in run.per_request or [] if c.drafts],
                draft=spec.path, target=target, eagle_version=spec.eagle_version, per_category=categories,
                conditions={"engine": f"vLLM {run.version}", "dataset": prompts.name, "prompts": len(encoded),
                            "context_tokens": options.context_tokens, "max_new_tokens": setup.max_new_tokens,
                            "sampling": "greedy", "dtype": dtype})}


def _acceptance(model: TargetModel, drafter, aux_ids: Sequence[int], encoded, k: int, max_new_tokens: int,
                eos, sampling: Sampling = Sampling(), progress: Progress | None = None,
                what: str = "as vLLM reads the files") -> AcceptanceCounter:
    """The reference's counters with other aux ids (the ones the engine captures) or another reading of the files;
    a sampled decode draws from a generator seeded as the measured one was."""
    counter = AcceptanceCounter(k)
    sampler = sampler_for(sampling)
    for ids in counted(progress, f"speculative decodes {what}", encoded, len(encoded), "prompts"):
        proposer = EagleProposer(drafter, aux_ids, max_len=len(ids) + max_new_tokens + k + 2)
        run = speculative_decode(LiveVerifier(model, aux_ids), proposer, ids, k=k, max_new_tokens=max_new_tokens,
                                 eos_ids=eos, sampler=sampler)
        counter.merge(run.counter)
    return counter


def engine_aux_ids(run: EngineRun, info) -> tuple[int, ...] | None:
    """The layers the engine says it captures (its log line), else the engine default it falls back to silently."""
    logged = logged_aux_ids(run.aux_log)
    if logged is not None:
        return logged
    return tuple(info.default_aux_ids)


def _counts(c: AcceptanceCounter) -> tuple[int, int, tuple[int, ...]]:
    return c.drafts, c.accepted, tuple(c.accepted_at)


def compare_engine(reference: AcceptanceCounter, run: EngineRun, aux_ids: Sequence[int],
                   served: Sequence[int] | None, as_served: AcceptanceCounter | None,
                   target_outputs: Sequence[Sequence[int]], per_prompt: Sequence[AcceptanceCounter] = ()) -> dict:
    """The verdict of --engine both: do vLLM's counters equal the reference's, and if not, is it the ids?
    Counters compare only when both engines' targets decoded the same text (in float32 they do). Where vLLM
    reports per-request counters, agreement means every prompt's counters agree, not only the totals."""
    differing = (None if run.per_request is None or len(run.per_request) != len(per_prompt) else
                 [i for i, (a, b) in enumerate(zip(per_prompt, run.per_request)) if _counts(a) != _counts(b)])
    same = _counts(reference) == _counts(run.counter) and not differing
    diverged = [i for i, (a, b) in enumerate(zip(target_outputs, run.target_outputs)) if list(a) != list(b)]
    doc = {"counters_equal": same, "reference_acceptance_length": reference.acceptance_length,
           "engine_acceptance_length": run.counter.acceptance_length, "reference_aux_layer_ids": list(aux_ids),
           "engine_aux_layer_ids": list(served) if served is not None else None,
           "reference_as_served_acceptance_length": as_served.acceptance_length if as_served else None,
           "target_outputs_differ": diverged, "prompts_with_other_counters": differing}
    if diverged and not same:
        doc.update(verdict="different decodes",
                   message=f"vLLM {run.version}'s target alone decodes other tokens than the reference's on prompt(s) "
                           f"{diverged} (rounding of this dtype), so the counters measure different text; compare in "
                           "float32")
    elif same:
        doc.update(verdict="agree", message=f"vLLM {run.version} and the reference count the same drafts and "
                                            "accepted tokens at every position"
                                            + (", prompt by prompt" if differing is not None else ""))
    elif as_served is not None and _counts(as_served) == _counts(run.counter):
        doc.update(verdict="engine reads other aux ids",
                   message=f"as served by vLLM {run.version}: τ {run.counter.acceptance_length:.3f} (it captures "
                           f"{list(served or ())}); as eaglekit reads the draft ({list(aux_ids)}): τ "
                           f"{reference.acceptance_length:.3f}; `eaglekit upgrade` writes the ids so vLLM reads those")
    else:
        doc.update(verdict="disagree",
                   message=f"vLLM {run.version} τ {run.counter.acceptance_length:.3f} vs reference "
                           f"{reference.acceptance_length:.3f} with the same ids: an engine misreading, a feature it "
                           "does not support, or an eaglekit bug")
    labels = run.acceptance_settings["labels"]
    if labels:  # vLLM counted under another rule than the reference's: say so beside the verdict
        doc["message"] = f"{doc['message']} (vLLM: {'; '.join(labels)})"
    return doc


def _warm_up(model: TargetModel, drafter, aux_ids: Sequence[int], prompt: Sequence[int], k: int) -> None:
    """One short untimed run of both paths: the first call of each shape pays one-off setup costs."""
    head = list(prompt[: max(2, min(len(prompt), 16))])
    greedy_decode(model, head, max_new_tokens=WARMUP_TOKENS)
    proposer = EagleProposer(drafter, aux_ids, max_len=len(head) + WARMUP_TOKENS + k + 2)
    speculative_decode(LiveVerifier(model, aux_ids), proposer, head, k=k, max_new_tokens=WARMUP_TOKENS)
