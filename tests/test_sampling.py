"""Sampler: greedy, the filter chain, repeat penalty, seeds."""

import numpy as np

from llamavk.sampling import Sampler, SamplingParams


def draws(params, logits, n=2000):
    s = Sampler(params)
    return np.bincount([s.sample(logits) for _ in range(n)], minlength=len(logits))


LOGITS = np.log(np.array([0.5, 0.3, 0.15, 0.04, 0.01], dtype=np.float32))


def test_greedy():
    assert Sampler(SamplingParams(temp=0)).sample(LOGITS) == 0
    assert Sampler(SamplingParams(temp=0.0)).sample(-LOGITS) == 4


def test_top_k_one_is_greedy():
    assert (draws(SamplingParams(temp=1.0, top_k=1, seed=1), LOGITS)[1:] == 0).all()


def test_top_p_keeps_the_smallest_set_reaching_p():
    counts = draws(SamplingParams(temp=1.0, top_k=0, top_p=0.8, min_p=0.0, seed=2), LOGITS)
    assert counts[0] > 0 and counts[1] > 0 and (counts[2:] == 0).all()      # 0.5 + 0.3 reaches 0.8


def test_min_p_drops_unlikely_tokens():
    counts = draws(SamplingParams(temp=1.0, top_k=0, top_p=1.0, min_p=0.1, seed=3), LOGITS)
    assert (counts[:3] > 0).all() and (counts[3:] == 0).all()             # 0.04 < 0.1 * 0.5


def test_unfiltered_sampling_follows_the_distribution():
    counts = draws(SamplingParams(temp=1.0, top_k=0, top_p=1.0, min_p=0.0, seed=4), LOGITS, n=20000)
    np.testing.assert_allclose(counts / counts.sum(), np.exp(LOGITS), atol=0.015)


def test_repeat_penalty_lowers_recent_tokens():
    s = Sampler(SamplingParams(temp=0, repeat_penalty=2.0, repeat_last_n=4), history=[0])
    assert s.sample(np.array([1.0, 0.9, 0.1], dtype=np.float32)) == 1    # 1.0 / 2 < 0.9
    s = Sampler(SamplingParams(temp=0, repeat_penalty=2.0, repeat_last_n=4), history=[1])
    assert s.sample(np.array([-1.0, -0.6, -5.0], dtype=np.float32)) == 0  # -0.6 * 2 < -1.0


def test_same_seed_same_tokens():
    p = SamplingParams(temp=1.0, top_k=0, top_p=1.0, min_p=0.0, seed=11)
    assert [Sampler(p).sample(LOGITS) for _ in range(1)] == [Sampler(p).sample(LOGITS)]
    a, b = Sampler(p), Sampler(p)
    assert [a.sample(LOGITS) for _ in range(50)] == [b.sample(LOGITS) for _ in range(50)]
