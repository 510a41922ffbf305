"""Perplexity aggregates, the paired bootstrap of the relative delta, and the outcome rule."""

from __future__ import annotations

import math
from types import SimpleNamespace

import pytest

from kvprobe.probes.perplexity import summarise
from kvprobe.quality.passages import plan_passage
from kvprobe.quality.perplexity_stats import DocRow, perplexities, relative_delta
from kvprobe.stats import Interval, bar_outcome


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


def test_same_scores_give_zero_delta_with_a_zero_width_interval():
    ref = _rows([-900.0, -1100.0, -1000.0], [1000, 1200, 1100])
    interval = relative_delta(ref, list(ref))
    assert (interval.estimate, interval.lo, interval.hi) == (0.0, 0.0, 0.0)


def test_a_uniform_shift_per_byte_gives_exactly_that_delta_in_every_resample():
    # Every document loses 0.002 nats per byte: byte perplexity rises by exp(0.002) - 1 whatever
    # documents a resample draws, so the interval collapses onto the point.
    nbytes = [1000, 2500, 1700, 900]
    ref = _rows([-3000.0, -7000.0, -5000.0, -2800.0], nbytes)
    cand = _rows([r.loglikelihood - 0.002 * r.bytes for r in ref], nbytes)
    interval = relative_delta(ref, cand, "byte")
    assert interval.estimate == pytest.approx(math.expm1(0.002))
    assert interval.lo == pytest.approx(math.expm1(0.002)) and interval.hi == pytest.approx(math.expm1(0.002))


def test_interval_is_the_pooled_delta_and_spans_the_per_document_deltas():
    nbytes = [1000, 1000, 1000, 1000, 1000]
    rises = [0.5, -1.0, 2.0, 0.0, 3.5]  # nats per document
    ref = _rows([-3000.0] * 5, nbytes)
    cand = _rows([r.loglikelihood - d for r, d in zip(ref, rises, strict=True)], nbytes)
    interval = relative_delta(ref, cand, "byte", resamples=4000, seed=7)
    assert interval.estimate == pytest.approx(math.expm1(sum(rises) / 5000))
    per_doc = [math.expm1(d / 1000) for d in rises]
    assert min(per_doc) <= interval.lo < interval.estimate < interval.hi <= max(per_doc)
    # Same seed, same interval: the run directory can be re-derived.
    assert relative_delta(ref, cand, "byte", resamples=4000, seed=7) == interval


def test_units_change_the_delta_as_the_unit_counts_say():
    ref = [DocRow(0, -1000.0, words=100, bytes=1000, tokens=250)]
    cand = [DocRow(0, -1001.0, words=100, bytes=1000, tokens=250)]
    assert relative_delta(ref, cand, "byte").estimate == pytest.approx(math.expm1(1 / 1000))
    assert relative_delta(ref, cand, "word").estimate == pytest.approx(math.expm1(1 / 100))
    assert relative_delta(ref, cand, "token").estimate == pytest.approx(math.expm1(1 / 250))


def test_documents_are_paired_by_index():
    ref = _rows([-100.0, -200.0], [100, 100])
    cand = [DocRow(1, -200.0, 100, 100, 300), DocRow(0, -110.0, 100, 100, 300)]  # other order
    assert relative_delta(ref, cand).estimate == pytest.approx(math.expm1(10 / 200))


@pytest.mark.parametrize(("lo", "hi", "expected"), [
    (-0.02, 0.01, "pass"),          # upper end exactly on the bar: pass
    (-0.02, 0.0100001, "inconclusive"),
    (0.01, 0.03, "inconclusive"),   # lower end exactly on the bar: not yet a fail
    (0.0100001, 0.03, "fail"),
    (0.02, 0.05, "fail"),
])
def test_outcome_rule_at_the_bar(lo, hi, expected):
    assert bar_outcome(Interval((lo + hi) / 2, lo, hi), 0.01) == expected


def _settings(**kw):
    base = {"delta_unit": "byte", "bootstrap_resamples": 500, "seed": 0, "reference_repeats": 2}
    return SimpleNamespace(**(base | kw))


def test_summary_reports_noise_deltas_and_outcomes_per_server():
    nbytes = [1000, 1000, 1000]
    ref1 = _rows([-3000.0, -3100.0, -2900.0], nbytes)
    ref2 = _rows([-3000.0, -3100.0, -2900.0], nbytes)
    same = _rows([r.loglikelihood - 0.001 * r.bytes for r in ref1], nbytes)  # +0.1%: passes a 1% bar
    worse = _rows([r.loglikelihood - 0.05 * r.bytes for r in ref1], nbytes)  # +5.1%: fails it
    rows = {("ref", 1): ref1, ("ref", 2): ref2, ("good", 1): same, ("bad", 1): worse}
    plans = [plan_passage(i, str(i), "x" * 1000, 2100, 8192, 2048) for i in range(3)]
    summary = summarise("ref", ["ref", "good", "bad", "gone"], rows, plans, _settings(), 0.01,
                        {"gone": "gone: HTTP 500"})
    servers = summary["servers"]
    assert servers["ref"]["delta"] == 0.0 and servers["ref"]["noise"] == 0.0 and servers["ref"]["outcome"] == "pass"
    assert servers["good"]["delta"] == pytest.approx(math.expm1(0.001)) and servers["good"]["outcome"] == "pass"
    assert servers["bad"]["outcome"] == "fail" and servers["bad"]["ci95"][0] > 0.01
    assert servers["gone"] == {"error": "gone: HTTP 500", "outcome": None}
    assert summary["crossed_chunk"] == 3
    for entry in (servers["ref"], servers["good"], servers["bad"]):
        assert {"bits_per_byte", "word_perplexity", "delta", "ci95", "noise", "outcome"} <= entry.keys()


def test_summary_without_a_second_reference_run_has_no_noise_and_no_reference_outcome():
    rows = {("ref", 1): _rows([-1000.0], [500]), ("c", 1): _rows([-1000.0], [500])}
    summary = summarise("ref", ["ref", "c"], rows, [], _settings(), 0.01, {"ref": "ref broke in run 2"})
    assert summary["servers"]["ref"]["noise"] is None and summary["servers"]["ref"]["outcome"] is None
    assert summary["servers"]["c"]["outcome"] == "pass" and summary["servers"]["c"]["noise"] is None
