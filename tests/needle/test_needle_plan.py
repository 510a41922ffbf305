"""The grid, the seeded cases and the up-front length budget."""

from __future__ import annotations

import itertools

import pytest

from kvprobe.config import NeedleSettings, parse_config
from kvprobe.corpus import filler_text
from kvprobe.errors import ConfigError
from kvprobe.needle.cases import check_templates, key_vocabulary, load_templates, make_cases, resolve_grid
from kvprobe.needle.plan import APPROXIMATE_MARGIN, fingerprint, grid, prompt_room


def test_default_grid_is_180_needles_from_1k_to_the_largest_that_fits() -> None:
    settings = NeedleSettings()
    room = prompt_room(settings, {"auto": 8192, "fp8": 8192})
    assert room == 8192 - 1024
    lengths, depths = grid(settings, room, approximate=False)
    assert len(lengths) == 36 and lengths[0] == 1024 and lengths[-1] == 7168  # 36 lengths x 5 depths, each cell once
    assert lengths == sorted(set(lengths)) and max(b - a for a, b in itertools.pairwise(lengths)) <= 176
    assert depths == [0.0, 0.25, 0.5, 0.75, 1.0]
    cases = make_cases(settings, lengths, depths)
    assert len(cases) == 180
    assert {(c.target_length, c.target_depth) for c in cases} == {(n, d) for n in lengths for d in depths}


def test_room_follows_the_tightest_server_and_the_answer_budget() -> None:
    settings = NeedleSettings(max_tokens=512)
    assert prompt_room(settings, {"a": 8192, "b": 4096, "c": None}) == 4096 - 512


def test_estimated_tokenizer_keeps_a_margin() -> None:
    lengths, _ = grid(NeedleSettings(), 7168, approximate=True)
    assert max(lengths) == int(7168 * APPROXIMATE_MARGIN)


@pytest.mark.parametrize("length", [9000, 7169])
def test_length_over_max_model_len_is_refused_up_front(length: int) -> None:
    settings = NeedleSettings(lengths=[1024, length])
    with pytest.raises(ConfigError) as err:
        prompt_room(settings, {"auto": 8192, "int8": 8192})
    (line,) = err.value.problems
    assert f"needle.lengths: {length} tokens + max_tokens 1024 = {length + 1024} is over max_model_len 8192" in line
    assert "longest prompt that fits is 7168 tokens" in line


def test_answer_budget_larger_than_the_context_is_refused() -> None:
    with pytest.raises(ConfigError, match=r"needle\.max_tokens = 8192 leaves 0 tokens"):
        prompt_room(NeedleSettings(max_tokens=8192), {"auto": 8192})


def test_unknown_max_model_len_needs_explicit_lengths() -> None:
    with pytest.raises(ConfigError, match=r"give needle\.lengths"):
        prompt_room(NeedleSettings(), {"auto": None})
    assert prompt_room(NeedleSettings(lengths=[2000]), {"auto": None}) is None


def test_cases_come_from_the_seed() -> None:
    lengths, depths = [1024, 2048], [0.0, 0.5, 1.0]
    a = make_cases(NeedleSettings(seed=7), lengths, depths)
    b = make_cases(NeedleSettings(seed=7), lengths, depths)
    c = make_cases(NeedleSettings(seed=8), lengths, depths)
    assert a == b
    assert [x.value for x in a] != [x.value for x in c]
    # more cases keep the earlier ones (their ids are padded to the count's width)
    def fields(cases):
        return [(x.target_length, x.target_depth, x.key, x.value, x.filler_start) for x in cases]

    fewer = make_cases(NeedleSettings(seed=7, count=40), lengths, depths)
    assert fields(a[:40]) == fields(fewer)


def test_keys_and_values_look_like_training_and_are_not_in_the_filler() -> None:
    text, vocab = filler_text(), set(key_vocabulary())
    for case in make_cases(NeedleSettings(count=200, seed=3), [1024], [0.5]):
        first, second = case.key.split("-")
        assert first in vocab and second in vocab and first.islower()
        assert len(case.value) == 7 and case.value.isdigit()
        assert case.key not in text and case.value not in text


def test_templates_rotate_and_fill() -> None:
    names = list(load_templates())
    assert names[0] == "ruler" and len(names) == 5
    cases = make_cases(NeedleSettings(count=5, templates=names), [1024], [0.5])
    assert [c.template for c in cases] == names
    templates = load_templates()
    ruler = make_cases(NeedleSettings(count=1), [1024], [0.5])[0]
    assert ruler.needle(templates) == f"One of the special magic numbers for {ruler.key} is: {ruler.value}."
    assert ruler.question(templates) == (f"What is the special magic number for {ruler.key} mentioned in the "
                                         "provided text?")


def test_unknown_template_is_named() -> None:
    with pytest.raises(ConfigError, match=r"needle\.templates: unknown template 'nope': choose from ruler"):
        check_templates(["ruler", "nope"])


def test_small_counts_and_explicit_grids() -> None:
    assert resolve_grid(NeedleSettings(count=1), 4000) == ([4000], [0.5])
    assert resolve_grid(NeedleSettings(count=3), 4000) == ([4000], [0.0, 0.5, 1.0])
    assert resolve_grid(NeedleSettings(lengths=[3000, 1000], depths=[0.5, 0.1]), 4000) == ([1000, 3000], [0.1, 0.5])
    # room below min_length: everything at the room
    assert resolve_grid(NeedleSettings(count=10), 700) == ([700], [0.0, 0.25, 0.5, 0.75, 1.0])


def test_settings_validation_names_the_key() -> None:
    base = {"server": [{"name": "a", "url": "http://127.0.0.1:1", "role": "reference"}]}
    with pytest.raises(ConfigError, match=r"needle\.depths: .*each in \[0, 1\]"):
        parse_config({**base, "needle": {"depths": [0.5, 1.5]}})
    with pytest.raises(ConfigError, match=r"needle\.lengths: .*at least 16 tokens"):
        parse_config({**base, "needle": {"lengths": [8]}})


def test_fingerprint_changes_with_what_shapes_the_cases() -> None:
    s = NeedleSettings()
    base = fingerprint(s, [1024], [0.5], "auto", "/m")
    assert base == fingerprint(NeedleSettings(concurrency=5, stream=True), [1024], [0.5], "auto", "/m")
    assert base != fingerprint(NeedleSettings(seed=1), [1024], [0.5], "auto", "/m")
    assert base != fingerprint(s, [2048], [0.5], "auto", "/m")
    assert base != fingerprint(s, [1024], [0.5], "tiktoken:cl100k_base", "/m")


def test_several_lengths_over_the_limit_make_one_line() -> None:
    with pytest.raises(ConfigError) as err:
        prompt_room(NeedleSettings(lengths=[1024, 7500, 9000]), {"auto": 8192})
    assert err.value.problems == [
        "needle.lengths: 9000 tokens + max_tokens 1024 = 10024 is over max_model_len 8192 of server 'auto' "
        "(so is 7500): the longest prompt that fits is 7168 tokens"]
