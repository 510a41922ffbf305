"""Perplexity from per-document loglikelihoods, and a candidate's relative delta with its interval.

Perplexity over a set of documents is exp(total NLL / total units) (lm-eval's weighted perplexity),
so a candidate's relative delta is exp((NLL_cand - NLL_ref) / units) - 1 on the same documents: the
check (kvprobe.verdict.checks.quality) computes it, passage by passage paired, with a t interval.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

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
