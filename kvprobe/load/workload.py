"""The load probe's simulated agents: multi-turn conversations whose context grows, as request bodies.

An agent's conversation: a system prompt shared by every agent of the case, then per turn a
tool-output-like block of text and a question; each next turn carries the whole history. The
assistant turns in the history are fixed text of the reply's size, not what the server answered,
so every server gets byte-identical prompts whatever its KV dtype made it generate. A nonce at the
start of the system prompt makes each case's prompts new to the prefix cache.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import Any

from kvprobe.config import LoadSettings
from kvprobe.corpus import filler_text

DEFAULT_CHARS_PER_TOKEN = 4.0


@dataclass(frozen=True)
class Shape:
    """One load shape with every field resolved."""

    name: str
    agents: tuple[int, ...]
    turns: int
    system_tokens: int
    tokens_per_turn: int
    max_output_tokens: int

    def max_prompt_tokens(self) -> int:
        """The last turn's prompt, in tokens (before the chat template's few tokens)."""
        return self.system_tokens + self.turns * self.tokens_per_turn + (self.turns - 1) * self.max_output_tokens

    def describe(self) -> dict[str, Any]:
        return {"shape": self.name, "turns": self.turns, "system_tokens": self.system_tokens,
                "tokens_per_turn": self.tokens_per_turn, "max_output_tokens": self.max_output_tokens}


def shapes_of(settings: LoadSettings) -> list[Shape]:
    """The configured shapes; unset fields take the [load] values."""
    base = dict(agents=tuple(settings.agents), turns=settings.turns, system_tokens=settings.system_tokens,
                tokens_per_turn=settings.tokens_per_turn, max_output_tokens=settings.max_output_tokens)
    if not settings.shapes:
        return [Shape(name="default", **base)]
    out = []
    for shape in settings.shapes:
        fields = dict(base)
        for key in base:
            value = getattr(shape, key)
            if value is not None:
                fields[key] = tuple(value) if key == "agents" else value
        out.append(Shape(name=shape.name, **fields))
    return out


class TextSource:
    """Deterministic slices of the shipped filler, sized in tokens by a chars-per-token ratio
    measured on the server's own tokenizer."""

    def __init__(self, chars_per_token: float = DEFAULT_CHARS_PER_TOKEN, text: str | None = None):
        self.text = text if text is not None else filler_text()
        self.cpt = chars_per_token

    def take(self, tokens: int, key: str) -> str:
        if tokens <= 0:
            return ""
        n = max(1, round(tokens * self.cpt))
        start = int.from_bytes(hashlib.blake2b(key.encode(), digest_size=8).digest()) % len(self.text)
        doubled = self.text if start + n <= len(self.text) else self.text + self.text
        while len(doubled) < start + n:
            doubled += self.text
        return doubled[start:start + n]


async def measure_chars_per_token(client: Any, text: str | None = None, samples: int = 6,
                                  size: int = 6000) -> float:
    """Characters per token of the filler on this server's tokenizer: the densest of a few samples
    spread over the text, so a slice sized with it is at most (about) the tokens asked for and a
    prompt sized to fit max_model_len does fit. Falls back to 4 without /tokenize."""
    text = text if text is not None else filler_text()
    step = max(1, (len(text) - size) // max(1, samples - 1))
    ratios = []
    for k in range(samples):
        sample = text[k * step: k * step + size]
        try:
            tokens = await client.tokenize(prompt=sample, add_special_tokens=False)
        except Exception:  # no /tokenize: an estimate, good enough to size prompts
            return DEFAULT_CHARS_PER_TOKEN
        ratios.append(len(sample) / max(1, len(tokens)))
    return min(ratios)


@dataclass
class Conversation:
    """One agent's conversation: turn k's request carries turns 0..k-1 and the new block."""

    system: str
    users: list[str]
    replies: list[str]

    def messages(self, turn: int) -> list[dict[str, str]]:
        msgs = [{"role": "system", "content": self.system}] if self.system else []
        for k in range(turn):
            msgs += [{"role": "user", "content": self.users[k]}, {"role": "assistant", "content": self.replies[k]}]
        msgs.append({"role": "user", "content": self.users[turn]})
        return msgs


def conversation(source: TextSource, shape: Shape, nonce: str, agent: int, index: int = 0) -> Conversation:
    """Agent `agent`'s `index`-th conversation of a case; the system prompt is the same for all agents."""
    system = ""
    if shape.system_tokens:
        system = (f"Session {nonce}. You are an agent that reads tool output and answers briefly.\n"
                  + source.take(shape.system_tokens, f"{nonce}/system"))
    users, replies = [], []
    for turn in range(shape.turns):
        key = f"{nonce}/{agent}/{index}/{turn}"
        users.append(f"Tool output (agent {agent}, call {index}.{turn}):\n"
                     + source.take(shape.tokens_per_turn, key)
                     + "\n\nQuestion: what does this output say, in one sentence?")
        replies.append(source.take(shape.max_output_tokens, key + "/reply"))
    return Conversation(system, users, replies)


def request_body(conv: Conversation, turn: int, settings: LoadSettings, shape: Shape,
                 overrides: dict[str, Any] | None = None) -> dict[str, Any]:
    body: dict[str, Any] = {"messages": conv.messages(turn), "max_tokens": shape.max_output_tokens,
                            "temperature": settings.temperature}
    if settings.ignore_eos:
        body["ignore_eos"] = True
    return body | (overrides or {})


def case_nonce(run_id: str, shape: str, agents: int, repeat: int) -> str:
    """Same for every server in one (shape, agents, repeat), new for each run and case."""
    return hashlib.blake2b(f"{run_id}/{shape}/{agents}/{repeat}".encode(), digest_size=6).hexdigest()
