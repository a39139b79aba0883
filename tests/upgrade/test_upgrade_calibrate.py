"""fc_norm calibration: the runtime's RMSNorm, the least-squares fit, fidelity, and a real target end to end."""

from __future__ import annotations

import json
import os

import jsonschema
import numpy as np
import pytest

from eaglekit.upgrade import UpgradeOptions, upgrade
from eaglekit.upgrade.calibrate import FcNormFit, apply_fc_norm, fc_fidelity, rms_normalize
from eaglekit.upgrade.encode import round_to
from tests.support import REPO
from tests.support.factory import make_draft

pytestmark = pytest.mark.model

torch = pytest.importorskip("torch")


def load_json(path) -> dict:
    with open(path, encoding="utf-8") as fh:
        return json.load(fh)


def runtime_fc_norm(x: np.ndarray, w: np.ndarray, eps: float, dtype) -> np.ndarray:
    """vLLM's RMSNorm.forward_native on a `dtype` input: float32 math, cast, then the weight multiply."""
    t = torch.from_numpy(x).to(dtype)
    h = t.float()
    h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps)
    return (h.to(dtype) * torch.from_numpy(w).to(dtype)).float().numpy()


@pytest.mark.parametrize("dtype,name", [(torch.bfloat16, "BF16"), (torch.float16, "F16"), (torch.float32, "F32")])
def test_fc_norm_matches_the_runtime(dtype, name):
    rng = np.random.default_rng(0)
    x = (rng.standard_normal((64, 96)) * rng.uniform(0.1, 30, size=(64, 1))).astype(np.float32)
    w = rng.uniform(0.5, 2.0, size=96).astype(np.float32)
    x = round_to(x, name)  # the draft receives the aux state in its own dtype
    ours = apply_fc_norm([x], w[None, :], 1e-5, name)[0]
    ref = runtime_fc_norm(x, w, 1e-5, dtype)
    # rsqrt vs 1/sqrt differ in float32's last bits; after rounding to 16 bits the results almost always agree
    ulp = {"BF16": 2**-7, "F16": 2**-10, "F32": 2**-20}[name]
    assert np.all(np.abs(ours - ref) <= ulp * np.abs(ref) + 1e-30)
    if name != "F32":
        assert np.mean(ours == ref) > 0.99


def _scaled_tokens(rng, n, width, channel_scale):
    """Tokens whose every row has RMS exactly 1 before the per-channel and per-token scales."""
    u = rng.standard_normal((n, width))
    u /= np.sqrt(np.mean(u * u, axis=1, keepdims=True))
    return u, (u * channel_scale).astype(np.float32)


def test_constant_scale_is_recovered_exactly():
    rng = np.random.default_rng(1)
    fit = FcNormFit(1, 32, eps=1e-12, dtype="F32")
    _, x = _scaled_tokens(rng, 500, 32, 7.5)  # every token has RMS 7.5, so norm(x)*7.5 == x
    fit.update([x])
    np.testing.assert_allclose(fit.weights()[0], 7.5, rtol=1e-5)


def test_the_fit_is_the_least_squares_optimum():
    rng = np.random.default_rng(2)
    width = 48
    scale = rng.uniform(0.2, 5.0, size=width)
    x = (rng.standard_normal((400, width)) * scale * rng.uniform(0.5, 3.0, size=(400, 1))).astype(np.float32)
    fit = FcNormFit(1, width, eps=1e-6, dtype="F32")
    fit.update([x[:150]])
    fit.update([x[150:]])  # statistics accumulate across batches
    w = fit.weights()[0]
    n = rms_normalize(x, 1e-6, "F32").astype(np.float64)

    def loss(weights):
        return np.sum((n * weights - x) ** 2, axis=0)

    base = loss(w)
    for factor in (0.99, 1.01):
        assert np.all(loss(w * factor) > base)
    one_batch = FcNormFit(1, width, eps=1e-6, dtype="F32")
    one_batch.update([x])
    np.testing.assert_allclose(one_batch.weights(), fit.weights(), rtol=1e-10)


def test_fidelity_measures_the_fc_output():
    rng = np.random.default_rng(3)
    chunks = [_scaled_tokens(rng, 200, 16, s)[1] for s in (3.0, 0.5, 12.0)]
    fc = rng.standard_normal((8, 48)).astype(np.float32)
    exact = fc_fidelity(fc, chunks, np.array([[3.0] * 16, [0.5] * 16, [12.0] * 16]), 1e-12, "F32")
    assert exact.relative_error < 1e-5 and exact.cosine > 1 - 1e-6
    ones = fc_fidelity(fc, chunks, np.ones((3, 16)), 1e-12, "F32")
    assert ones.relative_error > 0.5  # unit weights shrink the 3.0 and 12.0 chunks
    assert -1.0 <= ones.cosine <= 1.0 and ones.min_cosine <= ones.cosine


