"""Long prompts on tiny real targets: the prefill in chunks, and a prompt's rows shared between the passes over it
(greedy decode, capture, live decode, a longer context), decode exactly what one forward over each prompt decodes."""

from __future__ import annotations

import dataclasses
import random

import pytest

torch = pytest.importorskip("torch")

from eaglekit.decode import compare as compare_module  # noqa: E402
from eaglekit.decode.compare import compare_against  # noqa: E402
from eaglekit.decode.eagle import DraftStart, EagleProposer  # noqa: E402
from eaglekit.decode.options import VerifyOptions  # noqa: E402
from eaglekit.decode.prefix import SharedPrefix, chunk_spans  # noqa: E402
from eaglekit.decode.speculative import (  # noqa: E402
    LiveVerifier,
    ReplayVerifier,
    capture_pass,
    greedy_decode,
    speculative_decode,
)
from eaglekit.drafter.model import Drafter  # noqa: E402
from eaglekit.errors import UsageError  # noqa: E402
from eaglekit.families import apply_target, load_draft  # noqa: E402
from eaglekit.target import read_target  # noqa: E402
from eaglekit.target_model import load_target  # noqa: E402
from tests.support.factory import make_draft  # noqa: E402
from tests.support.targets import make_target_with_tokenizer, make_tiny_target  # noqa: E402

NEW, K, CHUNK = 24, 3, 16
AUX = (1, 2, 4)


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    return load_target(make_tiny_target(tmp_path_factory.mktemp("tiny")))


@pytest.fixture(scope="module")
def drafter(tiny, tmp_path_factory):
    path = make_draft(str(tmp_path_factory.mktemp("draft")), "vllm", hidden=64, vocab=256, draft_vocab=128,
                      aux_ids=AUX, target_layers=4, dtype="F32")
    spec = apply_target(load_draft(path), read_target(tiny.path))
    return Drafter.from_spec(spec, embed_tokens=tiny.embed_tokens, lm_head=tiny.lm_head)


def long_prompt(seed: int, length: int = 150) -> list[int]:
    rng = random.Random(seed)
    return [rng.randrange(3, 256) for _ in range(length)]


