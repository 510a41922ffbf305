"""Per-server counts and the paired comparison of each candidate with the reference.

Recall is hit / (hit + miss): a truncated answer (the cap cut it before any value) is not a
retrieval failure and an error is not an answer, so both are reported beside recall, not in it.
The paired comparison uses the cases both servers answered (hit or miss): the recall drop is the
reference's recall minus the candidate's on those cases, with a paired bootstrap interval and
McNemar's exact test on the discordant cases, and is held against `needle_recall_drop_max`.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import Any

import numpy as np

from kvprobe.stats import bar_outcome, paired_bootstrap


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


def mcnemar_exact(lost: int, gained: int) -> float:
    """Two-sided exact McNemar p-value: under no difference, each discordant case is a coin flip."""
    n = lost + gained
    if n == 0:
        return 1.0
    tail = sum(math.comb(n, i) for i in range(min(lost, gained) + 1)) / 2**n
    return min(1.0, 2 * tail)


def paired(reference: dict[str, dict[str, Any]], candidate: dict[str, dict[str, Any]], *, bar: float,
           resamples: int = 2000, seed: int = 0) -> dict[str, Any]:
    """`reference` and `candidate` map case id -> case record (with "status")."""
    common = sorted(set(reference) & set(candidate))

    def ids(ref_status: str, cand_status: str) -> list[str]:
        return [i for i in common if reference[i]["status"] == ref_status and candidate[i]["status"] == cand_status]

    lost, gained = ids("hit", "miss"), ids("miss", "hit")
    decided = [i for i in common if reference[i]["status"] in ("hit", "miss")
               and candidate[i]["status"] in ("hit", "miss")]
    out: dict[str, Any] = {
        "pairs": len(common),
        "decided": len(decided),
        "reference_hit_candidate_miss": lost,
        "reference_miss_candidate_hit": gained,
        "reference_hit_candidate_truncated": ids("hit", "truncated"),
        "reference_truncated_candidate_hit": ids("truncated", "hit"),
        "reference_hit_candidate_error": ids("hit", "error"),
        "mcnemar_p": mcnemar_exact(len(lost), len(gained)),
        # truncation is outside recall, so a candidate that rambles to the cap shows up here
        "truncation_rise": (sum(candidate[i]["status"] == "truncated" for i in common)
                            - sum(reference[i]["status"] == "truncated" for i in common)) / len(common)
        if common else None,
        "bar": bar,
        "recall_drop": None,
        "outcome": "inconclusive",
    }
    if decided:
        ref = np.array([reference[i]["status"] == "hit" for i in decided], dtype=float)
        cand = np.array([candidate[i]["status"] == "hit" for i in decided], dtype=float)
        interval = paired_bootstrap(ref, cand, lambda r, c: r.mean(axis=-1) - c.mean(axis=-1),
                                    resamples=resamples, seed=seed)
        out["recall_drop"] = {"estimate": interval.estimate, "lo": interval.lo, "hi": interval.hi}
        out["outcome"] = bar_outcome(interval, bar)
    return out
