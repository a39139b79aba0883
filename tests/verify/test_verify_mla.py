"""MLA end to end: a tiny random DeepSeek-V3 target (MLA attention, MoE layers, latent KV cache) against
Kimi-layout MLA drafts through `eaglekit verify`, and the EAGLE-3 -> 3.1 upgrade of such a draft.

The Llama tests cannot catch what is specific to this architecture: a target whose cache holds MLA latents
(cropped on every rejected draft), MoE routing in the verified rows, and MLA drafts whose ids are written
output-of-layer as Kimi's exporter does.
"""

from __future__ import annotations

import json
import os

import jsonschema
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from eaglekit.decode.options import VerifyOptions  # noqa: E402
from eaglekit.decode.prompts import bundled_prompts  # noqa: E402
from eaglekit.decode.speculative import (  # noqa: E402
    LiveVerifier,
    OracleProposer,
    RandomProposer,
    greedy_decode,
    speculative_decode,
)
from eaglekit.families import load_draft  # noqa: E402
from eaglekit.rules import run_rules  # noqa: E402
from eaglekit.target import read_target  # noqa: E402
from eaglekit.target_model import load_target  # noqa: E402
from eaglekit.verify.run import verify  # noqa: E402
from tests.support import REPO  # noqa: E402
from tests.support.cli import run_cli  # noqa: E402
from tests.support.factory import make_draft  # noqa: E402
from tests.support.targets import PROMPTS  # noqa: E402

SCHEMA_PATH = os.path.join(str(REPO), "schemas", "verify-report.schema.json")
with open(SCHEMA_PATH, encoding="utf-8") as fh:
    SCHEMA = json.load(fh)
LAYERS = 6
K = 3
NEW = 16
KIMI_IDS = (1, 3, 5)  # written output-of-layer, like Kimi's [1, 29, 57]
VLLM_IDS = [2, 4, 6]  # what they mean in vLLM's convention; 6 = L is the final pre-norm state
FAST = ["--limit", "2", "--max-new-tokens", str(NEW), "--no-progress"]


