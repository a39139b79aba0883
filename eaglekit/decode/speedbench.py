"""SPEED-Bench prompt files: the prepared JSONL or parquet export of `nvidia/SPEED-Bench`.

Rows carry `question_id`, `category`, `turns` (the user turns of one conversation) and optional `sub_category`,
`source`, `src_id`, `difficulty`, `multiturn`. Rows from licence-restricted sources are shipped holding a sentinel
text instead of their turns and must be rebuilt with network access by the dataset's preparation scripts, which can
fail and leave the sentinel behind: a selected row that still holds it is refused (count and first id), since
measuring the sentinel would silently report acceptance on a placeholder sentence.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from eaglekit.errors import CheckpointError, UsageError
from eaglekit.io.jsonfile import open_regular, parse_json, read_bounded

SENTINEL = "FULL BENCHMARK DATA SHOULD BE FETCHED FROM THE SOURCE USING SPECDEC_BENCH"
REQUIRED = ("question_id", "category", "turns")
MAX_BYTES = 1024 * 1024 * 1024  # the 32k-token throughput split is a few hundred MB
TURN_MODES = ("first", "all")


@dataclass(frozen=True)
class SpeedBenchRow:
    question_id: str
    category: str
    turns: tuple[str, ...]
    sub_category: str | None = None
    source: str | None = None


def looks_like_speed_bench(path: str, first_record: Any = None) -> bool:
    """A parquet file, or JSONL whose first record has SPEED-Bench's `question_id`, `category` and `turns`."""
    if path.endswith(".parquet"):
        return True
    return isinstance(first_record, dict) and all(key in first_record for key in REQUIRED)


def _row(record: Any, where: str, line: int) -> SpeedBenchRow:
    if not isinstance(record, dict):
        raise CheckpointError(f"row {line}: expected a JSON object with {', '.join(REQUIRED)}", where)
    missing = [key for key in REQUIRED if record.get(key) is None]
    if missing:
        raise CheckpointError(f"row {line}: SPEED-Bench rows need {', '.join(missing)}", where)
    turns = record["turns"]
    if hasattr(turns, "tolist"):  # parquet list columns arrive as arrays
        turns = turns.tolist()
    if not isinstance(turns, (list, tuple)) or not turns or not all(isinstance(t, str) for t in turns):
        raise CheckpointError(f"row {line} ({record['question_id']}): \"turns\" must be a non-empty list of strings",
                              where)
    optional = {key: None if record.get(key) is None else str(record[key]) for key in ("sub_category", "source")}
    return SpeedBenchRow(str(record["question_id"]), str(record["category"]), tuple(turns), **optional)


def _jsonl_records(path: str) -> list[Any]:
    try:
        text = read_bounded(path, "SPEED-Bench file", MAX_BYTES).decode("utf-8")
    except UnicodeDecodeError:
        raise CheckpointError("SPEED-Bench file is not UTF-8 text", path) from None
    return [parse_json(line, path, f"line {i + 1}") for i, line in enumerate(text.splitlines()) if line.strip()]


def _parquet_records(path: str) -> list[dict]:
    with open_regular(path, "SPEED-Bench file") as fh:  # refuses FIFOs and devices before pyarrow opens it
        size = os.fstat(fh.fileno()).st_size
    if size > MAX_BYTES:
        raise CheckpointError(f"SPEED-Bench file is {size} bytes; more than the {MAX_BYTES}-byte bound", path)
    import pyarrow.parquet as pq

    try:
        table = pq.read_table(path)
    except Exception as exc:  # pyarrow raises its own error types for every malformed file
        raise CheckpointError(f"not a readable parquet file ({type(exc).__name__}: "
                              f"{str(exc).splitlines()[0][:200] if str(exc) else 'no detail'})", path) from None
    missing = [key for key in REQUIRED if key not in table.column_names]
    if missing:
        raise CheckpointError(f"parquet file lacks SPEED-Bench column(s) {', '.join(missing)}", path)
    keep = [c for c in (*REQUIRED, "sub_category", "source") if c in table.column_names]
    return table.select(keep).to_pylist()


def read_speed_bench(path: str, records: Sequence[Any] | None = None) -> tuple[SpeedBenchRow, ...]:
    """Every row of a prepared SPEED-Bench file (`records`: JSONL lines already parsed by the caller)."""
    if records is None:
        records = _parquet_records(path) if path.endswith(".parquet") else _jsonl_records(path)
    rows = tuple(_row(record, path, i + 1) for i, record in enumerate(records))
    if not rows:
        raise CheckpointError("no rows in the SPEED-Bench file", path)
    return rows


def select(rows: Sequence[SpeedBenchRow], categories: Sequence[str], where: str) -> tuple[SpeedBenchRow, ...]:
    """The rows of the chosen categories (all when none is chosen); a selected row holding the sentinel is refused."""
    if categories:
        known = sorted({r.category for r in rows})
        unknown = [c for c in categories if c not in known]
        if unknown:
            raise UsageError(f"--category {', '.join(unknown)}: not in {where} (it has {', '.join(known)})")
        rows = tuple(r for r in rows if r.category in categories)
    masked = [r for r in rows if any(SENTINEL in turn for turn in r.turns)]
    if masked:
        raise CheckpointError(f"{len(masked)} selected row(s) still hold SPEED-Bench's placeholder instead of their "
                              f"text (first: question_id {masked[0].question_id}); rebuild them with the dataset's "
                              "preparation script, which needs network access", where)
    return tuple(rows)


def check_turns(mode: str) -> None:
    if mode not in TURN_MODES:
        raise UsageError(f"--turns {mode!r}: use one of {', '.join(TURN_MODES)}")
