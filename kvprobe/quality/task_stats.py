"""One server's own task score: the mean over its answers within the cap, and how many the cap cut.

The comparison with the reference, document by document, is the checks' (kvprobe.verdict.checks.answers).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from kvprobe.quality.task_eval import SampleRow


def accuracy(rows: Sequence[SampleRow]) -> dict[str, Any]:
    scored = [r.score for r in rows if not r.truncated]
    return {"accuracy": sum(scored) / len(scored) if scored else None, "documents": len(rows),
            "scored": len(scored), "truncated": len(rows) - len(scored)}
