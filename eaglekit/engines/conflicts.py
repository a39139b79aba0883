"""Which engines read the same aux-id list of one checkpoint in different conventions.

vLLM takes the ids as written (input-of-layer); SGLang's Llama path and tokenspeed add 1 (output-of-layer). When
two requested engines read the *same* key that differently, no value of that key is right for both: the note says
which key, who reads it how, and what to do (an engine flag where the engine has one, else a second key).
TensorRT-LLM never reads the ids (its setting decides) and llama.cpp reads its own GGUF, so neither conflicts.
"""

from __future__ import annotations

from dataclasses import dataclass

from eaglekit.config_view import as_ids, nested
from eaglekit.engines import (
    LABELS,
    LATEST,
    SGLANG,
    TOKENSPEED,
    VLLM,
    parse_version,
    sglang_capture,
    sglang_view,
    vllm_default_runner,
)
from eaglekit.engines.tokenspeed import tokenspeed_capture, tokenspeed_view
from eaglekit.spec import DraftSpec
from eaglekit.target import TargetInfo

TOP = "eagle_aux_hidden_state_layer_ids"
NESTED = "eagle_config.eagle_aux_hidden_state_layer_ids"


@dataclass(frozen=True)
class IdReading:
    engine: str
    key: str | None  # the list it reads (None: its default)
    shift: int  # added to every id read
    captured: tuple[int, ...] | None  # vLLM convention; None: depends on the target's L
    flag: str | None  # the engine flag that overrides the config, if it has one


def id_readings(spec: DraftSpec, engines: tuple[str, ...], target: TargetInfo | None = None) -> list[IdReading]:
    target = target or spec.target
    cfg = spec.config
    top, inner = as_ids(cfg.get(TOP)), as_ids(nested(cfg, "eagle_config").get("eagle_aux_hidden_state_layer_ids"))
    default = target.default_aux_ids if target is not None else None
    out = []
    if VLLM in engines:
        version = parse_version(LATEST[VLLM])
        runner = vllm_default_runner(version, target.architectures[0] if target and target.architectures else None)
        key = TOP if top else (NESTED if inner and runner == "v1" else None)
        read = top if key == TOP else inner if key == NESTED else None
        out.append(IdReading(VLLM, key, 0, read or default, None))
    if SGLANG in engines:
        view = sglang_view(spec, target)
        captured = sglang_capture(view, target)
        shift = 1 if inner and captured is not None and captured[0] == inner[0] + 1 else 0
        out.append(IdReading(SGLANG, NESTED if inner else None, shift, captured, None))
    if TOKENSPEED in engines:
        view = tokenspeed_view(spec, target)
        out.append(IdReading(TOKENSPEED, view.ids_key, 1 if view.shifted else 0, tokenspeed_capture(view, target),
                             "--eagle3-layers-to-capture"))
    return out


def conflicts(spec: DraftSpec, engines: tuple[str, ...], target: TargetInfo | None = None) -> list[str]:
    """One sentence per pair of requested engines that read one key of this config in different conventions."""
    readings = [r for r in id_readings(spec, engines, target) if r.key is not None]
    notes = []
    for i, a in enumerate(readings):
        for b in readings[i + 1:]:
            if a.key != b.key or a.shift == b.shift:
                continue
            how = f"{LABELS[a.engine]} reads {a.key} {_as(a.shift)}, {LABELS[b.engine]} {_as(b.shift)}"
            flagged = a if a.flag else b if b.flag else None
            if flagged is not None:
                other = b if flagged is a else a
                remedy = (f"write the ids for {LABELS[other.engine]} and pin {LABELS[flagged.engine]} with "
                          f"{flagged.flag}")
            else:
                remedy = "serve each engine its own `eaglekit upgrade --to` output"
            notes.append(f"{how}: no value of {a.key} is right for both; {remedy}")
    return notes


def _as(shift: int) -> str:
    return "as written (input-of-layer)" if shift == 0 else "plus 1 (output-of-layer)"
