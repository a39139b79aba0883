"""The target adapter on a tiny random Llama: aux states in vLLM's convention, caches, errors."""

from __future__ import annotations

import json
import os

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from eaglekit.errors import CheckpointError, UsageError  # noqa: E402
from eaglekit.target_model import load_target  # noqa: E402
from tests.support.targets import make_tiny_target  # noqa: E402

LAYERS = 4


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    return load_target(make_tiny_target(tmp_path_factory.mktemp("tiny-target")))


def test_geometry(tiny):
    assert (tiny.num_layers, tiny.hidden_size, tiny.vocab_size) == (LAYERS, 64, 256)
    assert tuple(tiny.embed_tokens.shape) == (256, 64) and tuple(tiny.lm_head.shape) == (256, 64)
    assert not tiny.tied
    assert tiny.tokenizer is None  # none saved; verify asks for one only when it has text to encode


def test_input_of_layer_ids_match_hf_hidden_states(tiny):
    ids = torch.tensor([[3, 17, 42, 99, 5]])
    result = tiny.forward(ids, [0, 1, 2, 3])
    with torch.inference_mode():
        hs = tiny.model(ids, output_hidden_states=True).hidden_states
    for k, layer in enumerate([0, 1, 2, 3]):
        torch.testing.assert_close(result.aux[k], hs[layer], rtol=0, atol=0)


def test_id_L_is_the_final_pre_norm_state(tiny):
    ids = torch.tensor([[3, 17, 42, 99, 5]])
    result = tiny.forward(ids, [LAYERS])
    (final,) = result.aux
    last_layer_out = {}
    handle = tiny.model.model.layers[-1].register_forward_hook(lambda m, a, out: last_layer_out.setdefault("h", out))
    try:
        with torch.inference_mode():
            tiny.model(ids)
    finally:
        handle.remove()
    out = last_layer_out["h"][0] if isinstance(last_layer_out["h"], tuple) else last_layer_out["h"]
    torch.testing.assert_close(final, out, rtol=0, atol=0)
    with torch.inference_mode():
        logits = tiny.model.lm_head(tiny.model.model.norm(final))
    torch.testing.assert_close(logits, result.logits)
    # ...and it is not the post-norm state
    assert (tiny.model.model.norm(final) - final).abs().max() > 1e-2


def test_aux_come_sorted_and_unique(tiny):
    ids = torch.tensor([[1, 2, 3]])
    result = tiny.forward(ids, [3, 1, 3, 0])
    ref = tiny.forward(ids, [0, 1, 3])
    assert len(result.aux) == 3
    for a, b in zip(result.aux, ref.aux):
        torch.testing.assert_close(a, b, rtol=0, atol=0)


def test_incremental_decode_matches_full_pass(tiny):
    ids = torch.tensor([[7, 8, 9, 10, 11, 12, 13]])
    full = tiny.forward(ids, [1, LAYERS])
    first = tiny.forward(ids[:, :4], [1, LAYERS])
    rest = tiny.forward(ids[:, 4:], [1, LAYERS], past=first.past)
    assert tiny.cache_length(rest.past) == 7
    torch.testing.assert_close(torch.cat([first.logits, rest.logits], 1), full.logits, rtol=1e-5, atol=1e-5)
    for k in range(2):
        torch.testing.assert_close(torch.cat([first.aux[k], rest.aux[k]], 1), full.aux[k], rtol=1e-5, atol=1e-5)


def test_crop_rolls_back_rejected_positions(tiny):
    prefix, rejected, accepted = torch.tensor([[7, 8, 9]]), torch.tensor([[50, 51, 52]]), torch.tensor([[60, 61]])
    p = tiny.forward(prefix, [2])
    tiny.forward(rejected, [2], past=p.past)
    tiny.crop(p.past, 3)
    assert tiny.cache_length(p.past) == 3
    after = tiny.forward(accepted, [2], past=p.past)
    fresh = tiny.forward(torch.cat([prefix, accepted], 1), [2])
    torch.testing.assert_close(after.logits, fresh.logits[:, 3:], rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(after.aux[0], fresh.aux[0][:, 3:], rtol=1e-5, atol=1e-5)


def test_logits_to_keep_limits_the_prefill_logits(tiny):
    ids = torch.tensor([[1, 2, 3, 4, 5, 6]])
    full = tiny.forward(ids, [1])
    last = tiny.forward(ids, [1], logits_to_keep=1)
    assert last.logits.shape[1] == 1 and last.aux[0].shape[1] == 6
    torch.testing.assert_close(last.logits[:, 0], full.logits[:, -1])


def test_tied_target_shares_one_tensor(tmp_path):
    target = load_target(make_tiny_target(tmp_path / "tied", tied=True))
    assert target.tied and target.embed_tokens.data_ptr() == target.lm_head.data_ptr()


@pytest.mark.parametrize("bad", [[-1], [LAYERS + 1], [0, 99]])
def test_out_of_range_aux_ids_are_refused(tiny, bad):
    with pytest.raises(UsageError, match=rf"outside \[0, {LAYERS}\]"):
        tiny.forward(torch.tensor([[1, 2]]), bad)


def test_missing_or_unsafe_targets_are_refused(tmp_path):
    with pytest.raises(CheckpointError, match="not a directory"):
        load_target(str(tmp_path / "nope"))
    (tmp_path / "empty").mkdir()
    with pytest.raises(CheckpointError, match="no config.json"):
        load_target(str(tmp_path / "empty"))
    # a pickle-only checkpoint is never unpickled
    pickled = tmp_path / "pickled"
    make_tiny_target(pickled)
    state = {k: v for k, v in transformers.LlamaForCausalLM.from_pretrained(pickled).state_dict().items()}
    torch.save(state, pickled / "pytorch_model.bin")
    os.remove(pickled / "model.safetensors")
    with pytest.raises(CheckpointError, match="cannot load the target model"):
        load_target(str(pickled))
    assert json.loads((pickled / "config.json").read_text())["model_type"] == "llama"


def test_bad_device_and_dtype(tmp_path):
    path = make_tiny_target(tmp_path / "t")
    with pytest.raises(UsageError, match="unknown dtype"):
        load_target(path, dtype="float8")
    with pytest.raises(UsageError, match="unknown device"):
        load_target(path, device="tpu")
