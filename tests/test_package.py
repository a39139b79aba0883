"""The package's public names resolve lazily, and importing eaglekit never imports torch."""

import importlib
import subprocess
import sys

import pytest

import eaglekit


def test_public_names_resolve_to_the_library():
    from eaglekit.families import load_draft
    from eaglekit.upgrade.run import upgrade

    assert eaglekit.load_draft is load_draft
    assert eaglekit.upgrade_draft is upgrade
    importlib.import_module("eaglekit.upgrade")  # the subpackage owns the short name; the alias stays stable

    assert eaglekit.upgrade_draft is upgrade
    for name in eaglekit.__all__:
        assert getattr(eaglekit, name) is not None


def test_import_is_light():
    code = "import sys, eaglekit; eaglekit.load_draft; eaglekit.run_rules; eaglekit.push; print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "False"


@pytest.mark.parametrize("blocked, extra", [("torch", "torch"), ("transformers", "torch")])
def test_a_missing_optional_dependency_is_one_line_naming_the_extra(tmp_path, blocked, extra):
    from tests.factory import make_draft, make_target_config

    draft = make_draft(str(tmp_path / "d"), "vllm")
    target = make_target_config(str(tmp_path / "t"))
    code = (f"import sys; sys.modules[{blocked!r}] = None\n"
            "from eaglekit.cli.main import main\n"
            f"main(['verify', {draft!r}, '--target', {target!r}])")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert result.returncode == 1
    assert result.stderr.strip().splitlines() == [
        f"Error: this command needs {blocked}, which is not installed: pip install 'eaglekit[{extra}]'"]
