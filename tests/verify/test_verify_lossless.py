"""verify's headline verdicts, each shown to fail when its code path is broken: a speculative decode that leaves the
target's greedy output is not lossless (exit 1, the prompt and token named); a divergence where the target's own
top-2 logits were tied within the dtype's tolerance (bfloat16: 0.5) is a numerical tie, and one just past it is
not; counters that differ from the engine's give the engine-disagreement verdict.

The target is a tiny random Llama with its own tokenizer, its lm_head scaled so its top-2 margins spread on both
sides of the bfloat16 tolerance; the speculative decode's output is the target's own with one token replaced at a
position chosen from the target's real margins."""

from __future__ import annotations

import json
import math
import os

import pytest

torch = pytest.importorskip("torch")

from eaglekit.decode.metrics import AcceptanceCounter  # noqa: E402
from eaglekit.runtime.engine import EngineRun  # noqa: E402
from eaglekit.verify.run import TIE_TOLERANCE, _divergence, compare_engine  # noqa: E402
from tests.support.cli import run_cli  # noqa: E402
from tests.support.factory import make_draft, rewrite_tensors  # noqa: E402
from tests.support.targets import make_target_with_tokenizer  # noqa: E402

BF16 = TIE_TOLERANCE["bfloat16"]
LOGIT_SCALE = 15.0  # the random head's margins (0.002-0.11) become 0.03-1.7: near-ties and clear choices


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    """(target, draft, prompts file): the target's lm_head scaled by LOGIT_SCALE, a draft that fits it."""
    from safetensors.numpy import load_file

    base = tmp_path_factory.mktemp("lossless")
    target = make_target_with_tokenizer(str(base / "target"))
    vocab = json.load(open(os.path.join(target, "config.json")))["vocab_size"]
    head = load_file(os.path.join(target, "model.safetensors"))["lm_head.weight"]
    rewrite_tensors(target, lambda ts: {**ts, "lm_head.weight": ("F32", ts["lm_head.weight"][1],
                                                                   (head * LOGIT_SCALE).astype("<f4").tobytes())})
    draft = make_draft(str(base / "draft"), "vllm", hidden=64, vocab=vocab, draft_vocab=128, aux_ids=(1, 2, 3),
                       target_layers=4, dtype="F32")
    prompts = base / "prompts.jsonl"
    prompts.write_text(json.dumps({"prompt": "Count to three and then say hello to the world."}) + "\n")
    return target, draft, str(prompts)


@pytest.fixture
def replace_token(monkeypatch):
    """`replace_token(choose)`: the speculative output becomes the target's greedy output with the token at
    `choose(margins)` replaced; returns the (position, margin) pairs it replaced, one per prompt."""
    import eaglekit.decode.setup as setup_module
    import eaglekit.verify.run as run_module

    plains, replaced = [], []
    real_greedy, real_speculative = setup_module.greedy_decode, run_module.speculative_decode

    def greedy(*args, **kwargs):
        plains.append(real_greedy(*args, **kwargs))
        return plains[-1]

    def arm(choose):
        def speculative(*args, **kwargs):
            run = real_speculative(*args, **kwargs)
            if not plains:  # the untimed warm-up before the first prompt
                return run
            plain = plains[-1]
            at = choose(plain.margins)
            assert at is not None, f"no position fits among the target's margins {plain.margins}"
            replaced.append((at, plain.margins[at]))
            run.tokens = [*plain.tokens[:at], plain.tokens[at] + 1, *plain.tokens[at + 1:]]
            return run

        monkeypatch.setattr(setup_module, "greedy_decode", greedy)
        monkeypatch.setattr(run_module, "speculative_decode", speculative)
        return replaced

    return arm


def nearest_within(margins, tolerance=BF16):
    """The position of the largest margin at or below `tolerance`: the near-tie closest to a real choice."""
    inside = [(m, i) for i, m in enumerate(margins) if m <= tolerance]
    return max(inside)[1] if inside else None


def nearest_past(margins, tolerance=BF16):
    """The position of the smallest margin above `tolerance`: the clear choice closest to a tie."""
    outside = [(m, i) for i, m in enumerate(margins) if m > tolerance]
    return min(outside)[1] if outside else None


def verify(pair, tmp_path) -> tuple[int, str, dict]:
    target, draft, prompts = pair
    saved = tmp_path / "report.json"
    result = run_cli(["verify", draft, "--target", target, "--prompts", prompts, "--max-new-tokens", "16",
                      "--dtype", "bfloat16", "--device", "cpu", "--save-report", str(saved), "--no-progress",
                      "--as-eaglekit-reads"])
    assert saved.exists(), result.stderr
    return result.exit_code, result.stderr, json.loads(saved.read_text())


