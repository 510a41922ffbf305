"""What to ask: the length x depth grid and, per case, a template, a random key and value, and where
in the filler the haystack starts. Everything follows from the recorded seed, so every server gets
the same cases and a rerun rebuilds them identically."""

from __future__ import annotations

import json
import math
import random
import re
from collections import Counter
from dataclasses import asdict, dataclass
from functools import cache
from typing import Any

from kvprobe.config import NeedleSettings
from kvprobe.corpus import TASKS_DIR, filler_text
from kvprobe.errors import ConfigError

DEFAULT_DEPTHS = (0.0, 0.25, 0.5, 0.75, 1.0)


@dataclass(frozen=True)
class Template:
    name: str
    needle: str
    question: str


@dataclass(frozen=True)
class CaseSpec:
    id: str
    target_length: int  # whole prompt, chat template included
    target_depth: float  # share of the haystack's tokens before the needle
    template: str
    key: str
    value: str
    filler_start: int  # word index in the filler where the haystack begins

    def needle(self, templates: dict[str, Template]) -> str:
        return templates[self.template].needle.format(key=self.key, value=self.value)

    def question(self, templates: dict[str, Template]) -> str:
        return templates[self.template].question.format(key=self.key, value=self.value)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@cache
def load_templates() -> dict[str, Template]:
    data = json.loads((TASKS_DIR / "needle" / "templates.json").read_text())
    return {name: Template(name, t["needle"], t["question"]) for name, t in data.items()}


def check_templates(names: list[str]) -> None:
    known = load_templates()
    unknown = [n for n in names if n not in known]
    if unknown:
        raise ConfigError([f"needle.templates: unknown template {unknown[0]!r}: choose from {', '.join(known)}"])


@cache
def filler_words() -> tuple[str, ...]:
    """The filler as words, each with the whitespace that follows it, so joining a run of them
    gives back the original text."""
    return tuple(re.findall(r"\S+\s*", filler_text()))


@cache
def key_vocabulary() -> tuple[str, ...]:
    """Plain lowercase words of the filler (seen at least 3 times, so no fragments): keys look like
    the text around them, as in needle-llama's training."""
    counts = Counter(re.findall(r"(?<![\w.-])[a-z]{3,12}(?![\w-])", filler_text()))
    return tuple(sorted(word for word, n in counts.items() if n >= 3))


def resolve_grid(settings: NeedleSettings, largest: int) -> tuple[list[int], list[float]]:
    """Lengths and depths of the grid. `largest` is the longest prompt every server accepts
    (max_model_len minus the answer budget)."""
    if settings.depths:
        depths = list(settings.depths)
    elif settings.count >= len(DEFAULT_DEPTHS):
        depths = list(DEFAULT_DEPTHS)
    elif settings.count == 1:
        depths = [0.5]
    else:
        depths = [round(i / (settings.count - 1), 4) for i in range(settings.count)]
    if settings.lengths:
        return list(settings.lengths), depths
    n_lengths = math.ceil(settings.count / len(depths))
    low = min(settings.min_length, largest)
    if n_lengths == 1:
        return [largest], depths
    step = (largest - low) / (n_lengths - 1)
    return sorted({round(low + i * step) for i in range(n_lengths)}), depths


def make_cases(settings: NeedleSettings, lengths: list[int], depths: list[float]) -> list[CaseSpec]:
    """`settings.count` cases over the grid cells (length-major), each with its own random stream
    derived from the seed and its index, so adding cases never changes the earlier ones."""
    cells = [(length, depth) for length in lengths for depth in depths]
    text, words, vocab = filler_text(), filler_words(), key_vocabulary()
    width = max(2, len(str(settings.count - 1)))
    cases = []
    for i in range(settings.count):
        rng = random.Random(f"kvprobe-needle/{settings.seed}/{i}")
        length, depth = cells[i % len(cells)]
        while True:  # the key and value must not already occur in the haystack
            first, second = rng.sample(vocab, 2)
            key = f"{first}-{second}"
            value = str(rng.randrange(1_000_000, 10_000_000))
            if key not in text and value not in text:
                break
        cases.append(CaseSpec(
            id=f"n{i:0{width}d}", target_length=length, target_depth=depth,
            template=settings.templates[i % len(settings.templates)], key=key, value=value,
            filler_start=rng.randrange(len(words)),
        ))
    return cases
