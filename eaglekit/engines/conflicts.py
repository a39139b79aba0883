"""Which engines read the same aux-id list of one checkpoint in different conventions.

vLLM takes the ids as written (input-of-layer); SGLang's Llama path and tokenspeed add 1 (output-of-layer). When
two requested engines read the *same* key that differently, no value of that key is right for both: the note says
which key, who reads it how, and what to do (an engine flag where the engine has one, else a second key).
TensorRT-LLM never reads the ids (its setting decides) and llama.cpp reads its own GGUF, so neither conflicts.
"""

from __future__ import annotations

from eaglekit.engines import RECORDS
from eaglekit.engines.base import IdReading
from eaglekit.spec import DraftSpec
from eaglekit.target import TargetInfo


def id_readings(spec: DraftSpec, engines: tuple[str, ...], target: TargetInfo | None = None) -> list[IdReading]:
    """How each requested engine that reads the config's ids reads them."""
    target = target or spec.target
    return [read(spec, target) for name in engines if (read := RECORDS[name].read_ids) is not None]


def conflicts(spec: DraftSpec, engines: tuple[str, ...], target: TargetInfo | None = None) -> list[str]:
    """One sentence per pair of requested engines that read one key of this config in different conventions."""
    readings = [r for r in id_readings(spec, engines, target) if r.key is not None]
    notes = []
    for i, a in enumerate(readings):
        for b in readings[i + 1:]:
            if a.key != b.key or a.shift == b.shift:
                continue
            how = f"{RECORDS[a.engine].label} reads {a.key} {_as(a.shift)}, {RECORDS[b.engine].label} {_as(b.shift)}"
            flagged = a if a.flag else b if b.flag else None
            if flagged is not None:
                other = b if flagged is a else a
                remedy = (f"write the ids for {RECORDS[other.engine].label} and pin "
                          f"{RECORDS[flagged.engine].label} with {flagged.flag}")
            else:
                remedy = "serve each engine its own `eaglekit upgrade --to` output"
            notes.append(f"{how}: no value of {a.key} is right for both; {remedy}")
    return notes


def _as(shift: int) -> str:
    return "as written (input-of-layer)" if shift == 0 else "plus 1 (output-of-layer)"
