"""inspect's panel and tables drawn without rich, byte for byte as rich would draw them.

Importing rich and laying a table out with it cost more CPU than everything else `eaglekit inspect` does
(bench/bench_inspect_cpu.py). These functions lay out the same characters: the rounded panel of key/value rows, the
heavy-headed tables, cells wrapped at spaces, a word wider than its column folded or cut with "…", the same column
widths at every screen width. Where stdout is a terminal they also write rich's styles: each run of text rich
renders as one styled segment (a span of a cell, a padded cell of a header, a line of a title) wrapped in the same
SGR codes, split where rich splits it. tests/cli/test_plain_tables.py holds them to rich's own output.

They lay out text whose every character is one cell wide (`one_cell`) in the styles `known_style` names; other
text (wide or combining characters, from a name in a hostile file, say), other styles and terminals whose output
rich shapes otherwise (Windows, notebooks, TERM=dumb) are left to rich.
"""

from __future__ import annotations

import builtins
import os
import re
import sys
from collections.abc import Iterable, Sequence
from typing import NamedTuple, TextIO

ONE_CELL = frozenset(
    [chr(c) for first, last in ((0x20, 0x7E), (0xA0, 0xAC), (0xAE, 0x2FF), (0x370, 0x482))
     for c in range(first, last + 1)] + list("‐‑‒–—―‘’‚“”„†‡•…‰′″‹›←↑→↓↔⇒∈∑−∓∕√∞∼≈≠≡≤≥⋯")
)
"""Characters every renderer (rich included) draws one cell wide, and that join no neighbour into one glyph."""
NEWLINE = "\n"
_WORD = re.compile(r"\s*\S+\s*")
_TRAILING_SPACE = re.compile(r"\s+$")
PANEL = tuple("╭─╮│╰╯")  # corners, top, sides and bottom of a rounded panel
HEAVY_HEAD = {kind: tuple(chars) for kind, chars in
              (("top", "┏━┳┓"), ("head", "┃┃┃"), ("rule", "┡━╇┩"), ("body", "│││"), ("bottom", "└─┴┘"))}
"""Left edge, fill or divider, and right edge of each line of a table (header row heavy, body light)."""
ELLIPSIS, FOLD, IGNORE = "ellipsis", "fold", "ignore"
HEADER_STYLE, TITLE_STYLE, PANEL_TITLE_STYLE = "bold", "italic", "bold"
"""rich's default theme: a table's header cells bold, its title italic; inspect's panel titles are bold."""
PLAIN, COLOUR, NO_COLOUR = "plain", "colour", "no colour"
"""How styles are written: not at all (not a terminal), with colours, or attributes only (NO_COLOR set)."""

ATTRIBUTES = {"bold": "1", "dim": "2", "italic": "3", "underline": "4", "reverse": "7", "strike": "9"}
"""Attribute names and their SGR codes, in the order rich writes them."""
COLOURS = {name: str(code) for base, prefix in ((30, ""), (90, "bright_"))
           for code, name in enumerate((prefix + colour for colour in
                                        ("black", "red", "green", "yellow", "blue", "magenta", "cyan", "white")),
                                       base)}
"""The sixteen standard colours: rich writes each with the same code under its standard, 256-colour and truecolor
systems, so the colour system a terminal has does not change these bytes."""


class Unfit(Exception):
    """A layout left to rich: some text would get less than one cell of width (a screen far too narrow)."""


class Marked(NamedTuple):
    """Text and its styled spans (start, end, style), as rich's Text holds them: spans never empty, in the order
    they were made, not overlapping."""

    plain: str
    spans: tuple[tuple[int, int, str], ...] = ()


Segment = tuple[str, str]
"""A run of text and its style ("" for none), as rich writes one: styled segments are never merged."""
Line = list[Segment]


def marked(parts: Iterable[str | tuple[str, str]]) -> Marked:
    """Text from plain strings and (text, style) pairs, as rich's Text.assemble builds it (a part without a style,
    or without text, gets no span)."""
    plain, spans = "", []
    for part in parts:
        text, style = (part, "") if isinstance(part, str) else part
        if text and style:
            spans.append((len(plain), len(plain) + len(text), style))
        plain += text
    return Marked(plain, tuple(spans))


