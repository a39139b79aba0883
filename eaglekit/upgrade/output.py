"""What every dialect's writer is handed: the decided conversion, its one plan, and the report to complete."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from types import ModuleType
from typing import Any

from eaglekit.io.writer import OutTensor
from eaglekit.progress import SILENT, Progress
from eaglekit.spec import DraftSpec
from eaglekit.target import TargetInfo
from eaglekit.upgrade.decide import Decisions
from eaglekit.upgrade.options import UpgradeOptions
from eaglekit.upgrade.plan import UpgradePlan
from eaglekit.upgrade.report import UpgradeReport


@dataclass
class OutputJob:
    dialect: ModuleType
    destination: str
    spec: DraftSpec
    opts: UpgradeOptions
    d: Decisions
    plan: UpgradePlan
    config: dict[str, Any]
    tensors: Callable[[], list[OutTensor]]  # the plan's tensors with their byte sources (built when asked)
    provenance: Callable[[dict[str, str]], dict[str, Any]]  # source file digests -> the provenance block
    report: UpgradeReport
    target: TargetInfo | None
    progress: Progress = SILENT  # the write: a stage counted in bytes
