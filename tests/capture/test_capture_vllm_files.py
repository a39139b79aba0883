"""The reader of vLLM extract_hidden_states files, fed files written the way vLLM's connector writes them."""

import os

import pytest

torch = pytest.importorskip("torch")
from safetensors.torch import save_file  # noqa: E402

from eaglekit.capture.vllm_files import IGNORE_INDEX, read_captured_states  # noqa: E402
from eaglekit.errors import CheckpointError, UsageError  # noqa: E402

pytestmark = pytest.mark.model

CAPTURED = [18, 2, 33, 36]  # as given to vLLM, unsorted: the file's slots follow ascending id order
SLOTS = sorted(CAPTURED)
HIDDEN = 16
LENGTHS = {"hs_2": 5, "hs_10": 3, "hs_1": 7}  # natural order: hs_1, hs_2, hs_10


def vllm_file(path, n, *, layers=len(CAPTURED), hidden=HIDDEN, dtype=torch.bfloat16, seed=0):
    """One request's file as ExampleHiddenStatesConnector writes it: no metadata, two tensors."""
    gen = torch.Generator().manual_seed(seed)
    states = torch.randn(n, layers, hidden, generator=gen).to(dtype)
    ids = torch.randint(0, 1000, (n,), generator=gen)  # torch.tensor(list) in vLLM: int64
    save_file({"hidden_states": states, "token_ids": ids}, str(path))
    return ids, states


@pytest.fixture
def captured(tmp_path):
    written = {name: vllm_file(tmp_path / f"{name}.safetensors", n, seed=i)
               for i, (name, n) in enumerate(LENGTHS.items())}
    (tmp_path / "hs_1.safetensors.lock").write_bytes(b"")  # vLLM's companion lock file is skipped
    return tmp_path, [written[name] for name in ("hs_1", "hs_2", "hs_10")]


def test_rows_in_natural_file_order_with_requested_layers_in_ascending_order(captured):
    directory, files = captured
    aux_ids = [33, 2, 18]  # a subset, requested out of order
    out = read_captured_states(str(directory), aux_ids, captured_ids=CAPTURED)
    assert set(out) == {"tokens", "labels", "aux", "offsets"}
    assert out["offsets"].tolist() == [0, 7, 12, 15]
    assert out["tokens"].dtype == out["labels"].dtype == out["offsets"].dtype == torch.int64
    assert out["aux"].dtype == torch.bfloat16 and out["aux"].shape == (15, 3 * HIDDEN)
    assert torch.equal(out["tokens"], torch.cat([ids for ids, _ in files]))
    for (ids, states), start, end in zip(files, out["offsets"][:-1], out["offsets"][1:]):
        assert out["labels"][start:end].tolist() == ids[1:].tolist() + [IGNORE_INDEX]
        expected = torch.cat([states[:, SLOTS.index(i)] for i in (2, 18, 33)], dim=-1)
        assert torch.equal(out["aux"][start:end], expected)


def test_without_captured_ids_the_files_hold_exactly_the_requested_ids(captured):
    directory, files = captured
    out = read_captured_states(str(directory), [36, 33, 18, 2], max_files=1)
    ids, states = files[0]
    assert out["offsets"].tolist() == [0, 7] and torch.equal(out["tokens"], ids)
    assert torch.equal(out["aux"], states.reshape(7, -1))


def test_float32_states_and_int32_ids_are_converted(tmp_path):
    ids, states = vllm_file(tmp_path / "r.safetensors", 4, layers=1, dtype=torch.float32)
    save_file({"hidden_states": states, "token_ids": ids.to(torch.int32)}, str(tmp_path / "r.safetensors"))
    out = read_captured_states(str(tmp_path), [5])
    assert out["tokens"].dtype == torch.int64 and torch.equal(out["aux"], states[:, 0].to(torch.bfloat16))


def test_not_a_directory(tmp_path):
    with pytest.raises(CheckpointError, match="is not a directory"):
        read_captured_states(str(tmp_path / "missing"), [2])


def test_no_files(tmp_path):
    (tmp_path / "notes.txt").write_text("x")
    with pytest.raises(CheckpointError, match=r"holds no \*\.safetensors files"):
        read_captured_states(str(tmp_path), [2])


def test_not_a_safetensors_file(tmp_path):
    (tmp_path / "r.safetensors").write_bytes(b"not a safetensors file")
    with pytest.raises(CheckpointError, match=r"r\.safetensors: is not a readable safetensors file"):
        read_captured_states(str(tmp_path), [2])


