"""The paired task comparison (kvprobe.quality.task_stats): drop, interval, McNemar, truncation."""

from __future__ import annotations

import pytest

from kvprobe.quality.task_eval import SampleRow
from kvprobe.quality.task_stats import accuracy, paired_drop
from kvprobe.stats import mcnemar_p


def rows(scores: list[float], truncated: tuple[int, ...] = ()) -> list[SampleRow]:
    return [SampleRow(i, s, truncated=i in truncated) for i, s in enumerate(scores)]


def test_identical_answers_give_zero_with_a_zero_interval() -> None:
    out = paired_drop(rows([1, 0, 1, 1]), rows([1, 0, 1, 1]))
    assert out["drop"] == 0.0 and out["ci95"] == [0.0, 0.0] and out["mcnemar_p"] == 1.0 and out["pairs"] == 4


def test_discordant_pairs_and_mcnemar() -> None:
    out = paired_drop(rows([1.0] * 12), rows([0.0] * 10 + [1.0] * 2))
    assert out["drop"] == pytest.approx(10 / 12) and out["ref_only"] == 10 and out["cand_only"] == 0
    assert out["mcnemar_p"] == pytest.approx(2 * 0.5**10)
    assert out["ci95"][0] > 0.5


def test_truncated_on_either_side_is_left_out_of_the_pairs() -> None:
    out = paired_drop(rows([1, 1, 1, 1], truncated=(0,)), rows([1, 0, 1, 1], truncated=(1,)))
    assert out["pairs"] == 2 and out["truncated"] == 2 and out["drop"] == 0.0
    assert accuracy(rows([1, 0, 1], truncated=(1,))) == {"accuracy": 1.0, "documents": 3, "scored": 2,
                                                         "truncated": 1}


def test_a_lower_is_better_metric_drops_the_other_way_and_scores_need_not_be_binary() -> None:
    out = paired_drop(rows([0.1, 0.2, 0.3]), rows([0.3, 0.4, 0.5]), higher_is_better=False)
    assert out["drop"] == pytest.approx(0.2) and out["binary"] is False and "mcnemar_p" not in out
    assert out["se"] == pytest.approx(0.0, abs=1e-12)  # the same shift on every document


def test_no_document_in_common_gives_no_drop() -> None:
    out = paired_drop(rows([1, 1]), [SampleRow(5, 1.0)])
    assert out["drop"] is None and out["pairs"] == 0 and out["unpaired"] == 3


def test_mcnemar_is_symmetric_and_one_without_discordance() -> None:
    assert mcnemar_p(0, 0) == 1.0
    assert mcnemar_p(7, 2) == pytest.approx(mcnemar_p(2, 7))
