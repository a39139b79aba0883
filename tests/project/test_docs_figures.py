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

import functools
import json
import os
import re
from dataclasses import dataclass

import pytest

from tests.support import REPO

ROOT = str(REPO)
RESULTS = os.path.join(ROOT, "bench", "results")
DOCS = ("README.md", "docs/benchmarks.md")
LEDGER_DOC = "docs/benchmarks.md"

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


BULLET = re.compile(r"\s*[-*] ")


def block_at(text: str, position: int) -> str:
    """The paragraph around a position; in a list, its item and the lines the list hangs from."""
    lines = text.splitlines(keepends=True)
    offsets = [0]
    for line in lines:
        offsets.append(offsets[-1] + len(line))
    here = max(i for i, o in enumerate(offsets[:-1]) if o <= position)
    start = here
    while start > 0 and lines[start - 1].strip():
        start -= 1
    first = here
    while first > start and not BULLET.match(lines[first]):
        first -= 1
    last = here
    while last + 1 < len(lines) and lines[last + 1].strip() and not BULLET.match(lines[last + 1]):
        last += 1
    lead = start
    while BULLET.match(lines[first]) and lead < first and not BULLET.match(lines[lead]):
        lead += 1
    return "".join(lines[start:lead]) + "".join(lines[first:last + 1])


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


@functools.cache
def ledger_tables(name: str) -> dict[str, list[list[str]]]:
    return _reprint(name, LEDGERS[name])


def _reprint(name: str, data: dict) -> dict[str, list[list[str]]]:
    """The tables bench_from_scratch.py prints from a ledger alone, header → rows, in the docs' minus sign."""
    import contextlib
    import io

    from bench.ledger import Ledger

    settings = {k: v for k, v in data["settings"].items() if k not in ("columns", "store")}
    ledger = Ledger(os.path.join(RESULTS, name), settings, data["settings"]["columns"])
    seeds = sorted({int(n.rsplit(" ", 1)[1]) for n in data["drafters"] if ", seed " in n})
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        ledger.print_tables(list(data["drafters"]), seeds)
    text = re.sub(r"(?<![\w])-(?=\d)", "−", printed.getvalue())
    return {t.header: t.rows for t in tables(text)}


def ledger_claims() -> dict[tuple[str, str], list[tuple[str, list[str]]]]:
    held: dict[tuple[str, str], list[tuple[str, list[str]]]] = {}
    for name, data in LEDGERS.items():
        for header, rows in ledger_tables(name).items():
            held.setdefault((LEDGER_DOC, header), []).extend((name, row) for row in rows)
    return held


@pytest.fixture(scope="module")
def claims() -> dict[tuple[str, str], list[tuple[str, list[str]]]]:
    """(doc, table header) → every (file, row) that lists a row of that table: the records' and the ledgers'."""
    held = ledger_claims()
    for name, record in RECORDS.items():
        for doc, header, row in quoted_rows(record):
            held.setdefault((doc, header), []).append((name, row))
    return held


def line_of(text: str, position: int) -> int:
    return text.count("\n", 0, position) + 1


# --- the files say what ran, where, when and from what --------------------------------------------------------

@pytest.mark.parametrize("name", sorted(RECORDS))
def test_every_result_file_says_what_ran_where_when_and_from_what(name):
    record = RECORDS[name]
    for key in ("what", "command", "machine", "date", "source", "quoted"):
        assert record.get(key), f"{name}: no {key}"
    assert re.match(r"\d{4}-\d{2}-\d{2}\b", record["date"]), f"{name}: the date from git history, ISO"
    if record["source"].startswith("transcribed"):
        assert re.search(r"recorded in docs at commits? [0-9a-f]{7}", record["source"]), name
    else:
        assert record.get("raw"), f"{name}: a re-run keeps its output"
    for quote in record["quoted"]:
        assert quote["in"] in DOCS and quote.get("recorded_in"), (name, quote)
        assert ("text" in quote) != ("rows" in quote), (name, quote)
    if "ledger" in record:
        assert record["ledger"] in LEDGERS, name


def test_every_ledger_has_a_record_of_its_run():
    described = {record["ledger"] for record in RECORDS.values() if "ledger" in record}
    assert set(LEDGERS) <= described


# --- the files' figures are in the docs --------------------------------------------------------------------------

@pytest.mark.parametrize("name", sorted(RECORDS))
def test_every_quoted_text_is_in_the_docs_as_its_file_records_it(name):
    missing = [quote for doc, quote in quoted_texts(RECORDS[name]) if not occurrences(read(doc), quote)]
    assert not missing, f"{name}: the docs no longer say: {missing}"


@pytest.mark.parametrize("name", sorted(RECORDS))
def test_every_quoted_row_is_a_row_of_its_table_in_the_docs(name):
    for doc, header, row in quoted_rows(RECORDS[name]):
        found = [t for t in tables(read(doc)) if t.header == header]
        assert len(found) == 1, f"{name}: {doc} has {len(found)} tables headed {header}"
        assert row in found[0].rows, f"{name}: {doc}'s table {header} has no row {row}"


