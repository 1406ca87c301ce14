"""Sampler: greedy, each filter of llama.cpp's chain and temperature against distributions computed by
hand, the penalties, suppressed tokens, seeds and the draw's random numbers (the draws themselves
against llama-completion's: test_sampling_llamacpp.py).

The chain (llama.cpp's default order): suppressed tokens -> penalties -> top-n-sigma -> top-k ->
typical -> top-p -> min-p -> temperature -> draw, where the filters see the probabilities at
temperature 1 and the temperature reshapes only the survivors. Every case below states its
distribution as fractions worked out from P.
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
    for bad in (dict(presence_penalty=math.inf), dict(typical_p=math.nan), dict(repeat_last_n=-2)):
        with pytest.raises(UsageError):
            SamplingParams(**bad)


def test_frequency_and_presence_penalties():
    """Window [0, 0, 2], repeat 2, frequency 0.1, presence 0.05: token 0's 1.0 / 2 - (2 x 0.1 + 0.05)
    = 0.25 and token 2's 0.2 / 2 - (0.1 + 0.05) = -0.05, token 1 (not in the window) keeps 0.3.
    Frequency 0.3 alone: once 1.0 - 0.3 = 0.7 > 0.5, twice 0.4 < 0.5."""
    s = Sampler(SamplingParams(temp=0, repeat_penalty=2.0, frequency_penalty=0.1, presence_penalty=0.05,
                               repeat_last_n=8), history=[0, 0, 2])
    assert s.sample(np.array([1.0, 0.3, 0.2], dtype=np.float32)) == 1
    assert s.sample(np.array([1.0, 0.24, 0.2], dtype=np.float32)) == 0
    s = Sampler(SamplingParams(temp=0, frequency_penalty=0.3, repeat_last_n=8), history=[0])
    assert s.sample(np.array([1.0, 0.5], dtype=np.float32)) == 0
    s.accept(0)
    assert s.sample(np.array([1.0, 0.5], dtype=np.float32)) == 1


def test_typical_keeps_the_most_typical_tokens():
    """P's entropy H = 1.1673 nats; |-log p - H| = 0.474, 0.037, 0.730, 2.05, 3.44: token 1 (0.3) is
    the most typical, then 0 (0.5). typical 0.2 keeps token 1 alone (0.3 > 0.2), even greedy, where
    the most likely token is 0; typical 0.5 keeps tokens 1 and 0 (0.3 + 0.5 > 0.5)."""
    assert Sampler(SamplingParams(temp=0, typical_p=0.2)).sample(LOGITS) == 1
    assert_distribution(frequencies(params(typical_p=0.5, seed=17)), [0.5, 0.3, 0, 0, 0])


def test_top_n_sigma_keeps_logits_within_n_deviations_of_the_best():
    """Logits 2, 1, 0, -1, -5: mean -0.6, standard deviation sqrt(29.2 / 5) = 2.417; n = 1 keeps
    logits >= 2 - 2.417 = -0.417 (e^2 : e : 1), n = 2 also -1."""
    logits = np.array([2, 1, 0, -1, -5], dtype=np.float32)
    assert_distribution(frequencies(params(top_n_sigma=1.0, seed=18), logits), np.exp([2, 1, 0]).tolist() + [0, 0])
    assert_distribution(frequencies(params(top_n_sigma=2.0, seed=19), logits), np.exp([2, 1, 0, -1]).tolist() + [0])


def test_suppressed_tokens_are_never_drawn():
    assert Sampler(SamplingParams(temp=0), suppress=[0]).sample(LOGITS) == 1
    s = Sampler(params(seed=20), suppress=[0, 2])
    assert_distribution(np.bincount([s.sample(LOGITS) for _ in range(N)], minlength=5) / N, [0, 0.3, 0, 0.04, 0.01])


def test_repeat_last_n_minus_one_is_the_context():
    s = Sampler(SamplingParams(temp=0, repeat_penalty=4.0, repeat_last_n=-1), history=[0] + [3] * 100, n_ctx=128)
    assert s.sample(LOGITS) == 1                                          # token 0, 101 tokens back, penalised
    s = Sampler(SamplingParams(temp=0, repeat_penalty=4.0, repeat_last_n=64), history=[0] + [3] * 100)
    assert s.sample(LOGITS) == 0


def test_draws_are_libstdcxx_canonical_doubles():
    """std::mt19937's first two words for its default seed 5489 (3499211612, 581869302: the C++
    standard's engine) make the first double: (w0 + w1 2^32) / 2^64."""
    from llamavk.cpp_random import MT19937, canonical

    rng = MT19937(5489)
    assert canonical(rng) == (3499211612 + 581869302 * 2.0 ** 32) / 2.0 ** 64


def test_xtc_drops_the_top_choices_but_the_least_likely():
    """Threshold 0.1: 0.5, 0.3 and 0.15 are at or above it; with probability 1 XTC drops all but
    the least likely of them, 0.15, which greedy then takes (sampling at T 1: 0.15 : 0.04 : 0.01).
    Threshold 0.45: only 0.5 is above it, and it is the least likely of those: nothing dropped.
    Threshold 0.6: XTC is off (above 0.5)."""
    assert Sampler(SamplingParams(temp=0, xtc_probability=1.0, xtc_threshold=0.1)).sample(LOGITS) == 2
    assert_distribution(frequencies(params(xtc_probability=1.0, xtc_threshold=0.1, seed=21)), [0, 0, 0.15, 0.04, 0.01])
    assert Sampler(SamplingParams(temp=0, xtc_probability=1.0, xtc_threshold=0.45)).sample(LOGITS) == 0   # one above
    assert Sampler(SamplingParams(temp=0, xtc_probability=1.0, xtc_threshold=0.6)).sample(LOGITS) == 0


