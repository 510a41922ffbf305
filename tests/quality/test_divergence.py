"""Agreement math: KL over truncated top-k with a leftover bucket, top-1, largest logprob difference."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
from replay import FIXTURES

from kvprobe.errors import Unreadable
from kvprobe.quality.divergence import compare, compare_position, parse_prompt_logprobs


def _softmax(logits: np.ndarray) -> np.ndarray:
    z = logits - logits.max()
    return z - np.log(np.exp(z).sum())


def _topk(logprobs: np.ndarray, k: int, actual: int) -> dict[int, float]:
    """What vLLM returns: the k most likely tokens plus the prompt's own token."""
    top = np.argsort(-logprobs)[:k]
    return {int(t): float(logprobs[t]) for t in {*top.tolist(), actual}}


def _exact_kl(lp: np.ndarray, lq: np.ndarray) -> float:
    return float(np.sum(np.exp(lp) * (lp - lq)))


def test_identical_positions_give_zero_kl_full_agreement_zero_diff():
    lp = _softmax(np.random.default_rng(1).normal(size=64))
    view = _topk(lp, 20, actual=7)
    kl, agree, diff = compare_position(view, dict(view))
    assert kl == 0.0 and agree and diff == 0.0


def test_truncated_kl_is_the_coarsened_kl_and_a_lower_bound_of_the_exact_kl():
    rng = np.random.default_rng(2)
    lp = _softmax(rng.normal(scale=2.0, size=200))
    lq = _softmax(np.log(np.exp(lp)) + rng.normal(scale=0.3, size=200))
    ref, cand = _topk(lp, 5, actual=11), _topk(lq, 5, actual=11)
    kl, _, diff = compare_position(ref, cand)

    shared = sorted(set(ref) & set(cand))
    p, q = np.exp(lp[shared]), np.exp(lq[shared])
    p_rest, q_rest = 1 - p.sum(), 1 - q.sum()
    by_hand = float(np.sum(p * (lp[shared] - lq[shared])) + p_rest * math.log(p_rest / q_rest))
    assert kl == pytest.approx(by_hand, rel=1e-9)
    assert 0 < kl <= _exact_kl(lp, lq)
    assert diff == pytest.approx(float(np.max(np.abs(lp[shared] - lq[shared]))))


def test_truncated_kl_becomes_exact_as_k_covers_the_vocabulary():
    rng = np.random.default_rng(3)
    lp = _softmax(rng.normal(size=30))
    lq = _softmax(rng.normal(size=30))
    approx = [compare_position(_topk(lp, k, 0), _topk(lq, k, 0))[0] for k in (2, 10, 30)]
    assert approx[0] <= approx[1] <= approx[2]
    assert approx[2] == pytest.approx(_exact_kl(lp, lq), rel=1e-9)


def test_mass_moved_out_of_the_top_k_shows_in_the_leftover_bucket():
    # Same logprobs on the two reported tokens would hide nothing; here the candidate keeps the
    # top token's logprob but reports much less mass on the rest of its top-k.
    ref = {1: math.log(0.5), 2: math.log(0.3)}
    cand = {1: math.log(0.5), 2: math.log(0.05)}
    kl, agree, diff = compare_position(ref, cand)
    expected = 0.3 * math.log(0.3 / 0.05) + 0.2 * math.log(0.2 / 0.45)
    assert kl == pytest.approx(expected)
    assert agree
    assert diff == pytest.approx(math.log(0.3 / 0.05))


def test_top1_disagreement_and_ties():
    assert not compare_position({1: -0.1, 2: -3.0}, {1: -3.0, 2: -0.1})[1]
    # A tie at the top of either side counts as agreement when the tied sets meet.
    assert compare_position({1: -0.7, 2: -0.7}, {2: -0.6, 1: -0.9})[1]


def test_compare_skips_positions_without_logprobs_and_checks_lengths():
    a = [None, {1: -0.1, 2: -2.5}, {3: -0.2, 4: -1.8}]
    result = compare(a, a)
    assert result.positions == 2 and all(result.top1)
    with pytest.raises(ValueError, match="prompt positions"):
        compare(a, a[:2])


def _capture(server: str) -> dict:
    return json.loads((FIXTURES / server / "completions_prompt_logprobs1_max1.response.json").read_text())


def test_real_vllm_prompt_logprobs_auto_vs_fp8():
    """The same prompt on real auto and fp8 servers (captured): fp8 really differs, a little."""
    auto = parse_prompt_logprobs(_capture("auto-8101"))
    fp8 = parse_prompt_logprobs(_capture("fp8-8102"))
    assert auto[0] is None and fp8[0] is None  # the first prompt token has no context
    assert all(isinstance(p, dict) and 1 <= len(p) <= 2 for p in auto[1:])
    same = compare(auto, auto)
    assert same.positions == len(auto) - 1 and max(same.kl) == 0.0 and all(same.top1)
    result = compare(auto, fp8)
    assert result.positions == len(auto) - 1
    assert 0 < max(result.diff) < 0.05  # the fixtures README: up to 0.029 nats per token
    assert 0 < max(result.kl) < 0.01


def test_parse_rejects_a_response_without_prompt_logprobs():
    with pytest.raises(Unreadable, match="prompt_logprobs"):
        parse_prompt_logprobs({"choices": [{"text": "x"}]})


def _answer(logprob: float) -> dict:
    return {"choices": [{"prompt_logprobs": [None, {"5": {"logprob": -0.1}, "9": {"logprob": logprob}}]}]}


def test_vllms_logprob_floor_is_read_and_below_it_is_garbage():
    # vLLM sends -inf as -9999.0: a real value, and the KL it makes is large but finite.
    floor = parse_prompt_logprobs(_answer(-9999.0))
    kl = compare(parse_prompt_logprobs(_answer(-1.0)), floor).kl
    assert math.isfinite(kl[0]) and kl[0] > 1000
    # -1e308 would make p * (lp - lq) overflow to inf, and every mean over it with it.
    with pytest.raises(Unreadable, match=r"\[1\]\[9\]\.logprob .* is below"):
        parse_prompt_logprobs(_answer(-1e308), "fp8")
