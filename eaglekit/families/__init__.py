"""Layout detection: one module per family, tried in PRIORITY order; the first match reads the draft."""

from __future__ import annotations

import dataclasses
import importlib
import pkgutil
from types import ModuleType

from eaglekit.engines import other_draft_method
from eaglekit.errors import UnknownLayoutError, UsageError
from eaglekit.families.base import Observed, build_spec
from eaglekit.io.checkpoint import CheckpointFiles, read_checkpoint
from eaglekit.spec import AuxLayers, DraftSpec
from eaglekit.target import TargetInfo

_SUPPORT = {"base", "names"}


def family_modules() -> list[ModuleType]:
    mods = [
        importlib.import_module(f"{__name__}.{info.name}")
        for info in pkgutil.iter_modules(__path__)
        if info.name not in _SUPPORT
    ]
    return sorted(mods, key=lambda m: m.PRIORITY)


def family_names() -> list[str]:
    return sorted({m.traits.__module__.rsplit(".", 1)[1].replace("_", "-") for m in family_modules()})


def detect(files: CheckpointFiles, family: str | None = None):
    obs = Observed.from_files(files)
    method = other_draft_method(obs.config.get("architectures"))
    if method is not None:
        raise UnknownLayoutError(f"architectures {obs.config['architectures']} is a {method} draft, which vLLM serves as "
                                 "its own speculative method, not EAGLE-3; eaglekit reads EAGLE-3 drafts only",
                                 files.config_path)
    for mod in family_modules():
        name = mod.__name__.rsplit(".", 1)[1].replace("_", "-")
        if family is not None:
            if name == family:
                return obs, mod.traits(obs)
            continue
        if mod.matches(obs):
            return obs, mod.traits(obs)
    if family is not None:
        raise UsageError(f"unknown family {family!r}; known: {', '.join(family_names())}")
    signals = [
        f"architectures={obs.config.get('architectures')}",
        f"model_type={obs.config.get('model_type')!r}",
        f"name forms={sorted(obs.forms) or 'none'}",
        f"{len(obs.names)} tensors",
    ]
    raise UnknownLayoutError("unknown draft layout (" + "; ".join(signals) + ")", files.root)


def apply_target(spec: DraftSpec, target: TargetInfo) -> DraftSpec:
    """Fill in what the draft leaves implicit: T, V, and the engine-default aux ids."""
    geometry = spec.geometry
    if not spec.facts.target_hidden_size_written and not spec.facts.fc_norm_tensor_ids:
        fc_in = spec.facts.fc_in_features
        geometry = dataclasses.replace(geometry, target_hidden_size=target.hidden_size)
        k = fc_in // target.hidden_size if fc_in and fc_in % target.hidden_size == 0 else spec.num_aux_hidden_states
        spec = dataclasses.replace(spec, geometry=geometry, num_aux_hidden_states=k)
    vocab = spec.vocab
    if vocab.vocab_size is None:
        spec = dataclasses.replace(spec, vocab=dataclasses.replace(vocab, vocab_size=target.vocab_size))
    written = spec.aux.as_written
    if spec.aux.convention == "output" and written and target.num_layers in written:
        # no layer L exists to take the output of: these are hidden_states indices (P18, P42), read them as such
        aux = AuxLayers(written, written, "input", False, spec.aux.location,
                        f"{spec.aux.location}; id {target.num_layers} = L of the target cannot be output-of-layer, "
                        "so all ids are read as input-of-layer")
        spec = dataclasses.replace(spec, aux=aux)
    if spec.aux.ids is None and spec.aux.as_written is None:
        default = target.default_aux_ids
        aux = AuxLayers(default, None, "input", spec.family == "eagle", "default",
                        f"engine default (2, L//2, L-3) for target L={target.num_layers}")
        spec = dataclasses.replace(spec, aux=aux)
    return dataclasses.replace(spec, target=target)


def load_draft(
    source: str,
    *,
    subfolder: str | None = None,
    revision: str | None = None,
    allow_pickle: bool = False,
    family: str | None = None,
    target: TargetInfo | None = None,
) -> DraftSpec:
    """Read a draft checkpoint (headers only) into its canonical description."""
    files = read_checkpoint(source, subfolder=subfolder, revision=revision, allow_pickle=allow_pickle)
    obs, traits = detect(files, family)
    spec = build_spec(obs, traits)
    if target is not None:
        spec = apply_target(spec, target)
    return spec