def test_xtc_applies_with_its_probability():
    """xtc_probability 0.5, threshold 0.1: half the tokens come from 0.15 : 0.04 : 0.01, half from P."""
    f = frequencies(params(xtc_probability=0.5, xtc_threshold=0.1, seed=22))
    assert_distribution(f, 0.5 * P + 0.5 * np.array([0, 0, 0.15, 0.04, 0.01]) / 0.2)


def test_xtc_draws_are_libstdcxx_floats():
    """uniform_real_distribution<float>: one word as a float (rounded to 24 bits) / 2^32; a word that
    rounds to 2^32 gives the float just below 1."""
    from llamavk.cpp_random import canonical_float

    class Words:
        def __init__(self, *w):
            self.w = list(w)

        def __call__(self):
            return self.w.pop(0)

    assert canonical_float(Words(3499211612)) == float(np.float32(3499211612) / np.float32(2 ** 32))
    assert canonical_float(Words(0xFFFFFFFF)) == float(np.nextafter(np.float32(1), np.float32(0)))


def test_mirostat_2_keeps_what_stays_within_mu_and_moves_mu():
    """tau 0.5: mu starts at 2 tau = 1 bit; -log2 0.5 = 1 stays, -log2 0.3 = 1.74 does not, so token 0
    alone; its surprise after renormalising is 0, so mu moves by eta (0.1) x (0 - 0.5) up to 1.05.
    mu 4 bits (tau 2; p >= 1/16 within: 0.5, 0.3, 0.15): draws from 0.5 : 0.3 : 0.15."""
    s = Sampler(SamplingParams(temp=1.0, mirostat=2, mirostat_tau=0.5, mirostat_eta=0.1, seed=1))
    assert s.sample(LOGITS) == 0 and s._mu == np.float32(1.05)
    s = Sampler(SamplingParams(temp=1.0, mirostat=2, mirostat_tau=2.0, mirostat_eta=0.1, seed=23))
    draws = []
    for _ in range(N):
        s._mu = np.float32(4.0)                  # every draw from the first one's cut
        draws.append(s.sample(LOGITS))
    assert_distribution(np.bincount(draws, minlength=5) / N, [0.5, 0.3, 0.15, 0, 0])


def test_discrete_is_libstdcxx_discrete_distribution():
    """The weights' running sums (normalised, the last set to 1) against one canonical double: the
    first sum at or above it; fewer than two weights draw nothing and give 0."""
    from llamavk.cpp_random import MT19937, canonical, discrete

    a, b = MT19937(7), MT19937(7)
    w = np.array([0.2, 0.3, 0.5], dtype=np.float32)
    for _ in range(200):
        u = canonical(b)
        assert discrete(w, a) == (0 if u <= 0.2 else 1 if u <= 0.5 else 2)
    assert discrete(np.array([1.0], dtype=np.float32), a) == 0 and a() == b()   # nothing drawn


def test_out_of_range_values_still_draw_a_token():
    """Values llama.cpp accepts without complaint: min-p above 1 keeps the best token (its sorted
    path), negative top-p and typical-p keep one; nothing ends without a token."""
    for kw in (dict(min_p=5.0), dict(min_p=5.0, top_k=3), dict(top_p=-1.0), dict(typical_p=-1.0),
               dict(top_n_sigma=0.001), dict(xtc_probability=1.0, xtc_threshold=0.0)):
        assert Sampler(params(seed=24, **kw)).sample(LOGITS) in range(5), kw
    assert Sampler(params(seed=24, min_p=5.0)).sample(LOGITS) == 0


def test_sampler_orders_as_llamacpp_names_them():
    """--samplers takes llama.cpp's names (case-insensitive; kebab-case, no underscores, and its
    aliases), --sampling-seq its letters; what llamavk lacks or does not know is a usage error."""
    from llamavk.errors import UsageError
    from llamavk.sampling import CHAIN, sampler_chain, sampler_sequence

    assert sampler_chain("penalties;dry;top_n_sigma;top_k;typ_p;top_p;min_p;xtc;temperature") == CHAIN
    assert sampler_sequence("edskypmxt") == CHAIN
    assert sampler_chain("Top-K;nucleus;minp;TEMP;typ;") == ("top_k", "top_p", "min_p", "temperature", "typ_p")
    for bad in ("top_k;infill", "top_k;nope"):
        with pytest.raises(UsageError):
            sampler_chain(bad)
    with pytest.raises(UsageError):
        sampler_sequence("kz")


def test_an_order_without_temperature_ignores_temp():
    """No "temperature" step: --temp 0 is not greedy (llama.cpp's chain then draws at temperature 1).
    The temperature first: min-p 0.5 sees T 2's probabilities, relative to the best sqrt(p / 0.5) =
    1, 0.775, 0.548, 0.283, 0.141, so it keeps three (at T 1, 1, 0.6, 0.3, ...: two)."""
    assert_distribution(frequencies(params(temp=0.0, samplers=("top_k",), seed=25)), P)
    f = frequencies(params(temp=2.0, min_p=0.5, samplers=("temperature", "min_p"), seed=26))
    assert_distribution(f, (P ** 0.5) * [1, 1, 1, 0, 0])