def known_style(style: str) -> bool:
    """Whether `style` is one written here as rich writes it: attribute and standard colour names only."""
    return all(word in ATTRIBUTES or word in COLOURS for word in style.split())


def output_mode(stream: TextIO | None) -> str | None:
    """How rich would style what it prints to `stream` (PLAIN, COLOUR or NO_COLOUR), where these functions print
    exactly that: UTF-8 (else rich draws ASCII boxes), not Windows (whose console rich narrows by a column), not
    inside IPython or IDLE (where rich renders for them), not a terminal rich thinks dumb (TERM dumb or unknown,
    laid out at 80 columns). None: rich prints it. A terminal is one as rich decides it: TTY_COMPATIBLE, else
    FORCE_COLOR, else isatty()."""
    if (stream is None or sys.platform == "win32" or hasattr(builtins, "get_ipython")
            or getattr(sys.stdin, "__module__", "").startswith("idlelib")):
        return None
    encoding = (getattr(stream, "encoding", None) or "utf-8").lower()
    if not encoding.startswith("utf"):
        return None
    if not _is_terminal(stream):
        return PLAIN
    if os.environ.get("TERM", "").lower() in ("dumb", "unknown"):
        return None
    return NO_COLOUR if os.environ.get("NO_COLOR", "") != "" else COLOUR


def _is_terminal(stream: TextIO) -> bool:
    forced = os.environ.get("TTY_COMPATIBLE", "")
    if forced in ("0", "1"):
        return forced == "1"
    if os.environ.get("FORCE_COLOR") is not None:
        return os.environ["FORCE_COLOR"] != ""
    try:
        return stream.isatty()
    except (AttributeError, ValueError):  # no isatty, or a closed stream: rich takes either for no terminal
        return False


def sgr(style: str, mode: str) -> str:
    """The SGR parameters rich writes for `style` (attributes in rich's order, then the last colour named; no
    colour under NO_COLOUR)."""
    words = style.split()
    codes = [code for name, code in ATTRIBUTES.items() if name in words]
    colours = [COLOURS[word] for word in words if word in COLOURS]
    return ";".join(codes + colours[-1:] if mode == COLOUR else codes)


def painted(lines: Iterable[Line], mode: str) -> str:
    """Lines as printed: each styled segment in its SGR codes and a reset (none where `mode` is PLAIN)."""
    out = []
    for line in lines:
        for text, style in line:
            codes = sgr(style, mode) if style and text and mode != PLAIN else ""
            out.append(f"\x1b[{codes}m{text}\x1b[0m" if codes else text)
        out.append(NEWLINE)
    return "".join(out)


def screen_width() -> int:
    """The width rich gives a console it is not told one: COLUMNS, else the terminal's (of stdin, stdout or
    stderr, the first that is one), else 80."""
    width = 0
    for descriptor in (0, 1, 2):
        try:
            width = os.get_terminal_size(descriptor).columns
            break
        except (AttributeError, ValueError, OSError):
            continue
    columns = os.environ.get("COLUMNS")
    if columns is not None and columns.isdigit():
        width = int(columns)
    return width or 80


def one_cell(texts: Sequence[str]) -> bool:
    """Whether every character of `texts` is one that these functions lay out as rich does (newlines allowed)."""
    return all(ONE_CELL.issuperset(text.replace(NEWLINE, "")) for text in texts)


def clipped(spans: Iterable[tuple[int, int, str]], start: int, end: int) -> tuple[tuple[int, int, str], ...]:
    """The parts of `spans` within [start, end), counted from `start` (rich's Text.divide and crops)."""
    return tuple((max(s, start) - start, min(e, end) - start, style) for s, e, style in spans
                 if min(e, end) > max(s, start))


