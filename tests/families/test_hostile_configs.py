"""Config values and quantised tensors as a careless or hostile producer writes them, through the real CLI.

Each value is either read exactly as every engine reads it, or it is an error finding in validate and a one-line
refusal in upgrade: never "not written", never a default. Quantisation tensors are either carried completely
(per-row scales follow their rows when upgrade sorts the vocabulary) or refused, and validate and upgrade agree.
"""

from __future__ import annotations

import json
import os
import struct

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from eaglekit.config_view import BOOL_KEYS
from eaglekit.engines import VLLM_ACCEPTS
from tests.support.factory import edit_config, make_draft, rewrite_tensors
from tests.support.hostile import clean, refused
from tests.support.rule_cases import CASES, RULES

FEW = settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
KEEP_FUNCTION = ("--no-fc-norm", "--no-norm-output")
FP8 = {"quant_method": "fp8", "activation_scheme": "static"}


def findings(path: str, *args: str) -> list[dict]:
    result = clean("validate", path, "--format", "json", *args)
    return json.loads(result.stdout)["findings"]


def errors(path: str, *args: str) -> dict[str, str]:
    """code -> first message of every error finding."""
    out: dict[str, str] = {}
    for f in findings(path, *args):
        if f["severity"] == "error":
            out.setdefault(f["code"], f["message"])
    return out


def fresh(tmp_path_factory, layout: str = "vllm", **kw) -> tuple[str, str]:
    root = tmp_path_factory.mktemp("d")
    return make_draft(str(root / "draft"), layout, **kw), str(root / "out")


def upgrade_refused(path: str, out: str, code: str) -> None:
    refused("upgrade", path, out, "--dry-run", *KEEP_FUNCTION, contains=f"[{code}]")


# ------------------------------------------------------------------ class 1: one typed reader, never a default

NOT_A_BOOL = st.sampled_from(["true", "false", "True", "1", ""]) | st.integers(0, 1) | st.just([True]) | st.just({})


@FEW
@given(key=st.sampled_from(BOOL_KEYS), value=NOT_A_BOOL)
def test_a_switch_that_is_not_a_json_boolean_is_reported_and_refused(tmp_path_factory, key, value):
    path, out = fresh(tmp_path_factory, config_patch={key: value})
    assert key in {f["key"] for f in findings(path) if f["code"] == "EK157"}
    upgrade_refused(path, out, "EK157")


def test_norm_before_residual_as_a_string_is_not_read_as_unwritten(tmp_path):
    path = make_draft(str(tmp_path / "d"), "vllm", config_patch={"norm_before_residual": "true"})
    assert "norm_before_residual" in errors(path)["EK157"]
    result = refused("upgrade", path, str(tmp_path / "out"), *KEEP_FUNCTION, contains="[EK157]")
    assert "not written" not in result.stderr and not os.path.exists(tmp_path / "out")


IDS = st.lists(st.integers(1, 11), min_size=3, max_size=3, unique=True).map(sorted)


@FEW
@given(ids=IDS, where=st.sampled_from(["top", "nested", "both"]))
def test_integral_float_ids_are_the_integers_every_engine_captures(tmp_path_factory, ids, where):
    """vLLM, SGLang and tokenspeed test `layer in ids`, where 2.0 == 2: integral floats are read as those ids."""
    floats = [float(i) for i in ids]
    patch = {"eagle_aux_hidden_state_layer_ids": floats if where != "nested" else None,
             "eagle_config": {"eagle_aux_hidden_state_layer_ids": floats, "use_aux_hidden_state": True}
             if where != "top" else None}
    path, out = fresh(tmp_path_factory, config_patch=patch)
    doc = json.loads(clean("inspect", path, "--format", "json").stdout)
    assert doc["aux_layer_ids"] == ids and "EK157" not in errors(path)
    clean("upgrade", path, out, *KEEP_FUNCTION, codes=(0,))
    with open(os.path.join(out, "config.json")) as fh:
        written = json.load(fh)["eagle_aux_hidden_state_layer_ids"]
    assert written == ids and all(type(i) is int for i in written)