class Recording(EagleProposer):
    """The EAGLE proposer, keeping every round's drafts."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.rounds: list[list[int]] = []

    def propose(self, k):
        drafts = super().propose(k)
        self.rounds.append(drafts)
        return drafts


def test_pieces_end_at_multiples_of_the_chunk_and_short_runs_are_one_forward():
    assert chunk_spans(0, 1023, 512) == [(0, 1023)]  # under two chunks: one forward, as before chunking
    assert chunk_spans(0, 1024, 512) == [(0, 512), (512, 1024)]
    assert chunk_spans(0, 7338, 512)[-2:] == [(6656, 7168), (7168, 7338)]
    assert chunk_spans(1536, 2100, 512) == [(1536, 2048), (2048, 2100)]
    assert chunk_spans(0, 9000, None) == [(0, 9000)]
    for start, end in ((0, 37), (16, 200), (0, 96)):
        spans = chunk_spans(start, end, CHUNK)
        assert spans[0][0] == start and spans[-1][1] == end and len(spans) == len(range(start, end - 1, CHUNK))
        assert all(a == b for (_, a), (b, _) in zip(spans, spans[1:]))
        assert all(last % CHUNK == 0 and 0 < last - first <= CHUNK for first, last in spans[:-1])
        assert 0 < spans[-1][1] - spans[-1][0] <= CHUNK
    for bad in (0, -1, True, 2.5):
        with pytest.raises(UsageError, match="prefill chunk"):
            VerifyOptions(prefill_chunk=bad).check()


def decode_all(tiny, drafter, prompt, chunk):
    """The target's greedy decode, the capture of prompt + continuation, a replay and a live decode through one
    shared prefix, as compare and verify run them."""
    prefix = SharedPrefix(tiny, AUX, chunk)
    plain = greedy_decode(tiny, prompt, max_new_tokens=NEW + K + 1, prefix=prefix)
    capture = capture_pass(tiny, prompt, plain.tokens, AUX, prefix=prefix)
    replayed = Recording(drafter, AUX, max_len=len(capture.tokens) + K + 2, chunk=chunk)
    replay = speculative_decode(ReplayVerifier(capture, AUX), replayed, prompt, k=K, max_new_tokens=NEW)
    lived = Recording(drafter, AUX, max_len=len(capture.tokens) + K + 2, chunk=chunk)
    live = speculative_decode(LiveVerifier(tiny, AUX, prefix), lived, prompt, k=K, max_new_tokens=NEW)
    return plain, capture, (replay, replayed.rounds), (live, lived.rounds), prefix


def test_chunked_and_shared_prefill_decodes_what_one_forward_decodes(tiny, drafter):
    for seed in range(3):
        prompt = long_prompt(seed)
        whole = decode_all(tiny, drafter, prompt, None)
        chunked = decode_all(tiny, drafter, prompt, CHUNK)
        assert chunked[0].tokens == whole[0].tokens
        assert chunked[1].tokens == whole[1].tokens
        for i in AUX:
            torch.testing.assert_close(chunked[1].states[i], whole[1].states[i], rtol=0, atol=1e-5)
        for (run, rounds), (reference, reference_rounds) in zip(chunked[2:4], whole[2:4]):
            assert rounds == reference_rounds  # every draft of every round
            assert run.tokens == reference.tokens == whole[0].tokens[:NEW]
            assert (run.counter.drafts, run.counter.accepted_at) == (reference.counter.drafts,
                                                                      reference.counter.accepted_at)
        # the capture and the live decode took the prompt's settled rows from the greedy decode
        assert chunked[4].reused_rows == 2 * ((len(prompt) - 1) // CHUNK * CHUNK) and whole[4].reused_rows == 0


def test_one_pass_over_the_prompt_serves_the_drafter_at_every_k(tiny, drafter, monkeypatch):
    """Proposers of one drafter sharing a `DraftStart` on one capture draft, round for round, what each drafts
    alone, and only the first runs the drafter over the prompt (its pieces before the last only into the cache)."""
    prompt = long_prompt(5)
    plain = greedy_decode(tiny, prompt, max_new_tokens=NEW + 7)
    capture = capture_pass(tiny, prompt, plain.tokens, AUX)
    rows: list[int] = []
    extend_cache = drafter.extend_cache

    def counted(ids, *args):
        rows.append(ids.shape[1])
        return extend_cache(ids, *args)

    monkeypatch.setattr(drafter, "extend_cache", counted)

    class Counting(Recording):
        def _run(self, tokens, *args, **kwargs):
            rows.append(len(tokens))
            return super()._run(tokens, *args, **kwargs)

    def replay(k, start):
        proposer = Counting(drafter, AUX, max_len=len(capture.tokens) + 8, chunk=CHUNK, start=start)
        run = speculative_decode(ReplayVerifier(capture, AUX), proposer, prompt, k=k, max_new_tokens=NEW)
        return proposer.rounds, (run.counter.drafts, run.counter.accepted_at)

    alone = [replay(k, None) for k in (3, 6)]
    alone_rows, start = sum(rows), DraftStart()
    rows.clear()
    shared = [replay(k, start) for k in (3, 6)]
    assert shared == alone
    assert alone_rows - sum(rows) == len(prompt)  # the second k took the prompt's rows from the first
    assert start.state is not None and start.state[0].length == len(prompt)


def test_rows_taken_from_an_earlier_prompt_are_the_rows_a_fresh_pass_computes(tiny):
    """Reuse is exact: a prompt sharing a prefix with the one before gets bit for bit the states (and the next
    token) a prefix of its own computes; rows after the first differing token are never taken."""
    first = long_prompt(0)
    for second in (first[:100] + long_prompt(1)[:60], first + [7, 8, 9], [9] + first[1:]):
        shared = SharedPrefix(tiny, AUX, CHUNK)
        shared.run(first)
        again = shared.run(second)
        fresh = SharedPrefix(tiny, AUX, CHUNK).run(second)
        common = next((i for i, (a, b) in enumerate(zip(first, second)) if a != b), len(first))
        assert shared.reused_rows == min(common, len(second) - 1, 144) // CHUNK * CHUNK
        assert torch.equal(again.logits, fresh.logits)
        for a, b in zip(again.aux, fresh.aux):
            assert torch.equal(a, b)
    with pytest.raises(ValueError, match="not kept by this prefix"):
        SharedPrefix(tiny, (1,), CHUNK).run(first, (2,))


def test_a_sliding_window_target_prefills_in_chunks_and_shares_nothing(tmp_path):
    """A sliding-window cache keeps only its window's rows and cannot be rolled back: the next prompt starts afresh
    (chunked all the same), and decodes what one forward decodes."""
    import transformers

    torch.manual_seed(0)
    config = transformers.MistralConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                                        num_attention_heads=4, num_key_value_heads=2, vocab_size=256,
                                        max_position_embeddings=256, sliding_window=40)
    transformers.MistralForCausalLM(config).save_pretrained(tmp_path / "mistral")
    target = load_target(str(tmp_path / "mistral"))
    first = long_prompt(0)
    shared = SharedPrefix(target, (1,), CHUNK)
    shared.run(first)
    again = shared.run(first + [7, 8])
    whole = SharedPrefix(target, (1,), None).run(first + [7, 8])
    assert shared.reused_rows == 0 and shared.computed_rows == 2 * len(first) + 2
    assert int(again.logits[0, -1].argmax()) == int(whole.logits[0, -1].argmax())
    torch.testing.assert_close(again.aux[0], whole.aux[0], rtol=0, atol=1e-5)


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    base = tmp_path_factory.mktemp("pair")
    target = make_target_with_tokenizer(str(base / "target"))
    vocab = len(load_target(target).tokenizer)
    drafts = [make_draft(str(base / name), "vllm", hidden=64, vocab=vocab, draft_vocab=128, aux_ids=(1, 2, 3),
                         target_layers=4, dtype="F32", seed=seed) for name, seed in (("a", 0), ("b", 7))]
    return target, drafts


def test_compare_across_contexts_and_templates_is_the_same_chunked_and_shared(pair, monkeypatch):
    """compare over several contexts and templates gives every prompt the drafts and counters it gives without
    chunks or sharing, and the longer contexts took rows from the shorter ones."""
    target, (a, b) = pair
    prefixes: list[SharedPrefix] = []
    drafted: list[list[list[int]]] = []

    class Kept(SharedPrefix):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            prefixes.append(self)

    class Drafting(Recording):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            drafted.append(self.rounds)

    monkeypatch.setattr(compare_module, "SharedPrefix", Kept)
    monkeypatch.setattr(compare_module, "EagleProposer", Drafting)
    options = VerifyOptions(limit=2, max_new_tokens=10, num_speculative_tokens=K, context_tokens=(0, 48, 96),
                            template=("chat", "raw"), device="cpu", dtype="float32")
    whole = compare_against(a, [b], target, dataclasses.replace(options, prefill_chunk=None))
    runs = len(drafted)
    chunked = compare_against(a, [b], target, dataclasses.replace(options, prefill_chunk=32))
    assert [s.to_dict() for s in chunked] == [s.to_dict() for s in whole]
    assert runs == 2 * 2 * 6 and drafted[runs:] == drafted[:runs]  # each draft's every round, prompt by prompt
    unchunked, shared = prefixes
    assert unchunked.reused_rows == 0
    # per prompt and template: the capture after the greedy decode, and +96 after +48
    assert shared.reused_rows > 2 * 2 * (48 + 96)
    assert shared.computed_rows + shared.reused_rows == unchunked.computed_rows


def test_a_context_that_pushes_a_prompt_past_the_targets_is_one_line_naming_the_option(pair):
    """--context-tokens that fits the target alone but not with a prompt after it is the option's fault: one line,
    exit 2, naming the option, the prompt and max_position_embeddings, before anything decodes."""
    from tests.support.cli import run_cli

    target, (a, b) = pair
    base = ["compare", a, b, "--target", target, "--limit", "2", "--max-new-tokens", "10", "--no-progress"]
    result = run_cli([*base, "--context-tokens", "0,200"])
    assert result.exit_code == 2, result.output
    (line,) = result.stderr.strip().splitlines()
    assert line.startswith("Error: --context-tokens 200: eaglekit/data/prompts/coding.jsonl: line 1 is then ")
    assert "past the target's 512-token context (max_position_embeddings) with --max-new-tokens 10 (14 decoded for " \
           "the last round): about " in line and line.endswith(" tokens of context fit")
    result = run_cli([*base, "--context-tokens", "512"])
    assert result.exit_code == 2 and "leave no room for a prompt in the target's 512-token context " \
                                     "(max_position_embeddings)" in result.stderr