def test_a_decode_that_leaves_the_targets_output_is_not_lossless_and_exits_1(pair, tmp_path, replace_token):
    """A replaced token where the target's top-2 margin is past the bfloat16 tolerance: not lossless, not passed,
    exit 1 with one line naming the prompt and the token."""
    replaced = replace_token(nearest_past)
    code, stderr, doc = verify(pair, tmp_path)
    (at, margin), = replaced
    assert margin > BF16
    assert code == 1 and stderr.startswith("Error: ") and len(stderr.strip().splitlines()) == 1, stderr
    assert "differs from the target's own greedy output on 1 prompt(s)" in stderr and f"at token {at})" in stderr
    assert doc["lossless"] is False and doc["passed"] is False and doc["exact_match"] is False
    divergence, = [p["divergence"] for p in doc["per_prompt"] if p["divergence"]]
    assert divergence == {"position": at, "target_top2_margin": pytest.approx(margin), "numerical_tie": False}


def test_a_near_tie_within_the_bf16_tolerance_is_not_a_divergence(pair, tmp_path, replace_token):
    """A replaced token where the target's own top-2 margin is within the bfloat16 tolerance: either token is the
    target's greedy choice, so the run is lossless (and passes) though not an exact match."""
    replaced = replace_token(nearest_within)
    code, stderr, doc = verify(pair, tmp_path)
    (at, margin), = replaced
    assert margin <= BF16 and margin > TIE_TOLERANCE["float32"]  # a tie only at the bfloat16 tolerance
    assert code == 0, stderr
    assert doc["lossless"] is True and doc["passed"] is True and doc["exact_match"] is False
    divergence, = [p["divergence"] for p in doc["per_prompt"] if p["divergence"]]
    assert divergence["position"] == at and divergence["numerical_tie"] is True


def test_the_tie_tolerance_is_inclusive_and_ends_at_the_dtypes_value():
    """At the tolerance a tie, one ULP past it a divergence; a decode of another length diverges where the shorter
    ends, with no margin to call it a tie; identical outputs have no divergence."""
    past = math.nextafter(BF16, math.inf)
    assert _divergence([1, 2, 9], [1, 2, 3], [0.1, 0.1, BF16], BF16)["numerical_tie"] is True
    assert _divergence([1, 2, 9], [1, 2, 3], [0.1, 0.1, past], BF16) == {
        "position": 2, "target_top2_margin": past, "numerical_tie": False}
    assert _divergence([1, 2], [1, 2, 3], [0.1, 0.1, 0.0], BF16)["position"] == 2
    assert _divergence([1, 2, 3, 4], [1, 2, 3], [0.0, 0.0, 0.0], BF16) == {
        "position": 3, "target_top2_margin": None, "numerical_tie": False}
    assert _divergence([1, 2, 3], [1, 2, 3], [0.0, 0.0, 0.0], BF16) is None


def engine_run(counter: AcceptanceCounter, outputs, per_request=None) -> EngineRun:
    return EngineRun("vllm", "0.32.0", counter, True, [], outputs, None, {}, per_request)


def test_counters_that_differ_from_the_engines_are_the_disagreement_verdict():
    """Same target outputs, same ids, other counters: `disagree` (an engine misreading or an eaglekit bug); equal
    totals with one prompt's counters differing disagree too where the engine reports per-request counters; equal
    counters agree; other target outputs are `different decodes`, not a disagreement."""
    outputs = [[5, 6, 7], [8, 9]]
    a, b = AcceptanceCounter.from_histogram([3, 2, 1, 0]), AcceptanceCounter.from_histogram([2, 1, 0, 1])
    ours = AcceptanceCounter(3)
    ours.merge(a)
    ours.merge(b)
    fewer = AcceptanceCounter.from_histogram([6, 2, 1, 1])  # as many drafts, one accepted token fewer

    def verdict(engine: EngineRun, per_prompt=(a, b)) -> dict:
        return compare_engine(ours, engine, (1, 2, 3), (1, 2, 3), None, outputs, list(per_prompt))

    disagree = verdict(engine_run(fewer, outputs))
    assert disagree["verdict"] == "disagree" and disagree["counters_equal"] is False
    assert "with the same ids" in disagree["message"]
    swapped = verdict(engine_run(ours, outputs, [b, a]))  # the totals agree, each prompt's counters do not
    assert swapped["verdict"] == "disagree" and swapped["prompts_with_other_counters"] == [0, 1]
    assert verdict(engine_run(ours, outputs, [a, b]))["verdict"] == "agree"
    assert verdict(engine_run(fewer, [[5, 6, 0], [8, 9]]))["verdict"] == "different decodes"
