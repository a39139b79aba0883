"""Every measured figure in README.md and docs/benchmarks.md comes from a result file in bench/results/.

A result file is either a ledger that bench/bench_from_scratch.py wrote (its tables are reprinted from the raw
counters and must equal the docs' tables of the same header), or a record of one run: its command, machine, date,
where its figures come from, and each figure exactly as the docs quote it (a text, or table rows cell for cell).

The docs are then held to the files both ways: every quoted text and row is in the docs, every table row in the
docs that holds a figure is listed by exactly one file, and every figure in the docs' prose lies inside a text some
file quotes. A figure is a number with a decimal part, a unit (s, min, MB, ×, % ...), thousands separators or a ±;
bare integers (prompt counts, steps, seeds) are settings and need no file. Version numbers, code spans and names
such as EAGLE-3.1 are not figures.
"""

from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
RESULTS = os.path.join(ROOT, "bench", "results")
DOCS = ("README.md", "docs/benchmarks.md")
WRITER_FIX = "not re-measured since the writer fix"

UNIT = r"(?:×|\s?%|\s?(?:ms|µs|s|min|minutes|h|hours|MB|GB|TB/s|tokens/s|steps/s)(?![\w/]))"
NUMBER = re.compile(r"(?<![\w.\-/=#])(?P<sign>[+−±-]\s?)?(?P<int>\d{1,3}(?:,\d{3})+|\d+)(?P<frac>\.\d+)?(?!\.?\d)"
                    rf"(?P<unit>{UNIT})?")
# Version numbers of named software and the method's own name are text, not figures.
NAMES = re.compile(r"\b(?:vLLM|Python|torch|llama\.cpp|speculators|hs-connectors)\s+v?\d+(?:\.\d+)*|\b3\.1\b(?!\d)")
CODE_SPAN = re.compile(r"`[^`\n]*`")
CELL_SPLIT = re.compile(r"(?<!\\)\|")


def read(doc: str) -> str:
    with open(os.path.join(ROOT, doc), encoding="utf-8") as fh:
        return fh.read()


def is_figure(match: re.Match) -> bool:
    """A measured figure, not a setting: a fraction, a unit, thousands separators or ±; never the 95 % level."""
    if match.group("unit") and match.group("unit").strip() == "%" and match.group("int") == "95":
        return False
    sign = (match.group("sign") or "").strip()
    return bool(match.group("frac") or match.group("unit") or "," in match.group("int") or sign == "±")


def figures(text: str) -> list[re.Match]:
    """The figures in a piece of prose, with positions in it (code spans and names blanked first)."""
    blank = CODE_SPAN.sub(lambda m: " " * len(m.group()), text)
    blank = NAMES.sub(lambda m: " " * len(m.group()), blank)
    return [m for m in NUMBER.finditer(blank) if is_figure(m)]


@dataclass
class Table:
    header: str
    start: int  # offset of the header line in the doc
    rows: list[list[str]]
    lines: list[str]


def cells(line: str) -> list[str]:
    return [c.strip() for c in CELL_SPLIT.split(line.strip())[1:-1]]


def tables(text: str) -> list[Table]:
    """Every Markdown table of a doc: its header line, body rows as cells, and the offset where it starts."""
    found: list[Table] = []
    offset, block, block_start = 0, [], 0
    for line in text.splitlines(keepends=True) + [""]:
        if line.startswith("|"):
            block_start = offset if not block else block_start
            block.append(line.rstrip("\n"))
        elif block:
            found.append(Table(block[0].strip(), block_start, [cells(r) for r in block[2:]], block[2:]))
            block = []
        offset += len(line)
    return found


def prose_spans(text: str) -> list[tuple[int, str]]:
    """(offset, text) of what the prose rule reads: every line outside tables and fences, and the comments of
    fenced shell lines (where the docs print timings)."""
    spans, offset, fenced = [], 0, False
    for line in text.splitlines(keepends=True):
        if line.startswith("```"):
            fenced = not fenced
        elif fenced:
            comment = re.search(r"\s#\s.*", line)
            if comment:
                spans.append((offset + comment.start(), comment.group()))
        elif not line.startswith("|"):
            spans.append((offset, line))
        offset += len(line)
    return spans


def occurrences(text: str, quote: str) -> list[tuple[int, int]]:
    """Where a quoted text stands in a doc; any run of white space matches any other (the docs are reflowed)."""
    pattern = r"\s+".join(re.escape(word) for word in quote.split())
    return [m.span() for m in re.finditer(pattern, text)]


def paragraph_at(text: str, position: int) -> str:
    """The paragraph (text between blank lines) around a position."""
    start = text.rfind("\n\n", 0, position)
    end = text.find("\n\n", position)
    return text[start + 2 if start >= 0 else 0: end if end >= 0 else len(text)]


# --- the result files -------------------------------------------------------------------------------------------

def result_files() -> dict[str, dict]:
    held = {}
    for name in sorted(os.listdir(RESULTS)):
        if name.endswith(".json"):
            with open(os.path.join(RESULTS, name), encoding="utf-8") as fh:
                held[name] = json.load(fh)
    return held


def is_ledger(data: dict) -> bool:
    return {"settings", "source", "conversations", "drafters"} <= set(data)


RECORDS = {name: data for name, data in result_files().items() if not is_ledger(data)}
LEDGERS = {name: data for name, data in result_files().items() if is_ledger(data)}


def quoted_texts(record: dict):
    for quote in record["quoted"]:
        if "text" in quote:
            yield quote["in"], quote["text"]


def quoted_rows(record: dict):
    for quote in record["quoted"]:
        for row in quote.get("rows", []):
            yield quote["in"], quote["table"], row


def ledger_tables(name: str, data: dict) -> dict[str, list[list[str]]]:
    """The tables bench_from_scratch.py prints from a ledger alone, header → rows, in the docs' minus sign."""
    import contextlib
    import io

    from bench.bench_from_scratch import Ledger

    settings = {k: v for k, v in data["settings"].items() if k not in ("columns", "store")}
    ledger = Ledger(os.path.join(RESULTS, name), settings, data["settings"]["columns"])
    seeds = sorted({int(n.rsplit(" ", 1)[1]) for n in data["drafters"] if ", seed " in n})
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        ledger.print_tables(list(data["drafters"]), seeds)
    text = re.sub(r"(?<![\w])-(?=\d)", "−", printed.getvalue())
    return {t.header: t.rows for t in tables(text)}


def claims() -> dict[tuple[str, str], list[tuple[str, list[str]]]]:
    """(doc, table header) → every (file, row) that lists a row of that table."""
    held: dict[tuple[str, str], list[tuple[str, list[str]]]] = {}
    for name, record in RECORDS.items():
        for doc, header, row in quoted_rows(record):
            held.setdefault((doc, header), []).append((name, row))
    for name, data in LEDGERS.items():
        for header, rows in ledger_tables(name, data).items():
            for row in rows:
                held.setdefault((data_doc(), header), []).append((name, row))
    return held


def data_doc() -> str:
    return "docs/benchmarks.md"