@FEW
@given(bad=st.sampled_from([2.5, -1, True, "2", None]), at=st.integers(0, 2),
       where=st.sampled_from(["eagle_aux_hidden_state_layer_ids", "eagle_config"]))
def test_ids_that_name_no_layer_are_reported_and_refused_not_defaulted(tmp_path_factory, bad, at, where):
    ids: list = [2, 6, 9]
    ids[at] = bad
    patch = ({"eagle_aux_hidden_state_layer_ids": ids, "eagle_config": None} if where != "eagle_config"
             else {"eagle_aux_hidden_state_layer_ids": None, "eagle_config": {"eagle_aux_hidden_state_layer_ids": ids}})
    path, out = fresh(tmp_path_factory, config_patch=patch)
    doc = json.loads(clean("inspect", path, "--format", "json").stdout)
    assert doc["aux_layer_ids"] is None and "not recorded" not in doc["aux_layer_ids_source"]
    assert "EK157" in errors(path)
    upgrade_refused(path, out, "EK157")


@FEW
@given(key=st.sampled_from(["rms_norm_eps", "rope_theta"]),
       value=st.sampled_from([0, -1e-5, 0.0, "1e-5", float("inf"), [1e-5]]),
       layout=st.sampled_from(["vllm", "speculators"]))
def test_numbers_out_of_range_are_reported_and_refused(tmp_path_factory, key, value, layout):
    path, out = fresh(tmp_path_factory, layout)
    place = (lambda c: c["transformer_layer_config"]) if layout == "speculators" else (lambda c: c)
    edit_config(path, lambda c: place(c).update({key: value}))
    assert "EK157" in errors(path)
    upgrade_refused(path, out, "EK157")


# ------------------------------------------------------------------ class 2: what the engine accepts


@FEW
@given(kind=st.text(alphabet="abcdefghijklmnopqrstuvwxyz_", min_size=1, max_size=10)
       .filter(lambda k: k not in VLLM_ACCEPTS.rope_types),
       spelling=st.sampled_from(["type", "rope_type"]))
def test_a_rope_type_vllm_does_not_build_is_an_error(tmp_path_factory, kind, spelling):
    path, out = fresh(tmp_path_factory, config_patch={"rope_scaling": {spelling: kind, "factor": 2.0}})
    assert repr(kind) in errors(path, "--engine", "vllm")["EK324"]
    upgrade_refused(path, out, "EK324")


@FEW
@given(kind=st.sampled_from(sorted(VLLM_ACCEPTS.rope_factor_types)),
       factor=st.sampled_from([-1, 0, -0.5, "2", True, None, float("inf")]))
def test_a_scaling_factor_that_is_not_positive_is_an_error(tmp_path_factory, kind, factor):
    scaling = {"rope_type": kind, "factor": factor, "original_max_position_embeddings": 4096,
               "low_freq_factor": 1.0, "high_freq_factor": 4.0}
    path, out = fresh(tmp_path_factory, config_patch={"rope_scaling": scaling})
    assert "EK324" in errors(path, "--engine", "vllm")
    upgrade_refused(path, out, "EK324")


def test_accepted_rope_scaling_passes_and_is_carried(tmp_path):
    scaling = {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 4096}
    path = make_draft(str(tmp_path / "d"), "vllm", config_patch={"rope_scaling": scaling})
    assert not {"EK157", "EK324"} & set(errors(path, "--engine", "vllm"))
    clean("upgrade", path, str(tmp_path / "out"), *KEEP_FUNCTION, codes=(0,))
    with open(tmp_path / "out" / "config.json") as fh:
        assert json.load(fh)["rope_scaling"] == scaling


@FEW
@given(value=st.sampled_from(["fp8", ["fp8"], 8, True]) | st.builds(lambda m: {"quant_method": m},
                                                                        st.sampled_from(["banana", "", 8, None])))
def test_a_quantization_config_vllm_cannot_read_is_an_error(tmp_path_factory, value):
    path, out = fresh(tmp_path_factory, config_patch={"quantization_config": value})
    code = "EK325" if isinstance(value, dict) else "EK157"
    assert code in errors(path, "--engine", "vllm")
    upgrade_refused(path, out, code)


