"""Where stdout is not a terminal, inspect's panel and tables are laid out by eaglekit.cli.plain, not rich (rich's
import and layout cost more CPU than the rest of inspect): the characters printed must be rich's own, for any rows
at any width, and for inspect's real reports; a terminal, or anything forcing styles, still gets rich."""

from __future__ import annotations

import io
import os

import pytest
from hypothesis import given, reject, settings
from hypothesis import strategies as st
from rich.cells import cell_len, chop_cells
from rich.console import Console
from rich.panel import Panel
from rich.table import Table
from rich.text import Text

from eaglekit.cli import output, plain
from eaglekit.cli.inspect import render, render_other_method
from eaglekit.inspection import inspect_draft
from tests.support.factory import make_draft, make_target_config
from tests.support.method_drafts import write_method_draft

LETTERS = "abcdefgh-_/.:0123456789—…τ≤→"
WORDS = st.text(LETTERS + "   ", max_size=60)
CELLS = st.builds(lambda a, b, newline: f"{a}\n{b}" if newline else a + b, WORDS,
                  st.one_of(st.just(""), st.text("x", min_size=20, max_size=130)), st.booleans())
WIDTHS = st.integers(min_value=24, max_value=220)


def rich_print(renderable, width: int) -> str:
    """What the CLI's console prints where stdout is not a terminal, at `width`."""
    buffer = io.StringIO()
    Console(file=buffer, width=width, highlight=False, soft_wrap=False, markup=False, emoji=False).print(renderable)
    return buffer.getvalue()


def printed(lines: list[str]) -> str:
    return "".join(f"{line}\n" for line in lines)


@settings(max_examples=300, deadline=None)
@given(rows=st.lists(st.tuples(st.text(LETTERS + " ", min_size=1, max_size=18), CELLS), min_size=1, max_size=6),
       title=st.text(LETTERS + " ", min_size=1, max_size=100), width=WIDTHS)
def test_a_panel_of_key_value_rows_is_rich_s_own(rows, title, width):
    keys, values = [key for key, _ in rows], [value for _, value in rows]
    try:
        lines = plain.panel_lines(keys, values, title, width)
    except plain.Unfit:
        reject()
    table = output.key_value_table(list(rows))
    assert printed(lines) == rich_print(Panel(table, title=Text(title, style="bold"), expand=False), width)


@settings(max_examples=300, deadline=None)
@given(columns=st.lists(st.tuples(st.text(LETTERS + " ", min_size=1, max_size=20), st.booleans(),
                                  st.sampled_from(["ellipsis", "fold", "ignore"])), min_size=1, max_size=5),
       rows=st.lists(st.lists(CELLS, min_size=5, max_size=5), max_size=5),
       title=st.sampled_from(["", "Serving these files", "a title wider than a narrow table " * 3]), width=WIDTHS)
def test_a_table_is_rich_s_own(columns, rows, title, width):
    cells = [row[:len(columns)] for row in rows]
    laid = [plain.Column(header, [row[i] for row in cells], no_wrap=no_wrap, overflow=overflow)
            for i, (header, no_wrap, overflow) in enumerate(columns)]
    try:
        lines = plain.table_lines(title, laid, width)
    except plain.Unfit:
        reject()
    table = Table(title=title or None, title_justify="left")
    for header, no_wrap, overflow in columns:
        table.add_column(header, no_wrap=no_wrap, overflow=overflow)
    for row in cells:
        table.add_row(*row)
    assert printed(lines) == rich_print(table, width)


@pytest.fixture(scope="module")
def reports(tmp_path_factory):
    base = tmp_path_factory.mktemp("plain")
    target = make_target_config(str(base / "target"))
    drafts = {
        "specforge": make_draft(str(base / "specforge"), "specforge"),
        "vllm31": make_draft(str(base / "vllm31"), "vllm", fc_norm=True, norm_output=True),
        "kimi": make_draft(str(base / "kimi"), "kimi", attention="mla", draft_vocab=None, embed=True),
        "modelopt": make_draft(str(base / "modelopt"), "modelopt"),
        "a folder with a name far wider than the panel it titles, " * 2: make_draft(
            str(base / ("a folder with a name far wider than the panel it titles, " * 2)), "eagle"),
        "dflash": write_method_draft(str(base / "dflash"), "dflash-flat"),
    }
    return {name: inspect_draft(path, target=None if name == "modelopt" else target, include_tensors=True).to_dict()
            for name, path in drafts.items()}


def rendered(doc: dict, width: int, through_rich: bool, monkeypatch, capsys) -> tuple[str, bool]:
    """inspect's human output of `doc` at `width`, and whether rich printed any of it: laid out here where it can
    be, or all by rich (a console made first takes everything)."""
    monkeypatch.setenv("COLUMNS", str(width))
    monkeypatch.setattr(output, "_consoles", {})
    capsys.readouterr()
    if through_rich:
        output.console("out")
    (render if doc.get("eagle3_draft") is not False else render_other_method)(doc)
    return capsys.readouterr().out, "out" in output._consoles


@pytest.mark.parametrize("width", [40, 64, 80, 132, 200])
def test_inspect_prints_what_rich_prints(reports, width, monkeypatch, capsys):
    for name, doc in reports.items():
        text, used_rich = rendered(doc, width, False, monkeypatch, capsys)
        assert not used_rich, name
        assert text == rendered(doc, width, True, monkeypatch, capsys)[0], name


def test_a_name_of_wide_characters_is_left_to_rich(reports, monkeypatch, capsys):
    doc = {**reports["specforge"], "path": "草稿/モデル"}
    text, used_rich = rendered(doc, 80, False, monkeypatch, capsys)
    assert used_rich and text == rendered(doc, 80, True, monkeypatch, capsys)[0]
    assert "╭" in text and "草稿/モデル" in text


@pytest.mark.parametrize("env", [{}, {"FORCE_COLOR": "1"}, {"FORCE_COLOR": ""}, {"TTY_COMPATIBLE": "1"},
                                 {"TTY_COMPATIBLE": "0"}, {"TTY_COMPATIBLE": "0", "FORCE_COLOR": "1"}])
@pytest.mark.parametrize("terminal", [False, True])
def test_styles_are_off_exactly_where_rich_prints_none(monkeypatch, env, terminal):
    for name in ("FORCE_COLOR", "TTY_COMPATIBLE"):
        monkeypatch.delenv(name, raising=False)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    reader, writer = os.openpty() if terminal else os.pipe()
    with open(writer, "w", encoding="utf-8") as stream:
        assert plain.styles_off(stream) == (not Console(file=stream).is_terminal)
    os.close(reader)


def test_a_stream_that_is_not_utf8_is_left_to_rich():
    stream = io.TextIOWrapper(io.BytesIO(), encoding="latin-1")
    assert not Console(file=stream).is_terminal and not plain.styles_off(stream)


@pytest.mark.parametrize("columns", [None, "100", "37", "wide"])
def test_the_width_is_the_one_rich_takes(monkeypatch, columns):
    if columns is None:
        monkeypatch.delenv("COLUMNS", raising=False)
    else:
        monkeypatch.setenv("COLUMNS", columns)
    assert plain.screen_width() == Console().width


def test_every_character_laid_out_is_one_cell_wide_in_rich():
    for character in plain.ONE_CELL:
        assert cell_len(character) == 1 and cell_len(f"a{character}b") == 3, hex(ord(character))
        assert chop_cells(f"ab{character}cd", 2) == ["ab", f"{character}c", "d"], hex(ord(character))
    assert not plain.one_cell(["tab\there"]) and not plain.one_cell(["e\u0301"]) and plain.one_cell(["a\nb"])
