"""Perplexity's token log-probabilities on the device (shaders/token_logprob.comp, token_scorer.py):
the kernel against numpy in float64, and whole perplexity / KL-divergence runs against the host's
log-softmax over the same model's logits."""

from __future__ import annotations

import numpy as np
import pytest

import llamavk
from llamavk.kernels import KernelCache, View
from llamavk.kernels.logprob import OUT_WORDS, log_probs, token_logprob
from llamavk.perplexity import perplexity, token_nll
from llamavk.vk import Buffer, CommandSequence


@pytest.fixture(scope="module")
def kc(dev):
    return KernelCache(dev)


def run_kernel(dev, kc, logits: np.ndarray, targets: np.ndarray, n_cols: int) -> np.ndarray:
    """The kernel over `logits` (rows x stride, the first n_cols of each row scored); its raw output."""
    x = Buffer(dev, logits.nbytes)
    x.write(np.ascontiguousarray(logits, dtype=np.float32))
    t = Buffer(dev, max(4, targets.nbytes))
    t.write(targets.astype(np.uint32))
    out = Buffer(dev, len(logits) * OUT_WORDS * 4, host_visible=True)
    mem = out.array(np.float32, len(logits) * OUT_WORDS).reshape(-1, OUT_WORDS)
    mem[:] = np.nan
    seq = CommandSequence(dev, "token_logprob").begin()
    token_logprob(seq, kc, View.whole(x), View.whole(t), View.whole(out), len(logits), n_cols, logits.shape[1])
    seq.end().run()
    return mem.copy()


def want_log_p(rows: np.ndarray, targets: np.ndarray) -> np.ndarray:
    x = rows.astype(np.float64)
    m = x.max(axis=1)
    return x[np.arange(len(x)), targets] - m - np.log(np.exp(x - m[:, None]).sum(axis=1))


@pytest.mark.parametrize("n_cols", [1, 33, 500, 4097, 32000])
def test_kernel_matches_numpy(dev, kc, n_cols):
    """Vocabularies not a multiple of the workgroup (or smaller than one subgroup), rows at large
    positive and negative offsets (the log-sum-exp must not overflow or lose them), a peaked row,
    a flat row, the maximum in the last column, and a row read with a stride wider than n_cols."""
    rng = np.random.default_rng(n_cols)
    rows = 7
    stride = n_cols + 3
    logits = rng.normal(0, 4, (rows, stride)).astype(np.float32)
    logits[1, :] += 8000.0                          # exp(x) overflows float32 without the maximum
    logits[2, :] -= 8000.0
    logits[3, :] = 0.5                              # flat
    logits[4, n_cols - 1] = 60.0                    # the maximum last
    logits[5, :] *= 10
    logits[5, rng.integers(0, n_cols)] = 300.0       # one token takes all the probability
    logits[:, n_cols:] = 1e30                       # past the row: never read
    targets = rng.integers(0, n_cols, rows)
    targets[4] = n_cols - 1
    out = run_kernel(dev, kc, logits, targets, n_cols)
    x = logits[:, :n_cols]
    np.testing.assert_array_equal(out[:, 0], x.max(axis=1))
    np.testing.assert_array_equal(out[:, 2], x[np.arange(rows), targets])
    got = log_probs(out)
    np.testing.assert_allclose(got, want_log_p(x, targets), rtol=1e-6, atol=2e-6)
    assert got[3] == pytest.approx(-np.log(n_cols), abs=1e-6)


def test_kernel_skips_rows_without_target(dev, kc):
    logits = np.random.default_rng(0).normal(size=(3, 50)).astype(np.float32)
    out = run_kernel(dev, kc, logits, np.array([3, 0xFFFFFFFF, 49], dtype=np.int64), 50)
    assert np.isnan(out[1]).all() and np.isfinite(out[[0, 2], :3]).all()      # left as poisoned
    np.testing.assert_allclose(log_probs(out[[0, 2]]), want_log_p(logits[[0, 2]], np.array([3, 49])), atol=2e-6)


