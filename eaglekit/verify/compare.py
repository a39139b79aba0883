"""compare(): two drafts of one target on the same prompts and the same captured target pass.

The target decodes each prompt once (greedy, a few tokens past --max-new-tokens so the last round of a replay
sees what a live target would), one forward over prompt + continuation captures every aux state either draft
reads, and both drafts are replayed against that capture. Acceptance is then measured on identical text for
both, and the difference per category comes with a paired bootstrap interval over conversations.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from eaglekit import __version__
from eaglekit.errors import UsageError
from eaglekit.families import apply_target, load_draft
from eaglekit.target import read_target
from eaglekit.target_model import load_target
from eaglekit.verify.checks import compatibility_checks, refuse_failures, vllm_rules
from eaglekit.verify.decode import ReplayVerifier, capture_pass, speculative_decode
from eaglekit.verify.eagle import EagleProposer
from eaglekit.verify.metrics import AcceptanceCounter
from eaglekit.verify.report import Condition, DecodeSettings, plain_report, sweep_document
from eaglekit.verify.run import (
    VerifyOptions,
    _prompt_set,
    refuse_clobbered_inputs,
    refuse_prompts_past_context,
    resolve_aux_ids,
    turns,
)
from eaglekit.verify.stats import paired_difference, pooled, summary, tau_interval


@dataclass
class Measured:
    """One draft's counters, one per prompt turn, in the prompts' order."""

    draft: str
    eagle_version: str
    aux_layer_ids: list[int]
    counters: list[AcceptanceCounter] = field(default_factory=list)


@dataclass
class CompareReport:
    settings: DecodeSettings
    names: list[str]
    categories: list[str | None]
    conversations: list[str]
    a: Measured
    b: Measured

    def _summary(self, m: Measured, picked: list[int]) -> dict:
        cs, gs = [m.counters[i] for i in picked], [self.conversations[i] for i in picked]
        return summary(pooled(cs, self.settings.num_speculative_tokens), tau_interval(cs, gs), len(picked),
                       len(set(gs)))

    def _difference(self, picked: list[int]) -> dict:
        point, interval = paired_difference([self.a.counters[i] for i in picked], [self.b.counters[i] for i in picked],
                                            [self.conversations[i] for i in picked])
        if interval is None:
            verdict = "too few prompts"
        elif interval.low > 0:
            verdict = "B better"
        elif interval.high < 0:
            verdict = "A better"
        else:
            verdict = "not resolved"
        return {"acceptance_length_difference": point, "interval": interval.to_dict() if interval else None,
                "verdict": verdict}

    def rows(self) -> dict[str, dict]:
        """Per category (all prompts first): both drafts' summaries and the paired difference B − A."""
        names = ["uncategorised" if c is None else c for c in self.categories]
        groups = {"all": list(range(len(names)))}
        if any(c is not None for c in self.categories):
            for name in dict.fromkeys(names):
                groups[name] = [i for i, n in enumerate(names) if n == name]
        return {name: {"a": self._summary(self.a, picked), "b": self._summary(self.b, picked),
                       "b_minus_a": self._difference(picked)} for name, picked in groups.items()}

    def header(self) -> dict[str, Any]:
        """What every condition of a sweep shares: versions, target, drafts, decode settings."""
        run = self.settings
        return {
            "eaglekit_version": __version__,
            "target": run.target,
            "drafts": {key: {"draft": m.draft, "eagle_version": m.eagle_version, "aux_layer_ids": m.aux_layer_ids}
                       for key, m in (("a", self.a), ("b", self.b))},
            "num_speculative_tokens": run.num_speculative_tokens,
            "max_new_tokens": run.max_new_tokens,
            "dtype": run.dtype,
            "device": run.device,
            "prompts": {"name": run.prompts_name, "count": len(self.names)},
        }

    def measurement(self) -> dict[str, Any]:
        """This condition's own figures: per category and per prompt turn."""
        return {
            "categories": self.rows(),
            "per_prompt": [{"name": n, "category": c, "conversation": g,
                            "a_acceptance_length": a.acceptance_length, "b_acceptance_length": b.acceptance_length}
                           for n, c, g, a, b in zip(self.names, self.categories, self.conversations,
                                                    self.a.counters, self.b.counters)],
        }

    def to_dict(self) -> dict[str, Any]:
        doc = self.header()
        doc["prompts"]["context_tokens"] = self.settings.context_tokens
        return {**doc, **self.measurement()}


