"""Engine and version facts (eaglekit.engines), run_rules' contract, and the vLLM-ready flag matrix upgrade relies
on."""

from __future__ import annotations

import itertools
import subprocess
import sys

import pytest

from eaglekit.engines.base import parse_version
from eaglekit.engines.sglang import SglangView, sglang_capture
from eaglekit.engines.vllm import VLLM_OLDEST_KNOWN, vllm_rewrite_architecture, vllm_view
from eaglekit.errors import UsageError
from eaglekit.families import load_draft
from eaglekit.rules import run_rules
from eaglekit.serving import minimum_versions, serving_support
from eaglekit.target import read_target
from tests.support.factory import edit_config, make_draft, make_target_config


def spec_of(tmp_path, layout="vllm", name="d", **kw):
    return load_draft(make_draft(str(tmp_path / name), layout, **kw))


def test_versions_parse_and_reject():
    assert parse_version("0.23") == (0, 23, 0)
    assert parse_version("v0.22.1") == (0, 22, 1)
    for bad in ("0", "latest", "0.2x", "1.2.3.4"):
        with pytest.raises(UsageError):
            parse_version(bad)


@pytest.mark.parametrize("written, resolved", [
    ("LlamaForCausalLMEagle3", "LlamaForCausalLMEagle3"),
    ("LlamaForCausalLM", "Eagle3LlamaForCausalLM"),
    ("DeepseekV3ForCausalLM", "Eagle3DeepseekV3ForCausalLM"),
    ("Eagle3DeepseekV2ForCausalLM", "Eagle3DeepseekV2ForCausalLM"),
    ("Qwen3ForCausalLMEagle3", "Qwen3ForCausalLMEagle3"),
])
def test_vllm_architecture_rewrite(written, resolved):
    assert vllm_rewrite_architecture(written) == resolved


def test_norm_before_residual_defaults_differ_between_layouts(tmp_path):
    assert vllm_view(spec_of(tmp_path, "speculators", "a", norm_before_residual=None)).norm_before_residual is True
    assert vllm_view(spec_of(tmp_path, "speculators", "b", norm_before_residual=False)).norm_before_residual is False
    assert vllm_view(spec_of(tmp_path, "specforge", "c")).norm_before_residual is False


def test_k_resolution_depends_on_class_and_version(tmp_path):
    llama = spec_of(tmp_path, "speculators", "a", k=4, aux_ids=(2, 4, 6, 9))
    qwen3 = spec_of(tmp_path, "speculators", "b", k=4, aux_ids=(2, 4, 6, 9), attention="qwen3")
    assert vllm_view(llama).k == 3  # the Llama class never reads the top-level list
    assert vllm_view(qwen3, (0, 26, 0)).k == 4 and vllm_view(qwen3, (0, 25, 0)).k == 3
    flat = spec_of(tmp_path, "vllm", "c", k=4, aux_ids=(2, 4, 6, 9))
    assert vllm_view(flat).k == 4 and vllm_view(flat, (0, 21, 0)).k == 3


def test_speculators_layout_passes_31_flags_from_025(tmp_path):
    spec = spec_of(tmp_path, "speculators", fc_norm=True, norm_output=True)
    assert not vllm_view(spec, (0, 24, 0)).fc_norm and not vllm_view(spec, (0, 24, 0)).norm_output
    assert vllm_view(spec, (0, 25, 0)).fc_norm and vllm_view(spec, (0, 25, 0)).norm_output


def test_runners_read_different_id_lists(tmp_path):
    view = vllm_view(spec_of(tmp_path, "specforge"), (0, 22, 0))
    assert view.top_level_ids is None and view.v1_ids == (1, 5, 8)
    assert vllm_view(spec_of(tmp_path, "specforge", "b"), (0, 21, 0)).v1_ids is None


@pytest.mark.parametrize("layout, recipe, floor", [
    ("vllm", {}, None),
    ("vllm", {"fc_norm": True}, "0.22.0"),
    ("vllm", {"norm_output": True}, "0.22.0"),
    ("vllm", {"attention": "mla", "fc_norm": True}, "0.23.0"),
    ("speculators", {"fc_norm": True, "norm_output": True}, "0.25.0"),
    ("vllm", {"k": 4, "aux_ids": (2, 4, 6, 9)}, "0.22.0"),
])
def test_vllm_version_floors(tmp_path, layout, recipe, floor):
    assert minimum_versions(spec_of(tmp_path, layout, **recipe))["vllm"].version == floor


def test_sglang_capture_shift_rules():
    assert sglang_capture(SglangView(3, "", (1, 5, 8), False), None) == (2, 6, 9)
    assert sglang_capture(SglangView(3, "", (2, 6, 9), False), None) == (3, 7, 10)
    assert sglang_capture(SglangView(3, "", (1, 29, 57), True), None) == (2, 30, 58)
    assert sglang_capture(SglangView(3, "", (2, 30, 58), True), None) == (2, 30, 58)
    assert sglang_capture(SglangView(3, "", None, False), None) is None


