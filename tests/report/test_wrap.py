"""kvprobe.report.wrap: lines break only between words, an interval is one word, a word wider than the line
stays whole, and a line keeps its own spacing."""

from __future__ import annotations

from kvprobe.report.wrap import longest, tokens, wrap


def test_an_interval_is_one_unit_and_a_bracket_far_from_its_close_is_not() -> None:
    assert tokens("drop +12.97% [-23.37%, +38.60%] vs bar") == ["drop", "+12.97%", "[-23.37%, +38.60%]", "vs", "bar"]
    assert longest("ratio 0.870 [0.614, 1.234] over 3+3 runs") == len("[0.614, 1.234]")
    # a "[" whose "]" is more than three words on is not an interval: the sentence still wraps
    assert tokens("see [the notes on it below, all] of it")[:2] == ["see", "[the"]


def test_lines_break_between_units_and_never_inside_one() -> None:
    text = "not shown to pass: ratio 0.870 [0.614, 1.234] over 3+3 runs, drop +12.97% [-23.37%, +38.60%]"
    for width in range(18, 60):
        lines = wrap(text, width)
        assert all(len(line) <= width for line in lines), (width, lines)
        assert " ".join(lines).split() == text.split()
        assert sum(line.count("[-23.37%, +38.60%]") for line in lines) == 1
        assert sum(line.count("[0.614, 1.234]") for line in lines) == 1


def test_a_word_wider_than_the_line_stays_whole_and_indents_hold() -> None:
    path = "/tmp/" + "d" * 90 + "/verdict.json"
    assert wrap(f"A: {path}: no signature", 80, "", "    ") == ["A:", f"    {path}:", "    no signature"]
    assert wrap("  auto       127.0.0.1:8101  reference", 80, "  ") == ["  auto       127.0.0.1:8101  reference"]
    assert wrap("", 80) == [""]


def test_a_bar_and_its_outcome_are_one_unit() -> None:
    text = "needle answers cut at the cap +0.000 [-0.021, +0.021] (bar 0.100) pass"
    assert tokens(text)[-2:] == ["[-0.021, +0.021]", "(bar 0.100) pass"]
    assert tokens("throughput drop (bar 5.00%) not measured")[-1] == "(bar 5.00%) not measured"
    assert tokens("0.95x (bar 5.00%) inconclusive · guardrails")[-3:] == ["(bar 5.00%) inconclusive", "·",
                                                                         "guardrails"]
    assert tokens("(bar 0.100)") == ["(bar 0.100)"]
    assert tokens("a (bar of soap) here")[:3] == ["a", "(bar", "of"]  # not a bar's figure: words as they are
    for width in range(20, 70):
        lines = wrap(text, width)
        assert all(not line.rstrip().endswith("(bar") and line.strip() != "pass" for line in lines), lines
        assert " ".join(lines).split() == text.split()
