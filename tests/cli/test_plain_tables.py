"""inspect's panel and tables are drawn by eaglekit.cli.plain, not rich (rich's import and layout cost more CPU
than the rest of inspect): the bytes printed must be rich's own, for any rows at any width and for inspect's real
reports, with no styles where stdout is not a terminal and rich's SGR codes where it is (each colour system, and
NO_COLOR); what plain cannot draw as rich does is still left to rich."""

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
STYLES = st.sampled_from(["", "", "bold", "dim", "italic", "red", "bold red", "yellow", "bold yellow", "green",
                          "cyan", "dim green", "underline bright_blue"])
PARTS = st.lists(st.tuples(st.one_of(WORDS, st.text("x", min_size=20, max_size=130), st.just("\n"),
                                     st.text("ab \n", max_size=12)), STYLES), min_size=1, max_size=5)
"""A cell as inspect makes one: plain and styled parts (output.Styled), a word wider than a column, a newline."""
WIDTHS = st.integers(min_value=24, max_value=220)
MODES = {
    "not a terminal": (plain.PLAIN, None),
    "standard colours": (plain.COLOUR, "standard"),
    "256 colours": (plain.COLOUR, "256"),
    "truecolor": (plain.COLOUR, "truecolor"),
    "NO_COLOR": (plain.NO_COLOUR, "truecolor"),
}
"""Each way rich writes inspect's output, as (plain's mode, the colour system rich is given)."""


def rich_print(renderable, width: int, mode: str = plain.PLAIN, color_system: str | None = None,
               soft_wrap: bool = False) -> str:
    """What the CLI's console prints at `width`: not a terminal (PLAIN), or a terminal of `color_system`."""
    buffer = io.StringIO()
    terminal = mode != plain.PLAIN
    Console(file=buffer, width=width, highlight=False, soft_wrap=False, markup=False, emoji=False,
            force_terminal=terminal, color_system=color_system if terminal else None,  # type: ignore[arg-type]
            no_color=mode == plain.NO_COLOUR).print(renderable, soft_wrap=soft_wrap)
    return buffer.getvalue()


@pytest.mark.parametrize("mode", MODES)
@settings(max_examples=150, deadline=None)
@given(rows=st.lists(st.tuples(st.text(LETTERS + " ", min_size=1, max_size=18), PARTS), min_size=1, max_size=6),
       title=st.text(LETTERS + " \n", min_size=1, max_size=100), width=WIDTHS)
def test_a_panel_of_key_value_rows_is_rich_s_own(mode, rows, title, width):
    keys, values = [key for key, _ in rows], [plain.marked(parts) for _, parts in rows]
    try:
        lines = plain.panel_lines(keys, values, title, width)
    except plain.Unfit:
        reject()
    table = output.key_value_table([(key, output.Styled(*parts)) for key, parts in rows])
    panel = Panel(table, title=output.styled((title, "bold")), expand=False)
    assert plain.painted(lines, MODES[mode][0]) == rich_print(panel, width, *MODES[mode])


@pytest.mark.parametrize("mode", MODES)
@settings(max_examples=150, deadline=None)
@given(columns=st.lists(st.tuples(st.text(LETTERS + " ", min_size=1, max_size=20), st.booleans(),
                                  st.sampled_from(["ellipsis", "fold", "ignore"])), min_size=1, max_size=5),
       rows=st.lists(st.lists(PARTS, min_size=5, max_size=5), max_size=5),
       title=st.sampled_from(["", "Serving these files", "a title wider than a narrow table " * 3]), width=WIDTHS)
def test_a_table_is_rich_s_own(mode, columns, rows, title, width):
    cells = [row[:len(columns)] for row in rows]
    laid = [plain.Column(header, [plain.marked(row[i]) for row in cells], no_wrap=no_wrap, overflow=overflow)
            for i, (header, no_wrap, overflow) in enumerate(columns)]
    try:
        lines = plain.table_lines(title, laid, width)
    except plain.Unfit:
        reject()
    table = Table(title=title or None, title_justify="left")
    for header, no_wrap, overflow in columns:
        table.add_column(header, no_wrap=no_wrap, overflow=overflow)
    for row in cells:
        table.add_row(*[output.styled(*parts) for parts in row])
    assert plain.painted(lines, MODES[mode][0]) == rich_print(table, width, *MODES[mode])


@pytest.mark.parametrize("mode", MODES)
@settings(max_examples=150, deadline=None)
@given(parts=PARTS, width=WIDTHS, wraps=st.booleans())
def test_a_line_of_text_is_rich_s_own(mode, parts, width, wraps):
    lines = plain.wrap(plain.marked(parts), width, plain.FOLD if wraps else plain.IGNORE)
    expected = rich_print(output.styled(*parts), width, *MODES[mode], soft_wrap=not wraps)
    assert plain.painted(map(plain.segments, lines), MODES[mode][0]) == expected


@pytest.mark.parametrize("mode", [plain.COLOUR, plain.NO_COLOUR])
@pytest.mark.parametrize("color_system", ["standard", "256", "truecolor"])
def test_every_style_written_is_written_as_rich_writes_it(mode, color_system):
    names = [*plain.ATTRIBUTES, *plain.COLOURS]
    for style in [*names, *(f"{a} {b}" for a in plain.ATTRIBUTES for b in names), "red bold green dim"]:
        assert plain.known_style(style)
        expected = rich_print(Text("x", style=style), 10, mode, color_system)
        assert plain.painted([[("x", style)]], mode) == expected, style
    assert not plain.known_style("on red") and not plain.known_style("#ff0000") and not plain.known_style("blink")


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


