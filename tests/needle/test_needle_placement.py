"""Token-exact placement against a deterministic toy tokenizer (the real one is exercised by the
integration tests): exact length, depth where asked, recorded depth = where the needle really starts."""

from __future__ import annotations

import random

import pytest
from needle_fakes import ToyTokenizer

from kvprobe.errors import PlacementError
from kvprobe.needle.cases import filler_words
from kvprobe.needle.placement import Filler, common_prefix, place, tokens_per_word

NEEDLE = "One of the special magic numbers for ready-lambda is: 4719305."
QUESTION = "What is the special magic number for ready-lambda mentioned in the provided text?"


class ToyEncoder:
    approximate = False
    name = "toy"

    def __init__(self) -> None:
        self.tok = ToyTokenizer()
        self.calls = 0

    async def encode(self, content: str, *, generation_prompt: bool = True) -> list[int]:
        self.calls += 1
        return self.tok.chat_ids(content, generation_prompt)


class PairEncoder(ToyEncoder):
    """Every word costs exactly two tokens, whatever its length: odd targets cannot be reached."""

    async def encode(self, content: str, *, generation_prompt: bool = True) -> list[int]:
        self.calls += 1
        words = content.split()
        return [1] * 4 + [7] * (2 * len(words)) + [2] * (5 if generation_prompt else 2)


@pytest.fixture(scope="module")
def filler() -> Filler:
    return Filler(filler_words())


async def _place(encoder, filler, length: int, depth: float, start: int):
    tpw = await tokens_per_word(encoder, filler)
    return await place(encoder=encoder, filler=filler, needle=NEEDLE, question=QUESTION, target_length=length,
                       target_depth=depth, start=start, tpw=tpw)


@pytest.mark.parametrize("depth", [0.0, 0.1, 0.25, 0.5, 0.75, 0.9, 1.0])
@pytest.mark.parametrize("length", [200, 1024, 3333, 7168])
async def test_exact_length_and_recorded_depth(filler: Filler, length: int, depth: float) -> None:
    encoder = ToyEncoder()
    start = random.Random(f"{length}/{depth}").randrange(len(filler.words))
    placed = await _place(encoder, filler, length, depth, start)
    ids = encoder.tok.chat_ids(placed.content)
    assert placed.exact and placed.length_tokens == length == len(ids)
    # depth_tokens is where the needle's tokens begin in the real prompt
    needle_at = placed.content.index(NEEDLE)
    before = encoder.tok.chat_ids(placed.content[:needle_at], generation_prompt=False)
    assert placed.depth_tokens == common_prefix(ids, before)
    assert placed.content.endswith("\n\n" + QUESTION)
    assert placed.content.count(NEEDLE) == 1
    open_tokens = len(encoder.tok.chat_ids("", generation_prompt=False)) - 2  # minus <|im_end|>, "\n"
    share = (placed.depth_tokens - open_tokens) / placed.haystack_tokens
    assert abs(share - depth) < 0.05, (share, depth)
    assert placed.measurements < 80
    assert not placed.approximate and placed.tokenizer == "toy"


async def test_depth_zero_starts_with_the_needle_and_one_ends_with_it(filler: Filler) -> None:
    first = await _place(ToyEncoder(), filler, 1500, 0.0, 123)
    assert first.content.startswith(NEEDLE)
    last = await _place(ToyEncoder(), filler, 1500, 1.0, 123)
    assert last.content.endswith(NEEDLE + "\n\n" + QUESTION)


async def test_unreachable_target_returns_the_closest_marked_not_exact(filler: Filler) -> None:
    encoder = PairEncoder()
    bare = len(await encoder.encode(NEEDLE + "\n\n" + QUESTION))
    target = bare + 101  # parity makes it impossible
    placed = await _place(encoder, filler, target, 0.5, 0)
    assert not placed.exact
    assert placed.length_tokens == target - 1  # closest, and under the target rather than over
    assert placed.measurements <= 120  # the request budget holds


async def test_target_shorter_than_needle_and_question_is_refused(filler: Filler) -> None:
    with pytest.raises(PlacementError, match="cannot hold the needle"):
        await _place(ToyEncoder(), filler, 20, 0.5, 0)


def test_filler_wraps_around() -> None:
    f = Filler(["a ", "b ", "c "])
    assert f.text(2, 4) == "c a b c "
    assert f.word(-1) == "c "


def test_common_prefix() -> None:
    assert common_prefix([1, 2, 3], [1, 2, 4]) == 2
    assert common_prefix([1, 2], [1, 2, 3]) == 2
    assert common_prefix([], [1]) == 0