@dataclass
class CompareSweep:
    """compare under several conditions (templates x contexts), one report each, on one loaded target and pair of
    drafters. A sweep of one chat-template condition writes exactly that condition's report."""

    reports: list[CompareReport]

    @property
    def conditions(self) -> list[Condition]:
        return [r.settings.condition for r in self.reports]

    def to_dict(self) -> dict[str, Any]:
        if plain_report(self.conditions):
            return self.reports[0].to_dict()
        return sweep_document(self.reports[0].header(), [(r.settings.condition, r.measurement()) for r in self.reports])


def compare(draft_a: str, draft_b: str, target: str, options: VerifyOptions = VerifyOptions(), *,
            on_prompt: Callable[[int, int, str], None] | None = None) -> CompareReport:
    """Measure both drafts on one captured target pass per prompt turn under one condition; refuse either before
    decoding if it does not fit the target."""
    options.check()
    if len(options.conditions) > 1:
        raise UsageError("compare() measures one condition: compare_conditions() runs several --context-tokens or "
                         "--template values")
    return compare_conditions(draft_a, draft_b, target, options, on_prompt=on_prompt).reports[0]


def compare_conditions(draft_a: str, draft_b: str, target: str, options: VerifyOptions = VerifyOptions(), *,
                       on_prompt: Callable[[int, int, str], None] | None = None) -> CompareSweep:
    """compare under every condition of `options` (each template with each context length); the target and both
    drafters are loaded once."""
    return compare_against(draft_a, [draft_b], target, options, on_prompt=on_prompt)[0]


def compare_against(reference: str, drafts: Sequence[str], target: str, options: VerifyOptions = VerifyOptions(), *,
                    on_prompt: Callable[[int, int, str], None] | None = None) -> list[CompareSweep]:
    """Each of `drafts` against `reference` under every condition of `options`: the target decodes each prompt once
    per condition and every drafter is replayed on that pass, so N drafts cost one target decode, not N. One sweep
    per draft, in order (A = the reference)."""
    options.check()
    info = read_target(target)
    specs = []
    for path in (reference, *drafts):
        raw = load_draft(path)
        spec = apply_target(raw, info)
        aux_ids, aux_source = resolve_aux_ids(spec, None)
        refuse_failures(compatibility_checks(raw, info, aux_ids, aux_source, spec.num_aux_hidden_states,
                                             vllm_rules(spec, info)), raw.path)
        specs.append((raw.path, spec, aux_ids))
    names = ["draft A", "draft B"] if len(drafts) == 1 else ["reference", *(f"draft {i + 1}"
                                                                            for i in range(len(drafts)))]
    refuse_clobbered_inputs(options, [(name, path) for name, (path, _, _) in zip(names, specs)], target)
    prompts = _prompt_set(options)
    model = load_target(target, device=options.device, dtype=options.dtype)
    refuse_prompts_past_context(prompts, model, options, lookahead=options.num_speculative_tokens + 1)

    from eaglekit.drafter.model import Drafter

    drafters = [Drafter.from_spec(spec, device=model.device, dtype=model.dtype, embed_tokens=model.embed_tokens,
                                  lm_head=model.lm_head) for _, spec, _ in specs]
    captured = sorted({i for _, _, ids in specs for i in ids})
    k, conditions = options.num_speculative_tokens, options.conditions
    sweeps: list[list[CompareReport]] = [[] for _ in drafts]
    for done, condition in enumerate(conditions):
        measured = [Measured(path, spec.eagle_version, list(ids)) for path, spec, ids in specs]
        names, categories, conversations = [], [], []
        for prompt, ids, plain in turns(prompts, model, options.at(condition), lookahead=k + 1):
            capture = capture_pass(model, ids, plain.tokens, captured)
            for drafter, m in zip(drafters, measured):
                proposer = EagleProposer(drafter, m.aux_layer_ids, max_len=len(capture.tokens) + k + 2)
                run = speculative_decode(ReplayVerifier(capture, m.aux_layer_ids), proposer, ids, k=k,
                                         max_new_tokens=options.max_new_tokens, eos_ids=model.eos_token_ids)
                m.counters.append(run.counter)
            names.append(prompt.name)
            categories.append(prompt.category)
            conversations.append(prompt.conversation or prompt.name)
            if on_prompt is not None:
                label = f"{condition.label}: {prompt.name}" if len(conditions) > 1 else prompt.name
                on_prompt(prompts.turns * done + len(names), prompts.turns * len(conditions), label)
        settings = DecodeSettings(target, k, options.max_new_tokens, str(model.dtype).replace("torch.", ""),
                                  str(model.device), prompts.name, condition.context_tokens, condition.template)
        for sweep, m in zip(sweeps, measured[1:]):
            sweep.append(CompareReport(settings, names, categories, conversations, measured[0], m))
    return [CompareSweep(reports) for reports in sweeps]
