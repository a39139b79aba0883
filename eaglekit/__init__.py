"""eaglekit: the tooling between EAGLE-3 training stacks and serving engines.

    import eaglekit
    spec = eaglekit.load_draft("./draft")                      # canonical description, headers only
    report = eaglekit.run_rules(spec, engine="vllm")           # validate
    eaglekit.upgrade_draft("./draft", "./draft-vllm", eaglekit.UpgradeOptions(fc_norm=False, norm_output=False))

Heavy dependencies (torch, transformers, triton) are imported only by the modules that compute, so the names
below are resolved on first use. (`upgrade_draft` and `verify_draft` are `eaglekit.upgrade.upgrade` and
`eaglekit.verify.run.verify`, `finetune_draft` is `eaglekit.finetune.run.finetune`: the subpackages own the
short names.)
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # the same names, for type checkers and IDEs (tests/project/test_package.py keeps both equal)
    from eaglekit.decode.options import VerifyOptions
    from eaglekit.errors import EaglekitError
    from eaglekit.families import load_draft
    from eaglekit.finetune.options import FinetuneOptions
    from eaglekit.finetune.run import finetune as finetune_draft
    from eaglekit.hub.push import push
    from eaglekit.inspection import inspect_draft
    from eaglekit.rules import run_rules
    from eaglekit.serving import serving_support
    from eaglekit.upgrade import UpgradeOptions
    from eaglekit.upgrade import upgrade as upgrade_draft
    from eaglekit.verify.run import verify as verify_draft

__version__ = "0.1.0"

_EXPORTS = {  # public name -> (module, attribute)
    "EaglekitError": ("eaglekit.errors", "EaglekitError"),
    "load_draft": ("eaglekit.families", "load_draft"),
    "inspect_draft": ("eaglekit.inspection", "inspect_draft"),
    "run_rules": ("eaglekit.rules", "run_rules"),
    "serving_support": ("eaglekit.serving", "serving_support"),
    "upgrade_draft": ("eaglekit.upgrade", "upgrade"),
    "UpgradeOptions": ("eaglekit.upgrade", "UpgradeOptions"),
    "verify_draft": ("eaglekit.verify.run", "verify"),
    "VerifyOptions": ("eaglekit.decode.options", "VerifyOptions"),
    "push": ("eaglekit.hub.push", "push"),
    "finetune_draft": ("eaglekit.finetune.run", "finetune"),
    "FinetuneOptions": ("eaglekit.finetune.options", "FinetuneOptions"),
}

__all__ = ["__version__", *_EXPORTS]


def __getattr__(name: str):
    if name in _EXPORTS:
        module, attribute = _EXPORTS[name]
        return getattr(importlib.import_module(module), attribute)
    raise AttributeError(f"module 'eaglekit' has no attribute {name!r}")
