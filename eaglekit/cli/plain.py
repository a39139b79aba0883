"""inspect's panel and tables as plain text, without rich, where rich itself would print plain text.

Importing rich and laying a table out with it cost more CPU than everything else `eaglekit inspect` does
(bench/bench_inspect_cpu.py). Where stdout is not a terminal (a pipe, a file, a CI log) rich prints no styles, only
characters, and these functions print the same characters: the rounded panel of key/value rows, the heavy-headed
tables, cells wrapped at spaces, a word wider than its column folded or cut with "…", the same column widths at
every screen width. tests/cli/test_plain_tables.py holds them to rich's own output.

They lay out text whose every character is one cell wide (`one_cell`); other text (wide or combining characters,
from a name in a hostile file, say) and terminals are left to rich.
"""

from __future__ import annotations

import builtins
import os
import re
import sys
from collections.abc import Sequence
from typing import TextIO

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


class Unfit(Exception):
    """A layout left to rich: some text would get less than one cell of width (a screen far too narrow)."""


def styles_off(stream: TextIO | None) -> bool:
    """Whether rich would print to `stream` without any style, in the boxes drawn here: not a terminal and nothing
    forcing one (TTY_COMPATIBLE, FORCE_COLOR), UTF-8 (else rich draws ASCII boxes), not Windows (whose console
    rich narrows by a column), not inside IPython (where rich renders for the notebook)."""
    if stream is None or sys.platform == "win32" or hasattr(builtins, "get_ipython"):
        return False
    forced = os.environ.get("TTY_COMPATIBLE", "")
    if forced in ("0", "1"):
        terminal = forced == "1"
    elif os.environ.get("FORCE_COLOR") is not None:
        terminal = os.environ["FORCE_COLOR"] != ""
    else:
        try:
            terminal = stream.isatty()
        except (AttributeError, ValueError):  # no isatty, or a closed stream: rich takes either for no terminal
            terminal = False
    encoding = (getattr(stream, "encoding", None) or "utf-8").lower()
    return not terminal and encoding.startswith("utf")


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


