"""Perplexity from per-document loglikelihoods, and a candidate's relative delta with its interval.

Perplexity over a set of documents is exp(total NLL / total units) (lm-eval's weighted perplexity),
so a candidate's relative delta is exp((NLL_cand - NLL_ref) / units) - 1 on the same documents.
Its 95% interval is a paired bootstrap over documents: a resample keeps each document's reference
and candidate score together, so how hard a document is cancels out.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

import numpy as np

from kvprobe.stats import Interval, paired_bootstrap

Unit = Literal["byte", "word", "token"]
UNIT_FIELD = {"byte": "bytes", "word": "words", "token": "tokens"}


@dataclass(frozen=True)
class DocRow:
    index: int
    loglikelihood: float
    words: int
    bytes: int
    tokens: int


def perplexities(rows: Sequence[DocRow]) -> dict[str, float]:
    """lm-eval's aggregates (word_perplexity, byte_perplexity, bits_per_byte) plus token perplexity."""
    ll = math.fsum(r.loglikelihood for r in rows)
    words, nbytes, tokens = (sum(getattr(r, f) for r in rows) for f in ("words", "bytes", "tokens"))
    return {
        "word_perplexity": math.exp(-ll / words),
        "byte_perplexity": math.exp(-ll / nbytes),
        "bits_per_byte": -ll / nbytes / math.log(2),
        "token_perplexity": math.exp(-ll / tokens) if tokens else math.nan,
        "loglikelihood": ll,
        "words": words,
        "bytes": nbytes,
        "tokens": tokens,
        "docs": len(rows),
    }


def _paired(ref: Sequence[DocRow], cand: Sequence[DocRow]) -> tuple[list[DocRow], list[DocRow]]:
    by_index = {r.index: r for r in cand}
    common = [r for r in ref if r.index in by_index]
    if not common:
        raise ValueError("no document was scored on both servers")
    return common, [by_index[r.index] for r in common]


def relative_delta(ref: Sequence[DocRow], cand: Sequence[DocRow], unit: Unit = "byte", *,
                   resamples: int = 2000, seed: int = 0) -> Interval:
    """cand perplexity / ref perplexity - 1 over the documents both scored, with a paired 95% interval."""
    ref, cand = _paired(ref, cand)
    field = UNIT_FIELD[unit]
    # Each document is a pair (NLL rise, unit count); resampling documents keeps the pair together.
    rise = [r.loglikelihood - c.loglikelihood for r, c in zip(ref, cand, strict=True)]
    units = [getattr(r, field) for r in ref]

    def statistic(r: np.ndarray, u: np.ndarray) -> np.ndarray:
        return np.expm1(r.sum(axis=-1) / u.sum(axis=-1))

    return paired_bootstrap(rise, units, statistic, resamples=resamples, seed=seed)
