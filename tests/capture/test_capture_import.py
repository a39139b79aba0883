"""`capture --import`: hs-connectors FP8 files kept bit for bit in an fp8 store and within E4M3's error of a bfloat16
import; hostile import folders refused in one line naming the file, before anything is written."""

from __future__ import annotations

import importlib
import json
import os
import pickle
import re
import sys
import types

import numpy as np
import pytest

torch = pytest.importorskip("torch")
from safetensors.torch import load_file, save_file  # noqa: E402

from eaglekit.capture import store as st  # noqa: E402
from tests.support import REPO  # noqa: E402
from tests.support.cli import run_cli  # noqa: E402
from tests.support.factory import encode, make_draft, make_target_config, write_safetensors  # noqa: E402

V, H, L = 384, 64, 4
CAPTURED = (1, 2, 3, L)  # eagle_aux_hidden_state_layer_ids as vLLM ran: the aux ids and id L
AUX = (1, 2, 3)
LENGTHS = (9, 5, 12)


@pytest.fixture(scope="module")
def target(tmp_path_factory) -> str:
    """A target as a store's reader needs it: config, embeddings, final norm and lm_head (no decoder layer)."""
    path = make_target_config(str(tmp_path_factory.mktemp("import") / "target"), layers=L, hidden=H, vocab=V,
                              tied=False)
    rng = np.random.default_rng(0)
    write_safetensors(os.path.join(path, "model.safetensors"), {
        "model.embed_tokens.weight": ("F32", (V, H), encode(rng.standard_normal((V, H)), "F32")),
        "model.norm.weight": ("F32", (H,), encode(rng.uniform(0.5, 1.5, H), "F32")),
        "lm_head.weight": ("F32", (V, H), encode(rng.standard_normal((V, H)) / 8, "F32")),
    })
    return path


@pytest.fixture(scope="module")
def fp8_connector():
    """speculators' hs-connectors 0.9.0 FP8HiddenStatesConnector, imported with a stand-in for the vLLM class it
    subclasses: its static `_write_tensors` is the code that quantizes and writes each request's file."""
    pytest.importorskip("hs_connectors")
    parent = "vllm.distributed.kv_transfer.kv_connector.v1"
    with pytest.MonkeyPatch.context() as mp:
        for name in ("vllm", "vllm.distributed", "vllm.distributed.kv_transfer",
                     "vllm.distributed.kv_transfer.kv_connector", parent):
            mp.setitem(sys.modules, name, types.ModuleType(name))
        example = types.ModuleType(f"{parent}.example_hidden_states_connector")
        example.ExampleHiddenStatesConnector = type("ExampleHiddenStatesConnector", (), {})
        mp.setitem(sys.modules, example.__name__, example)
        mp.setattr(sys.modules[parent], "example_hidden_states_connector", example, raising=False)
        mp.delitem(sys.modules, "hs_connectors.fp8_hidden_states_connector", raising=False)
        connector = importlib.import_module("hs_connectors.fp8_hidden_states_connector").FP8HiddenStatesConnector
    return connector


def request_states(n: int, seed: int) -> torch.Tensor:
    """[n, layers, H] bfloat16 states whose size varies by token and grows with depth (as residual streams do), so
    one scale per token leaves the shallow layers in E4M3's subnormal range."""
    gen = torch.Generator().manual_seed(seed)
    token = torch.exp(torch.randn(n, 1, 1, generator=gen) * 2)
    depth = torch.tensor([0.05, 0.3, 1.0, 6.0]).reshape(1, len(CAPTURED), 1)
    return (torch.randn(n, len(CAPTURED), H, generator=gen) * token * depth).to(torch.bfloat16)