def segments(text: Marked) -> Line:
    """`text` cut where any span starts or ends, each piece in the styles of the spans over it (rich's
    Text.render): two spans of one style side by side stay two segments, as rich writes them."""
    if not text.spans:
        return [(text.plain, "")]
    events = sorted([(0, False, 0), (len(text.plain), True, 0),
                     *((s, False, i) for i, (s, _, _) in enumerate(text.spans, 1)),
                     *((e, True, i) for i, (_, e, _) in enumerate(text.spans, 1))], key=lambda event: event[:2])
    active: list[int] = []
    line = []
    for (offset, leaving, index), (following, _, _) in zip(events, events[1:]):
        if leaving:
            active.remove(index)
        else:
            active.append(index)
        if following > offset:
            line.append((text.plain[offset:following], " ".join(text.spans[i - 1][2] for i in sorted(active) if i)))
    return line


def divide(line: str, width: int, fold: bool) -> list[tuple[int, int]]:
    """A line's pieces (start, end) at most `width` wide, each starting a word; a word wider than a line is folded
    (`fold`) or left whole, to be cut."""
    breaks: list[int] = []
    offset = 0
    for match in _WORD.finditer(line):
        start, word = match.start(), match.group(0)
        length = len(word.rstrip())
        if width - offset >= length:
            offset += len(word)
        elif length > width:
            if fold:
                chunks = [word[i:i + width] for i in range(0, len(word), width)]
                for chunk in chunks[:-1]:
                    if start:
                        breaks.append(start)
                    start += len(chunk)
                if start:
                    breaks.append(start)
                offset = len(chunks[-1])
            else:
                if start:
                    breaks.append(start)
                offset = len(word)
        elif offset and start:
            breaks.append(start)
            offset = len(word)
    return list(zip([0, *breaks], [*breaks, len(line)]))


def truncate(text: Marked, width: int, overflow: str, pad: bool = False) -> Marked:
    """`text` cut to `width` (its last cell an ellipsis under "ellipsis", styled as the cell it replaces), or padded
    with unstyled spaces to it (`pad`); under "ignore" left as it is, unpadded."""
    if overflow == IGNORE:
        return text
    if len(text.plain) > width:
        cut = text.plain[:max(width - 1, 0)] + "…" if overflow == ELLIPSIS else text.plain[:width]
        return Marked(cut, clipped(text.spans, 0, len(cut)))
    return Marked(text.plain + " " * (width - len(text.plain)), text.spans) if pad else text


def wrap(text: str | Marked, width: int, overflow: str = FOLD, *, no_wrap: bool = False,
         pad: bool = False) -> list[Marked]:
    """`text`'s lines wrapped within `width`: pieces of each line, the spaces that spill past the width dropped,
    then cut to the width (padded to it with `pad`, as a left-justified cell is); a line not wrapped (`no_wrap`,
    "ignore") is only cut, its spaces kept."""
    if width < 1:
        raise Unfit(width)
    text = Marked(text) if isinstance(text, str) else text
    lines, start = [], 0
    for line in text.plain.split(NEWLINE):
        spans = clipped(text.spans, start, start + len(line))
        start += len(line) + 1
        whole = no_wrap or overflow == IGNORE
        for a, b in [(0, len(line))] if whole else divide(line, width, overflow == FOLD):
            if not whole and b - a > width and (space := _TRAILING_SPACE.search(line, a, b)):
                b -= min(b - space.start(), b - a - width)
            lines.append(truncate(Marked(line[a:b], clipped(spans, a, b)), width, overflow, pad))
    return lines


def fit(line: Line, width: int) -> Line:
    """A line cut, or padded with a segment of unstyled spaces, to exactly `width` cells."""
    length = sum(len(text) for text, _ in line)
    if length < width:
        return [*line, (" " * (width - length), "")]
    fitted: Line = []
    for text, text_style in line:
        if width <= 0:
            break
        fitted.append((text[:width], text_style))
        width -= len(text)
    return fitted


def styled_as(line: Line, style: str) -> Line:
    """Each segment of `line` under `style` too (rich's apply_style)."""
    return [(text, f"{style} {own}".strip()) for text, own in line] if style else line


