"""The matrix-vector kernel's fused forms (decode): RMS norm of the input, residual add, chunks."""

import numpy as np
import pytest
from gguf import GGMLQuantizationType as T

from llamavk.kernels import KernelCache, View, upload_qweight
from llamavk.kernels.matmul import matmul
from llamavk.vk import Buffer, CommandSequence

from .test_kernels_matmul import make_weight


def f32(dev, a):
    buf = Buffer(dev, max(4, a.nbytes), host_visible=True)
    buf.array(np.float32, a.size)[:] = a.reshape(-1)
    return buf


@pytest.mark.parametrize("qtype,cols", [(T.Q4_0, 96), (T.Q8_0, 160), (T.Q4_K, 256), (T.F16, 100), (T.Q6_K, 512)])
@pytest.mark.parametrize("n_tokens", [1, 3])
@pytest.mark.parametrize("chunked", [False, True])
def test_norm_and_residual_fused(dev, qtype, cols, n_tokens, chunked):
    rows, eps = 37, 1e-5
    rng = np.random.default_rng(cols + n_tokens)
    raw, w = make_weight(qtype, rows, cols, seed=cols)
    x = (rng.standard_normal((n_tokens, cols)) * 3).astype(np.float32)
    nw = rng.uniform(0.5, 1.5, cols).astype(np.float32)
    res = rng.standard_normal((n_tokens, rows)).astype(np.float32)
    bias = rng.standard_normal(rows).astype(np.float32)
    kc = KernelCache(dev)
    qw = upload_qweight(dev, raw, qtype, rows, cols, max_chunk_bytes=raw.shape[1] * 5 if chunked else None)
    X, N, R, B = f32(dev, x), f32(dev, nw), f32(dev, res), f32(dev, bias)
    Y = f32(dev, np.full((n_tokens, rows), np.nan, np.float32))
    seq = CommandSequence(dev).begin()
    matmul(seq, kc, qw, View.whole(X), View.whole(Y), n_tokens, bias=View.whole(B), norm=View.whole(N), eps=eps,
           residual=View.whole(R))
    seq.end().run()
    xd = x.astype(np.float64)
    xn = xd / np.sqrt((xd ** 2).mean(axis=1, keepdims=True) + eps) * nw
    want = res + bias + xn @ w.T
    got = Y.array(np.float32, n_tokens * rows).reshape(n_tokens, rows)
    assert np.abs(got - want).max() <= 1e-3 * np.abs(want).max()


@pytest.mark.parametrize("qtype,cols", [(T.Q4_0, 96), (T.Q6_K, 256), (T.F32, 50)])
def test_glu_input_fused(dev, qtype, cols):
    """x' = silu(gate) * up (the SwiGLU feeding the FFN down product), with a residual; large negative
    gates must give 0, not NaN."""
    rows, n_tokens = 21, 2
    rng = np.random.default_rng(cols)
    raw, w = make_weight(qtype, rows, cols, seed=cols + 7)
    gate = (rng.standard_normal((n_tokens, cols)) * 4).astype(np.float32)
    gate[0, :3] = [-200.0, -1e4, 90.0]
    up = rng.standard_normal((n_tokens, cols)).astype(np.float32)
    res = rng.standard_normal((n_tokens, rows)).astype(np.float32)
    kc = KernelCache(dev)
    qw = upload_qweight(dev, raw, qtype, rows, cols)
    G, Up, R = f32(dev, gate), f32(dev, up), f32(dev, res)
    Y = f32(dev, np.full((n_tokens, rows), np.nan, np.float32))
    seq = CommandSequence(dev).begin()
    matmul(seq, kc, qw, View.whole(G), View.whole(Y), n_tokens, residual=View.whole(R), glu=View.whole(Up))
    seq.end().run()
    g64 = gate.astype(np.float64)
    xin = g64 / (1.0 + np.exp(np.minimum(-g64, 700))) * up
    want = res + xin @ w.T
    got = Y.array(np.float32, n_tokens * rows).reshape(n_tokens, rows)
    assert np.isfinite(got).all()
    assert np.abs(got - want).max() <= 1e-3 * np.abs(want).max()