def write_requests(folder, connector=None) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """One file per request: with `connector`, through hs-connectors' own writer; else as vLLM's
    ExampleHiddenStatesConnector._write_tensors writes it (save_file of hidden_states and token_ids; vLLM 0.32.0,
    vllm/distributed/kv_transfer/kv_connector/v1/example_hidden_states_connector.py)."""
    os.makedirs(folder, exist_ok=True)
    written = []
    for k, n in enumerate(LENGTHS):
        states = request_states(n, seed=k)
        ids = torch.randint(0, V, (n,), generator=torch.Generator().manual_seed(100 + k))
        tensors = {"hidden_states": states, "token_ids": ids}
        path = os.path.join(folder, f"hs_{k}.safetensors")
        if connector is None:
            save_file(tensors, path)
        else:
            connector._write_tensors(tensors, types.SimpleNamespace(synchronize=lambda: None), path, None)
        written.append((ids, states))
    return written


def capture(target, files, store, *extra):
    return run_cli(["capture", target, store, "--import", str(files), "--captured-ids", ",".join(map(str, CAPTURED)),
                    "--shard-tokens", "10", "--no-progress", "--format", "json", *extra])


def raw_shards(store):
    """Every shard's tensors as stored (fp8 not dequantized), concatenated over the store."""
    manifest = st.read_manifest(store)
    shards = [load_file(os.path.join(store, s.file)) for s in manifest.shards]
    return {name: torch.cat([s[name] for s in shards]) for name in shards[0]}


@pytest.fixture(scope="module")
def imported(target, fp8_connector, tmp_path_factory):
    """The same requests written by vLLM's connector (bfloat16) and by hs-connectors' (FP8), each imported."""
    base = tmp_path_factory.mktemp("imported")
    plain = write_requests(base / "bf16-files")
    write_requests(base / "fp8-files", fp8_connector)
    stores = {}
    for files, dtype in (("bf16-files", "bfloat16"), ("fp8-files", "fp8"), ("fp8-files", "float32")):
        stores[(files, dtype)] = str(base / f"{files}-{dtype}")
        result = capture(target, base / files, stores[(files, dtype)], "--store-dtype", dtype)
        assert result.exit_code == 0, result.stderr
    return base, plain, stores


def test_the_connector_writes_what_the_reader_expects(imported):
    base, plain, _ = imported
    tensors = load_file(str(base / "fp8-files" / "hs_0.safetensors"))
    assert sorted(tensors) == ["hidden_states", "hidden_states_scales", "token_ids"]
    assert tensors["hidden_states"].dtype == torch.float8_e4m3fn
    assert tensors["hidden_states"].shape == (LENGTHS[0], len(CAPTURED), H)
    assert tensors["hidden_states_scales"].dtype == torch.float32
    assert tensors["hidden_states_scales"].shape == (LENGTHS[0], 1, 1)
    assert torch.equal(tensors["token_ids"], plain[0][0])


def test_an_fp8_store_keeps_the_files_e4m3_bits_and_scales(imported):
    """aux holds the files' E4M3 bytes of ids 1..3, aux_scale each token's scale for every id, and last (id L) the
    float32 product E4M3 value × scale."""
    base, _, stores = imported
    files = [load_file(str(base / "fp8-files" / f"hs_{k}.safetensors")) for k in range(len(LENGTHS))]
    values = torch.cat([f["hidden_states"] for f in files])
    scales = torch.cat([f["hidden_states_scales"] for f in files]).reshape(-1)
    stored = raw_shards(stores[("fp8-files", "fp8")])
    assert stored["aux"].dtype == torch.float8_e4m3fn
    assert torch.equal(stored["aux"].view(torch.uint8), values[:, : len(AUX)].view(torch.uint8))
    assert torch.equal(stored["aux_scale"], scales[:, None].expand(-1, len(AUX)))
    assert torch.equal(stored["last"], values[:, -1].float() * scales[:, None])
    assert torch.equal(stored["token_ids"], torch.cat([f["token_ids"] for f in files]))


