"""A report table (kvprobe.report.tables.TableData) laid out for the terminal in the width it is printed at,
without cutting a figure.

A cell wraps only between words (kvprobe.report.wrap: an interval like `[0.94, 1.04]` is one word), so a
column is never narrower than its longest word. When the table does not fit at its natural widths, its
free-text columns (TableData.prose: a decision's reason, a platform) go under it, one entry per row; when
the rest still does not fit, the columns that do not fit continue in a second table under the first,
repeating the row's key columns (TableData.keys). Nothing is dropped and nothing is folded.

Drawn as plain lines (a header, a rule under each column, the rows), not with rich's Table: rich narrows an
overflowing table by folding cells mid-word, which is how `1,048,576` came out as `1,048,57` / `6`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from rich.console import Console, ConsoleOptions, RenderResult
from rich.text import Text

from kvprobe.report.wrap import longest, wrap

if TYPE_CHECKING:
    from kvprobe.report.tables import TableData

GAP = 2  # spaces between columns
RULE = "─"
# A free-text column narrower than this reads as a column of single words: it goes under the table.
PROSE_MIN = 32
CONTINUED = " (continued)"
# The width a column is packed at (or its natural width, when narrower); a key column a little wider.
SNUG, SNUG_KEY = 12, 24


@dataclass
class Column:
    index: int  # in TableData.headers
    natural: int  # its widest cell or header, on one line
    least: int  # its longest word: it is never narrower


def _columns(data: TableData, width: int) -> list[Column]:
    cols = []
    for i, header in enumerate(data.headers):
        texts = [header, *(row[i] for row in data.rows)]
        cols.append(Column(i, max(len(t) for t in texts), max(longest(t) for t in texts)))
    keys = cols[:data.keys]
    # Key columns stay on one line, unless they would take half the width between them.
    if sum(c.natural for c in keys) + GAP * len(keys) <= width // 2:
        for c in keys:
            c.least = c.natural
    return cols


def _total(cols: list[Column], widths: dict[int, int]) -> int:
    return sum(widths[c.index] for c in cols) + GAP * (len(cols) - 1)


def _fill(cols: list[Column], width: int) -> dict[int, int]:
    """Widths for one table: every column at its least, then the room left given out, first to the columns
    closest to their natural width (each one made whole is a column of single lines)."""
    widths = {c.index: c.least for c in cols}
    room = width - _total(cols, widths)
    for c in sorted(cols, key=lambda c: c.natural - c.least):
        if room <= 0:
            break
        more = min(room, c.natural - widths[c.index])
        widths[c.index] += more
        room -= more
    return widths


def _parts(data: TableData, width: int) -> tuple[list[dict[int, int]], list[Column]]:
    """The tables to draw (each: column index -> width, in column order) and the free-text columns that go
    under them."""
    cols = _columns(data, width)
    natural = {c.index: c.natural for c in cols}
    if _total(cols, natural) <= width:
        return [natural], []
    keys, rest = cols[:data.keys], cols[data.keys:]
    prose = [c for c in rest if data.headers[c.index] in data.prose]
    others = [c for c in rest if c not in prose]
    # A free-text column stays in only when everything else fits whole beside it with room to read it.
    kept = keys + others
    room = (width - _total(kept, natural) - GAP * len(prose)) // max(len(prose), 1)
    if prose and all(room >= max(PROSE_MIN, c.least) for c in prose):
        return [{c.index: min(c.natural, room) if c in prose else c.natural for c in cols}], []
    # Packed at a snug width, not the least: a column squeezed to its longest word makes every row as tall as
    # its tallest cell (a check's name over four lines), where one more table under this one costs a header.
    snug = {c.index: min(c.natural, max(c.least, SNUG_KEY if c in keys else SNUG)) for c in cols}
    if _total(keys + others[:1], snug) > width:
        snug = {c.index: c.least for c in cols}
    parts: list[list[Column]] = []
    current: list[Column] = []
    for c in others:
        if current and _total(keys + current + [c], snug) > width:
            parts.append(current)
            current = []
        current.append(c)
    if current or not parts:
        parts.append(current)
    return [_fill(keys + part, width) for part in parts], prose


def _style(data: TableData, row: int, cell: str, styles: dict[str, str]) -> str:
    tag = data.tags[row] if row < len(data.tags) else None
    return styles.get(tag or "", "") if cell == tag else ""


def _lines(cells: list[tuple[list[str], str]], widths: list[int], style: str = "") -> list[Text]:
    """One row: its wrapped cells side by side, each padded to its column (the last is not)."""
    out = []
    for i in range(max(len(lines) for lines, _ in cells)):
        line = Text(style=style)
        for j, ((lines, cell_style), w) in enumerate(zip(cells, widths, strict=True)):
            text = lines[i] if i < len(lines) else ""
            line.append(text, style=cell_style)
            if j < len(cells) - 1:
                line.append(" " * (w - len(text) + GAP))
        line.rstrip()
        out.append(line)
    return out


def render(data: TableData, width: int, styles: dict[str, str] | None = None) -> list[Text]:
    """The table as lines of at most `width` characters (unless a single word is wider): its title, header,
    a rule under each column and the rows; a table that continues under itself, the same again; then, after a
    blank line, the free-text columns and the note, and a blank line. `styles`: tag -> rich style for the
    cell that says the row's outcome."""
    styles = styles or {}
    parts, prose = _parts(data, width)
    out: list[Text] = []
    for n, widths in enumerate(parts):
        if n:
            out.append(Text(""))
        out.append(Text(data.title + (CONTINUED if n else ""), style="bold"))
        order = list(widths)
        sizes = [widths[i] for i in order]
        out += _lines([(wrap(data.headers[i], widths[i]), "") for i in order], sizes, "bold")
        out.append(Text((" " * GAP).join(RULE * w for w in sizes)))
        for r, row in enumerate(data.rows):
            out += _lines([(wrap(row[i], widths[i]), _style(data, r, row[i], styles)) for i in order], sizes)
    if prose or data.note:
        out.append(Text(""))
    for c in prose:
        out.append(Text(data.headers[c.index], style="bold"))
        out += [Text(line) for line in under(data, c.index, width)]
    if data.note:
        out += [Text(line, style="dim") for line in wrap(data.note, width)]
    out.append(Text(""))
    return out


def under(data: TableData, index: int, width: int) -> list[str]:
    """A free-text column under its table: `  KEY: text` per row that says something (not `-`), its wrapped
    lines indented under it. Rows named by one column that say the same thing are one entry (three servers on
    one platform are one line, not three); a row named by several columns is named `A · B`."""
    said: dict[str, list[str]] = {}
    for row in data.rows:
        if row[index].strip() in ("", "-"):
            continue
        key = " · ".join(row[:data.keys])
        said.setdefault(row[index] if data.keys == 1 else f"{key}\0{row[index]}", []).append(key)
    lines = []
    for text, keys in said.items():
        lines += wrap(f"{', '.join(keys)}: {text.rpartition(chr(0))[2]}", width, "  ", "      ")
    return lines


class FittedTable:
    """A TableData as a rich renderable, laid out in the width it is printed at."""

    def __init__(self, data: TableData, styles: dict[str, str] | None = None) -> None:
        self.data, self.styles = data, styles

    def __rich_console__(self, console: Console, options: ConsoleOptions) -> RenderResult:
        for line in render(self.data, options.max_width, self.styles):
            line.no_wrap, line.overflow = True, "ignore"  # laid out already; a word wider than the line stays whole
            yield line
