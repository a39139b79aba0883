"""The one setup every decode of drafts against a target starts from (verify, compare, finetune's evaluation).

Each draft is read resolved against the target and checked against it, the prompts are chosen, the target is
loaded and every prompt is checked to leave room for its decode, all before the first forward: a mismatch costs
seconds, not a run. Decode settings (k, new tokens, device, dtype, EOS) are read off the setup, never re-derived,
so every report of one run says what was actually decoded.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from eaglekit.decode.prefix import SharedPrefix
from eaglekit.decode.prompts import PromptSet, bundled_prompts, encode, read_prompts, with_context
from eaglekit.decode.sampling import Sampling, sampler_for
from eaglekit.decode.settings import Condition, DecodeSettings
from eaglekit.decode.speculative import check_room, greedy_decode
from eaglekit.errors import IncompatibleDraftError, UsageError
from eaglekit.families import load_draft
from eaglekit.findings import Finding
from eaglekit.io.outputs import read_roles, refuse_clobber, target_roles
from eaglekit.progress import Progress, quiet
from eaglekit.quantization import refuse_emulation_on_declared
from eaglekit.rules import ValidationReport, decode_findings, run_rules
from eaglekit.spec import DraftSpec
from eaglekit.target import TargetInfo, read_target, target_config_path
from eaglekit.target_model import TargetModel, load_target, load_tokenizer, resolve_device, resolve_dtype

if TYPE_CHECKING:
    from eaglekit.decode.options import VerifyOptions


@dataclass(frozen=True)
class DecodeDraft:
    """One draft as a decode reads it: resolved against the target (`spec.as_written` is what its files record),
    the aux ids the decode captures, vLLM's rules run over it, and the decode rules' findings (its compatibility
    checks, EK291..EK299) drawn from both."""

    name: str  # how a refusal names it: "draft", "draft A", "reference", ...
    spec: DraftSpec
    aux_ids: tuple[int, ...]
    aux_source: str
    rules: ValidationReport
    checks: list[Finding]

    @property
    def path(self) -> str:
        return self.spec.path


@dataclass(frozen=True)
class DecodeSetup:
    """Drafts, prompts and the target of one run, with the settings every decode of it uses."""

    target: str  # as given (the reports name it so)
    info: TargetInfo
    drafts: tuple[DecodeDraft, ...]
    prompts: PromptSet
    k: int
    max_new_tokens: int
    device: str
    dtype: str  # torch's name without "torch.", as the reports write it
    tokenizer: Any
    model: TargetModel | None  # None when an engine decodes alone: the tokenizer is all of the target loaded here
    sampling: Sampling = Sampling()

    @property
    def target_model(self) -> TargetModel:
        if self.model is None:
            raise RuntimeError("this setup did not load the target (an engine decodes alone)")
        return self.model

    @property
    def eos_ids(self) -> frozenset[int]:
        return self.target_model.eos_token_ids

    def drafter(self, draft: DecodeDraft, overrides: dict[str, bool] | None = None):
        """`draft`'s drafter on the target's device and dtype, sharing its embedding and lm_head where it ships
        none; `overrides` flips norm flags (what another reading of the files would decode)."""
        from eaglekit.drafter.model import Drafter

        model = self.target_model
        return Drafter.from_spec(draft.spec, device=model.device, dtype=model.dtype, embed_tokens=model.embed_tokens,
                                 lm_head=model.lm_head, overrides=overrides or None)

    def settings(self, condition: Condition) -> DecodeSettings:
        served = self.model.quantization if self.model is not None else None
        return DecodeSettings(self.target, self.k, self.max_new_tokens, self.dtype, self.device, self.prompts.name,
                              condition.context_tokens, condition.template, served.to_dict() if served else None,
                              self.sampling)


def decode_setup(drafts: Sequence[tuple[str, str]], target: str, options: VerifyOptions, *,
                 load_model: bool = True, lookahead: int = 0, progress: Progress | None = None) -> DecodeSetup:
    """Read and check every (name, path) draft against `target`, choose the prompts and load the target (its
    tokenizer only without `load_model`); refuse, before any decode, a draft that does not fit, an output that
    would overwrite an input, or a prompt with no room for `options.max_new_tokens` + `lookahead` tokens."""
    info = read_target(target)
    refuse_emulation_on_declared(options.target_quantization, info)
    refuse_context_past_target(options, info.max_position_embeddings)
    specs = [(name, load_draft(path, target=info)) for name, path in drafts]
    refuse_clobbered_inputs(options, [(name, spec.path) for name, spec in specs], target)
    checked = tuple(_checked(name, spec, info, options) for name, spec in specs)
    prompts = select_prompts(options)
    if load_model:
        quiet(progress).stage("loading the target")
        model = load_target(target, device=options.device, dtype=options.dtype,
                            quantization=options.target_quantization)
        refuse_prompts_past_context(prompts, model, options, lookahead)
        device, dtype, tokenizer = str(model.device), model.dtype, model.tokenizer
    else:
        model = None
        device = resolve_device(options.device)
        dtype = resolve_dtype(options.dtype, device)
        tokenizer = load_tokenizer(os.path.dirname(os.path.abspath(target_config_path(target))), info)
    return DecodeSetup(target, info, checked, prompts, options.num_speculative_tokens, options.max_new_tokens,
                       device, str(dtype).replace("torch.", ""), tokenizer, model, options.sampling)


PARALLEL_DRAFTING_REFUSAL = (
    "a P-EAGLE draft (parallel drafting): every decode here, the reference loop and its vLLM runs alike, drafts one "
    "token at a time as EAGLE-3 does, which is neither how it is trained nor how vLLM serves it; missing: a "
    "parallel-drafting decode (one forward over mask_token_id slots fed mask_hidden). Serve it in vLLM with "
    "\"parallel_drafting\": true in --speculative-config (validate names the setting)")


def _checked(name: str, spec: DraftSpec, info: TargetInfo, options: VerifyOptions) -> DecodeDraft:
    if spec.facts.parallel_drafting:
        raise IncompatibleDraftError(PARALLEL_DRAFTING_REFUSAL, spec.path)
    aux_ids, aux_source = resolve_aux_ids(spec, options.aux_layer_ids)
    rules = vllm_rules(spec, info, options.engine_version)
    checks = decode_findings(spec, info, aux_ids, aux_source, rules)
    refuse_incompatible(checks, spec.path)
    assert aux_ids is not None, "EK294 is an error without ids"
    return DecodeDraft(name, spec, aux_ids, aux_source, rules, checks)


def vllm_rules(spec: DraftSpec, target: TargetInfo, engine_version: str | None = None) -> ValidationReport:
    """The one rules run a decode command makes: vLLM's reading of the target-applied draft, at the version the
    command mirrors (the latest modelled by default); the decode rules and the served section are views of it."""
    return run_rules(spec, target=target, engine="vllm", engine_version=engine_version,
                     groups=("structure", "target", "engine"))


def refuse_incompatible(checks: Sequence[Finding], draft_path: str) -> None:
    """An error among the decode rules' findings stops the decode with its first message."""
    errors = [f for f in checks if f.severity == "error"]
    if errors:
        more = f" (and {len(errors) - 1} more error(s))" if len(errors) > 1 else ""
        raise IncompatibleDraftError(f"does not fit the target: {errors[0].code} {errors[0].message}{more}",
                                     draft_path)