def test_serving_support_says_who_serves_it_as_is(tmp_path):
    by_engine = {s.engine: s for s in serving_support(spec_of(tmp_path, "vllm", "a"))}
    assert by_engine["vllm"].as_is and by_engine["vllm"].min_version == "0.21.0"
    assert not by_engine["sglang"].as_is and by_engine["sglang"].reason.startswith("EK351")

    by_engine = {s.engine: s for s in serving_support(spec_of(tmp_path, "specforge", "b"))}
    assert not by_engine["vllm"].as_is and by_engine["vllm"].min_version is None and "EK307" in by_engine["vllm"].reason
    assert by_engine["sglang"].as_is and by_engine["sglang"].min_version == "0.5.23"

    mla = {s.engine: s for s in serving_support(spec_of(tmp_path, "vllm", "c", attention="mla", fc_norm=True))}
    assert mla["vllm"].min_version == "0.23.0" and "PR #43482" in mla["vllm"].reason and mla["sglang"].as_is


VLLM_READY = [
    {"fc_norm": f, "norm_output": n, "attention": a, "draft_vocab": v, "layers": layers}
    for f, n, a, v, layers in itertools.product((False, True), (False, True), ("llama", "qwen3", "mla"), (128, None),
                                                (1, 2))
    if not (a == "mla" and layers > 1)
]


@pytest.mark.parametrize("recipe", VLLM_READY, ids=lambda r: "-".join(f"{k}={v}" for k, v in r.items()))
def test_vllm_ready_fixtures_pass_every_vllm_rule(recipe, tmp_path):
    """upgrade refuses to publish on errors, so exactly the vLLM-ready checklist (§10) must pass, at its floor too."""
    target = read_target(make_target_config(str(tmp_path / "t")))
    spec = load_draft(make_draft(str(tmp_path / "d"), "vllm", **recipe), target=target)
    floor = minimum_versions(spec)["vllm"].version or VLLM_OLDEST_KNOWN
    for version in (None, floor):
        report = run_rules(spec, target=target, engine="vllm", engine_version=version, deep=True)
        assert [(f.code, f.message) for f in report.findings if f.severity != "info"] == []


def test_usage_errors(tmp_path):
    spec = spec_of(tmp_path)
    with pytest.raises(UsageError):
        run_rules(spec, engine="all", engine_version="0.30")
    with pytest.raises(UsageError):
        run_rules(spec, engine="mlc")
    with pytest.raises(UsageError):
        run_rules(spec, groups=("structure", "vibes"))


def test_target_recorded_by_load_draft_is_used(tmp_path):
    target = read_target(make_target_config(str(tmp_path / "t"), vocab=300))
    spec = load_draft(make_draft(str(tmp_path / "d"), "vllm"), target=target)
    assert "EK201" in {f.code for f in run_rules(spec).findings}
    assert "EK201" not in {f.code for f in run_rules(load_draft(str(tmp_path / "d"))).findings}


def test_engine_all_runs_every_engine_once_each(tmp_path):
    report = run_rules(spec_of(tmp_path), engine="all")
    assert report.engines == {"vllm": "0.33.0", "sglang": "0.5.23", "trtllm": "1.2.0", "llamacpp": "b11434",
                              "tokenspeed": "0.1.0"}
    # vLLM-convention ids in eagle_config: SGLang shifts them (error); TensorRT-LLM and tokenspeed need a setting
    assert [f.code for f in report.findings] == ["EK351", "EK361", "EK381"]
    pair = run_rules(spec_of(tmp_path, name="e"), engine="vllm,sglang")
    assert pair.engines == {"vllm": "0.33.0", "sglang": "0.5.23"}
    assert [f.code for f in pair.findings] == ["EK351"]


def test_header_groups_never_read_tensor_bytes(tmp_path, monkeypatch):
    from eaglekit.rules import scan

    def refuse(*a, **k):
        raise AssertionError("tensor bytes read by a header-only group")

    monkeypatch.setattr(scan, "scan_draft", refuse)
    path = make_draft(str(tmp_path / "d"), "vllm")
    edit_config(path, lambda c: c.update(num_hidden_layers=4))
    report = run_rules(load_draft(path), groups=("structure", "target"))
    assert [f.code for f in report.findings] == ["EK101"]


def test_rules_and_validate_stay_torch_free(tmp_path):
    path = make_draft(str(tmp_path / "d"), "vllm", fc_norm=True)
    code = ("import sys; from eaglekit.families import load_draft; from eaglekit.rules import run_rules; "
            "from eaglekit.serving import serving_support; s = load_draft(sys.argv[1]); "
            "run_rules(s, engine='all', deep=True); serving_support(s); "
            "from eaglekit.cli.main import main; sys.argv = ['eaglekit', 'validate', sys.argv[1], '--deep']; "
            "import contextlib, io\n"
            "with contextlib.redirect_stdout(io.StringIO()):\n"
            "    try: main()\n"
            "    except SystemExit: pass\n"
            "assert 'torch' not in sys.modules and 'triton' not in sys.modules, 'torch imported'")
    subprocess.run([sys.executable, "-c", code, path], check=True)


@pytest.mark.parametrize("version, error, warning",
                         [("0.29.0", False, True), ("0.30.0", True, False), (None, True, False)])
def test_d2t_with_the_full_vocabulary_fails_only_from_vllm_030(tmp_path, version, error, warning):
    import numpy as np

    spec = load_draft(make_draft(str(tmp_path / "d"), "vllm", draft_vocab=None, add={"d2t": np.zeros(256, np.int64)}))
    codes = {f.code for f in run_rules(spec, engine="vllm", engine_version=version, groups=("engine",)).findings}
    assert ("EK306" in codes, "EK323" in codes) == (error, warning)
