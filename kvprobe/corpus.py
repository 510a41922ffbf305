"""Text shipped in tasks/: where it lives and how to read it (nothing is downloaded at run time)."""

from __future__ import annotations

import os
from functools import cache
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from kvprobe.client import Client

TASKS_DIR = Path(os.environ.get("KVPROBE_TASKS_DIR", Path(__file__).resolve().parents[1] / "tasks"))


@cache
def filler_text() -> str:
    """English prose from Python's pydoc topics (PSF licence; see tasks/README.md)."""
    return (TASKS_DIR / "filler" / "pydoc_topics.txt").read_text()


async def filler_ids(client: Client, tokens: int, *, prefix: str = "",
                     add_special_tokens: bool | None = None) -> list[int]:
    """Exactly `tokens` token ids of `prefix` + filler from the server's /tokenize, the filler
    repeated if it is short (empty if the server returns no ids)."""
    ids = await client.tokenize(prompt=(prefix + filler_text())[: tokens * 8], add_special_tokens=add_special_tokens)
    if not ids:
        return []
    return (ids * (tokens // len(ids) + 1))[:tokens]