@pytest.mark.parametrize("name", sorted(LEDGERS))
def test_each_ledger_reprints_the_tables_the_docs_print_from_it(name):
    """The tables bench_from_scratch.py draws from the ledger's counters are, row for row, the docs' tables."""
    docs = {t.header: t.rows for t in tables(read(LEDGER_DOC))}
    for header, rows in ledger_tables(name).items():
        assert header in docs, f"{name}: {LEDGER_DOC} has no table {header}"
        assert sorted(docs[header]) == sorted(rows), f"{name}: {header}"


def test_the_training_tables_are_each_runs_summary_in_its_ledger():
    for name, record in RECORDS.items():
        if "training_table" not in record:
            continue
        drafters = LEDGERS[record["ledger"]]["drafters"]
        top1 = {n: " / ".join(d["trained"].rsplit("top-1 by depth ", 1)[1].split())
                for n, d in drafters.items() if "trained" in d}
        seeds = sorted({n.rsplit(" ", 1)[1] for n in top1})
        expected = [[s, top1[f"EAGLE-3 from scratch, seed {s}"], top1[f"EAGLE-3.1 from scratch, seed {s}"]]
                    for s in seeds]
        table = [t for t in tables(read(LEDGER_DOC)) if t.header == record["training_table"]]
        assert len(table) == 1 and table[0].rows == expected, name


def test_the_bundled_drafters_size_is_what_their_headers_hold():
    """The one figure the docs give for checked-in files is read again from them, as its record says."""
    from eaglekit.families import load_draft

    record = RECORDS["bundled-drafters.json"]
    quote = next(text for _, text in quoted_texts(record))
    for held in record["raw"]:
        spec = load_draft(os.path.join(ROOT, "examples", "drafters", held["path"]))
        assert (spec.num_parameters, spec.total_bytes) == (held["num_parameters"], held["total_bytes"])
        assert f"{spec.num_parameters / 1e6:.1f} M parameters" in quote
        assert f"{spec.total_bytes / 1e6:.0f} MB in bf16" in quote


# --- every figure in the docs is in a file ---------------------------------------------------------------------

@pytest.mark.parametrize("doc", DOCS)
def test_every_table_row_holding_a_figure_is_listed_by_exactly_one_result_file(doc, claims):
    text = read(doc)
    headers = [t.header for t in tables(text)]
    assert len(headers) == len(set(headers)), f"{doc}: two tables share a header; a file names a table by it"
    unlisted, twice = [], []
    for table in tables(text):
        listed = claims.get((doc, table.header), [])
        for row, line in zip(table.rows, table.lines):
            if not any(figures(cell) for cell in row):
                continue
            owners = [name for name, claimed in listed if claimed == row]
            (unlisted if not owners else twice if len(owners) > 1 else []).append(line[:100])
    assert not unlisted, f"{doc}: rows no file in bench/results lists: {unlisted}"
    assert not twice, f"{doc}: rows two files list: {twice}"


@pytest.mark.parametrize("doc", DOCS)
def test_every_figure_in_the_prose_lies_inside_a_text_a_result_file_quotes(doc):
    text = read(doc)
    spans = [span for record in RECORDS.values() for d, quote in quoted_texts(record) if d == doc
             for span in occurrences(text, quote)]
    loose = []
    for offset, piece in prose_spans(text):
        for match in figures(piece):
            start, end = offset + match.start(), offset + match.end()
            if not any(a <= start and end <= b for a, b in spans):
                loose.append(f"line {line_of(text, start)}: {match.group().strip()}")
    assert not loose, f"{doc}: figures no file in bench/results quotes: {loose}"


# --- what is not a measurement of today's code says so ----------------------------------------------------------

def _marks(doc: str, quote: dict) -> list[str]:
    """The text around a quote that must carry its mark: its paragraph or list item; for rows, the row or the
    paragraph that leads into the table."""
    text = read(doc)
    if "text" in quote:
        return [block_at(text, start) for start, _ in occurrences(text, quote["text"])]
    table = next(t for t in tables(text) if t.header == quote["table"])
    lead = block_at(text, len(text[:table.start].rstrip()) - 1)
    return [line + "\n" + lead for row, line in zip(table.rows, table.lines) if row in quote["rows"]]


@pytest.mark.parametrize("name", sorted(RECORDS))
def test_a_marked_figure_carries_its_mark_where_the_docs_print_it(name):
    """Figures measured before the finetune writer fix say so; eaglekit's predictions of an engine say so."""
    for quote in RECORDS[name]["quoted"]:
        for mark in quote.get("marked", []):
            for block in _marks(quote["in"], quote):
                assert mark.lower() in " ".join(block.lower().split()), f"{name}: '{mark}' missing around: {block}"