def divide(line: str, width: int, fold: bool) -> list[str]:
    """A line cut into pieces at most `width` wide, at the start of a word; a word wider than a line is folded
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
    return [line[a:b] for a, b in zip([0, *breaks], [*breaks, len(line)])]


def truncate(text: str, width: int, overflow: str, pad: bool = False) -> str:
    """`text` cut to `width` (its last cell an ellipsis under "ellipsis"), or padded with spaces to it (`pad`)."""
    if overflow != IGNORE and len(text) > width:
        return text[:max(width - 1, 0)] + "…" if overflow == ELLIPSIS else text[:width]
    return text + " " * (width - len(text)) if pad else text


def wrap(text: str, width: int, overflow: str = FOLD, *, no_wrap: bool = False, pad: bool = False) -> list[str]:
    """`text`'s lines wrapped within `width`: pieces of each line, the spaces that spill past the width dropped,
    then cut to the width (padded to it with `pad`, as a left-justified cell is)."""
    if width < 1:
        raise Unfit(width)
    lines = []
    for line in text.split(NEWLINE):
        for piece in [line] if no_wrap or overflow == IGNORE else divide(line, width, overflow == FOLD):
            if len(piece) > width and (space := _TRAILING_SPACE.search(piece)):
                piece = piece[:len(piece) - min(len(space.group(0)), len(piece) - width)]
            lines.append(truncate(truncate(piece, width, overflow, pad), width, overflow))
    return lines


def fit(line: str, width: int) -> str:
    """A rendered line cut or padded to exactly `width` cells."""
    return line[:width] if len(line) > width else line + " " * (width - len(line))


class Column:
    """One column of a table: its header, its cells, whether they may wrap, and the padding beside them."""

    def __init__(self, header: str, cells: list[str], *, no_wrap: bool = False, overflow: str = ELLIPSIS,
                 pad: tuple[int, int] = (1, 1)) -> None:
        self.header, self.cells, self.no_wrap, self.overflow = header, cells, no_wrap, overflow
        self.left, self.right = pad

    def measure(self, width: int, with_header: bool) -> tuple[int, int]:
        """(narrowest, widest) the column can be within `width`: its longest word and its longest line, padded."""
        if width < 1:
            return 0, 0
        ranges = [measure_cell(cell, self.left, self.right, width)
                  for cell in ([self.header] if with_header else []) + self.cells]
        low = max((r[0] for r in ranges), default=1)
        high = max((r[1] for r in ranges), default=width)
        return min(low, width), min(high, width)

    def render(self, cell: str, width: int) -> list[str]:
        """A cell's lines at the column's `width`: wrapped within the padding, each exactly `width` wide."""
        inner = width - self.left - self.right
        lines = wrap(cell, inner, self.overflow, no_wrap=self.no_wrap, pad=True)
        return [" " * self.left + fit(line, inner) + " " * self.right for line in lines]


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


def grid_lines(columns: list[Column], width: int) -> list[str]:
    """Borderless, headerless rows (a panel's key/value rows) within `width`."""
    widths = column_widths(columns, width, with_header=False)
    return [line for row in zip(*(c.cells for c in columns)) for line in _row_lines(columns, row, widths, "top", "")]


def _row_lines(columns: list[Column], row: Sequence[str], widths: list[int], align: str, divider: str) -> list[str]:
    """One row's lines: each cell rendered at its column's width, the shorter ones filled with blank lines at the
    bottom (`align` "top") or the top ("bottom")."""
    cells = [column.render(cell, w) for column, cell, w in zip(columns, row, widths)]
    height = max(len(lines) for lines in cells)
    shaped = []
    for lines, w in zip(cells, widths):
        blank = [" " * w] * (height - len(lines))
        shaped.append(lines + blank if align == "top" else blank + lines)
    return [divider.join(parts) for parts in zip(*shaped)]


def panel_lines(keys: list[str], values: list[str], title: str, width: int) -> list[str]:
    """The rounded panel rich draws around key/value rows (keys unwrapped, values folded) under a centred title,
    as narrow as its content allows within `width`."""
    columns = [Column("", keys, no_wrap=True, pad=(0, 1)), Column("", values, overflow=FOLD, pad=(1, 0))]
    inner = width - 2
    if inner - 2 < 1:
        raise Unfit(width)
    child = min(_grid_width(columns, inner) + 2, inner)
    heading = f" {title.replace(NEWLINE, ' ')} "
    child = min(width - 2, max(child, len(heading) + 2))
    outer = child + 2
    left, fill, right, side, bottom_left, bottom_right = PANEL
    if outer <= 4:
        raise Unfit(width)
    heading = heading[:outer - 4]
    spare = outer - 4 - len(heading)
    top = left + fill + fill * (spare // 2) + heading + fill * (spare - spare // 2) + fill + right
    body = [side + " " + fit(line, child - 2) + " " + side for line in grid_lines(columns, child - 2)]
    return [top, *body, bottom_left + fill * (outer - 2) + bottom_right]


def _grid_width(columns: list[Column], width: int) -> int:
    """How wide a borderless grid measures within `width`, as a panel sizes itself around it."""
    total = sum(column_widths(columns, width, with_header=False))
    return _measured(0, sum(column.measure(total, with_header=False)[1] for column in columns), width)[1]


def table_lines(title: str, columns: list[Column], width: int) -> list[str]:
    """A heavy-headed table within `width`: its title on top, left-justified over the table's width."""
    widths = column_widths(columns, width - len(columns) - 1, with_header=True)
    table_width = sum(widths) + len(columns) + 1
    lines = wrap(title, table_width, FOLD, pad=True) if title else []

    def rule(kind: str) -> str:
        left, fill, cross, right = HEAVY_HEAD[kind]
        return left + cross.join(fill * w for w in widths) + right

    lines.append(rule("top"))
    rows = [[c.header for c in columns], *zip(*(c.cells for c in columns))]
    for index, row in enumerate(rows):
        left, divider, right = HEAVY_HEAD["head" if index == 0 else "body"]
        lines += [left + line + right for line in _row_lines(columns, row, widths, "bottom" if index == 0 else "top",
                                                             divider)]
        if index == 0:
            lines.append(rule("rule"))
    lines.append(rule("bottom"))
    return [line[:width] for line in lines]