class Column:
    """One column of a table: its header, its cells, whether they may wrap, the padding beside them, and the style
    its cells are drawn in."""

    def __init__(self, header: str, cells: Sequence[str | Marked], *, no_wrap: bool = False,
                 overflow: str = ELLIPSIS, pad: tuple[int, int] = (1, 1), style: str = "") -> None:
        self.header, self.no_wrap, self.overflow, self.style = Marked(header), no_wrap, overflow, style
        self.cells = [Marked(cell) if isinstance(cell, str) else cell for cell in cells]
        self.left, self.right = pad

    def measure(self, width: int, with_header: bool) -> tuple[int, int]:
        """(narrowest, widest) the column can be within `width`: its longest word and its longest line, padded."""
        if width < 1:
            return 0, 0
        ranges = [measure_cell(cell.plain, self.left, self.right, width)
                  for cell in ([self.header] if with_header else []) + self.cells]
        low = max((r[0] for r in ranges), default=1)
        high = max((r[1] for r in ranges), default=width)
        return min(low, width), min(high, width)

    def render(self, cell: Marked, width: int, style: str) -> list[Line]:
        """A cell's lines at the column's `width`, in `style`: wrapped within the padding, each exactly `width`
        wide (rich's Padding around the cell's text)."""
        inner = width - self.left - self.right
        left: Line = [(" " * self.left, "")] if self.left else []
        right: Line = [(" " * self.right, "")] if self.right else []
        return [styled_as(left + fit(segments(line), inner) + right, style)
                for line in wrap(cell, inner, self.overflow, no_wrap=self.no_wrap, pad=True)]


def measure_cell(text: str, left: int, right: int, width: int) -> tuple[int, int]:
    """(narrowest, widest) a padded cell can be within `width`: its longest word and its longest line."""
    if width < 1:
        return 0, 0
    if width - left - right < 1:
        return _measured(width, width, width)
    lines = text.splitlines()
    high = max((len(line) for line in lines), default=0)
    low, high = _measured(max((len(word) for word in text.split()), default=high), high, width)
    return _measured(min(low + left + right, width), min(high + left + right, width), width)


def _measured(low: int, high: int, width: int) -> tuple[int, int]:
    """A (narrowest, widest) range made consistent and capped at `width`; nothing at all if under one cell."""
    low = max(0, min(max(0, low), high))
    low, high = min(low, width), min(max(0, low, high), width)
    return (0, 0) if high < 1 else (min(low, high), high)


def column_widths(columns: list[Column], width: int, with_header: bool) -> list[int]:
    """Each column's width within `width` (borders excluded): as wide as its content, else the widest wrapping
    columns narrowed first, else every column evenly."""
    widths = [column.measure(width, with_header)[1] or 1 for column in columns]
    if sum(widths) > width:
        widths = _narrow_widest(widths, [not c.no_wrap for c in columns], width)
        if sum(widths) > width:
            widths = reduce_by_ratio(sum(widths) - width, [1] * len(widths), widths, widths)
        widths = [column.measure(w, with_header)[1] or 0 for column, w in zip(columns, widths)]
    return widths


def _narrow_widest(widths: list[int], wrapping: list[bool], width: int) -> list[int]:
    """Narrow the widest wrapping columns toward the next widest until the total fits (or none can narrow)."""
    excess = sum(widths) - width
    while any(wrapping) and sum(widths) != 0 and excess > 0:
        widest = max(w for w, can in zip(widths, wrapping) if can)
        next_widest = max(w if can and w != widest else 0 for w, can in zip(widths, wrapping))
        ratios = [1 if w == widest and can else 0 for w, can in zip(widths, wrapping)]
        if not any(ratios) or widest == next_widest:
            break
        widths = reduce_by_ratio(excess, ratios, [min(excess, widest - next_widest)] * len(widths), widths)
        excess = sum(widths) - width
    return widths


def reduce_by_ratio(total: int, ratios: list[int], maximums: list[int], values: list[int]) -> list[int]:
    """`values` less `total` shared out by `ratios`, no slot losing more than its maximum (rounded as Python
    rounds, half to even)."""
    ratios = [ratio if most else 0 for ratio, most in zip(ratios, maximums)]
    remaining_ratio, remaining, result = sum(ratios), total, []
    for ratio, most, value in zip(ratios, maximums, values):
        if ratio and remaining_ratio > 0:
            taken = min(most, round(ratio * remaining / remaining_ratio))
            result.append(value - taken)
            remaining -= taken
            remaining_ratio -= ratio
        else:
            result.append(value)
    return result