def test_dequantized_states_are_within_e4m3_error_of_a_bfloat16_import(imported):
    """With s = amax over the token's layers / 448 and v = x / s, E4M3 (3 mantissa bits) rounds a normal v
    (|v| >= 2^-6) to within half its spacing, 2^-4 |v|, and a subnormal one to within 2^-10: so
    |q s - x| <= max(2^-4 |x|, 2^-10 s), plus float32 rounding of x / s and of q s (2^-22 |x| covers both)."""
    _, plain, stores = imported
    exact = raw_shards(stores[("bf16-files", "bfloat16")])  # the bfloat16 states, held exactly
    fp8 = st.dequantized(raw_shards(stores[("fp8-files", "fp8")]))
    dequantized = raw_shards(stores[("fp8-files", "float32")])
    x = torch.cat([states for _, states in plain]).float()
    assert torch.equal(exact["aux"].float(), x[:, : len(AUX)]) and torch.equal(exact["last"], x[:, -1])
    scale = x.abs().amax(dim=(1, 2)) / 448
    for name, held in (("aux", x[:, : len(AUX)]), ("last", x[:, -1])):
        s = scale[:, None, None] if name == "aux" else scale[:, None]
        bound = torch.maximum(held.abs() * 2**-4, s * 2**-10) + held.abs() * 2**-22
        error = (fp8[name] - held).abs()
        assert (error <= bound).all()
        assert (error / bound).max() > 0.5  # the states were quantized: the bound is nearly reached
        assert torch.equal(dequantized[name], fp8[name])  # a float32 store holds the same products


def test_the_import_report_names_the_fp8_files(imported, target):
    base, _, stores = imported
    result = capture(target, base / "fp8-files", stores[("fp8-files", "fp8")], "--store-dtype", "fp8")
    assert result.exit_code == 0, result.stderr  # the same command again: the complete store is kept
    import jsonschema

    doc = json.loads(result.stdout)
    jsonschema.validate(doc, json.load(open(os.path.join(REPO, "schemas", "capture-report.schema.json"))))
    assert doc["engine"]["dtype"] == "float8_e4m3fn with a float32 scale per token"
    assert "(3 hs-connectors FP8 files)" in doc["data"] and doc["captured_records"] == 0
    assert any("kept bit for bit" in note for note in doc["notes"])


@pytest.mark.model
def test_finetune_trains_from_an_fp8_import(imported, target, tmp_path):
    _, _, stores = imported
    draft = make_draft(str(tmp_path / "draft"), "vllm", hidden=H, vocab=V, draft_vocab=V, aux_ids=AUX,
                       target_layers=L, fc_norm=True, norm_output=True)
    out = str(tmp_path / "tuned")
    result = run_cli(["finetune", draft, out, "--target", target, "--store", stores[("fp8-files", "fp8")],
                      "--steps", "2", "--batch-tokens", "16", "--no-progress", "--format", "json"])
    assert result.exit_code == 0, result.stderr
    doc = json.loads(result.stdout)
    assert os.path.isfile(os.path.join(out, "model.safetensors")) and doc["training"]["steps"] == 2


# ---------------------------------------------------------------- hostile imports: refused before anything is written


def good(n=4, layers=len(CAPTURED), hidden=H, ids=None, dtype=torch.bfloat16):
    return {"hidden_states": torch.ones(n, layers, hidden, dtype=dtype),
            "token_ids": torch.tensor(ids if ids is not None else [3] * n)}


def fp8(scales, n=4):
    return {"hidden_states": torch.ones(n, len(CAPTURED), H).to(torch.float8_e4m3fn), "hidden_states_scales": scales,
            "token_ids": torch.tensor([3] * n)}


def huge_rows(path):
    """A header declaring 2^40 rows over a few bytes of data."""
    rows = 1 << 40
    write_safetensors(path, {"hidden_states": ("BF16", (rows, len(CAPTURED), H), b"\0" * 8),
                             "token_ids": ("I64", (rows,), b"\0" * 8)})


def torch_archive(path):
    torch.save(good(), path)


def pickled(path):
    with open(path, "wb") as fh:
        pickle.dump({"hidden_states": [[0.0]], "token_ids": [1]}, fh)


NAN_STATE = torch.ones(4, len(CAPTURED), H).to(torch.float8_e4m3fn)
NAN_STATE.view(torch.uint8)[2, 0, 5] = 0x7F

