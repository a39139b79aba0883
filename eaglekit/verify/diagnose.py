"""The target sweep (pitfalls.md): score the drafter under competing readings of its checkpoint.

One captured target pass per prompt (every aux state the hypotheses need) is replayed through the same
speculative loop for each hypothesis: aux ids as declared, shifted by +1 and -1, the engine default,
norm_before_residual and norm_output flipped, and the other concatenation orders of an unsorted id list.
Each reading is also scored teacher-forced on the same positions (draft chains unrolled as in training), which
pairs the readings position by position. When a reading other than the declared one wins clearly, the report
names it and the fix.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass, field

from eaglekit.decode.eagle import EagleProposer
from eaglekit.decode.metrics import AcceptanceCounter
from eaglekit.decode.speculative import Capture, ReplayVerifier, speculative_decode

MIN_GAIN_ABS = 0.2
MIN_GAIN_REL = 0.1
"""A hypothesis wins clearly when its τ beats the declared one by max(0.2, 10 %), or when its τ is higher and
its teacher-forced chains accept significantly more: a paired z over the same positions of at least
MIN_PAIRED_Z, on at least MIN_PAIRED_SAMPLES positions. τ alone moves by chance on a few prompts; the expected
number of accepted drafts computed from the probabilities the chain gives the target's tokens is the smooth
quantity behind τ and separates a real misreading (say ids off by one layer, whose states differ little, or a
flipped norm_output, which only changes drafts after the first) from noise with far fewer tokens."""
MIN_PAIRED_Z = 4.0
MIN_PAIRED_SAMPLES = 30
MAX_PERMUTED_IDS = 4


@dataclass(frozen=True)
class Hypothesis:
    name: str
    kind: str  # declared | aux-shift | aux-default | aux-order | norm_before_residual | norm_output
    aux_ids: tuple[int, ...]
    overrides: tuple[tuple[str, bool], ...] = ()
    aux_order: tuple[int, ...] | None = None  # concatenation order of the ascending states

    @property
    def declared(self) -> bool:
        return self.kind == "declared"


@dataclass
class HypothesisResult:
    hypothesis: Hypothesis
    counter: AcceptanceCounter
    first_hits: list[bool] = field(default_factory=list)  # teacher-forced first draft right, per position
    chain_probs: list[list[float]] = field(default_factory=list)  # per position, per depth: p(target's token)

    @property
    def first_draft_accuracy(self) -> float:
        return sum(self.first_hits) / len(self.first_hits) if self.first_hits else 0.0

    @property
    def first_draft_prob(self) -> float:
        return sum(c[0] for c in self.chain_probs) / len(self.chain_probs) if self.chain_probs else 0.0

    @property
    def expected_accepted(self) -> list[float]:
        """Per position: sum over depths j of p_0 * ... * p_j, the drafts a round starting there expects to keep."""
        return [expected_accepted(chain) for chain in self.chain_probs]

    @property
    def teacher_forced_acceptance_length(self) -> float:
        scores = self.expected_accepted
        return 1.0 + sum(scores) / len(scores) if scores else 1.0

    def paired_z(self, declared: "HypothesisResult") -> tuple[float, int]:
        """z of the mean per-position gain in expected accepted drafts over the declared reading, and the number
        of positions paired."""
        gains = [a - b for a, b in zip(self.expected_accepted, declared.expected_accepted)]
        n = len(gains)
        if n < 2:
            return 0.0, n
        mean = sum(gains) / n
        var = sum((g - mean) ** 2 for g in gains) / (n - 1)
        if var == 0.0:
            return (0.0 if mean == 0.0 else math.copysign(math.inf, mean)), n
        return mean / math.sqrt(var / n), n

    def to_dict(self, declared: "HypothesisResult | None" = None) -> dict:
        """The JSON row; against `declared` it carries the paired z the verdict used (null when not finite)."""
        h = self.hypothesis
        z, paired = self.paired_z(declared) if declared is not None else (None, 0)
        return {
            "name": h.name,
            "kind": h.kind,
            "declared": h.declared,
            "aux_layer_ids": list(h.aux_ids),
            "aux_order": list(h.aux_order) if h.aux_order is not None else None,
            "overrides": dict(h.overrides),
            "acceptance_length": self.counter.acceptance_length,
            "per_position_acceptance": self.counter.per_position,
            "first_draft_accuracy": self.first_draft_accuracy,
            "first_draft_prob": self.first_draft_prob,
            "teacher_forced_acceptance_length": self.teacher_forced_acceptance_length,
            "first_draft_samples": len(self.first_hits),
            "paired_z": z if z is not None and math.isfinite(z) else None,
            "paired_positions": paired,
        }


@dataclass
class Diagnosis:
    verdict: str  # "declared" | "mismatch" | "broken"
    best: str
    message: str
    fix: str | None = None
    results: list[HypothesisResult] = field(default_factory=list)

    def result_rows(self) -> list[dict]:
        """Every hypothesis as JSON, each other reading paired against the declared one."""
        declared = next(r for r in self.results if r.hypothesis.declared)
        return [r.to_dict(None if r is declared else declared) for r in self.results]


def hypotheses(aux_ids: Sequence[int], as_written: Sequence[int] | None, num_layers: int,
               default_ids: Sequence[int], norm_before_residual: bool, norm_output: bool) -> list[Hypothesis]:
    """The readings to compare, declared first; id sets that fall outside [0, L] are skipped."""
    ids = tuple(sorted(aux_ids))
    out = [Hypothesis("declared", "declared", ids)]
    seen = {ids}
    for shift in (1, -1):
        shifted = tuple(i + shift for i in ids)
        if all(0 <= i <= num_layers for i in shifted) and shifted not in seen:
            out.append(Hypothesis(f"aux ids {shift:+d}", "aux-shift", shifted))
            seen.add(shifted)
    default = tuple(sorted(set(default_ids)))
    if default not in seen and len(default) == len(ids) and all(0 <= i <= num_layers for i in default):
        out.append(Hypothesis("engine default ids", "aux-default", default))
    out.append(Hypothesis(f"norm_before_residual={not norm_before_residual}", "norm_before_residual", ids,
                          (("norm_before_residual", not norm_before_residual),)))
    out.append(Hypothesis(f"norm_output={not norm_output}", "norm_output", ids, (("norm_output", not norm_output),)))
    written = tuple(as_written) if as_written is not None else None
    if written is not None and list(written) != sorted(written) and len(written) <= MAX_PERMUTED_IDS:
        for order in itertools.permutations(range(len(ids))):
            if order != tuple(range(len(ids))):
                out.append(Hypothesis("fc blocks in order " + ",".join(str(ids[i]) for i in order), "aux-order",
                                      ids, aux_order=order))
    return out


def needed_ids(hyps: Sequence[Hypothesis]) -> tuple[int, ...]:
    return tuple(sorted({i for h in hyps for i in h.aux_ids}))


class Sweep:
    """Accumulates each hypothesis's acceptance over the prompts' captured passes."""

    def __init__(self, hyps: Sequence[Hypothesis], make_drafter: Callable[[dict[str, bool]], object], *, k: int,
                 max_new_tokens: int, eos_ids: Collection[int]):
        self.hyps = list(hyps)
        self.make_drafter = make_drafter
        self.k, self.max_new_tokens, self.eos_ids = k, max_new_tokens, eos_ids
        self.counters = [AcceptanceCounter(k) for _ in self.hyps]
        self.hits: list[list[bool]] = [[] for _ in self.hyps]
        self.chains: list[list[list[float]]] = [[] for _ in self.hyps]
        self._drafters: dict[tuple, object] = {}

    def _drafter(self, overrides: tuple[tuple[str, bool], ...]):
        if overrides not in self._drafters:
            self._drafters[overrides] = self.make_drafter(dict(overrides))
        return self._drafters[overrides]

    def add(self, capture: Capture) -> None:
        prompt = capture.tokens[: capture.prompt_len]
        targets = capture.tokens[capture.prompt_len + 1 :]
        for hyp, counter, hits, chains in zip(self.hyps, self.counters, self.hits, self.chains):
            drafter = self._drafter(hyp.overrides)
            proposer = EagleProposer(drafter, hyp.aux_ids, aux_order=hyp.aux_order,
                                     max_len=len(capture.tokens) + self.k + 2)
            result = speculative_decode(ReplayVerifier(capture, hyp.aux_ids), proposer, prompt, k=self.k,
                                        max_new_tokens=self.max_new_tokens, eos_ids=self.eos_ids)
            counter.merge(result.counter)
            predictions, chain_probs = teacher_forced_chains(drafter, capture, hyp, self.k)
            hits.extend(p == t for p, t in zip(predictions, targets))
            chains.extend(chain_probs)

    def results(self) -> list[HypothesisResult]:
        return [HypothesisResult(h, c, hits, chains)
                for h, c, hits, chains in zip(self.hyps, self.counters, self.hits, self.chains)]


def expected_accepted(chain: Sequence[float]) -> float:
    total, survive = 0.0, 1.0
    for p in chain:
        survive *= p
        total += survive
    return total


def teacher_forced_chains(drafter, capture: Capture, hyp: Hypothesis,
                          depth: int) -> tuple[list[int], list[list[float]]]:
    """Teacher-forced draft chains along the captured continuation, unrolled as in training (one drafter pass
    per depth): row i pairs state i with token i+1 and drafts tokens i+2, i+3, ... as a round that has committed
    tokens up to i+1 would, had each earlier draft been the target's token.

    Entry j is about the round drafting token prompt_len + 1 + j: its first drafted token, and per depth the
    probability the drafter gives the target's actual token (0 outside the draft vocabulary or past the end of
    the capture)."""
    import torch

    from eaglekit.drafter.unroll import unrolled_steps

    tokens, start = capture.tokens, capture.prompt_len - 1
    rows = len(tokens) - 2
    if rows <= start:
        return [], []
    states = [capture.states[i][:rows].unsqueeze(0) for i in hyp.aux_ids]
    if hyp.aux_order is not None:
        states = [states[i] for i in hyp.aux_order]
    device = drafter.norm.weight.device
    known = torch.tensor(tokens, device=device)
    with torch.inference_mode():
        hidden = drafter.combine([s.to(device) for s in states])
        ids = torch.tensor([(tokens[1:] + [0] * depth)[: rows + depth - 1]], device=device)
        draft_to_target = drafter.target_token_ids()
        target_to_draft = torch.full((drafter.config.vocab_size,), -1, dtype=torch.long, device=device)
        target_to_draft[draft_to_target] = torch.arange(len(draft_to_target), device=device)
        per_depth, first = [], None
        for j, out in enumerate(unrolled_steps(drafter, ids, hidden, depth, first_row=start)):
            logits = out.draft_logits[0, start:] if j == 0 else out.draft_logits[0]
            probs = logits.float().softmax(-1)
            if j == 0:
                first = draft_to_target[probs.argmax(-1)]
            wanted = torch.arange(start, rows, device=device) + 2 + j
            inside = wanted < len(tokens)
            column = target_to_draft[known[wanted.clamp(max=len(tokens) - 1)]]
            picked = probs.gather(-1, column.clamp(min=0).unsqueeze(-1)).squeeze(-1)
            per_depth.append(picked.masked_fill((column < 0) | ~inside, 0.0))
    if first is None:
        raise ValueError("no unrolled step: depth must be at least 1")
    return first.tolist(), torch.stack(per_depth, -1).tolist()


def _fix(h: Hypothesis) -> str | None:
    if h.kind in ("aux-shift", "aux-default"):
        ids = ",".join(str(i) for i in h.aux_ids)
        return f"eaglekit upgrade DRAFT OUT --aux-layer-ids {ids} --aux-convention input"  # verify fills both in
    if h.kind in ("norm_before_residual", "norm_output"):
        key, value = h.overrides[0]
        return f"set \"{key}\": {str(value).lower()} in the draft's config.json"
    return None


def _explain(h: Hypothesis, declared_ids: Sequence[int]) -> str:
    if h.kind == "aux-shift":
        return (f"the aux layer ids look off by {h.name.split()[-1]}: {list(h.aux_ids)} fits the target better than "
                f"the declared {list(declared_ids)} (P16)")
    if h.kind == "aux-default":
        return f"the engine default ids {list(h.aux_ids)} fit better than the declared {list(declared_ids)} (P17)"
    if h.kind == "aux-order":
        return (f"the fc column blocks follow the unsorted written id order ({h.name.split()[-1]}), while engines "
                "concatenate in ascending id order (P20)")
    if h.kind == "norm_before_residual":
        return f"the draft was trained with {h.name} but its config says otherwise (P12)"
    if h.kind == "norm_output":
        return (f"the draft was trained with {h.name} but its config says otherwise: the flag was lost on the way "
                "(P9, P38) or meant something else to its producer (P35)")
    return h.name


def _wins_clearly(result: HypothesisResult, declared: HypothesisResult) -> bool:
    base = declared.counter.acceptance_length
    gain = result.counter.acceptance_length - base
    if gain >= max(MIN_GAIN_ABS, MIN_GAIN_REL * base):
        return True
    z, paired = result.paired_z(declared)
    return gain > 0 and paired >= MIN_PAIRED_SAMPLES and z >= MIN_PAIRED_Z


def conclude(results: Sequence[HypothesisResult]) -> Diagnosis:
    declared = next(r for r in results if r.hypothesis.declared)
    base = declared.counter.acceptance_length
    best = max(results, key=lambda r: r.counter.acceptance_length)
    winners = [r for r in results if not r.hypothesis.declared and _wins_clearly(r, declared)]
    if winners:
        top = max(winners, key=lambda r: r.counter.acceptance_length)
        h = top.hypothesis
        message = (f"{_explain(h, declared.hypothesis.aux_ids)}: τ {top.counter.acceptance_length:.2f} vs {base:.2f} "
                   f"as declared; first draft right {top.first_draft_accuracy:.1%} vs "
                   f"{declared.first_draft_accuracy:.1%}, "
                   f"teacher-forced τ {top.teacher_forced_acceptance_length:.2f} vs "
                   f"{declared.teacher_forced_acceptance_length:.2f}")
        return Diagnosis("mismatch", h.name, message, _fix(h), list(results))
    if best.counter.acceptance_length < 1.1:
        return Diagnosis("broken", "declared", "τ ≈ 1 under every hypothesis: the weights, the head or the vocabulary "
                         "map are likely broken (P1, P4, P5)", None, list(results))
    return Diagnosis("declared", "declared", f"the declared configuration fits best (τ {base:.2f}); no other reading "
                     "wins clearly", None, list(results))
