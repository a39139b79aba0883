"""What every engine module shares: release numbers, the id conventions, and the record that describes an engine.

An engine is data: one `Engine` record per serving engine (eaglekit/engines/<engine>.py), listed once in
eaglekit/engines/__init__.py. Code outside eaglekit/engines/ asks the record and never compares engine names.
"""

from __future__ import annotations

import os
import re
import shlex
from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

from eaglekit.errors import UsageError
from eaglekit.spec import DraftSpec
from eaglekit.target import TargetInfo

Version = tuple[int, int, int]

_VERSION = re.compile(r"^v?(\d{1,6})\.(\d{1,6})(?:\.(\d{1,6}))?$")
_BUILD = re.compile(r"^b?(\d{4,6})$")  # llama.cpp names releases by build number: b9606
FIRST_BUILD_NUMBER = 1000
UPGRADE_DEFAULT_DIALECT = "vllm"  # what `eaglekit upgrade` writes without --to


def parse_version(text: str) -> Version:
    """'0.23' or '0.23.1' -> (0, 23, 1); anything else is a usage error."""
    build = _BUILD.match(text.strip())
    if build:
        return int(build.group(1)), 0, 0
    m = _VERSION.match(text.strip())
    if not m:
        raise UsageError(f"engine version {text!r} is not X.Y or X.Y.Z")
    return int(m.group(1)), int(m.group(2)), int(m.group(3) or 0)


def format_version(v: Version) -> str:
    if v[0] >= FIRST_BUILD_NUMBER and v[1:] == (0, 0):
        return f"b{v[0]}"
    return ".".join(str(p) for p in v)


def output_of_layer(ids: tuple[int, ...]) -> tuple[int, ...] | None:
    """vLLM-convention ids (input of layer i) as the output-of-layer ids TensorRT-LLM, tokenspeed and SGLang's
    Llama path take; None when the list holds the embedding (0), which that convention cannot name."""
    return tuple(i - 1 for i in ids) if ids and min(ids) >= 1 else None


TOP_IDS = "eagle_aux_hidden_state_layer_ids"
NESTED_IDS = "eagle_config.eagle_aux_hidden_state_layer_ids"


@dataclass(frozen=True)
class IdReading:
    """How one engine reads the aux-id list of a config (to find engines that read one key differently)."""

    engine: str
    key: str | None  # the list it reads (None: its default)
    shift: int  # added to every id read
    captured: tuple[int, ...] | None  # vLLM convention; None: depends on the target's L
    flag: str | None  # the engine flag that overrides the config, if it has one


Requirements = Callable[[DraftSpec], list[tuple[Version, str]]]
Settings = Callable[[DraftSpec, TargetInfo | None], tuple[str, ...]]
ServeCommand = Callable[[str, str, int, tuple[str, ...]], str]
ReadIds = Callable[[DraftSpec, TargetInfo | None], IdReading]


def no_settings(spec: DraftSpec, target: TargetInfo | None) -> tuple[str, ...]:
    return ()


@dataclass(frozen=True)
class Engine:
    """One serving engine: the releases modelled, what it loads, how to serve with it, and the functions that
    read a draft as it does. Its rules live in `rules_module` (registered on import)."""

    name: str  # the --engine value
    label: str  # how people write it
    latest: str  # newest release modelled
    oldest: str  # oldest release modelled (== latest: one release modelled)
    loads: Literal["safetensors", "gguf"]  # the files it loads: a GGUF engine needs `upgrade --to gguf` first
    dialect: str  # the `eaglekit upgrade --to` value that writes the files it reads
    rules_module: str
    requirements: Requirements  # version floors this draft needs, with why
    serve: ServeCommand  # (target, draft, k, settings) -> the command line
    settings: Settings = no_settings  # what to pass it beside the files (empty: the files say everything)
    read_ids: ReadIds | None = None  # how it reads the config's aux ids (None: it never reads them)

    @property
    def versions_modelled(self) -> bool:
        """A range of releases is modelled (else verdicts hold for `latest` only)."""
        return self.oldest != self.latest

    @property
    def needs_conversion(self) -> bool:
        return self.loads == "gguf"

    def upgrade_flag(self) -> str:
        """The --to option of the upgrade that writes for this engine (empty: upgrade's default)."""
        return "" if self.dialect == UPGRADE_DEFAULT_DIALECT else f" --to {self.dialect}"

    def upgrade_output(self, draft: str) -> str:
        """Where the fix command writes: the current folder, named after the draft (never inside the source's own
        folder or repository)."""
        name = os.path.basename(os.path.abspath(draft))
        return name + (".gguf" if self.needs_conversion else f"-{self.dialect}")

    def upgrade_target(self, target: str | None) -> str | None:
        """The --target part of the fix, as upgrade takes it: the target's folder (not its config.json); for a
        GGUF engine the target's GGUF file, whose tokenizer goes into the draft. None when the conversion needs a
        GGUF file that is not known (the target was given as a folder holding none, or not at all)."""
        if not self.needs_conversion:
            return "" if target is None else f" --target {shlex.quote(target_folder(target))}"
        gguf = target_gguf(target)
        return None if gguf is None else f" --target {shlex.quote(gguf)}"

    def conversion_hint(self) -> str:
        """What the conversion needs when no runnable command can be printed."""
        return (f"{self.label} loads GGUF only: convert with `eaglekit upgrade DRAFT OUT.gguf --to {self.dialect} "
                "--target TARGET.gguf`, giving the target's GGUF file (its tokenizer goes into the draft)")


def target_folder(target: str) -> str:
    """The target as upgrade takes it: its folder where eaglekit read its config.json."""
    return (os.path.dirname(target) or ".") if os.path.basename(target) == "config.json" else target


def target_gguf(target: str | None) -> str | None:
    """The target's GGUF file: the target itself, or the one GGUF in its folder; None when there is no single one."""
    if target is None:
        return None
    if target.endswith(".gguf"):
        return target
    folder = target_folder(target)
    try:
        found = [n for n in os.listdir(folder) if n.endswith(".gguf")]
    except OSError:  # not a folder, or unreadable: no GGUF is known
        return None
    return os.path.join(folder, found[0]) if len(found) == 1 else None


def single_release_requirements(latest: str, what: str) -> Requirements:
    """An engine modelled at one release: that release is the floor of any EAGLE-3.1 flag."""

    def requirements(spec: DraftSpec) -> list[tuple[Version, str]]:
        if spec.flags.fc_norm or spec.flags.norm_output:
            return [(parse_version(latest), what)]
        return []

    return requirements
