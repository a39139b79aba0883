"""Upgrade any EAGLE-3 layout to a correct, engine-ready EAGLE-3.1 (or normalised EAGLE-3) checkpoint.

    from eaglekit.upgrade import UpgradeOptions, upgrade
    report = upgrade("./draft", "./draft-31", UpgradeOptions(target="./target"))
"""

from eaglekit.upgrade.options import UpgradeOptions
from eaglekit.upgrade.report import UpgradeReport
from eaglekit.upgrade.run import upgrade

__all__ = ["UpgradeOptions", "UpgradeReport", "upgrade"]
