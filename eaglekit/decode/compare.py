"""compare(): two drafts of one target on the same prompts and the same captured target pass.

The target decodes each prompt once (greedy, a few tokens past --max-new-tokens so the last round of a replay
sees what a live target would), one pass over prompt + continuation captures every aux state either draft
reads (a long prompt's rows computed once, shared with its greedy decode and longer contexts: eaglekit.decode.prefix),
and both drafts are replayed against that capture. Acceptance is then measured on identical text for
both, and the difference per category comes with a paired bootstrap interval over conversations.

With --temperature the target samples its continuation (seeded) and the drafts are replayed on it with the greedy
match rule: with argmax drafts that is the same law as vLLM's rejection sampling (eaglekit.decode.sampling), and
both drafts still meet identical text.

compare_in_vllm measures the same pair through the serving engine instead, for a target too large to load here:
each draft is served once over every condition's first turns and vLLM's per-request counters are paired prompt by
prompt (greedy speculative decoding is lossless, so both drafts meet the target's own text there too).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from eaglekit import __version__
from eaglekit.decode.eagle import DraftStart, EagleProposer
from eaglekit.decode.metrics import AcceptanceCounter
from eaglekit.decode.options import VerifyOptions
from eaglekit.decode.prefix import SharedPrefix
from eaglekit.decode.prompts import Prompt, encode
from eaglekit.decode.settings import Condition, DecodeSettings, plain_report, quantization_entry, sweep_document
from eaglekit.decode.setup import DecodeSetup, decode_setup, turn_label, turns
from eaglekit.decode.speculative import ReplayVerifier, capture_pass, speculative_decode
from eaglekit.decode.stats import paired_difference, sample_marker, summary
from eaglekit.errors import UsageError
from eaglekit.progress import Progress, quiet


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
        return summary([m.counters[i] for i in picked], [self.conversations[i] for i in picked],
                       self.settings.num_speculative_tokens)

    def _difference(self, picked: list[int]) -> dict:
        groups = [self.conversations[i] for i in picked]
        point, interval = paired_difference([self.a.counters[i] for i in picked], [self.b.counters[i] for i in picked],
                                            groups)
        if interval is None:
            verdict = "too few prompts"
        elif interval.low > 0:
            verdict = "B better"
        elif interval.high < 0:
            verdict = "A better"
        else:
            verdict = "not resolved"
        return {"acceptance_length_difference": point, "interval": interval.to_dict() if interval else None,
                "verdict": verdict, **sample_marker(len(set(groups)))}

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
            **quantization_entry(run),
            "sampling": run.sampling.to_dict(),
            "acceptance_settings": run.acceptance_settings,
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
            progress: Progress | None = None) -> CompareReport:
    """Measure both drafts on one captured target pass per prompt turn under one condition; refuse either before
    decoding if it does not fit the target."""
    options.check()
    if len(options.conditions) > 1:
        raise UsageError("compare() measures one condition: compare_conditions() runs several --context-tokens or "
                         "--template values")
    return compare_conditions(draft_a, draft_b, target, options, progress=progress).reports[0]


def compare_conditions(draft_a: str, draft_b: str, target: str, options: VerifyOptions = VerifyOptions(), *,
                       progress: Progress | None = None) -> CompareSweep:
    """compare under every condition of `options` (each template with each context length); the target and both
    drafters are loaded once."""
    return compare_against(draft_a, [draft_b], target, options, progress=progress)[0]


def compare_against(reference: str, drafts: Sequence[str], target: str, options: VerifyOptions = VerifyOptions(), *,
                    progress: Progress | None = None) -> list[CompareSweep]:
    """Each of `drafts` against `reference` under every condition of `options`: the target decodes each prompt once
    per condition and every drafter is replayed on that pass, so N drafts cost one target decode, not N. One sweep
    per draft, in order (A = the reference)."""
    k = options.num_speculative_tokens
    return compare_across_k(reference, drafts, target, options, (k,), progress=progress)[k]


def compare_across_k(reference: str, drafts: Sequence[str], target: str, options: VerifyOptions, ks: Sequence[int], *,
                     progress: Progress | None = None) -> dict[int, list[CompareSweep]]:
    """compare_against at every k of `ks` on the same target passes: the target's greedy text does not depend on k,
    so one decode per prompt and condition (a few tokens past --max-new-tokens for the largest k's last round)
    serves every k and every drafter. {k: one sweep per draft, in order}; options.num_speculative_tokens is not read.

    Each prompt turn is decoded under every condition before the next turn, through one `SharedPrefix`: its greedy
    decode, its capture and the same prompt under a longer context share the rows of the prompt they have in
    common, so a long context is prefilled once per prompt, not once per pass and condition; each drafter runs over
    the prompt once for every k (eaglekit.decode.eagle.DraftStart). `progress` hears of
    the target's load, each target decode token by token, and each turn's drafts replayed on it."""
    ks = sorted(set(ks))
    if not ks:
        raise UsageError("compare_across_k needs at least one k")
    widest = dataclasses.replace(options, num_speculative_tokens=ks[-1])  # every check sized for the largest k
    widest.check()
    progress = quiet(progress)
    names = ["draft A", "draft B"] if len(drafts) == 1 else ["reference", *(f"draft {i + 1}"
                                                                            for i in range(len(drafts)))]
    lookahead = ks[-1] + 1
    setup = decode_setup(list(zip(names, (reference, *drafts))), target, widest, lookahead=lookahead,
                         progress=progress)
    model, conditions = setup.target_model, options.conditions
    drafters = [setup.drafter(draft) for draft in setup.drafts]
    captured = sorted({i for draft in setup.drafts for i in draft.aux_ids})
    prefix = SharedPrefix(model, captured, options.prefill_chunk)
    streams = [turns(setup.prompts, model, widest.at(c), lookahead=lookahead, prefix=prefix, progress=progress)
               for c in conditions]
    measured = {k: [[Measured(d.path, d.spec.eagle_version, list(d.aux_ids)) for d in setup.drafts]
                    for _ in conditions] for k in ks}
    asked: list[list[Prompt]] = [[] for _ in conditions]
    for turn in range(setup.prompts.turns):
        for index, stream in enumerate(streams):
            prompt, ids, plain = next(stream)
            progress.stage(f"{turn_label(turn + 1, setup.prompts.turns)}: the drafts on the target's pass",
                           len(drafters) * len(ks), "drafts")
            capture = capture_pass(model, ids, plain.tokens, captured, prefix=prefix)
            starts = [DraftStart() for _ in drafters]  # each drafter's pass over the prompt, paid once for every k
            for k in ks:
                for drafter, start, m in zip(drafters, starts, measured[k][index]):
                    proposer = EagleProposer(drafter, m.aux_layer_ids, max_len=len(capture.tokens) + ks[-1] + 2,
                                             chunk=options.prefill_chunk, start=start)
                    run = speculative_decode(ReplayVerifier(capture, m.aux_layer_ids), proposer, ids, k=k,
                                             max_new_tokens=setup.max_new_tokens, eos_ids=setup.eos_ids)
                    m.counters.append(run.counter)
                    progress.advance()
            asked[index].append(prompt)
    return {k: _sweeps(setup, k, conditions, measured[k], asked, len(drafts)) for k in ks}


def _sweeps(setup: DecodeSetup, k: int, conditions: Sequence[Condition], measured: list[list[Measured]],
            asked: list[list[Prompt]], drafts: int) -> list[CompareSweep]:
    """One sweep per draft (B) against the reference (A) from one k's counters, condition by condition."""
    sweeps: list[list[CompareReport]] = [[] for _ in range(drafts)]
    for condition, (a, *others), prompts in zip(conditions, measured, asked):
        settings = dataclasses.replace(setup.settings(condition), num_speculative_tokens=k)
        order = ([p.name for p in prompts], [p.category for p in prompts],
                 [p.conversation or p.name for p in prompts])
        for sweep, m in zip(sweeps, others):
            sweep.append(CompareReport(settings, *order, a, m))
    return [CompareSweep(reports) for reports in sweeps]


@dataclass(frozen=True)
class EngineComparison:
    """compare_in_vllm's result: the sweep, as compare_conditions reports one, and what the engine did."""

    sweep: CompareSweep
    engine: str  # "vLLM 0.32.0"
    differing_prompts: int  # prompt turns whose greedy text differed between the two drafts' runs (numerics)
    read_otherwise: tuple[str, ...] = ()  # drafts whose aux ids vLLM captured differ from eaglekit's reading

    def describe(self) -> str:
        differs = (f"; {self.differing_prompts} prompt(s) decoded to other text under the two drafts (the engine's "
                   "numerics), paired all the same") if self.differing_prompts else ""
        return (f"measured in {self.engine}, from its per-request acceptance counters{differs}"
                + "".join(f"; {note}" for note in self.read_otherwise))


def compare_in_vllm(draft_a: str, draft_b: str, target: str, options: VerifyOptions, *,
                    progress: Progress | None = None) -> EngineComparison:
    """Both drafts served by vLLM (options.engine_options: its Python, tensor parallelism, engine arguments) on every
    condition's first turns, one engine start per draft; the tokenizer is the only part of the target loaded here.
    Its per-request counters pair the drafts prompt by prompt, as compare_conditions pairs the reference's."""
    from eaglekit.runtime.engine import draft_in_vllm

    options.check()
    setup = decode_setup([("draft A", draft_a), ("draft B", draft_b)], target, options, load_model=False)
    prompts = setup.prompts
    if prompts.turns != len(prompts.prompts):
        raise UsageError("a comparison in vLLM measures first turns: each later turn follows the target's answer to "
                         "the one before, which only the reference decodes")
    encoded = {condition: [encode(p, setup.tokenizer, context_tokens=condition.context_tokens, index=i,
                                  template=condition.template) for i, p in enumerate(prompts.prompts)]
               for condition in options.conditions}
    every = [ids for condition in options.conditions for ids in encoded[condition]]
    runs = []
    for done, draft in enumerate(setup.drafts):
        quiet(progress).stage(f"{draft.name} in vLLM ({done + 1}/{len(setup.drafts)}), {len(every)} prompts")
        runs.append(draft_in_vllm(draft.path, target, every, k=setup.k, max_new_tokens=setup.max_new_tokens,
                                  dtype=setup.dtype, opts=options.engine_options,
                                  context=setup.info.max_position_embeddings))
    engine = f"vLLM {runs[0].version}"
    names = [p.name for p in prompts.prompts]
    categories = [p.category for p in prompts.prompts]
    conversations = [p.conversation or p.name for p in prompts.prompts]
    reports = []
    served = [run.aux_ids or d.aux_ids for d, run in zip(setup.drafts, runs)]  # what vLLM captured, as it said
    for index, condition in enumerate(options.conditions):
        window = slice(index * len(names), (index + 1) * len(names))
        a, b = (Measured(d.path, d.spec.eagle_version, list(ids), run.per_request[window])
                for d, ids, run in zip(setup.drafts, served, runs))
        settings = dataclasses.replace(setup.settings(condition), device=engine,
                                       engine_settings=options.engine_options.speculative_settings)
        reports.append(CompareReport(settings, names, categories, conversations, a, b))
    differing = sum(x != y for x, y in zip(runs[0].tokens, runs[1].tokens))
    otherwise = tuple(f"{d.name}: vLLM captured aux ids {list(ids)}, eaglekit reads {list(d.aux_ids)}"
                      for d, ids in zip(setup.drafts, served) if tuple(ids) != tuple(d.aux_ids))
    return EngineComparison(CompareSweep(reports), engine, differing, otherwise)