def resolve_aux_ids(spec: DraftSpec, override: Sequence[int] | None) -> tuple[tuple[int, ...] | None, str]:
    """The ids to capture (vLLM convention, ascending) and where they came from."""
    if override is not None:
        return tuple(sorted(override)), "--aux-layer-ids (vLLM convention)"
    if spec.aux.ids is None:
        return None, spec.aux.source
    return tuple(sorted(spec.aux.ids)), spec.aux.source


def refuse_clobbered_inputs(options: VerifyOptions, drafts: Sequence[tuple[str, str]], target: str) -> None:
    """Before any decode: no file the caller will write from this run (`options.outputs`) lands in a draft (name,
    folder), the target or the prompts file."""
    reads = [role for name, folder in drafts for role in read_roles(name, folder)]
    refuse_clobber(options.outputs, [*reads, *target_roles(target), *read_roles("--prompts", options.prompts_file)])


def select_prompts(options: VerifyOptions) -> PromptSet:
    """The --prompts file (its --category and --turns selection) or the bundled prompts, the first --limit."""
    if options.prompts_file:
        prompts = read_prompts(options.prompts_file, options.categories, options.turns)
    elif options.categories or options.turns != "first":
        raise UsageError("--category and --turns select from a --prompts file (SPEED-Bench or JSONL with "
                         "\"category\"); the bundled prompts have neither")
    else:
        prompts = bundled_prompts()
    if options.limit is not None:
        prompts = dataclasses.replace(prompts, prompts=prompts.prompts[: options.limit])
    return prompts


