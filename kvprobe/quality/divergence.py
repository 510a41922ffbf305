"""Two servers' next-token distributions compared position by position, from top-k prompt logprobs.

A server returns, per prompt position, the logprobs of its top k tokens plus the token actually in
the prompt. Only those tokens are known, so the distributions are compared on a coarser partition:
the tokens both servers reported, and one bucket holding all the remaining probability mass. The KL
divergence of the coarsened distributions is never more than the true KL (data-processing
inequality), so it is an honest lower bound that becomes exact as k grows.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from kvprobe.errors import Unreadable
from kvprobe.server.untrusted import logprob, number

TopK = dict[int, float]  # token id -> logprob, at one position

# Past any vocabulary (the largest are ~260k): a token id beyond it is garbage, not a token.
_TOKEN_ID_MAX = 2**31
# Leftover mass below this is rounding, not probability.
_MASS_EPS = 1e-9
# A candidate whose reported tokens hold all its mass still gives the leftover tokens some probability.
_Q_FLOOR = 1e-10


def parse_prompt_logprobs(response: dict[str, Any], server: str = "server") -> list[TopK | None]:
    """vLLM /v1/completions `prompt_logprobs`: per position {token_id: logprob}; None where the
    server gives nothing (the first position, which has no context). Unreadable when the answer has
    none or a logprob is not a finite number in [-1e4, 0] (a NaN would poison every mean after it)."""
    where = f"{server}: /v1/completions prompt_logprobs"
    choices = response.get("choices") if isinstance(response, dict) else None
    first = choices[0] if isinstance(choices, list) and choices and isinstance(choices[0], dict) else {}
    entries = first.get("prompt_logprobs")
    if not isinstance(entries, list):
        raise Unreadable(f"{where}: the answer has no choices[0].prompt_logprobs list", server=server)
    out: list[TopK | None] = []
    for pos, entry in enumerate(entries):
        if entry is None:
            out.append(None)
            continue
        # Empty has no top-1 to compare (max() of nothing): vLLM always sends at least the prompt's token.
        if not isinstance(entry, dict) or not entry:
            raise Unreadable(f"{where}[{pos}] is not an object of token logprobs", server=server)
        out.append({number(tok, f"{where}[{pos}] token id", integer=True, minimum=0, maximum=_TOKEN_ID_MAX, text=True):
                    logprob(v.get("logprob") if isinstance(v, dict) else v, f"{where}[{pos}][{tok}].logprob")
                    for tok, v in entry.items()})
    return out


def compare_position(ref: TopK, cand: TopK) -> tuple[float, bool, float]:
    """(KL(ref || cand) with a leftover bucket, same top-1 token, largest |logprob difference|)."""
    shared = [t for t in ref if t in cand]
    lp = np.fromiter((ref[t] for t in shared), float, len(shared))
    lq = np.fromiter((cand[t] for t in shared), float, len(shared))
    p, q = np.exp(lp), np.exp(lq)
    kl = float(np.sum(p * (lp - lq)))
    p_rest = 1.0 - float(p.sum())
    q_rest = 1.0 - float(q.sum())
    if p_rest > _MASS_EPS:
        kl += p_rest * (math.log(p_rest) - math.log(max(q_rest, _Q_FLOOR)))
    top_ref, top_cand = max(ref.values()), max(cand.values())
    # Ties at the top (bf16 logits) count as agreement when the two tied sets meet.
    agree = any(ref[t] == top_ref and cand[t] == top_cand for t in shared)
    diff = float(np.max(np.abs(lp - lq))) if shared else math.nan
    return max(kl, 0.0), agree, diff


@dataclass
class Comparison:
    """Per-position results for one passage."""

    kl: list[float] = field(default_factory=list)
    top1: list[bool] = field(default_factory=list)
    diff: list[float] = field(default_factory=list)

    @property
    def positions(self) -> int:
        return len(self.kl)


def compare(ref: Sequence[TopK | None], cand: Sequence[TopK | None]) -> Comparison:
    if len(ref) != len(cand):
        raise ValueError(f"servers returned {len(ref)} and {len(cand)} prompt positions for the same prompt")
    out = Comparison()
    for r, c in zip(ref, cand, strict=True):
        if r is None or c is None:
            continue
        kl, agree, diff = compare_position(r, c)
        out.kl.append(kl)
        out.top1.append(agree)
        out.diff.append(diff)
    return out
