"""A candidate's task accuracy against the reference's, document by document.

Only documents both servers answered within the cap are paired: an answer the cap cut is counted
apart (not a wrong answer), as the needle probe does. The drop is the reference's mean score minus
the candidate's (the other way round for a metric where lower is better), with a paired bootstrap
95% interval over documents, and McNemar's exact p when every score is 0 or 1.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from kvprobe.quality.task_eval import SampleRow
from kvprobe.stats import mcnemar_p, paired_bootstrap


def accuracy(rows: Sequence[SampleRow]) -> dict[str, Any]:
    """One server's own figures: the mean over its answers within the cap, and how many the cap cut."""
    scored = [r.score for r in rows if not r.truncated]
    return {"accuracy": sum(scored) / len(scored) if scored else None, "documents": len(rows),
            "scored": len(scored), "truncated": len(rows) - len(scored)}


def paired_drop(ref: Sequence[SampleRow], cand: Sequence[SampleRow], *, higher_is_better: bool = True,
                resamples: int = 2000, seed: int = 0) -> dict[str, Any]:
    """The candidate's drop vs the reference on the documents both answered within the cap."""
    by_doc = {r.doc: r for r in cand}
    pairs = [(r, by_doc[r.doc]) for r in ref if r.doc in by_doc]
    truncated = sum(r.truncated or c.truncated for r, c in pairs)
    kept = [(r.score, c.score) for r, c in pairs if not (r.truncated or c.truncated)]
    out: dict[str, Any] = {"pairs": len(kept), "truncated": truncated,
                           "unpaired": len(ref) + len(cand) - 2 * len(pairs)}
    if not kept:
        return out | {"drop": None, "ci95": None}
    r_scores, c_scores = [k[0] for k in kept], [k[1] for k in kept]
    sign = 1.0 if higher_is_better else -1.0
    iv = paired_bootstrap(r_scores, c_scores, lambda r, c: sign * (r.mean(axis=-1) - c.mean(axis=-1)),
                          resamples=resamples, seed=seed)
    diffs = [sign * (a - b) for a, b in kept]
    mean = sum(diffs) / len(diffs)
    sd = (sum((d - mean) ** 2 for d in diffs) / (len(diffs) - 1)) ** 0.5 if len(diffs) > 1 else None
    out |= {"drop": iv.estimate, "ci95": iv.as_list(), "reference_accuracy": sum(r_scores) / len(kept),
            "candidate_accuracy": sum(c_scores) / len(kept),
            # The paired difference's standard error: the power figures' se (kvprobe.power).
            "se": sd / len(diffs) ** 0.5 if sd is not None else None}
    if all(s in (0.0, 1.0) for s in r_scores + c_scores):
        ref_only = sum(a == 1.0 and b == 0.0 for a, b in kept)
        cand_only = sum(b == 1.0 and a == 0.0 for a, b in kept)
        better, worse = (ref_only, cand_only) if higher_is_better else (cand_only, ref_only)
        out |= {"binary": True, "ref_only": better, "cand_only": worse, "mcnemar_p": mcnemar_p(better, worse)}
    else:
        out["binary"] = False
    return out
