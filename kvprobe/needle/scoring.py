"""Scoring one answer: was the value said, where, and if not, why not.

A reasoning model may restate the fact while thinking and answer after `</think>`; a parser puts
the first part in `reasoning` (`reasoning_content` on older servers) and the second in `content`,
and an answer cut by max_tokens may have no content at all. The value counts wherever it appears.
"""

from __future__ import annotations

import re
from typing import Literal

from kvprobe.server.client import Generation

Status = Literal["hit", "miss", "truncated", "error"]

# A number as people and models write it: plain digits, or grouped in threes with a separator.
_NUMBER = re.compile(r"(?<!\d)(?:\d{1,3}(?:[,.\u00a0\u202f' _]\d{3})+|\d+)(?!\d)")


def _normalise(text: str) -> str:
    return " ".join(text.casefold().split())


def contains_value(text: str | None, value: str) -> bool:
    """Digits-only values match a whole number in the text once its separators are dropped
    ("2,815,901" counts for 2815901; "28159012" does not); other values match case- and
    whitespace-insensitively."""
    if not text:
        return False
    if value.isdigit():
        return any(re.sub(r"\D", "", m.group()) == value for m in _NUMBER.finditer(text))
    return _normalise(value) in _normalise(text)


def found_in(gen: Generation, value: str) -> list[str]:
    """Where the value appears: a sorted subset of ["content", "reasoning"]."""
    return [field for field, text in (("content", gen.content), ("reasoning", gen.reasoning))
            if contains_value(text, value)]


def score(gen: Generation, value: str) -> tuple[Status, list[str]]:
    """Exactly one of hit / truncated (stopped by the cap before the value) / miss (finished
    without it) / error (the request failed), with where the value was found."""
    if gen.error is not None:
        return "error", []
    where = found_in(gen, value)
    if where:
        return "hit", where
    if gen.finish_reason == "length":
        return "truncated", []
    return "miss", []
