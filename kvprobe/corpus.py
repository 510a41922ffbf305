"""Text shipped in tasks/: where it lives and how to read it (nothing is downloaded at run time)."""

from __future__ import annotations

import os
from functools import cache
from pathlib import Path

TASKS_DIR = Path(os.environ.get("KVPROBE_TASKS_DIR", Path(__file__).resolve().parents[1] / "tasks"))


@cache
def filler_text() -> str:
    """English prose from Python's pydoc topics (PSF licence; see tasks/README.md)."""
    return (TASKS_DIR / "filler" / "pydoc_topics.txt").read_text()
