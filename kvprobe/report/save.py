"""A figure to a PNG file through kvprobe.disk: a disk that refuses it is one line naming the file,
not a traceback from inside matplotlib's savefig."""

from __future__ import annotations

import io
from pathlib import Path
from typing import TYPE_CHECKING, Any

from kvprobe.disk import write_atomic

if TYPE_CHECKING:  # matplotlib is imported by the caller that draws, not by importing this
    from matplotlib.figure import Figure


def save_png(fig: Figure, path: str | Path, **savefig: Any) -> Path:
    buf = io.BytesIO()
    fig.savefig(buf, format="png", **savefig)
    return write_atomic(Path(path), buf.getvalue())
