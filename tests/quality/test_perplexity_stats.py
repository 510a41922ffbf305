"""Perplexity aggregates, what the probe records, and the check's t interval over passages with the noise."""

from __future__ import annotations

import math
from types import SimpleNamespace

import pytest

from kvprobe.config import Bars
from kvprobe.probes.perplexity import summarise
from kvprobe.quality.passages import plan_passage
from kvprobe.quality.perplexity_stats import DocRow, perplexities
from kvprobe.verdict.checks.quality import perplexity_check
from kvprobe.verdict.evidence import read_perplexity


def _rows(lls: list[float], nbytes: list[int], words: int = 100, tokens: int = 300) -> list[DocRow]:
    return [DocRow(i, ll, words, b, tokens) for i, (ll, b) in enumerate(zip(lls, nbytes, strict=True))]


def test_perplexities_match_lm_eval_aggregations():
    from lm_eval.api.metrics import bits_per_byte, weighted_perplexity

    rows = [DocRow(0, -1200.5, 310, 2000, 600), DocRow(1, -800.25, 190, 1500, 420)]
    got = perplexities(rows)
    assert got["word_perplexity"] == pytest.approx(weighted_perplexity([(r.loglikelihood, r.words) for r in rows]))
    assert got["byte_perplexity"] == pytest.approx(weighted_perplexity([(r.loglikelihood, r.bytes) for r in rows]))
    assert got["bits_per_byte"] == pytest.approx(bits_per_byte([(r.loglikelihood, r.bytes) for r in rows]))
    assert got["token_perplexity"] == pytest.approx(math.exp(2000.75 / 1020))


def _settings(**kw):
    base = {"delta_unit": "byte", "reference_repeats": 2}
    return SimpleNamespace(**(base | kw))


def _check(ref: list[DocRow], cand: list[DocRow], unit: str = "byte", ref_again: list[DocRow] | None = None,
           bar: float = 0.01) -> dict:
    """The perplexity check on what the probe's summarise records, read as the verdict reads it."""
    rows = {("ref", 1): ref, ("cand", 1): cand, ("ref", 2): ref_again if ref_again is not None else list(ref)}
    summary = summarise("ref", ["ref", "cand"], rows, [], _settings(delta_unit=unit), bar, {})
    inputs = {"reference": "ref", "probes": {"perplexity": read_perplexity(summary)}, "probes_status": {}}
    return perplexity_check(inputs, "cand", Bars(perplexity_delta_max=bar))


def test_same_scores_give_zero_delta_with_a_zero_width_interval():
    ref = _rows([-900.0, -1100.0, -1000.0], [1000, 1200, 1100])
    check = _check(ref, list(ref))
    assert (check["value"], *check["interval"]) == (0.0, 0.0, 0.0)


def test_a_uniform_shift_per_byte_is_exactly_that_delta():
    nbytes = [1000, 2500, 1700, 900]
    ref = _rows([-3000.0, -7000.0, -5000.0, -2800.0], nbytes)
    cand = _rows([r.loglikelihood - 0.002 * r.bytes for r in ref], nbytes)
    check = _check(ref, cand)
    assert check["value"] == pytest.approx(math.expm1(0.002))
    assert check["interval"] == pytest.approx([math.expm1(0.002)] * 2)


def test_the_interval_is_a_t_interval_over_passages():
    from scipy.stats import t

    nbytes = [1000] * 5
    rises = [0.5, -1.0, 2.0, 0.0, 3.5]  # nats per passage
    ref = _rows([-3000.0] * 5, nbytes)
    cand = _rows([r.loglikelihood - d for r, d in zip(ref, rises, strict=True)], nbytes)
    check = _check(ref, cand)
    r = sum(rises) / 5000
    se = (sum((d / 1000 - r) ** 2 for d in rises) / 4) ** 0.5 / 5**0.5
    assert check["value"] == pytest.approx(math.expm1(r))
    half = t.ppf(0.975, 4) * se
    assert check["interval"] == pytest.approx([math.expm1(r - half), math.expm1(r + half)])
    # 5 passages: fewer than a pass needs, whatever the interval says
    assert check["outcome"] == "inconclusive" and "5 passages: a pass needs at least 8" in check["text"]


