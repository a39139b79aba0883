"""Sampled speculative decoding (vLLM's rejection sampling) is lossless: what it emits follows the target's own
sampling distribution, whatever the draft proposes. Checked by a chi-square test against the exact probabilities,
which a deliberately wrong sampler fails; the defaults keep the greedy decode exactly."""

from __future__ import annotations

import math
from statistics import NormalDist

import pytest

torch = pytest.importorskip("torch")

from eaglekit.decode.sampling import RejectionSampler, Sampling, sampler_for, target_probabilities  # noqa: E402
from eaglekit.decode.speculative import (  # noqa: E402
    LiveVerifier,
    RandomProposer,
    VerifyStep,
    greedy_decode,
    speculative_decode,
)
from eaglekit.errors import UsageError  # noqa: E402
from tests.support.targets import PROMPTS, make_tiny_target  # noqa: E402

VOCAB = 8
PROMPT = [1, 5, 2]
SAMPLES = 4000
FALSE_ALARM = 1e-6
"""The chi-square threshold is the (1 - 1e-6) quantile for the test's degrees of freedom: a correct sampler fails
it once in a million seeds, while the wrong samplers below exceed it many times over at this N."""


@pytest.fixture(autouse=True)
def one_thread():
    """Thousands of 8-token softmaxes: intra-op threads only cost here (tens of times over on a busy machine)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


class BigramTarget:
    """A tiny random target whose next-token logits depend on the last token only: a `Verifier` with logits, so
    the speculative loop runs on it as on a live model, and every sequence's exact probability is a product."""

    aux_ids: tuple[int, ...] = ()

    def __init__(self, seed: int = 0):
        generator = torch.Generator().manual_seed(seed)
        self.table = torch.randn(VOCAB, VOCAB, generator=generator) * 2.0

    def _step(self, tokens) -> VerifyStep:
        logits = self.table[torch.tensor(list(tokens))]
        return VerifyStep(logits.argmax(-1).tolist(), [], logits)

    def prefill(self, prompt):
        return self._step(prompt[-1:])

    def verify(self, tokens):
        return self._step(tokens)

    def commit(self, length):
        pass


class SecondChoiceProposer:
    """A deliberately poor draft: always the target's second most likely token after the last one."""

    aux_ids: tuple[int, ...] = ()

    def __init__(self, target: BigramTarget):
        self.second = target.table.topk(2).indices[:, 1].tolist()
        self.last = 0

    def begin(self, prompt, aux, next_token):
        self.last = next_token

    def propose(self, k):
        drafts = [self.second[self.last]]
        while len(drafts) < k:
            drafts.append(self.second[drafts[-1]])
        return drafts

    def advance(self, accepted, bonus, aux):
        self.last = bonus


class AcceptsEveryDraft(RejectionSampler):
    def judge(self, drafts, rows):
        return len(drafts), self.sample(rows[len(drafts)])


class ResidualKeepsTheDraft(RejectionSampler):
    """The classic mistake: the replacement of a rejected draft is drawn from p itself, draft included."""

    def judge(self, drafts, rows):
        probs = target_probabilities(rows, self.sampling)
        for position, draft in enumerate(drafts):
            if float(probs[position, draft]) < float(torch.rand((), dtype=torch.float64, generator=self.generator)):
                return position, self.sample(rows[position])
        return len(drafts), self.sample(rows[len(drafts)])


def exact_first_three(target: BigramTarget, sampling: Sampling) -> torch.Tensor:
    """P(t0, t1, t2) of the target sampling alone: [V, V, V]."""
    rows = target_probabilities(target.table.double(), sampling).double()
    first = rows[PROMPT[-1]]
    return first[:, None, None] * rows[:, :, None] * rows[None, :, :]


def drawn_first_three(target: BigramTarget, sampler: RejectionSampler, k: int) -> torch.Tensor:
    counts = torch.zeros(VOCAB, VOCAB, VOCAB, dtype=torch.float64)
    for _ in range(SAMPLES):
        run = speculative_decode(target, SecondChoiceProposer(target), PROMPT, k=k, max_new_tokens=3, sampler=sampler)
        counts[tuple(run.tokens[:3])] += 1
    return counts


def chi_square(counts: torch.Tensor, exact: torch.Tensor) -> tuple[float, float]:
    """Pearson's statistic over cells expecting at least 5 draws (the rest pooled into one), and the threshold it
    must stay under: the chi-square (1 - FALSE_ALARM) quantile for its degrees of freedom (Wilson-Hilferty)."""
    expected, observed = exact.flatten() * SAMPLES, counts.flatten()
    kept = expected >= 5
    cells_e = torch.cat([expected[kept], expected[~kept].sum().reshape(1)])
    cells_o = torch.cat([observed[kept], observed[~kept].sum().reshape(1)])
    if cells_e[-1] < 5:  # too little mass to pool: merge it into the smallest kept cell
        cells_e, cells_o = cells_e[:-1], cells_o[:-1]
        smallest = int(cells_e.argmin())
        cells_e[smallest] += expected[~kept].sum()
        cells_o[smallest] += observed[~kept].sum()
    statistic = float(((cells_o - cells_e) ** 2 / cells_e).sum())
    df = len(cells_e) - 1
    z = NormalDist().inv_cdf(1 - FALSE_ALARM)
    threshold = df * (1 - 2 / (9 * df) + z * math.sqrt(2 / (9 * df))) ** 3
    return statistic, threshold