@FEW
@given(eps=st.sampled_from([1e308, 3.5e38, float(np.finfo(np.float32).max) * 1.001]))
def test_an_eps_that_float32_cannot_hold_is_an_error(tmp_path_factory, eps):
    path, out = fresh(tmp_path_factory, config_patch={"rms_norm_eps": eps})
    assert "EK326" in errors(path, "--engine", "vllm") and "EK157" not in errors(path)
    upgrade_refused(path, out, "EK326")


@FEW
@given(eps=st.sampled_from([1.0, 0.05, 1e30, float(np.finfo(np.float32).max)]))
def test_a_large_eps_the_engine_runs_is_a_warning_not_a_refusal(tmp_path_factory, eps):
    path, out = fresh(tmp_path_factory, config_patch={"rms_norm_eps": eps})
    assert "EK327" in {f["code"] for f in findings(path, "--engine", "vllm") if f["severity"] == "warning"}
    assert "EK326" not in errors(path, "--engine", "vllm")
    clean("upgrade", path, out, "--dry-run", *KEEP_FUNCTION, codes=(0,))


# ------------------------------------------------------------------ class 3: quantised drafts


def _fp8_rows(rows: int, cols: int, seed: int) -> bytes:
    """Distinct finite positive float8_e4m3 bytes (below the NaN pattern 0x7F)."""
    return np.random.default_rng(seed).integers(1, 0x78, size=(rows, cols), dtype=np.uint8).tobytes()


def _quantise_head(tensors: dict) -> None:
    _, shape, _ = tensors["lm_head.weight"]
    tensors["lm_head.weight"] = ("F8_E4M3", shape, _fp8_rows(*shape, seed=1))
    scale = np.linspace(0.5, 2.0, shape[0], dtype="<f4")
    tensors["lm_head.weight_scale"] = ("F32", (shape[0],), scale.tobytes())
    tensors["lm_head.input_scale"] = ("F32", (), np.array(0.25, "<f4").tobytes())


def _read(path: str) -> dict[str, np.ndarray]:
    """Every tensor of a one-file draft, fp8 as its raw bytes."""
    with open(os.path.join(path, "model.safetensors"), "rb") as fh:
        (n,) = struct.unpack("<Q", fh.read(8))
        header = json.loads(fh.read(n))
        data = fh.read()
    header.pop("__metadata__", None)
    kinds = {"F8_E4M3": "u1", "F32": "<f4", "I64": "<i8", "BF16": "<u2", "BOOL": "?"}
    return {name: np.frombuffer(data[e["data_offsets"][0]:e["data_offsets"][1]], dtype=kinds[e["dtype"]])
            .reshape(e["shape"]) for name, e in header.items()}


def test_per_row_scales_follow_the_rows_when_the_vocabulary_is_sorted(tmp_path):
    src = make_draft(str(tmp_path / "d"), "vllm", frequency_ordered=True, config_patch={"quantization_config": FP8})
    rewrite_tensors(src, _quantise_head)
    assert not errors(src, "--engine", "vllm")
    out = str(tmp_path / "out")
    clean("upgrade", src, out, *KEEP_FUNCTION, codes=(0,))
    a, b = _read(src), _read(out)
    target_a = np.arange(a["d2t"].size) + a["d2t"]
    target_b = np.arange(b["d2t"].size) + b["d2t"]
    assert (np.diff(target_b) > 0).all() and not (np.diff(target_a) > 0).all()  # the map was sorted
    row_of = {int(t): i for i, t in enumerate(target_a)}
    source_rows = [row_of[int(t)] for t in target_b]
    assert np.array_equal(b["lm_head.weight"], a["lm_head.weight"][source_rows])
    assert np.array_equal(b["lm_head.weight_scale"], a["lm_head.weight_scale"][source_rows])
    assert np.array_equal(b["lm_head.input_scale"], a["lm_head.input_scale"])
    with open(os.path.join(out, "config.json")) as fh:
        assert json.load(fh)["eaglekit"]["function"] == "preserved"