def make_deepseek_target(path, *, layers=LAYERS, hidden=64, vocab=320, seed=0) -> str:
    """A random DeepseekV3ForCausalLM (3 dense layers, then MoE) with a byte-level BPE tokenizer, as safetensors.

    verify encodes text prompts, so the target needs a tokenizer; one trained on the bundled prompts keeps V small.
    The target has no eos token, so every generation runs to max_new_tokens.
    """
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    text = ["\n".join(m["content"] for m in p.messages) for p in bundled_prompts().prompts]
    tok.train_from_iterator(text, trainers.BpeTrainer(vocab_size=vocab,
                                                      initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    fast = transformers.PreTrainedTokenizerFast(tokenizer_object=tok)
    fast.save_pretrained(path)
    torch.manual_seed(seed)
    config = transformers.DeepseekV3Config(
        vocab_size=len(fast), hidden_size=hidden, intermediate_size=128, num_hidden_layers=layers,
        first_k_dense_replace=3, n_routed_experts=4, num_experts_per_tok=2, n_group=1, topk_group=1,
        n_shared_experts=1, moe_intermediate_size=32, num_attention_heads=4, num_key_value_heads=4,
        q_lora_rank=32, kv_lora_rank=24, qk_nope_head_dim=8, qk_rope_head_dim=8, v_head_dim=12,
        max_position_embeddings=512, bos_token_id=None, eos_token_id=None, tie_word_embeddings=False,
    )
    model = transformers.DeepseekV3ForCausalLM(config)
    # random norm weights make a pre-norm/post-norm mix-up visible
    with torch.no_grad():
        model.model.norm.weight.uniform_(0.5, 1.5)
    model.save_pretrained(path)
    return str(path)


@pytest.fixture(scope="module", autouse=True)
def one_thread():
    """Matrices this small run fastest on one thread; several threads spin against each other on a busy machine."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def deepseek_dir(tmp_path_factory):
    return make_deepseek_target(tmp_path_factory.mktemp("deepseek-v3"))


@pytest.fixture(scope="module")
def deepseek(deepseek_dir):
    return load_target(deepseek_dir)


@pytest.fixture(scope="module")
def kimi_drafts(deepseek, tmp_path_factory):
    """Kimi-layout MLA drafts with the target's geometry (H = T, V = target V, own embed_tokens), 3 and 3.1."""
    base = tmp_path_factory.mktemp("kimi")
    flags = {"3": {}, "3.1": {"fc_norm": True, "norm_output": True}}
    return {version: make_draft(str(base / version), "kimi", attention="mla", draft_vocab=None, embed=True,
                                hidden=deepseek.hidden_size, vocab=deepseek.vocab_size, aux_ids=KIMI_IDS,
                                target_layers=LAYERS, **f)
            for version, f in flags.items()}


def test_target_is_an_mla_moe_deepseek(deepseek):
    assert (deepseek.num_layers, deepseek.hidden_size, deepseek.vocab_size) == (LAYERS, 64, 320)
    assert deepseek.model.config.model_type == "deepseek_v3"
    layers = deepseek.model.model.layers
    assert all(hasattr(layer.self_attn, "kv_a_proj_with_mqa") for layer in layers)
    assert [hasattr(layer.mlp, "experts") for layer in layers] == [False] * 3 + [True] * 3
    assert deepseek.tokenizer is not None and not deepseek.eos_token_ids


def test_aux_ids_follow_vllm_convention(deepseek):
    ids = torch.tensor([[3, 17, 42, 99, 5]])
    result = deepseek.forward(ids, range(LAYERS + 1))
    with torch.inference_mode():
        hs = deepseek.model(ids, output_hidden_states=True).hidden_states
    for layer in range(LAYERS):  # id i: the residual stream entering layer i
        torch.testing.assert_close(result.aux[layer], hs[layer], rtol=0, atol=0)
    final = result.aux[LAYERS]  # id L: the final state before the model's norm
    with torch.inference_mode():
        normed = deepseek.model.model.norm(final)
        torch.testing.assert_close(deepseek.model.lm_head(normed), result.logits)
    assert (normed - final).abs().max() > 1e-2


def test_crop_rolls_back_the_mla_cache(deepseek):
    prefix, rejected, accepted = torch.tensor([[7, 8, 9]]), torch.tensor([[50, 51, 52]]), torch.tensor([[60, 61]])
    first = deepseek.forward(prefix, [2, LAYERS])
    deepseek.forward(rejected, [2, LAYERS], past=first.past)
    deepseek.crop(first.past, 3)
    assert deepseek.cache_length(first.past) == 3
    after = deepseek.forward(accepted, [2, LAYERS], past=first.past)
    fresh = deepseek.forward(torch.cat([prefix, accepted], 1), [2, LAYERS])
    torch.testing.assert_close(after.logits, fresh.logits[:, 3:], rtol=1e-5, atol=1e-5)
    for mine, ref in zip(after.aux, fresh.aux):
        torch.testing.assert_close(mine, ref[:, 3:], rtol=1e-5, atol=1e-5)


def test_oracle_reaches_k_plus_one_and_random_stays_lossless(deepseek):
    for prompt in PROMPTS:
        plain = greedy_decode(deepseek, prompt, max_new_tokens=NEW)
        reference = greedy_decode(deepseek, prompt, max_new_tokens=NEW + K + 1).tokens
        oracle = speculative_decode(LiveVerifier(deepseek, ()), OracleProposer(reference), prompt, k=K,
                                    max_new_tokens=NEW)
        assert oracle.tokens == plain.tokens
        assert oracle.counter.acceptance_length == K + 1
        assert oracle.counter.per_position == [1.0] * K
        rand = speculative_decode(LiveVerifier(deepseek, ()), RandomProposer(deepseek.vocab_size, seed=1), prompt,
                                  k=K, max_new_tokens=NEW)
        assert rand.tokens == plain.tokens  # k rows rolled back out of the MLA cache nearly every round
        assert rand.counter.acceptance_length < 1.1


def check_lossless_report(doc: dict, version: str, served: bool = True) -> None:
    """A schema-valid report of a lossless run with a consistent τ, for a draft read as `version`; `served`: vLLM
    reads the files as eaglekit does (else EK299 warns that it does not)."""
    jsonschema.validate(doc, SCHEMA)
    assert doc["lossless"] and doc["exact_match"] and doc["passed"]
    assert [(p["identical"], p["generated_tokens"]) for p in doc["per_prompt"]] == [(True, NEW)] * 2
    assert [(c["code"], c["severity"]) for c in doc["checks"]] == ([] if served else [("EK299", "warning")])
    tau, rates = doc["acceptance_length"], doc["per_position_acceptance"]
    assert 1 <= tau <= K + 1 and doc["num_speculative_tokens"] == K
    assert tau == pytest.approx(1 + sum(rates)) and rates == sorted(rates, reverse=True)
    assert [(d["depth"], d["samples"]) for d in doc["drift"]] == [(i, doc["num_drafts"]) for i in range(1, K + 1)]
    assert doc["aux_layer_ids"] == VLLM_IDS
    assert doc["eagle_version"] == version
    is31 = version == "3.1"
    assert (doc["flags"]["fc_norm"], doc["flags"]["norm_output"]) == (is31, is31)


@pytest.mark.parametrize("version", ["3", "3.1"])
def test_kimi_mla_draft_is_lossless_through_the_cli(deepseek_dir, kimi_drafts, version):
    result = run_cli(["verify", kimi_drafts[version], "--target", deepseek_dir, "--format", "json", *FAST])
    assert result.exit_code == 0, result.output
    doc = json.loads(result.stdout)
    check_lossless_report(doc, version, served=False)  # the published Kimi layout is not what vLLM reads
    assert "output-of-layer" in doc["aux_layer_ids_source"]


def test_upgraded_kimi_draft_is_vllm_023_ready_and_still_lossless(deepseek_dir, kimi_drafts, tmp_path):
    out = str(tmp_path / "kimi-3.1")
    result = run_cli(["upgrade", kimi_drafts["3"], out, "--target", deepseek_dir, "--fc-norm-init", "ones",
                      "--format", "json"])
    assert result.exit_code == 0, result.output
    upgraded = json.loads(result.stdout)
    assert upgraded["aux"]["origin"] == "source" and upgraded["aux"]["ids"] == VLLM_IDS
    assert upgraded["flags"]["fc_norm_init"] == "ones"

    target = read_target(deepseek_dir)
    spec = load_draft(out)
    assert run_rules(spec, target=target, engine="vllm", engine_version="0.23").errors == 0
    old = [f for f in run_rules(spec, target=target, engine="vllm", engine_version="0.22").findings
           if f.severity == "error"]
    assert [f.code for f in old] == ["EK311"] and "MLA fc_norm" in old[0].message

    report = verify(out, deepseek_dir, VerifyOptions(limit=2, max_new_tokens=NEW))
    check_lossless_report(report.to_dict(), "3.1")
