"""Word wrap that never cuts a figure. Lines break only at spaces, so a number, a percentage or a version
(`1,048,576`, `+12.97%`, `580.159.04`) stays whole; a bracketed interval (`[0.94, 1.04]`) is one unit, so
its two ends stay on one line; and a word longer than the line is left whole on a line of its own (a path
must still paste), never folded. The terminal tables (kvprobe.report.text_table), `compare` and `check`
wrap their text here."""

from __future__ import annotations

# An interval's ends are a few words apart at most: a "[" whose "]" is further off is not an interval,
# and gluing it would keep a whole sentence on one line.
_INTERVAL_WORDS = 3


def tokens(text: str) -> list[str]:
    """The unbreakable units of `text`: its words, with the words of a bracketed interval joined by one space."""
    words = text.split()
    out: list[str] = []
    i = 0
    while i < len(words):
        word = words[i]
        opened = word.rfind("[")
        if opened >= 0 and "]" not in word[opened:]:
            close = next((j for j in range(i + 1, min(len(words), i + 1 + _INTERVAL_WORDS)) if "]" in words[j]),
                         None)
            if close is not None:
                out.append(" ".join(words[i:close + 1]))
                i = close + 1
                continue
        out.append(word)
        i += 1
    return out


def longest(text: str) -> int:
    """The narrowest width `text` wraps into without cutting a unit."""
    return max((len(t) for t in tokens(text)), default=0)


def wrap(text: str, width: int, indent: str = "", hang: str = "") -> list[str]:
    """`text` in lines of at most `width` characters (a unit longer than the room is a line of its own);
    the first line starts with `indent`, the others with `hang`."""
    lines: list[str] = []
    line = indent
    fresh = True  # nothing on the line yet but its indent
    for unit in tokens(text):
        if not fresh and len(line) + 1 + len(unit) > width:
            lines.append(line)
            line, fresh = hang, True
        line = line + unit if fresh else f"{line} {unit}"
        fresh = False
    if not fresh or not lines:
        lines.append(line)
    return lines