def test_units_change_the_delta_as_the_unit_counts_say():
    ref = [DocRow(0, -1000.0, words=100, bytes=1000, tokens=250)]
    cand = [DocRow(0, -1001.0, words=100, bytes=1000, tokens=250)]
    assert _check(ref, cand, "byte")["value"] == pytest.approx(math.expm1(1 / 1000))
    assert _check(ref, cand, "word")["value"] == pytest.approx(math.expm1(1 / 100))
    assert _check(ref, cand, "token")["value"] == pytest.approx(math.expm1(1 / 250))


def test_passages_are_paired_by_index():
    ref = _rows([-100.0, -200.0], [100, 100])
    cand = [DocRow(1, -200.0, 100, 100, 300), DocRow(0, -110.0, 100, 100, 300)]  # other order
    assert _check(ref, cand)["value"] == pytest.approx(math.expm1(10 / 200))


def test_a_noisy_reference_widens_the_interval_and_too_much_noise_is_not_passed():
    nbytes = [1000] * 10
    ref = _rows([-3000.0 - 10 * i for i in range(10)], nbytes)
    cand = _rows([r.loglikelihood - 0.0005 * r.bytes * (1 + 0.1 * (i % 3)) for i, r in enumerate(ref)], nbytes)
    quiet = _check(ref, cand)
    assert quiet["noise"]["deterministic"] and "10/10 passages bit-identical over 2 runs" in quiet["text"]
    wobble = _rows([r.loglikelihood - 0.0004 * r.bytes for r in ref], nbytes)  # the reference moved 0.04%
    noisy = _check(ref, cand, ref_again=wobble)
    assert noisy["noise"]["deterministic"] is False and noisy["noise"]["rms"] == pytest.approx(math.expm1(0.0004))
    assert noisy["interval"][1] - noisy["interval"][0] > quiet["interval"][1] - quiet["interval"][0]
    assert "reference run-to-run 0.04%" in noisy["text"]
    shaky = _rows([r.loglikelihood - 0.004 * r.bytes for r in ref], nbytes)  # 0.4%: over a third of 1%
    loud = _check(ref, _rows([r.loglikelihood for r in ref], nbytes), ref_again=shaky)
    assert loud["outcome"] == "inconclusive" and "over a third of the bar" in loud["text"]


def test_summary_records_every_passage_and_judges_nothing():
    nbytes = [1000, 1000, 1000]
    ref1 = _rows([-3000.0, -3100.0, -2900.0], nbytes)
    ref2 = _rows([-3000.5, -3100.0, -2900.0], nbytes)
    worse = _rows([r.loglikelihood - 0.05 * r.bytes for r in ref1], nbytes)
    rows = {("ref", 1): ref1, ("ref", 2): ref2, ("bad", 1): worse}
    plans = [plan_passage(i, str(i), "x" * 1000, 2100, 8192, 2048) for i in range(3)]
    summary = summarise("ref", ["ref", "bad", "gone"], rows, plans, _settings(), 0.01, {"gone": "gone: HTTP 500"})
    servers = summary["servers"]
    assert servers["ref"]["passage_ll"] == [-3000.0, -3100.0, -2900.0]
    assert servers["ref"]["repeat_ll"] == [[-3000.5, -3100.0, -2900.0]]
    assert servers["bad"]["passage_units"] == nbytes and servers["bad"]["passage_doc"] == [0, 1, 2]
    assert servers["gone"] == {"error": "gone: HTTP 500"}
    assert summary["crossed_chunk"] == 3
    for entry in (servers["ref"], servers["bad"]):
        assert not {"delta", "ci95", "noise", "outcome"} & entry.keys()  # the checks judge