# ---------------------------------------------------------------- a real (tiny) target model


@pytest.fixture(scope="module")
def tiny_target(tmp_path_factory):
    """A 4-layer Llama with its own byte-level BPE tokenizer, saved as an ordinary HF directory."""
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    from eaglekit.capture.plan import calibration_text

    path = str(tmp_path_factory.mktemp("tiny-target"))
    text, _ = calibration_text(None)
    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.train_from_iterator([text], trainers.BpeTrainer(vocab_size=384, special_tokens=["<unk>", "<s>"]))
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="<unk>", bos_token="<s>")
    fast.save_pretrained(path)
    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=len(fast), hidden_size=64, intermediate_size=128, num_hidden_layers=4,
                      num_attention_heads=4, num_key_value_heads=2, tie_word_embeddings=False)
    model = LlamaForCausalLM(cfg)
    with torch.no_grad():  # give the residual stream channel structure, as trained models have
        model.model.embed_tokens.weight.mul_(torch.linspace(0.2, 40.0, 64))
    model.save_pretrained(path)
    return path, len(fast)


def _fresh_text_fidelity(target_dir, draft_dir, ids, weights):
    """fc fidelity on text the calibration never saw, with hidden states from HF's own output_hidden_states."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from eaglekit.families import load_draft
    from eaglekit.io.tensors import read_array

    tok = AutoTokenizer.from_pretrained(target_dir)
    model = AutoModelForCausalLM.from_pretrained(target_dir).eval()
    text = ("Tomorrow the library opens late because the heating failed; readers may return books at the side door. "
            "def area(r):\n    return 3.14159 * r * r\n") * 3
    with torch.no_grad():
        hs = model(torch.tensor([tok(text)["input_ids"]]), output_hidden_states=True).hidden_states
    chunks = [hs[i][0, 1:].numpy() for i in ids]
    fc = read_array(load_draft(draft_dir), "fc.weight", as_float32=True)
    return fc_fidelity(fc, chunks, weights, 1e-5, "BF16")


def test_calibrated_fc_norm_beats_unit_weights_on_a_real_target(tiny_target, tmp_path):
    target_dir, vocab = tiny_target
    # specforge writes output-of-layer ids [0, 1, 2] for vLLM ids (1, 2, 3)
    src = make_draft(str(tmp_path / "src"), "specforge", vocab=vocab, draft_vocab=200, aux_ids=(1, 2, 3),
                     target_layers=4)
    report = upgrade(src, str(tmp_path / "cal"), UpgradeOptions(target=target_dir))  # the default, with weights
    assert report.flags["fc_norm_init"] == "calibrated" and report.function == "eagle3-function"
    assert report.flags["fc_norm"] and report.flags["norm_output"] and report.output["eagle_version"] == "3.1"
    assert not any("kept EAGLE-3" in w for w in report.warnings)
    fid = report.fidelity
    assert fid is not None and fid.tokens >= 64 and fid.fit_tokens > fid.tokens
    assert fid.relative_error < 0.5 * fid.ones_relative_error
    assert fid.cosine >= fid.ones_cosine - 1e-3
    cfg = load_json(tmp_path / "cal" / "config.json")
    assert cfg["eaglekit"]["fidelity"]["fc_output_relative_error"] == pytest.approx(fid.relative_error, abs=1e-6)
    schema = load_json(os.path.join(str(REPO), "schemas", "upgrade-report.schema.json"))
    jsonschema.validate(json.loads(json.dumps(report.to_dict())), schema)

    from eaglekit.families import load_draft
    from eaglekit.io.tensors import read_array

    out = load_draft(str(tmp_path / "cal"))
    weights = np.stack([read_array(out, f"fc_norm.{k}.weight", as_float32=True) for k in range(3)])
    assert np.all(np.isfinite(weights)) and not np.allclose(weights, 1.0)
    fresh = _fresh_text_fidelity(target_dir, src, (1, 2, 3), weights)
    fresh_ones = _fresh_text_fidelity(target_dir, src, (1, 2, 3), np.ones_like(weights))
    assert fresh.relative_error < fresh_ones.relative_error


def test_calibration_with_only_fc_norm_is_approximately_preserving(tiny_target, tmp_path):
    target_dir, vocab = tiny_target
    src = make_draft(str(tmp_path / "src"), "vllm", vocab=vocab, draft_vocab=None, aux_ids=(1, 2, 4),
                     target_layers=4)
    report = upgrade(src, str(tmp_path / "out"), UpgradeOptions(target=target_dir, norm_output=False))
    assert report.function == "approximate"
    assert report.summary.startswith("approximately preserving: first-step fc output cosine")


def test_ones_init_with_a_target_that_has_weights(tiny_target, tmp_path):
    target_dir, vocab = tiny_target
    src = make_draft(str(tmp_path / "src"), "vllm", vocab=vocab, draft_vocab=None, aux_ids=(1, 2, 3))
    report = upgrade(src, str(tmp_path / "out"), UpgradeOptions(target=target_dir, fc_norm_init="ones"))
    assert report.fidelity is None and report.flags["fc_norm_init"] == "ones"


def test_calibration_text_from_a_file(tiny_target, tmp_path):
    target_dir, vocab = tiny_target
    text = tmp_path / "text.txt"
    text.write_text("The quick brown fox jumps over the lazy dog. " * 80)
    src = make_draft(str(tmp_path / "src"), "vllm", vocab=vocab, draft_vocab=None, aux_ids=(1, 2, 3))
    report = upgrade(src, str(tmp_path / "out"), UpgradeOptions(target=target_dir, calibration_file=str(text)))
    assert report.fidelity.text == str(text)


def test_calibration_on_smollm2(tmp_path):
    """SmolLM2-135M (L=30, T=576): a real trained target, its default aux layers (2, 15, 27)."""
    pytest.importorskip("gguf")
    from tests.support.smollm2 import smollm2_path

    target_dir = smollm2_path()
    src = make_draft(str(tmp_path / "src"), "specforge", hidden=576, heads=9, kv_heads=3, head_dim=64,
                     intermediate=256, vocab=49152, draft_vocab=4096, aux_ids=(2, 15, 27), target_layers=30)
    report = upgrade(src, str(tmp_path / "out"), UpgradeOptions(target=target_dir, calibration_tokens=512))
    fid = report.fidelity
    assert fid.relative_error < fid.ones_relative_error
    assert fid.cosine > fid.ones_cosine
    assert load_json(os.path.join(tmp_path, "out", "config.json"))["eaglekit"]["fidelity"]


# ---------------------------------------------------------------- the function-preserving EAGLE-3.1 start


def _fresh_capture(target_dir, ids):
    """Tokens and aux states (HF's own output_hidden_states) of text the calibration never saw."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(target_dir)
    model = AutoModelForCausalLM.from_pretrained(target_dir).eval()
    text = ("The ferry leaves at nine unless the wind is strong; then it waits for the afternoon tide. "
            "for i in range(10):\n    print(i * i)\n") * 4
    tokens = torch.tensor(tok(text)["input_ids"])
    with torch.no_grad():
        hs = model(tokens[None], output_hidden_states=True).hidden_states
    return tokens, torch.cat([hs[i][0] for i in ids], dim=-1)


def _chain(drafter, tokens, aux, depth=3):
    from eaglekit.drafter.unroll import unrolled_steps

    rows = len(tokens) - depth
    with torch.no_grad():
        return list(unrolled_steps(drafter, tokens[1:][None], drafter.combine(aux[:rows][None]), depth))


@pytest.mark.parametrize("layout,dtype,draft_vocab", [("vllm", "F32", None), ("specforge", "BF16", 200)])
def test_the_default_upgrade_keeps_the_source_function(tiny_target, tmp_path, layout, dtype, draft_vocab):
    """norm_output on, with the rescale: the same first-step logits, the EAGLE-3 state fed back up to its
    per-token magnitude, and chained drafts that agree with the source's far more than a plain switch-on."""
    from eaglekit.drafter.model import Drafter
    from eaglekit.families import load_draft

    target_dir, vocab = tiny_target
    ids = (1, 2, 3)
    src = make_draft(str(tmp_path / "src"), layout, vocab=vocab, draft_vocab=draft_vocab, aux_ids=ids,
                     target_layers=4, dtype=dtype, embed=True, frequency_ordered=draft_vocab is not None)
    report = upgrade(src, str(tmp_path / "out"), UpgradeOptions(target=target_dir, fc_norm=False))
    assert report.function == "eagle3-function" and report.flags["norm_output_added"]
    assert report.summary.startswith("EAGLE-3.1 flags, EAGLE-3 function, not yet trained as 3.1")
    start = report.start
    # fc_norm is off: the first step's logits are the source's, up to the folded head's rounding (near-ties)
    assert start.agreement[0] == 1.0 if dtype == "F32" else start.agreement[0] >= 0.99
    assert all(a > b for a, b in zip(start.agreement[1:], start.agreement_without_rescale[1:]))
    cfg = load_json(tmp_path / "out" / "config.json")
    assert cfg["norm_output"] is True
    assert cfg["eaglekit"]["function"] == "eagle3-function"
    assert cfg["eaglekit"]["norm_output_rescale"]["scale"] == pytest.approx(start.scale)

    # measured here, independently, on text neither the calibration nor the report saw
    source = Drafter.from_spec(load_draft(src))
    output = Drafter.from_spec(load_draft(str(tmp_path / "out")))
    plain = Drafter.from_spec(load_draft(src), overrides={"norm_output": True})
    tokens, aux = _fresh_capture(target_dir, ids)
    a, b, p = _chain(source, tokens, aux), _chain(output, tokens, aux), _chain(plain, tokens, aux)
    tol = {"F32": 1e-4, "BF16": 2e-2}[dtype]  # the folded lm_head is rounded once into the draft's dtype
    torch.testing.assert_close(source.to_target_vocab(a[0].draft_logits).softmax(-1),
                               output.to_target_vocab(b[0].draft_logits).softmax(-1), atol=tol, rtol=0)
    h = a[0].feedback[0]  # EAGLE-3 feeds back the pre-norm state; the output feeds h · c / rms(h)
    expected = h * start.scale / h.pow(2).mean(-1, keepdim=True).add(1e-6).sqrt()
    torch.testing.assert_close(b[0].feedback[0], expected, atol=1e-3 * start.scale, rtol=1e-3)

    def agree(x, y):  # in target ids: the output's vocabulary map is sorted, the source's frequency-ordered
        return float((x.logits.argmax(-1) == y.logits.argmax(-1)).float().mean())

    rescaled = [agree(x, y) for x, y in zip(a, b)]
    switched = [agree(x, y) for x, y in zip(a, p)]
    assert rescaled[0] >= 0.98
    assert min(rescaled[1:]) >= 0.8 and rescaled[2] > switched[2]


def test_a_draft_that_borrows_the_head_stays_a_warm_start(tiny_target, tmp_path):
    target_dir, vocab = tiny_target
    src = make_draft(str(tmp_path / "src"), "vllm", vocab=vocab, draft_vocab=None, aux_ids=(1, 2, 3),
                     target_layers=4, lm_head=False)
    report = upgrade(src, str(tmp_path / "out"), UpgradeOptions(target=target_dir))
    assert report.function == "warm-start" and report.start is None
    assert any("borrows the target's lm_head" in w for w in report.warnings)


def test_the_eagle3_function_start_is_publishable_and_its_card_says_it_is_untrained_as_31(tiny_target, tmp_path):
    from eaglekit.hub.push import push

    target_dir, vocab = tiny_target
    src = make_draft(str(tmp_path / "src"), "vllm", vocab=vocab, draft_vocab=None, aux_ids=(1, 2, 3),
                     target_layers=4)
    assert upgrade(src, str(tmp_path / "out"), UpgradeOptions(target=target_dir)).function == "eagle3-function"
    result = push(str(tmp_path / "out"), "org/start", target=target_dir, dry_run=True)
    assert not result.forced
    assert "Not yet trained as EAGLE-3.1" in result.card and "untrained warm start" not in result.card


def test_calibration_on_the_quantized_target_fits_other_norms_and_names_the_numerics(tiny_target, tmp_path):
    from eaglekit.families import load_draft
    from eaglekit.io.tensors import read_array
    from eaglekit.quantization import SCHEMES

    target_dir, vocab = tiny_target
    src = make_draft(str(tmp_path / "src"), "vllm", vocab=vocab, draft_vocab=None, aux_ids=(1, 2, 3))
    full = upgrade(src, str(tmp_path / "full"), UpgradeOptions(target=target_dir))
    served = upgrade(src, str(tmp_path / "nvfp4"), UpgradeOptions(target=target_dir, target_quantization="nvfp4"))
    assert full.fidelity is not None and served.fidelity is not None
    assert full.fidelity.target_quantization is None
    doc = json.loads(json.dumps(served.to_dict()))
    assert doc["fidelity"]["target_quantization"] == SCHEMES["nvfp4"].to_dict()
    schema = load_json(os.path.join(str(REPO), "schemas", "upgrade-report.schema.json"))
    jsonschema.validate(doc, schema)

    def fc_norm(path):
        draft = load_draft(path)
        return np.stack([read_array(draft, f"fc_norm.{k}.weight", as_float32=True) for k in range(3)])

    # the quantized target's states are other states: the fitted norms move, and stay finite
    assert np.all(np.isfinite(fc_norm(str(tmp_path / "nvfp4"))))
    assert not np.array_equal(fc_norm(str(tmp_path / "full")), fc_norm(str(tmp_path / "nvfp4")))
    with pytest.raises(Exception, match="target-quantization"):
        upgrade(src, str(tmp_path / "refused"), UpgradeOptions(target_quantization="nvfp4"))