def refuse_context_past_target(options: VerifyOptions, context: int | None, option: str = "--context-tokens") -> None:
    """Options that cannot fit the target's context are the options' fault, and are said so before anything loads
    (not blamed on the first prompt, nor found by a decode that runs on): the context prepended, the new tokens,
    and the k drafts plus the bonus token its last round verifies past them. Every decode shares it (verify,
    compare, bench, finetune's evaluation)."""
    k, new_tokens = options.num_speculative_tokens, options.max_new_tokens
    for condition in options.conditions:
        if context is not None and condition.context_tokens + new_tokens + k + 1 >= context:
            raise UsageError(f"{option} {condition.context_tokens:,}, {new_tokens:,} new tokens and -k "
                             f"{k:,} (the drafts of the last round and its bonus token) leave no room for a prompt in "
                             f"the target's {context:,}-token context (max_position_embeddings)")


def refuse_prompts_past_context(prompts: PromptSet, model: TargetModel, options: VerifyOptions,
                                lookahead: int = 0) -> None:
    """Every first turn, under every condition, must leave room for its decode in the target's context: checked
    before the first decode, so a long last prompt costs seconds, not the whole run."""
    refuse_context_past_target(options, model.context)
    new_tokens = options.max_new_tokens + lookahead
    for condition in options.conditions:
        for index, first in enumerate(prompts.prompts):
            prompt = with_context(first, model.tokenizer, condition.context_tokens, index)
            if condition.context_tokens and model.context is not None:
                _refuse_context_past_prompt(prompt, model, condition, options, new_tokens)
            check_room(model, encode(prompt, model.tokenizer, template=condition.template), new_tokens)


def _refuse_context_past_prompt(prompt, model: TargetModel, condition: Condition, options: VerifyOptions,
                                new_tokens: int) -> None:
    """A prompt that fits alone but not after --context-tokens is the option's fault: said so, with the context
    that fits."""
    context = model.context
    assert context is not None, "only a target with a stated context bounds the prompts"
    ids = encode(prompt, model.tokenizer, template=condition.template, max_tokens=2 * context)  # counted, not cut
    over = len(ids) + new_tokens - context
    if over > 0:
        where = f"{prompt.file}: " if prompt.file else ""
        decoded = f" ({new_tokens:,} decoded for the last round)" if new_tokens != options.max_new_tokens else ""
        raise UsageError(f"--context-tokens {condition.context_tokens:,}: {where}{prompt.label} is then {len(ids):,} "
                         f"tokens ({condition.template} template), past the target's {context:,}-token context "
                         f"(max_position_embeddings) with --max-new-tokens {options.max_new_tokens:,}{decoded}: about "
                         f"{max(0, condition.context_tokens - over):,} tokens of context fit")


def turn_label(done: int, total: int) -> str:
    """How a progress stage names the prompt turn it works on."""
    return f"prompt {done}/{total}"


def turns(prompts: PromptSet, model: TargetModel, options: VerifyOptions, lookahead: int = 0,
          prefix: SharedPrefix | None = None, progress: Progress | None = None):
    """(prompt, token ids, the target's own decode) for every prompt and each of its follow-up turns, under the one
    condition of `options`; a follow-up is asked after the target's answer to the turn before, as a served
    conversation would be. The target decodes greedily, or samples (one generator seeded from `options` across
    every turn) when `options` ask for a temperature.
    `lookahead` decodes that many tokens past --max-new-tokens (a replay's last round reads them); each prompt's
    prefill goes through `prefix` (shared with the passes that follow), else one chunked as `options` say.
    `progress` hears of each target decode as the stage `prompt N/M: target alone`, token by token."""
    sampler = sampler_for(options.sampling)
    progress = quiet(progress)
    done = 0
    for index, first in enumerate(prompts.prompts):
        prompt = with_context(first, model.tokenizer, options.condition.context_tokens, index)
        while True:
            ids = encode(prompt, model.tokenizer, template=options.condition.template)
            done += 1
            progress.stage(f"{turn_label(done, prompts.turns)}: target alone", options.max_new_tokens + lookahead,
                           "tokens")
            plain = greedy_decode(model, ids, max_new_tokens=options.max_new_tokens + lookahead,
                                  eos_ids=model.eos_token_ids, sampler=sampler,
                                  prefix=prefix or SharedPrefix(model, (), options.prefill_chunk), progress=progress)
            yield prompt, ids, plain
            if not prompt.follow_ups:
                break
            answer = plain.tokens[: options.max_new_tokens]
            prompt = prompt.next_turn(model.tokenizer.decode(answer, skip_special_tokens=True))
