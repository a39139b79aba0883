"""The speculative loop on a tiny real target: bracket proposers, partial acceptance, cache rollback, and the
EAGLE proposer's row pairing checked against a from-scratch recomputation without any cache."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from eaglekit.decode.eagle import EagleProposer  # noqa: E402
from eaglekit.decode.metrics import DriftStats  # noqa: E402
from eaglekit.decode.speculative import (  # noqa: E402
    LiveVerifier,
    OracleProposer,
    RandomProposer,
    ReplayVerifier,
    capture_pass,
    greedy_decode,
    speculative_decode,
)
from eaglekit.drafter.model import Drafter  # noqa: E402
from eaglekit.families import apply_target, load_draft  # noqa: E402
from eaglekit.target import read_target  # noqa: E402
from eaglekit.target_model import load_target  # noqa: E402
from tests.support.factory import make_draft  # noqa: E402
from tests.support.targets import PROMPTS, make_tiny_target  # noqa: E402

NEW = 20


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    return load_target(make_tiny_target(tmp_path_factory.mktemp("tiny")))


@pytest.fixture(scope="module")
def drafter_and_spec(tiny, tmp_path_factory):
    path = make_draft(str(tmp_path_factory.mktemp("draft")), "vllm", hidden=64, vocab=256, draft_vocab=128,
                      aux_ids=(1, 2, 4), target_layers=4, dtype="F32")
    spec = apply_target(load_draft(path), read_target(tiny.path))
    drafter = Drafter.from_spec(spec, embed_tokens=tiny.embed_tokens, lm_head=tiny.lm_head)
    return drafter, spec


class PartialOracle(OracleProposer):
    """Right about the first `correct` drafts of every round, wrong (a shifted token) after that."""

    def __init__(self, reference, correct):
        super().__init__(reference)
        self.correct = correct

    def propose(self, k):
        drafts = super().propose(k)
        return drafts[: self.correct] + [(t + 1) % 256 for t in drafts[self.correct :]]


@pytest.mark.parametrize("k", [1, 3, 5])
def test_oracle_reaches_k_plus_one_and_random_stays_at_one(tiny, k):
    for prompt in PROMPTS:
        plain = greedy_decode(tiny, prompt, max_new_tokens=NEW)
        reference = greedy_decode(tiny, prompt, max_new_tokens=NEW + k + 1).tokens
        oracle = speculative_decode(LiveVerifier(tiny, ()), OracleProposer(reference), prompt, k=k, max_new_tokens=NEW)
        assert oracle.tokens == plain.tokens
        assert oracle.counter.acceptance_length == k + 1
        assert oracle.counter.per_position == [1.0] * k
        rand = speculative_decode(LiveVerifier(tiny, ()), RandomProposer(256, seed=1), prompt, k=k, max_new_tokens=NEW)
        assert rand.tokens == plain.tokens  # every round rejects: the cache must roll back k rows each time
        assert rand.counter.acceptance_length < 1.1


@pytest.mark.parametrize("correct", [0, 1, 2])
def test_partial_acceptance_is_counted_per_position_and_stays_lossless(tiny, correct):
    k, prompt = 3, PROMPTS[0]
    plain = greedy_decode(tiny, prompt, max_new_tokens=NEW)
    reference = greedy_decode(tiny, prompt, max_new_tokens=NEW + k + 1).tokens
    result = speculative_decode(LiveVerifier(tiny, ()), PartialOracle(reference, correct), prompt, k=k,
                                max_new_tokens=NEW)
    assert result.tokens == plain.tokens
    assert result.counter.acceptance_length == 1 + correct
    assert result.counter.per_position == [1.0] * correct + [0.0] * (k - correct)


def test_eos_stops_both_decodes_at_the_same_token(tiny):
    prompt = PROMPTS[0]
    full = greedy_decode(tiny, prompt, max_new_tokens=NEW).tokens
    eos = full[5]
    plain = greedy_decode(tiny, prompt, max_new_tokens=NEW, eos_ids={eos})
    assert plain.tokens == full[: full.index(eos) + 1]
    reference = greedy_decode(tiny, prompt, max_new_tokens=NEW + 4).tokens
    spec = speculative_decode(LiveVerifier(tiny, ()), OracleProposer(reference), prompt, k=3, max_new_tokens=NEW,
                              eos_ids={eos})
    assert spec.tokens == plain.tokens


def _reference_drafts(drafter, spec, tiny, sequence, k):
    """Chain drafts after `sequence` recomputed from scratch (no cache): rows pair state i with token i+1."""
    ids = spec.aux.ids
    states = capture_pass(tiny, sequence[:-1], [], ids).states
    with torch.inference_mode():
        hidden = drafter.combine([states[i].unsqueeze(0) for i in sorted(ids)])
        tokens = list(sequence[1:])
        drafts = []
        for step in range(k):
            n = len(tokens)
            out = drafter(torch.tensor([tokens]), hidden, torch.arange(n).unsqueeze(0))
            index = int(out.draft_logits[0, -1].argmax())
            drafts.append(index + int(drafter.d2t[index]))
            hidden = torch.cat([hidden, out.feedback[:, -1:]], 1)
            tokens.append(drafts[-1])
    return drafts


def test_eagle_proposer_matches_a_cacheless_recomputation(tiny, drafter_and_spec):
    drafter, spec = drafter_and_spec
    ids, k = spec.aux.ids, 4
    prompt = PROMPTS[0]
    first = tiny.forward(torch.tensor([prompt]), ids)
    next_token = int(first.logits[0, -1].argmax())
    proposer = EagleProposer(drafter, ids, max_len=64)
    proposer.begin(prompt, [a[0] for a in first.aux], next_token)
    drafts = proposer.propose(k)
    assert drafts == _reference_drafts(drafter, spec, tiny, [*prompt, next_token], k)

    # the target keeps two drafts and adds a bonus: the chain's rows must go, the verified rows come in
    accepted, bonus = drafts[:2], 77
    verified = capture_pass(tiny, [*prompt, next_token, *accepted], [], ids).states
    rows = [verified[i][len(prompt):] for i in sorted(ids)]
    proposer.advance(accepted, bonus, rows)
    assert proposer.cache.length == len(prompt) + len(accepted) + 1
    again = proposer.propose(k)
    assert again == _reference_drafts(drafter, spec, tiny, [*prompt, next_token, *accepted, bonus], k)


def test_live_and_replayed_target_agree_and_drift_is_recorded(tiny, drafter_and_spec):
    drafter, spec = drafter_and_spec
    ids, k = spec.aux.ids, 3
    for prompt in PROMPTS:
        plain = greedy_decode(tiny, prompt, max_new_tokens=NEW)
        drift = DriftStats(k)
        live = speculative_decode(LiveVerifier(tiny, ids), EagleProposer(drafter, ids, max_len=64, drift=drift), prompt,
                                  k=k, max_new_tokens=NEW)
        assert live.tokens == plain.tokens
        capture = capture_pass(tiny, prompt, greedy_decode(tiny, prompt, max_new_tokens=NEW + k + 1).tokens)
        replay = speculative_decode(ReplayVerifier(capture, ids), EagleProposer(drafter, ids, max_len=64), prompt,
                                    k=k, max_new_tokens=NEW)
        assert replay.tokens == plain.tokens
        assert replay.counter.accepted_at == live.counter.accepted_at
        rows = drift.rows()
        assert [r["samples"] for r in rows] == [live.counter.drafts] * k
        assert all(r["hidden_rms"] > 0 and 0 <= r["sink_attention"] <= 1 for r in rows)


def test_replay_refuses_a_different_prompt_and_uncaptured_ids(tiny):
    capture = capture_pass(tiny, PROMPTS[0], [1, 2, 3], (1, 2))
    with pytest.raises(ValueError, match="not captured"):
        ReplayVerifier(capture, (3,))
    with pytest.raises(ValueError, match="differs"):
        ReplayVerifier(capture, (1,)).prefill(PROMPTS[1])


def test_teacher_forced_chains_match_the_proposer(tiny, drafter_and_spec):
    """Along the target's own path, the proposer's first draft is the chain's first draft, and each depth's
    probability is what a chain started there gives the target's token, teacher-forced."""
    from eaglekit.verify.diagnose import Hypothesis, teacher_forced_chains

    drafter, spec = drafter_and_spec
    ids, prompt, depth = spec.aux.ids, PROMPTS[1], 3
    continuation = greedy_decode(tiny, prompt, max_new_tokens=NEW).tokens
    capture = capture_pass(tiny, prompt, continuation)
    tokens = capture.tokens
    predictions, chains = teacher_forced_chains(drafter, capture, Hypothesis("declared", "declared", ids), depth)
    assert len(predictions) == len(chains) == len(continuation) - 1
    draft_to_target = (drafter.draft_ids + drafter.d2t).tolist()

    def prob(logits, token):
        return float(logits.float().softmax(-1)[draft_to_target.index(token)]) if token in draft_to_target else 0.0

    n = len(prompt)
    proposer = EagleProposer(drafter, ids, max_len=64)
    proposer.begin(prompt, [capture.states[i][:n] for i in ids], continuation[0])
    for j in range(len(continuation) - 1):
        assert chains[j][0] == pytest.approx(prob(proposer._last[0], continuation[j + 1]), abs=1e-5)
        assert proposer.propose(1)[0] == predictions[j]
        proposer.advance([], continuation[j + 1], [capture.states[i][n + j : n + j + 1] for i in ids])

    # deeper: a chain from committed position p (= row p-1) fed the target's tokens through the KV cache
    with torch.no_grad():
        states = drafter.combine([capture.states[i].unsqueeze(0) for i in ids])
        for row in range(n - 1, len(tokens) - 2, 5):
            cache = drafter.new_cache(1, len(tokens) + depth)
            out = drafter(torch.tensor([tokens[1 : row + 2]]), states[:, : row + 1], torch.arange(row + 1)[None], cache)
            logits, feedback = out.draft_logits[0, -1], out.feedback[:, -1:]
            for d in range(depth):
                if d:
                    out = drafter(torch.tensor([[tokens[row + 1 + d]]]), feedback, torch.tensor([[row + d]]), cache)
                    logits, feedback = out.draft_logits[0, -1], out.feedback
                want = prob(logits, tokens[row + 2 + d]) if row + 2 + d < len(tokens) else 0.0
                assert chains[row - (n - 1)][d] == pytest.approx(want, rel=1e-4, abs=1e-9), (row, d)
