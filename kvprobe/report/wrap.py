"""Word wrap that never cuts a figure. Lines break only at spaces, so a number, a percentage or a version
(`1,048,576`, `+12.97%`, `580.159.04`) stays whole; a bracketed interval (`[0.94, 1.04]`) is one unit, so
its two ends stay on one line; a bar and the outcome after it (`(bar 0.100) pass`, the summary's) are one
unit, so a line never ends on "(bar" nor starts on a lone outcome; and a word longer than the line is
left whole on a line of its own (a path must still paste), never folded. The terminal tables
(kvprobe.report.text_table), `compare` and `check` wrap their text here."""

from __future__ import annotations

import re

# An interval's ends are a few words apart at most: a "[" whose "]" is further off is not an interval,
# and gluing it would keep a whole sentence on one line.
_INTERVAL_WORDS = 3


def _units(text: str) -> list[tuple[int, int]]:
    """Where the unbreakable units of `text` are: its words, a bracketed interval's words as one."""
    words = [m.span() for m in re.finditer(r"\S+", text)]
    out: list[tuple[int, int]] = []
    i = 0
    while i < len(words):
        start, end = words[i]
        opened = text.rfind("[", start, end)
        if opened >= 0 and "]" not in text[opened:end]:
            close = next((j for j in range(i + 1, min(len(words), i + 1 + _INTERVAL_WORDS))
                          if "]" in text[slice(*words[j])]), None)
            if close is not None:
                out.append((start, words[close][1]))
                i = close + 1
                continue
        if text[start:end] == "(bar" and i + 1 < len(words) and text[slice(*words[i + 1])].endswith(")"):
            following = [text[slice(*w)] for w in words[i + 2:i + 4]]
            last = i + 1 + (2 if following == ["not", "measured"] else 1 if following[:1] and following[0].isalpha()
                            else 0)
            out.append((start, words[last][1]))
            i = last + 1
            continue
        out.append((start, end))
        i += 1
    return out


def tokens(text: str) -> list[str]:
    """The unbreakable units of `text`: its words, with the words of a bracketed interval as one, and a bar
    with its outcome."""
    return [text[a:b] for a, b in _units(text)]


def longest(text: str) -> int:
    """The narrowest width `text` wraps into without cutting a unit."""
    return max((len(t) for t in tokens(text)), default=0)


def wrap(text: str, width: int, indent: str = "", hang: str = "") -> list[str]:
    """`text` in lines of at most `width` characters (a unit longer than the room is a line of its own);
    the first line starts with `indent`, the others with `hang`. The spaces between two units on one line
    are the text's own (a plan's aligned columns stay aligned); a line breaks in place of them."""
    lines: list[str] = []
    line = indent
    last = None  # where the previous unit on this line ended; None: nothing on the line yet
    for start, end in _units(text):
        if last is not None and len(line) + (start - last) + (end - start) > width:
            lines.append(line)
            line, last = hang, None
        line += (text[last:start] if last is not None else "") + text[start:end]
        last = end
    if last is not None or not lines:
        lines.append(line)
    return lines