ROWS, COLS = 128, 64  # lm_head [Vd, H] of the factory draft
SUFFIXES = ["weight_scale", "weight_scale_2", "input_scale", "weight_zero_point", "weight_g_idx", "k_scale",
            "junk_scale", "scale"]
MODULES = ["lm_head", "layers.0.mlp.up_proj", "layers.0.self_attn", "layers.0.mlp.nothing"]
SHAPES = [(), (1,), (ROWS,), (ROWS, 1), (ROWS // 8, 2), (COLS,), (ROWS, 4)]
DTYPES = ["F32", "BF16", "I32", "I64", "BOOL"]


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(module=st.sampled_from(MODULES), suffix=st.sampled_from(SUFFIXES), shape=st.sampled_from(SHAPES),
       dtype=st.sampled_from(DTYPES))
def test_validate_passes_exactly_the_quantised_drafts_upgrade_converts(tmp_path_factory, module, suffix, shape, dtype):
    path, out = fresh(tmp_path_factory, frequency_ordered=True, config_patch={"quantization_config": FP8})
    size = int(np.prod(shape)) if shape else 1
    raw = np.zeros(size, dtype={"F32": "<f4", "BF16": "<u2", "I32": "<i4", "I64": "<i8", "BOOL": "?"}[dtype])
    rewrite_tensors(path, lambda t: t.update({f"{module}.{suffix}": (dtype, shape, raw.tobytes())}))
    passed = not errors(path, "--engine", "vllm")
    result = clean("upgrade", path, out, "--dry-run", *KEEP_FUNCTION)
    assert passed == (result.exit_code == 0), (passed, result.stderr)


@FEW
@given(dtype=st.sampled_from(["BOOL", "I64", "I32", "I16", "U16"]),
       name=st.sampled_from(["norm.weight", "fc.weight", "layers.0.mlp.down_proj.weight", "lm_head.weight"]),
       quantised=st.booleans())
def test_a_weight_that_holds_no_floats_is_an_error_even_beside_a_quantization_config(
        tmp_path_factory, dtype, name, quantised):
    path, out = fresh(tmp_path_factory, config_patch={"quantization_config": FP8} if quantised else None)
    itemsize = {"BOOL": 1, "I64": 8, "I32": 4, "I16": 2, "U16": 2}[dtype]

    def retype(t):
        _, shape, _ = t[name]
        t[name] = (dtype, shape, bytes(int(np.prod(shape)) * itemsize))

    rewrite_tensors(path, retype)
    assert name in errors(path, "--deep")["EK159"]
    upgrade_refused(path, out, "EK159")


# ------------------------------------------------------------------ one rule, both commands


REFUSING = [c for c in CASES if RULES[c.code].refuses_upgrade]


@pytest.mark.parametrize("case", REFUSING, ids=lambda c: c.id)
def test_upgrade_refuses_exactly_on_the_finding_validate_reports(case, tmp_path):
    """The catalogue's broken draft of every refusing rule is refused by upgrade with that code; its twin is not."""
    for builder, broken in ((case.broken, True), (case.healthy, False)):
        where = tmp_path / ("broken" if broken else "healthy")
        where.mkdir()
        built = builder(where)
        path = built[0] if isinstance(built, tuple) else built
        result = clean("upgrade", path, str(where / "out"), "--dry-run", *KEEP_FUNCTION)
        assert (f"[{case.code}]" in result.stderr) == broken, result.stderr
    assert json.loads(clean("explain", case.code, "--format", "json").stdout)["facts"]["refuses_upgrade"] is True


# ------------------------------------------------------------------ quantised weights need their scale


@FEW
@given(dtype=st.sampled_from(["F8_E4M3", "F8_E5M2", "I8", "U8"]),
       name=st.sampled_from(["fc.weight", "layers.0.mlp.down_proj.weight", "lm_head.weight"]),
       method=st.sampled_from(["fp8", "compressed-tensors", "modelopt"]), scaled=st.booleans())
def test_a_quantised_weight_without_its_scale_is_an_error_and_refused(tmp_path_factory, dtype, name, method, scaled):
    path, out = fresh(tmp_path_factory, config_patch={"quantization_config": {"quant_method": method}})
    scale = f"{name.removesuffix('.weight')}.weight_scale"

    def quantise(t):
        _, shape, _ = t[name]
        t[name] = (dtype, shape, bytes(int(np.prod(shape))))
        if scaled:
            t[scale] = ("F32", (1,), np.ones(1, "<f4").tobytes())

    rewrite_tensors(path, quantise)
    found = errors(path, "--deep")
    if scaled:
        assert "EK160" not in found
    else:
        assert scale in found["EK160"] and method in found["EK160"]
        upgrade_refused(path, out, "EK160")


# ------------------------------------------------------------------ values engines read that eaglekit's decode ignores


@FEW
@given(value=st.sampled_from(["gelu", "relu", "SiLU", "swish", "", None, 1, ["silu"]])
       | st.text(alphabet="abcdefghijklmnopqrstuvwxyz_", min_size=1, max_size=12).filter(lambda v: v != "silu"))
def test_a_hidden_act_vllm_does_not_build_is_an_error_and_refused(tmp_path_factory, value):
    path, out = fresh(tmp_path_factory)
    edit_config(path, lambda c: c.update(hidden_act=value))
    assert "hidden_act" in errors(path, "--engine", "vllm")["EK328"]
    upgrade_refused(path, out, "EK328")


def test_silu_and_an_unwritten_hidden_act_pass(tmp_path):
    for value in ("silu", None):
        path = make_draft(str(tmp_path / f"d{value}"), "vllm")
        edit_config(path, lambda c: c.update(hidden_act=value) if value else c.pop("hidden_act", None))
        assert "EK328" not in errors(path, "--engine", "vllm")


@FEW
@given(value=st.sampled_from(["banana", "bf16", "torch.bfloat16", "", 16, True, ["bfloat16"], {}]),
       key=st.sampled_from(["torch_dtype", "dtype"]))
def test_a_torch_dtype_that_names_no_dtype_is_an_error_and_refused(tmp_path_factory, value, key):
    path, out = fresh(tmp_path_factory)
    edit_config(path, lambda c: c.update({key: value}))
    assert errors(path)["EK157"].startswith(key)
    upgrade_refused(path, out, "EK157")


# ------------------------------------------------------------------ hostile names stay out of every rendering


@settings(max_examples=6, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(length=st.integers(2_000, 200_000), char=st.sampled_from("ab.é_"))
def test_a_huge_tensor_name_leaves_every_message_small(tmp_path_factory, length, char):
    from eaglekit.errors import MAX_MESSAGE_CHARS, MAX_QUOTED_CHARS
    from eaglekit.families import load_draft
    from eaglekit.rules import decode_findings, run_rules
    from eaglekit.target import read_target
    from tests.support.factory import make_target_config

    path, _ = fresh(tmp_path_factory)
    name = char * length
    rewrite_tensors(path, lambda t: t.update({name: ("F32", (1,), np.ones(1, "<f4").tobytes())}))
    listed = findings(path, "--engine", "vllm")
    hostile = [f for f in listed if f.get("tensor") == name]
    assert hostile and all(name not in f["message"] for f in hostile)  # the location keeps it whole
    for f in listed:
        assert len(f["message"]) <= MAX_MESSAGE_CHARS
        assert max(len(w) for w in f["message"].split()) <= MAX_QUOTED_CHARS
    target = read_target(make_target_config(str(tmp_path_factory.mktemp("t") / "target")))
    spec = load_draft(path, target=target)
    served = run_rules(spec, target=target, engine="vllm", groups=("structure", "target", "engine"))
    checks = decode_findings(spec, target, (2, 6, 9), "config", served)
    assert any(c.code == "EK299" for c in checks)  # it quotes vLLM's first error, about the hostile name
    assert all(len(c.message) <= MAX_MESSAGE_CHARS and max(map(len, c.message.split())) <= MAX_QUOTED_CHARS
               for c in checks)
