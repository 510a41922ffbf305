"""One server's own task score: answers within the cap only, with the cut ones counted."""

from __future__ import annotations

from kvprobe.quality.task_eval import SampleRow
from kvprobe.quality.task_stats import accuracy


def test_accuracy_counts_cut_answers_apart() -> None:
    rows = [SampleRow(0, 1.0), SampleRow(1, 0.0), SampleRow(2, 1.0, truncated=True), SampleRow(3, 1.0)]
    assert accuracy(rows) == {"accuracy": 2 / 3, "documents": 4, "scored": 3, "truncated": 1}
    assert accuracy([SampleRow(0, 0.0, truncated=True)])["accuracy"] is None
