"""Sampler: greedy, each filter of llama.cpp's chain and temperature against distributions computed by
hand, the repeat penalty, seeds.

The chain (llama.cpp's default order): repeat penalty -> top-k -> top-p -> min-p -> temperature ->
draw, where top-p and min-p see the probabilities at temperature 1 and the temperature reshapes only
the survivors. Every case below states its distribution as fractions worked out from P.
"""

import numpy as np
import pytest

from llamavk.sampling import Sampler, SamplingParams

P = np.array([0.5, 0.3, 0.15, 0.04, 0.01])
LOGITS = np.log(P).astype(np.float32)
N = 10000


def frequencies(params, logits=LOGITS, n=N):
    s = Sampler(params)
    return np.bincount([s.sample(logits) for _ in range(n)], minlength=len(logits)) / n


def assert_distribution(freq, want):
    """Every token within 5 standard errors of its hand-computed probability (binomial, n draws,
    fixed seeds: deterministic); tokens the filters drop are never drawn."""
    want = np.asarray(want, dtype=np.float64)
    want = want / want.sum()
    sigma = np.sqrt(want * (1 - want) / N)
    assert (freq[want == 0] == 0).all(), f"dropped tokens drawn: {freq}"
    assert (np.abs(freq - want) <= 5 * sigma + 1e-9).all(), f"{freq} vs {want}"


def params(**kw):
    base = dict(temp=1.0, top_k=0, top_p=1.0, min_p=0.0, seed=1)
    return SamplingParams(**{**base, **kw})


def test_greedy():
    assert Sampler(SamplingParams(temp=0)).sample(LOGITS) == 0
    assert Sampler(SamplingParams(temp=0.0)).sample(-LOGITS) == 4


def test_unfiltered_sampling_follows_the_distribution():
    assert_distribution(frequencies(params(seed=4)), P)


@pytest.mark.parametrize("temp", [0.5, 2.0])
def test_temperature_divides_the_logits(temp):
    """softmax(log p / T) = p^(1/T) / sum: T 0.5 squares the probabilities (0.25 : 0.09 : 0.0225 :
    0.0016 : 0.0001), T 2 takes their square roots."""
    assert_distribution(frequencies(params(temp=temp, seed=5)), P ** (1 / temp))


def test_top_k_keeps_the_k_most_likely():
    """k = 3: 0.5 : 0.3 : 0.15 renormalised; k = 2 at T 0.5: 0.25 : 0.09."""
    assert_distribution(frequencies(params(top_k=3, seed=6)), [0.5, 0.3, 0.15, 0, 0])
    assert_distribution(frequencies(params(top_k=2, temp=0.5, seed=7)), [0.25, 0.09, 0, 0, 0])
    assert (frequencies(params(top_k=1, seed=8), n=200)[1:] == 0).all()


def test_top_p_keeps_the_smallest_set_reaching_p():
    """Cumulative 0.5, 0.8, 0.95, 0.99, 1: p = 0.75 keeps two, 0.9 three, 0.97 four."""
    assert_distribution(frequencies(params(top_p=0.75, seed=9)), [0.5, 0.3, 0, 0, 0])
    assert_distribution(frequencies(params(top_p=0.9, seed=10)), [0.5, 0.3, 0.15, 0, 0])
    assert_distribution(frequencies(params(top_p=0.97, seed=11)), [0.5, 0.3, 0.15, 0.04, 0])


def test_min_p_is_relative_to_the_most_likely():
    """min-p 0.1 keeps p >= 0.05 (0.1 x 0.5): three tokens; 0.5 keeps p >= 0.25: two."""
    assert_distribution(frequencies(params(min_p=0.1, seed=12)), [0.5, 0.3, 0.15, 0, 0])
    assert_distribution(frequencies(params(min_p=0.5, seed=13)), [0.5, 0.3, 0, 0, 0])


def test_filters_see_temperature_one_and_the_temperature_applies_last():
    """top-p 0.75 at T 2: the filter keeps 0.5 and 0.3 (at T 1), then T 2 gives sqrt(0.5) : sqrt(0.3).
    (Had the temperature come first, p^(1/2) normalised is 0.364, 0.282, 0.199, ...: three kept.)"""
    assert_distribution(frequencies(params(top_p=0.75, temp=2.0, seed=14)), [0.5 ** 0.5, 0.3 ** 0.5, 0, 0, 0])


def test_the_whole_chain():
    """top-k 4 drops 0.01; top-p 0.9 on 0.5/0.99, 0.3/0.99, ... (cumulative 0.505, 0.808, 0.960)
    keeps three; min-p 0.35 on 0.5/0.95, 0.3/0.95, 0.15/0.95 drops 0.158 (< 0.35 x 0.526); T 0.5:
    0.25 : 0.09."""
    f = frequencies(params(top_k=4, top_p=0.9, min_p=0.35, temp=0.5, seed=15))
    assert_distribution(f, [0.25, 0.09, 0, 0, 0])


def test_repeat_penalty_lowers_recent_tokens():
    s = Sampler(SamplingParams(temp=0, repeat_penalty=2.0, repeat_last_n=4), history=[0])
    assert s.sample(np.array([1.0, 0.9, 0.1], dtype=np.float32)) == 1    # 1.0 / 2 < 0.9
    s = Sampler(SamplingParams(temp=0, repeat_penalty=2.0, repeat_last_n=4), history=[1])
    assert s.sample(np.array([-1.0, -0.6, -5.0], dtype=np.float32)) == 0  # -0.6 * 2 < -1.0


def test_repeat_penalty_before_sampling_and_its_window():
    """Penalty 2 on token 0 (logit log 0.5 < 0: multiplied) with temperature 1 sampling: logits
    2 log 0.5, log 0.3, ... i.e. 0.25 : 0.3 : 0.15 : 0.04 : 0.01. Tokens older than repeat_last_n
    are not penalised."""
    s = Sampler(params(repeat_penalty=2.0, repeat_last_n=2, seed=16), history=[0])
    f = np.bincount([s.sample(LOGITS) for _ in range(N)], minlength=5) / N
    assert_distribution(f, [0.25, 0.3, 0.15, 0.04, 0.01])
    s = Sampler(SamplingParams(temp=0, repeat_penalty=2.0, repeat_last_n=2), history=[0, 3, 4])
    assert s.sample(LOGITS) == 0                                          # 0 left the window


def test_seeds():
    p = params(seed=11)
    a, b = Sampler(p), Sampler(p)
    first = [a.sample(LOGITS) for _ in range(50)]
    assert first == [b.sample(LOGITS) for _ in range(50)]
    other = Sampler(params(seed=12))
    assert [other.sample(LOGITS) for _ in range(50)] != first


def test_params_that_would_make_nan_probabilities_are_refused():
    import math

    from llamavk.errors import UsageError

    for bad in (dict(repeat_penalty=0.0), dict(repeat_penalty=-2.0), dict(temp=math.nan), dict(min_p=math.inf)):
        with pytest.raises(UsageError):
            SamplingParams(**bad)
    SamplingParams(temp=0.0, top_k=-1, top_p=2.0, min_p=0.0, repeat_penalty=1.3)   # llama.cpp's "off" values