HOSTILE = {
    "hidden size": ([good(hidden=32)], "hs_0.safetensors: holds states of hidden size 32; the target's hidden_size "
                                       "is 64"),
    "negative token id": ([good(ids=[3, -1, 3, 3])], r"hs_0.safetensors: token_ids\[1\] is -1, outside the target's "
                                                     r"vocabulary \[0, 384\)"),
    "token id V": ([good(ids=[3, 3, 3, V])], r"token_ids\[3\] is 384, outside"),
    "token id 10^9": ([good(ids=[10**9, 3, 3, 3])], r"token_ids\[0\] is 1000000000, outside"),
    "mixed hidden sizes": ([good(), good(hidden=H * 2)], "hs_1.safetensors: holds states of hidden size 128"),
    "mixed layer counts": ([good(), good(layers=3)], r"hs_1.safetensors: holds 3 captured layers, but --captured-ids "
                                                     r"names 4: \[1, 2, 3, 4\]"),
    "pickle": ([good(), pickled], "hs_1.safetensors: is not a readable safetensors file: it is a Python pickle"),
    "torch.save archive": ([torch_archive], "hs_0.safetensors: is not a readable safetensors file: it is a zip "
                                            r"archive \(torch.save"),
    "2^40 rows": ([huge_rows], "hs_0.safetensors: is not a readable safetensors file: tensor 'hidden_states': "
                               "BF16.* needs 562949953421312 bytes"),
    "scales [n]": ([fp8(torch.ones(4))], r"hidden_states_scales is F32 \[4\], expected F32 \[4, 1, 1\]"),
    "scales per layer": ([fp8(torch.ones(4, len(CAPTURED), 1))], r"hidden_states_scales is F32 \[4, 4, 1\]"),
    "scales of another length": ([fp8(torch.ones(3, 1, 1))], r"hidden_states_scales is F32 \[3, 1, 1\]"),
    "bfloat16 scales": ([fp8(torch.ones(4, 1, 1, dtype=torch.bfloat16))], r"hidden_states_scales is BF16"),
    "NaN scale": ([fp8(torch.tensor([1.0, float("nan"), 1, 1]).reshape(4, 1, 1))],
                  "hidden_states_scales of token 1 is nan: a scale must be finite and positive"),
    "infinite scale": ([fp8(torch.tensor([1.0, 1, 1, float("inf")]).reshape(4, 1, 1))], "token 3 is inf"),
    "zero scale": ([fp8(torch.zeros(4, 1, 1))], "token 0 is 0.0"),
    "fp8 without scales": ([good(dtype=torch.float8_e4m3fn)], "hidden_states is F8_E4M3 .* expected a float tensor"),
    "NaN state": ([fp8(torch.ones(4, 1, 1)), {**fp8(torch.ones(4, 1, 1)), "hidden_states": NAN_STATE}],
                  "hs_1.safetensors: hidden_states holds NaN or infinite values"),
}


@pytest.mark.parametrize("case", sorted(HOSTILE))
def test_a_hostile_import_is_refused_in_one_line_and_writes_nothing(case, target, tmp_path):
    files, problem = HOSTILE[case]
    folder = tmp_path / "files"
    folder.mkdir()
    for k, content in enumerate(files):
        path = str(folder / f"hs_{k}.safetensors")
        if callable(content):
            content(path)
        else:
            save_file(content, path)
    before = {name: (folder / name).read_bytes() for name in os.listdir(folder)}
    store = tmp_path / "store"
    result = capture(target, folder, str(store))
    assert result.exit_code == 1, result.stdout
    assert len(result.stderr.strip().splitlines()) == 1
    assert result.stderr.startswith(f"Error: {folder}{os.sep}") and re.search(problem, result.stderr), result.stderr
    assert not store.exists()
    assert {name: (folder / name).read_bytes() for name in os.listdir(folder)} == before


def test_captured_ids_naming_a_layer_twice_are_refused_before_anything_is_written(target, tmp_path):
    folder = tmp_path / "files"
    folder.mkdir()
    save_file(good(), str(folder / "hs_0.safetensors"))
    store = tmp_path / "store"
    result = run_cli(["capture", target, str(store), "--import", str(folder), "--captured-ids", "1,2,2,4",
                      "--no-progress"])
    assert result.exit_code == 2 and "names a layer twice" in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1 and not store.exists()