def test_wrong_tensor_names(tmp_path):
    save_file({"hidden_states": torch.zeros(3, 4 * HIDDEN), "input_ids": torch.zeros(3, dtype=torch.long)},
              str(tmp_path / "r.safetensors"))
    with pytest.raises(CheckpointError, match=r"r\.safetensors: holds tensors \['hidden_states', 'input_ids'\]"):
        read_captured_states(str(tmp_path), [2])


def test_wrong_state_shape(tmp_path):
    save_file({"hidden_states": torch.zeros(3, 4 * HIDDEN), "token_ids": torch.zeros(3, dtype=torch.long)},
              str(tmp_path / "r.safetensors"))
    with pytest.raises(CheckpointError, match=r"hidden_states is F32 \[3, 64\], expected"):
        read_captured_states(str(tmp_path), [2])


def test_wrong_state_dtype(tmp_path):
    save_file({"hidden_states": torch.zeros(3, 1, HIDDEN, dtype=torch.int64),
               "token_ids": torch.zeros(3, dtype=torch.long)}, str(tmp_path / "r.safetensors"))
    with pytest.raises(CheckpointError, match=r"hidden_states is I64"):
        read_captured_states(str(tmp_path), [2])


def test_wrong_token_dtype(tmp_path):
    save_file({"hidden_states": torch.zeros(3, 1, HIDDEN), "token_ids": torch.zeros(3)},
              str(tmp_path / "r.safetensors"))
    with pytest.raises(CheckpointError, match=r"token_ids is F32 \[3\], expected int64"):
        read_captured_states(str(tmp_path), [2])


def test_token_and_state_lengths_differ(tmp_path):
    save_file({"hidden_states": torch.zeros(4, 1, HIDDEN), "token_ids": torch.zeros(3, dtype=torch.long)},
              str(tmp_path / "r.safetensors"))
    with pytest.raises(CheckpointError, match="token_ids has 3 tokens but hidden_states has 4 rows"):
        read_captured_states(str(tmp_path), [2])


def test_empty_sequence(tmp_path):
    vllm_file(tmp_path / "r.safetensors", 0, layers=1)
    with pytest.raises(CheckpointError, match="token_ids is empty"):
        read_captured_states(str(tmp_path), [2])


def test_hidden_sizes_differ_between_files(tmp_path):
    vllm_file(tmp_path / "a.safetensors", 3)
    vllm_file(tmp_path / "b.safetensors", 3, hidden=HIDDEN * 2)
    with pytest.raises(CheckpointError, match=r"b\.safetensors: holds 4 layers of hidden size 32, but "
                                              r"a\.safetensors holds 4 of size 16"):
        read_captured_states(str(tmp_path), [2], captured_ids=CAPTURED)


def test_requested_id_not_captured(captured):
    directory, _ = captured
    with pytest.raises(CheckpointError, match=r"hs_1\.safetensors: aux ids \[5\] were not captured: "
                                              r"the file holds layer ids \[2, 18, 33, 36\]"):
        read_captured_states(str(directory), [2, 5], captured_ids=CAPTURED)


def test_layer_count_needs_captured_ids(captured):
    directory, _ = captured
    with pytest.raises(CheckpointError, match="holds 4 captured layers but 3 aux ids .* pass captured_ids"):
        read_captured_states(str(directory), [2, 18, 33])


def test_captured_ids_disagree_with_the_file(captured):
    directory, _ = captured
    with pytest.raises(CheckpointError, match=r"holds 4 captured layers, but captured_ids names 3"):
        read_captured_states(str(directory), [2], captured_ids=[2, 18, 33])


def test_non_finite_states(tmp_path):
    states = torch.zeros(3, 1, HIDDEN)
    states[1, 0, 0] = float("nan")
    save_file({"hidden_states": states, "token_ids": torch.zeros(3, dtype=torch.long)},
              str(tmp_path / "r.safetensors"))
    with pytest.raises(CheckpointError, match="NaN or infinite"):
        read_captured_states(str(tmp_path), [2])


@pytest.mark.parametrize("kwargs", [{"aux_ids": []}, {"aux_ids": [2, 2]}, {"aux_ids": [-1]},
                                    {"aux_ids": [2], "max_files": 0}])
def test_bad_arguments(tmp_path, kwargs):
    with pytest.raises(UsageError):
        read_captured_states(str(tmp_path), **kwargs)


def test_module_imports_without_torch():
    import subprocess
    import sys

    code = ("import sys; sys.modules['torch'] = None; import eaglekit.capture.vllm_files; "
            "assert 'safetensors.torch' not in sys.modules")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path))
    subprocess.run([sys.executable, "-c", code], check=True, env=env)
