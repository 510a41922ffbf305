"""How a passage meets a server's limits: rolling windows and prefill chunks.

A passage longer than one request allows is split into windows, never cut: every token is scored.
The layout follows lm-eval's rolling loglikelihood with max_length = max_model_len: a window scores
up to max_model_len - 2 tokens after one context token (lm-eval keeps one position for the token it
generates and one for the context), so each request is at most max_model_len - 1 prompt tokens.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any


def window_tokens(max_model_len: int) -> int:
    """Tokens one window scores; lm-eval: (max_length - 1) - 1."""
    if max_model_len < 3:
        raise ValueError(f"max_model_len {max_model_len} leaves no room for a passage")
    return max_model_len - 2


def rolling_windows(n_tokens: int, max_model_len: int) -> list[int]:
    """Scored tokens per window: the sizes add up to n_tokens (nothing is dropped)."""
    size = window_tokens(max_model_len)
    sizes = []
    left = n_tokens
    while left > 0:
        sizes.append(min(size, left))
        left -= sizes[-1]
    return sizes


def split_ids(ids: list[int], max_model_len: int) -> list[list[int]]:
    """Disjoint slices of a passage, each short enough for one prompt-logprobs request."""
    size = window_tokens(max_model_len)
    return [ids[i:i + size] for i in range(0, len(ids), size)]


@dataclass
class PassagePlan:
    index: int
    id: str
    tokens: int
    bytes: int
    windows: list[int]  # scored tokens per window
    prompt_tokens: int  # longest request: context token + the first window
    crossed_chunk: bool  # the longest request is longer than one prefill chunk

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def plan_passage(index: int, ident: str, text: str, n_tokens: int, max_model_len: int,
                 prefill_chunk_tokens: int) -> PassagePlan:
    windows = rolling_windows(n_tokens, max_model_len)
    prompt = (windows[0] if windows else 0) + 1
    return PassagePlan(index, ident, n_tokens, len(text.encode()), windows, prompt, prompt > prefill_chunk_tokens)
