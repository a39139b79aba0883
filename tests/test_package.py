"""The package's public names resolve lazily, and importing eaglekit never imports torch."""

import importlib
import subprocess
import sys

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
