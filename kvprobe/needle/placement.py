"""Token-exact placement: build the prompt, measure it with the tokenizer, adjust, until the whole
chat prompt has exactly the target number of tokens.

The user message is `{head}{needle} {tail}\\n\\n{question}`, head and tail being runs of filler
words. First the head is sized so the needle sits at the target depth (in tokens of the haystack);
then the outer side of the haystack (the tail, or the head's start when the needle goes last) is
grown word by word to bracket the target, and its outermost word is trimmed a character at a time
until the count is exact. Byte-pair merges make a count jump by 2 now and then; another run of
words is tried then. Depth is recorded as measured, not forced.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from kvprobe.errors import PlacementError
from kvprobe.needle.tokens import Encoder


@dataclass
class Placed:
    content: str  # the user message sent to every server
    length_tokens: int  # the whole prompt as the builder's tokenizer counts it
    depth_tokens: int  # prompt tokens before the needle's first token
    haystack_tokens: int  # filler tokens around the needle
    exact: bool  # length_tokens == target
    approximate: bool  # counted with an estimate, not the server's tokenizer
    tokenizer: str
    measurements: int


class Filler:
    """Filler words (each with its trailing whitespace), read cyclically from any start."""

    def __init__(self, words: tuple[str, ...] | list[str]):
        if not words:
            raise ValueError("empty filler")
        self.words = words

    def word(self, index: int) -> str:
        return self.words[index % len(self.words)]

    def text(self, start: int, count: int) -> str:
        return "".join(self.word(start + i) for i in range(max(0, count)))


def common_prefix(a: list[int], b: list[int]) -> int:
    return next((i for i, (x, y) in enumerate(zip(a, b, strict=False)) if x != y), min(len(a), len(b)))


class _Counter:
    """The encoder behind a memo and a request budget."""

    def __init__(self, encoder: Encoder, budget: int):
        self.encoder = encoder
        self.budget = budget
        self.calls = 0
        self._memo: dict[tuple[str, bool], list[int]] = {}

    async def ids(self, content: str, generation_prompt: bool = True) -> list[int]:
        key = (content, generation_prompt)
        if key not in self._memo:
            self.calls += 1
            self._memo[key] = await self.encoder.encode(content, generation_prompt=generation_prompt)
        return self._memo[key]

    async def count(self, content: str) -> int:
        return len(await self.ids(content))

    @property
    def spent(self) -> bool:
        return self.calls >= self.budget


async def tokens_per_word(encoder: Encoder, filler: Filler, sample_words: int = 2000) -> float:
    """How many tokens a filler word costs on average with this tokenizer (one request)."""
    empty = len(await encoder.encode(""))
    full = len(await encoder.encode(filler.text(0, sample_words)))
    return max(0.1, (full - empty) / sample_words)


Make = Callable[[int, int, int], str]  # (words, trimmed characters, shift) -> user message


async def _bracket(count: Callable[[int], Awaitable[int]], target: int, guess: int, slope: float,
                   tries: int = 30) -> tuple[int | None, int | None]:
    """For a word count -> token count that grows with words: (largest words under the target,
    smallest words over it) once they are adjacent, or (w, w) when w hits the target exactly.
    Secant steps (filler density varies: tables cost far more tokens a word than prose), with
    bisection when one side stops moving."""
    under: tuple[int, int] | None = None
    over: tuple[int, int] | None = None
    words, previous, last_side, stalls = max(0, guess), None, None, 0
    for _ in range(tries):
        n = await count(words)
        if n == target:
            return words, words
        side = n < target
        if side and (under is None or words > under[0]):
            under = (words, n)
        if not side and (over is None or words < over[0]):
            over = (words, n)
        if over is not None and (over[0] == 0 or (under is not None and over[0] - under[0] <= 1)):
            break
        stalls = stalls + 1 if side == last_side else 0
        last_side = side
        if previous is not None and previous[0] != words and previous[1] != n:
            slope = max(0.05, (n - previous[1]) / (words - previous[0]))
        previous = (words, n)
        if under is not None and over is not None:
            if stalls >= 2:
                step_to = (under[0] + over[0]) // 2
            else:
                step_to = under[0] + round((target - under[1]) * (over[0] - under[0]) / (over[1] - under[1]))
            words = min(max(step_to, under[0] + 1), over[0] - 1)
        else:
            words = max(0, words + (round((target - n) / slope) or (1 if side else -1)))
    return (under[0] if under else None), (over[0] if over else None)


async def _fit(counter: _Counter, make: Make, target: int, guess: int, tpw: float,
               edge_len: Callable[[int, int], int]) -> tuple[str, int]:
    """Find (words, trim, shift) whose message counts exactly `target` tokens; on a spent budget,
    the closest message found (under the target preferred)."""
    best: tuple[int, str, int] | None = None  # (distance, content, count)

    async def measure(words: int, trim: int = 0, shift: int = 0) -> int:
        nonlocal best
        content = make(words, trim, shift)
        n = await counter.count(content)
        distance = abs(n - target) * 2 + (n > target)  # prefer a shorter prompt on a tie
        if best is None or distance < best[0]:
            best = (distance, content, n)
        return n

    for shift in range(4):
        under, over = await _bracket(lambda w, s=shift: measure(w, 0, s), target, guess, tpw)
        if over is not None and over == under:
            break  # exact
        if over is None or over == 0 or counter.spent:
            break  # unreachable, or even no filler at all is over the target: nothing to trim
        # Keep only part of the outermost word of the smallest over-target run (search on how many
        # of its characters stay: long runs of punctuation can be dozens of tokens).
        edge = edge_len(over, shift)
        await _bracket(lambda k, s=shift, w=over, e=edge: measure(w, max(0, e - k), s), target, edge // 2,
                       max(0.05, (await measure(over, 0, shift) - await measure(under or 0, 0, shift)) / edge))
        if best[2] == target or counter.spent:  # type: ignore[index]
            break
        guess = over  # a byte-pair merge jumped over the target: try a run shifted by a word
    return best[1], best[2]  # type: ignore[index]


async def _size_head(head_tokens: Callable[[str], Awaitable[int]], filler: Filler, start: int, want: int,
                     tpw: float) -> int:
    """The number of head words whose tokens come closest to `want`."""
    async def count(words: int) -> int:
        return await head_tokens(filler.text(start, words))

    under, over = await _bracket(count, want, max(1, round(want / tpw)), tpw)
    options = [w for w in (under, over) if w is not None]
    if not options:
        return 0
    distances = {w: abs(await count(w) - want) for w in options}
    return min(options, key=lambda w: (distances[w], w))


async def place(
    *,
    encoder: Encoder,
    filler: Filler,
    needle: str,
    question: str,
    target_length: int,
    target_depth: float,
    start: int,
    tpw: float,
    budget: int = 120,
) -> Placed:
    counter = _Counter(encoder, budget)
    tail_sep = "\n\n" + question

    def message(head: str, tail: str) -> str:
        return head + needle + (" " + tail if tail else "") + tail_sep

    bare = await counter.count(message("", ""))
    if target_length <= bare:
        raise PlacementError(f"a {target_length}-token prompt cannot hold the needle, the question and the chat "
                             f"template ({bare} tokens with no filler): ask for longer prompts")
    haystack = target_length - bare
    empty_open = len(await counter.ids("", generation_prompt=False))

    async def head_tokens(head: str) -> int:
        return len(await counter.ids(head, generation_prompt=False)) - empty_open

    if target_depth >= 1.0:
        # The needle goes last: the head's start is the adjustable edge.
        end = start + round(haystack / tpw)

        def make(words: int, trim: int, shift: int) -> str:
            return message(filler.text(end - shift - words, words)[trim:], "")

        def edge(words: int, shift: int) -> int:
            return len(filler.word(end - shift - words))

        content, _ = await _fit(counter, make, target_length, round(haystack / tpw), tpw, edge)
        head = content[: content.index(needle)]
    else:
        head_words = 0
        if target_depth > 0:
            head_words = await _size_head(head_tokens, filler, start, round(target_depth * haystack), tpw)
        head = filler.text(start, head_words)
        tail_start = start + head_words

        def make(words: int, trim: int, shift: int) -> str:
            tail = filler.text(tail_start + shift, words).rstrip()
            if trim:
                tail = tail[:-trim].rstrip()
            return message(head, tail)

        def edge(words: int, shift: int) -> int:
            return len(filler.word(tail_start + shift + words - 1).rstrip()) + 1

        remaining = target_length - await counter.count(message(head, ""))
        content, _ = await _fit(counter, make, target_length, max(0, round(remaining / tpw)), tpw, edge)

    full = await counter.ids(content)
    depth = common_prefix(full, await counter.ids(head, generation_prompt=False))
    return Placed(
        content=content,
        length_tokens=len(full),
        depth_tokens=depth,
        haystack_tokens=len(full) - bare,
        exact=len(full) == target_length,
        approximate=encoder.approximate,
        tokenizer=encoder.name,
        measurements=counter.calls,
    )

