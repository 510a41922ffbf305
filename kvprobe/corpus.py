"""Text shipped in tasks/: where it lives and how to read it (nothing is downloaded at run time)."""

from __future__ import annotations

from functools import cache
from pathlib import Path

from kvprobe import settings

# Fixed at import ($KVPROBE_TASKS_DIR, else the tasks/ folder beside the package).
TASKS_DIR = settings.tasks_dir(Path(__file__).resolve().parents[1] / "tasks")


@cache
def filler_text() -> str:
    """English prose from Python's pydoc topics (PSF licence; see tasks/README.md)."""
    return (TASKS_DIR / "filler" / "pydoc_topics.txt").read_text()