@pytest.mark.parametrize("top_p,k", [(1.0, 2), (1.0, 1), (0.9, 2)])
def test_speculative_sampling_emits_the_targets_own_distribution(top_p, k):
    target = BigramTarget()
    sampling = Sampling(temperature=1.0, top_p=top_p, seed=7)
    counts = drawn_first_three(target, RejectionSampler(sampling), k)
    statistic, threshold = chi_square(counts, exact_first_three(target, sampling))
    assert statistic < threshold, (statistic, threshold)


@pytest.mark.parametrize("wrong", [AcceptsEveryDraft, ResidualKeepsTheDraft])
def test_the_same_test_fails_a_wrong_sampler(wrong):
    target = BigramTarget()
    sampling = Sampling(temperature=1.0, seed=7)
    counts = drawn_first_three(target, wrong(sampling), 2)
    statistic, threshold = chi_square(counts, exact_first_three(target, sampling))
    assert statistic > threshold, (statistic, threshold)


def test_the_poor_draft_is_accepted_sometimes_and_rejected_sometimes():
    target = BigramTarget()
    sampler = RejectionSampler(Sampling(temperature=1.0, seed=7))
    accepted = [speculative_decode(target, SecondChoiceProposer(target), PROMPT, k=2, max_new_tokens=3,
                                   sampler=sampler).counter.accepted_at[0] for _ in range(400)]
    assert 0.05 < sum(accepted) / len(accepted) < 0.95


def test_top_p_keeps_vllms_nucleus():
    """vLLM sorts ascending and cuts a token when the probability up to and including it is at most 1 - p."""
    logits = torch.tensor([0.5, 0.3, 0.15, 0.05]).log()
    kept = target_probabilities(logits, Sampling(1.0, 0.7)) > 0
    assert kept.tolist() == [True, True, False, False]
    assert (target_probabilities(logits, Sampling(1.0, 0.9)) > 0).tolist() == [True, True, True, False]
    assert (target_probabilities(logits, Sampling(1.0, 1e-9)) > 0).tolist() == [True, False, False, False]
    halved = target_probabilities(logits, Sampling(2.0))
    assert torch.allclose(halved, torch.softmax(logits / 2, -1))


def test_a_seed_reproduces_a_sampled_decode_and_another_seed_draws_another():
    target = BigramTarget()

    def run(seed):
        sampler = RejectionSampler(Sampling(temperature=0.8, top_p=0.95, seed=seed))
        result = speculative_decode(target, SecondChoiceProposer(target), PROMPT, k=3, max_new_tokens=40,
                                    sampler=sampler)
        return result.tokens, result.counter.accepted_at

    assert run(3) == run(3)
    assert run(3) != run(4)


def test_greedy_settings_take_the_argmax_path():
    assert sampler_for(Sampling()) is None
    assert sampler_for(Sampling(temperature=1e-6)) is None  # below vLLM's 1e-5: greedy
    target = BigramTarget()
    greedy = speculative_decode(target, SecondChoiceProposer(target), PROMPT, k=3, max_new_tokens=30)
    again = speculative_decode(target, SecondChoiceProposer(target), PROMPT, k=3, max_new_tokens=30,
                               sampler=sampler_for(Sampling(top_p=1.0, seed=99)))
    assert (greedy.tokens, greedy.counter) == (again.tokens, again.counter)


@pytest.mark.parametrize("temperature,top_p", [(-0.1, 1.0), (float("nan"), 1.0), (1.0, 0.0), (1.0, 1.5), (0.0, 0.9)])
def test_impossible_sampling_settings_are_refused(temperature, top_p):
    with pytest.raises(UsageError):
        Sampling(temperature, top_p).check()


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    from eaglekit.target_model import load_target

    return load_target(make_tiny_target(tmp_path_factory.mktemp("tiny")))


def test_on_a_live_target_the_defaults_decode_exactly_as_greedy_and_a_seed_reproduces_a_sample(tiny):
    def decode(sampling=None, seed=0):
        sampler = sampler_for(sampling) if sampling is not None else None
        run = speculative_decode(LiveVerifier(tiny, ()), RandomProposer(256, seed=1), PROMPTS[0], k=3,
                                 max_new_tokens=16, sampler=sampler)
        return run.tokens, run.counter

    greedy = decode()
    assert decode(Sampling()) == greedy
    assert greedy[0] == greedy_decode(tiny, PROMPTS[0], max_new_tokens=16).tokens
    assert decode(Sampling(temperature=1.0, seed=5)) == decode(Sampling(temperature=1.0, seed=5))
    sampled = [decode(Sampling(temperature=1.0, seed=seed))[0] for seed in (5, 6)]
    assert sampled[0] != sampled[1] and greedy[0] not in sampled  # a near-uniform random target: samples differ
    alone = greedy_decode(tiny, PROMPTS[0], max_new_tokens=16, sampler=sampler_for(Sampling(temperature=1.0, seed=5)))
    assert alone.tokens == greedy_decode(tiny, PROMPTS[0], max_new_tokens=16,
                                         sampler=sampler_for(Sampling(temperature=1.0, seed=5))).tokens