def grid_lines(columns: list[Column], width: int) -> list[Line]:
    """Borderless, headerless rows (a panel's key/value rows) within `width`."""
    widths = column_widths(columns, width, with_header=False)
    return [line for row in zip(*(c.cells for c in columns)) for line in _row_lines(columns, row, widths, False, "")]


def _row_lines(columns: list[Column], row: Sequence[Marked], widths: list[int], header: bool,
               divider: str) -> list[Line]:
    """One row's lines: each cell rendered at its column's width (a header's in HEADER_STYLE), the shorter ones
    filled with blank lines in the cell's style at the bottom, or at the top for a header."""
    styles = [HEADER_STYLE if header else column.style for column in columns]
    cells = [column.render(cell, w, style) for column, cell, w, style in zip(columns, row, widths, styles)]
    height = max(len(lines) for lines in cells)
    shaped = []
    for lines, w, style in zip(cells, widths, styles):
        blank: list[Line] = [[(" " * w, style)]] * (height - len(lines))
        shaped.append(blank + lines if header else lines + blank)
    joined = []
    for parts in zip(*shaped):
        line: Line = []
        for index, part in enumerate(parts):
            line += ([(divider, "")] if index and divider else []) + part
        joined.append(line)
    return joined


def panel_lines(keys: list[str], values: Sequence[str | Marked], title: str, width: int) -> list[Line]:
    """The rounded panel rich draws around key/value rows (keys bold and unwrapped, values folded) under a centred
    bold title, as narrow as its content allows within `width`."""
    columns = [Column("", keys, no_wrap=True, pad=(0, 1), style="bold"), Column("", values, overflow=FOLD, pad=(1, 0))]
    inner = width - 2
    if inner - 2 < 1:
        raise Unfit(width)
    child = min(_grid_width(columns, inner) + 2, inner)
    name = title.replace(NEWLINE, " ")
    heading = Marked(f" {name} ", ((1, 1 + len(name), PANEL_TITLE_STYLE),) if name else ())
    child = min(width - 2, max(child, len(heading.plain) + 2))
    outer = child + 2
    left, fill, right, side, bottom_left, bottom_right = PANEL
    if outer <= 4:
        raise Unfit(width)
    heading = truncate(heading, outer - 4, FOLD)
    spare = outer - 4 - len(heading.plain)
    top = [(left + fill + fill * (spare // 2), ""), *segments(heading),
           (fill * (spare - spare // 2) + fill + right, "")]
    body = [[(side + " ", ""), *fit(line, child - 2), (" " + side, "")] for line in grid_lines(columns, child - 2)]
    return [top, *body, [(bottom_left + fill * (outer - 2) + bottom_right, "")]]


def _grid_width(columns: list[Column], width: int) -> int:
    """How wide a borderless grid measures within `width`, as a panel sizes itself around it."""
    total = sum(column_widths(columns, width, with_header=False))
    return _measured(0, sum(column.measure(total, with_header=False)[1] for column in columns), width)[1]


def table_lines(title: str, columns: list[Column], width: int) -> list[Line]:
    """A heavy-headed table within `width`: its title on top, left-justified over the table's width, in
    TITLE_STYLE line by line."""
    widths = column_widths(columns, width - len(columns) - 1, with_header=True)
    table_width = sum(widths) + len(columns) + 1
    lines: list[Line] = [[(line.plain, TITLE_STYLE)] for line in wrap(title, table_width, FOLD, pad=True)] \
        if title else []

    def rule(kind: str) -> Line:
        left, fill, cross, right = HEAVY_HEAD[kind]
        return [(left + cross.join(fill * w for w in widths) + right, "")]

    lines.append(rule("top"))
    rows = [[c.header for c in columns], *zip(*(c.cells for c in columns))]
    for index, row in enumerate(rows):
        left, divider, right = HEAVY_HEAD["head" if index == 0 else "body"]
        lines += [[(left, ""), *line, (right, "")] for line in _row_lines(columns, row, widths, index == 0, divider)]
        if index == 0:
            lines.append(rule("rule"))
    lines.append(rule("bottom"))
    return [fit(line, width) if sum(len(text) for text, _ in line) > width else line for line in lines]