TERMINALS = {
    "not a terminal": ({}, None),
    "standard colours": ({"FORCE_COLOR": "1", "TERM": "xterm"}, "standard"),
    "256 colours": ({"FORCE_COLOR": "1", "TERM": "xterm-256color"}, "256"),
    "truecolor": ({"FORCE_COLOR": "1", "TERM": "xterm-256color", "COLORTERM": "truecolor"}, "truecolor"),
    "NO_COLOR": ({"FORCE_COLOR": "1", "TERM": "xterm-256color", "NO_COLOR": "1"}, "256"),
}
"""Each way stdout reaches a user, by the environment rich reads (FORCE_COLOR: a terminal as rich takes one), and
the colour system rich's console finds there."""
STYLE_VARIABLES = ("FORCE_COLOR", "TTY_COMPATIBLE", "TERM", "COLORTERM", "NO_COLOR")


def rendered(doc: dict, width: int, through_rich: bool, monkeypatch, capsys) -> tuple[str, bool]:
    """inspect's human output of `doc` at `width`, and whether rich printed any of it: drawn by plain where it can
    be, or all by rich (a console made first takes everything)."""
    monkeypatch.setenv("COLUMNS", str(width))
    monkeypatch.setattr(output, "_consoles", {})
    capsys.readouterr()
    if through_rich:
        output.console("out")
    (render if doc.get("eagle3_draft") is not False else render_other_method)(doc)
    return capsys.readouterr().out, "out" in output._consoles


@pytest.mark.parametrize("terminal", TERMINALS)
@pytest.mark.parametrize("width", [40, 64, 80, 132, 200])
def test_inspect_prints_what_rich_prints(reports, width, terminal, monkeypatch, capsys):
    environment, color_system = TERMINALS[terminal]
    for name in STYLE_VARIABLES:
        monkeypatch.delenv(name, raising=False)
    for name, value in environment.items():
        monkeypatch.setenv(name, value)
    for name, doc in reports.items():
        text, used_rich = rendered(doc, width, False, monkeypatch, capsys)
        assert not used_rich, name
        assert text == rendered(doc, width, True, monkeypatch, capsys)[0], name
        assert str(output.console("out").color_system) == str(color_system)
        assert ("\x1b[1m" in text) == (color_system is not None), name
        assert ("\x1b[31m" in text) == (terminal not in ("not a terminal", "NO_COLOR") and name != "dflash"), name


def test_a_name_of_wide_characters_is_left_to_rich(reports, monkeypatch, capsys):
    doc = {**reports["specforge"], "path": "草稿/モデル"}
    text, used_rich = rendered(doc, 80, False, monkeypatch, capsys)
    assert used_rich and text == rendered(doc, 80, True, monkeypatch, capsys)[0]
    assert "╭" in text and "草稿/モデル" in text


def test_a_style_plain_does_not_write_is_left_to_rich(monkeypatch, capsys):
    for name in STYLE_VARIABLES:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("FORCE_COLOR", "1")
    monkeypatch.setattr(output, "_consoles", {})
    capsys.readouterr()
    output.print_text(output.Styled(("on a blue ground", "white on blue")))
    assert "out" in output._consoles and "\x1b[37;44mon a blue ground" in capsys.readouterr().out


ENVIRONMENTS = [{}, {"FORCE_COLOR": "1"}, {"FORCE_COLOR": ""}, {"TTY_COMPATIBLE": "1"}, {"TTY_COMPATIBLE": "0"},
                {"TTY_COMPATIBLE": "0", "FORCE_COLOR": "1"}, {"TERM": "xterm-256color"}, {"TERM": "xterm-kitty"},
                {"TERM": "dumb"}, {"TERM": "UNKNOWN", "FORCE_COLOR": "1"}, {"COLORTERM": "24bit", "TERM": "vt100"},
                {"NO_COLOR": "1"}, {"NO_COLOR": ""}, {"NO_COLOR": "1", "TERM": "dumb"}]


@pytest.mark.parametrize("env", ENVIRONMENTS)
@pytest.mark.parametrize("terminal", [False, True])
def test_plain_draws_exactly_where_rich_styles_as_it_does(monkeypatch, env, terminal):
    """Not a terminal to rich: no styles. A terminal with a colour system: styles, with colours unless NO_COLOR.
    A terminal rich thinks dumb (no colour system, 80 columns whatever COLUMNS says): left to rich."""
    for name in STYLE_VARIABLES:
        monkeypatch.delenv(name, raising=False)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    reader, writer = os.openpty() if terminal else os.pipe()
    with open(writer, "w", encoding="utf-8") as stream:
        console = Console(file=stream)
        expected = (plain.PLAIN if not console.is_terminal else None if console.color_system is None
                    else plain.NO_COLOUR if console.no_color else plain.COLOUR)
        assert plain.output_mode(stream) == expected
    os.close(reader)


def test_a_stream_that_is_not_utf8_is_left_to_rich():
    stream = io.TextIOWrapper(io.BytesIO(), encoding="latin-1")
    assert not Console(file=stream).is_terminal and plain.output_mode(stream) is None


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