def host_and_device(m, tokens, n_ctx, n_seq, **kw):
    """A perplexity run twice: the device reduction, then the host's log-softmax of the same logits."""
    nlls = {"device": [], "host": []}

    def scored(key):
        return lambda logits, targets: nlls[key].append(token_nll(logits, targets))

    dev = m.perplexity_tokens(tokens, n_ctx, -1, 1, on_scored=scored("device"), n_seq=n_seq, **kw)
    host = perplexity(list(tokens), n_ctx, lambda b: m.runtime.eval("all", b, 0, seq_len=n_ctx if len(b) > n_ctx else 0),
                      1, on_scored=scored("host"), n_seq=n_seq)
    return dev, host, nlls


@pytest.mark.parametrize("arch,qtype", [("llama", "q8_0"), ("qwen2", "q4_0")])
def test_perplexity_on_device_equals_host(synthetic_model, arch, qtype):
    """5 chunks of 30 tokens, 4 per batch, micro-batches of 48 rows (sequences continue across
    micro-batches, batches of 4 and 1 chunks, two slots in flight): the device's log-probabilities
    give the host's PPL, running values and uncertainty; the rows handed to on_scored are the
    scored rows of the same logits."""
    path = synthetic_model(arch, qtype)
    tokens = [int(t) for t in np.random.default_rng(4).integers(3, 500, 5 * 30 + 7)]
    with llamavk.load(path, n_ctx=4 * 30, n_ubatch=48, warn=lambda msg: None) as m:
        assert m._token_scorer() is not None
        dev, host, nlls = host_and_device(m, tokens, 30, 4)
        alone = m.perplexity_tokens(tokens, 30, -1, 1, n_seq=4)      # no rows copied
        one = m.perplexity_tokens(tokens, 30, -1, 1, n_seq=1)        # one chunk per batch
    assert dev.n_chunks == host.n_chunks == 5 and dev.count == host.count == 5 * 14
    for r in (dev, alone, one):
        assert r.ppl == pytest.approx(host.ppl, rel=1e-5)
        np.testing.assert_allclose(r.running, host.running, rtol=1e-5)
        assert r.uncertainty == pytest.approx(host.uncertainty, rel=1e-4)
    assert len(nlls["device"]) == len(nlls["host"]) == 5
    for a, b in zip(nlls["device"], nlls["host"]):
        np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-6)


def test_host_path_by_environment(synthetic_model, monkeypatch):
    """LLAMAVK_PPL_HOST=1: the host's log-softmax (the comparison path) gives the same PPL."""
    path = synthetic_model("llama", "q8_0")
    tokens = [int(t) for t in np.random.default_rng(5).integers(3, 500, 3 * 32)]
    with llamavk.load(path, n_ctx=64, warn=lambda msg: None) as m:
        on_device = m.perplexity_tokens(tokens, 32, -1, 1)
        monkeypatch.setenv("LLAMAVK_PPL_HOST", "1")
        assert m._token_scorer() is None
        on_host = m.perplexity_tokens(tokens, 32, -1, 1)
    assert on_device.ppl == pytest.approx(on_host.ppl, rel=1e-5)


def test_kl_divergence_base_from_device_rows(synthetic_model, tmp_path):
    """A base written while the device scores (only scored rows copied) compares against the same
    model with KLD ~0 and the same top token everywhere."""
    path = synthetic_model("llama", "q8_0")
    tokens = [int(t) for t in np.random.default_rng(6).integers(3, 500, 3 * 32 + 4)]
    base = tmp_path / "base.kld"
    with llamavk.load(path, n_ctx=64, n_ubatch=40, warn=lambda msg: None) as m:
        r = m.perplexity_tokens(tokens, 32, -1, 1, kl_divergence_base=base)
        k = m.kl_divergence(base)
    assert r.count == k.count == 3 * 15
    assert abs(k.kld_mean) < 1e-4 and k.same_top == pytest.approx(1.0)
