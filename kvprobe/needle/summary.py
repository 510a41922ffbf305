"""Per-server counts and which cases each candidate lost or gained against the reference.

Recall here is hit / (hit + miss), each server's own figure; the check that decides the bar
(kvprobe.verdict.checks.answers) scores every planned case, an answer cut at the cap or failed as a miss on
either side. This module only counts: it judges nothing.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from kvprobe.stats import mcnemar_p


def server_summary(cases: Iterable[dict[str, Any]]) -> dict[str, Any]:
    counts = {"hit": 0, "miss": 0, "truncated": 0, "error": 0}
    for case in cases:
        counts[case["status"]] += 1
    answered = counts["hit"] + counts["miss"]
    finished = answered + counts["truncated"]
    return {
        **counts,
        "cases": sum(counts.values()),
        "recall": counts["hit"] / answered if answered else None,
        "truncation_rate": counts["truncated"] / finished if finished else None,
    }


def paired(reference: dict[str, dict[str, Any]], candidate: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """`reference` and `candidate` map case id -> case record (with "status"): the case ids in each
    discordant cell, for the heatmaps and the reports."""
    common = sorted(set(reference) & set(candidate))

    def ids(ref_status: str, cand_status: str) -> list[str]:
        return [i for i in common if reference[i]["status"] == ref_status and candidate[i]["status"] == cand_status]

    lost, gained = ids("hit", "miss"), ids("miss", "hit")
    return {
        "pairs": len(common),
        "reference_hit_candidate_miss": lost,
        "reference_miss_candidate_hit": gained,
        "reference_hit_candidate_truncated": ids("hit", "truncated"),
        "reference_truncated_candidate_hit": ids("truncated", "hit"),
        "reference_hit_candidate_error": ids("hit", "error"),
        "mcnemar_p": mcnemar_p(len(lost), len(gained)),
    }
