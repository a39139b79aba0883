"""Layout detection: one registered family per producer, tried in priority order; the first match reads the draft."""

from __future__ import annotations

import dataclasses
import importlib
import pkgutil

from eaglekit.errors import NotEagle3DraftError, UnknownLayoutError, UsageError
from eaglekit.families.base import FAMILIES, Family, Observed, Traits, build_spec
from eaglekit.io.checkpoint import CheckpointFiles, OversizedCheckpoint, read_checkpoint
from eaglekit.spec import AuxLayers, DraftSpec, aux_count
from eaglekit.target import TargetInfo

_SUPPORT = {"base", "names", "methods"}
for _module in pkgutil.iter_modules(__path__):  # importing a layout module registers its family
    if _module.name not in _SUPPORT:
        importlib.import_module(f"{__name__}.{_module.name}")


def family_names() -> list[str]:
    return sorted(FAMILIES)


def eagle3_family_names() -> list[str]:
    """The families read as EAGLE-3 drafts (the others are drafts of other speculative methods)."""
    return sorted(name for name, f in FAMILIES.items() if f.is_eagle3)


def detect(files: CheckpointFiles, family: str | None = None) -> tuple[Observed, Traits]:
    obs = Observed.from_files(files)
    if family is not None and family not in FAMILIES:
        raise UsageError(f"unknown family {family!r}; known: {', '.join(family_names())}")
    refuse_other_methods(obs, family)
    chosen: Family | None
    if family is not None:
        chosen = FAMILIES[family]
    else:
        chosen = next((f for f in _in_priority_order() if f.is_eagle3 and f.matches(obs)), None)
    if chosen is not None:
        return obs, dataclasses.replace(chosen.traits(obs), family=chosen.name)
    signals = [
        f"architectures={obs.config.get('architectures')}",
        f"model_type={obs.config.get('model_type')!r}",
        f"name forms={sorted(obs.forms) or 'none'}",
        f"{len(obs.names)} tensors",
    ]
    raise UnknownLayoutError("unknown draft layout (" + "; ".join(signals) + ")", files.root)


def refuse_other_methods(obs: Observed, family: str | None = None) -> None:
    """A draft of another speculative method is refused, described, before any EAGLE-3 family is tried: whatever
    `--family` names, no command reads one as EAGLE-3."""
    forced = FAMILIES.get(family) if family is not None else None
    if forced is not None and not forced.is_eagle3:
        other: Family | None = forced
    else:
        other = next((f for f in _in_priority_order() if not f.is_eagle3 and f.matches(obs)), None)
    if other is not None and other.describe is not None:
        raise NotEagle3DraftError(other.describe(obs), obs.files.root)


def _in_priority_order() -> list[Family]:
    return sorted(FAMILIES.values(), key=lambda f: f.priority)


def apply_target(spec: DraftSpec, target: TargetInfo) -> DraftSpec:
    """Fill in what the draft leaves implicit: T, V, and the engine-default aux ids (the draft as written stays
    reachable as `as_written`)."""
    as_written = spec.as_written
    geometry = spec.geometry
    if not spec.facts.target_hidden_size_written and not spec.facts.fc_norm_tensor_ids:
        geometry = dataclasses.replace(geometry, target_hidden_size=target.hidden_size)
        k = aux_count(spec.facts.fc_in_features, target.hidden_size) or spec.num_aux_hidden_states
        spec = dataclasses.replace(spec, geometry=geometry, num_aux_hidden_states=k)
    vocab = spec.vocab
    if vocab.vocab_size is None:
        spec = dataclasses.replace(spec, vocab=dataclasses.replace(vocab, vocab_size=target.vocab_size))
    ids_written = spec.aux.as_written
    if spec.aux.convention == "output" and ids_written and target.num_layers in ids_written:
        # no layer L exists to take the output of: these are hidden_states indices (P18, P42), read them as such
        aux = AuxLayers(ids_written, ids_written, "input", False, spec.aux.location,
                        f"{spec.aux.location}; id {target.num_layers} = L of the target cannot be output-of-layer, "
                        "so all ids are read as input-of-layer")
        spec = dataclasses.replace(spec, aux=aux)
    if spec.aux.ids is None and spec.aux.location is None:  # not written at all (a wrong list is reported, EK157)
        default = target.default_aux_ids
        aux = AuxLayers(default, None, "input", spec.family == "eagle", "default",
                        f"engine default (2, L//2, L-3) for target L={target.num_layers}")
        spec = dataclasses.replace(spec, aux=aux)
    return dataclasses.replace(spec, target=target, written=as_written)


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
    try:
        files = read_checkpoint(source, subfolder=subfolder, revision=revision, allow_pickle=allow_pickle)
    except OversizedCheckpoint as exc:  # a full model: one that carries its own draft heads is named as such
        refuse_other_methods(Observed.from_files(exc.files, exc.names))
        raise
    obs, traits = detect(files, family)
    spec = build_spec(obs, traits)
    if target is not None:
        spec = apply_target(spec, target)
    return spec
