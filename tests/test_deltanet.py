"""The qwen35 hybrids' kernels on a real Vulkan device against numpy written here: the causal
convolution with carried state, the gated delta rule token by token (decode) and in chunks (prompts),
the gated per-head norm, the gated attention's Q norm and output gate. State carries across calls,
restarts at position 0 and at every sequence start of a batch of several sequences (step seq_len).
Outputs are poisoned with NaN before every run; states start as garbage where they must not be read."""

from __future__ import annotations

import numpy as np
import pytest

from llamavk.kernels import KernelCache
from llamavk.kernels import deltanet as dn

from .test_kernels_ops import host, poisoned, run, set_step, step_buffer, upload


@pytest.fixture(scope="module")
def kc(dev):
    return KernelCache(dev)


def starts(n_past, n, seq_len):
    """Which tokens of a batch start a sequence (position 0 within their sequence)."""
    pos = np.arange(n_past, n_past + n)
    return (pos % seq_len if seq_len else pos) == 0


# -- causal convolution --------------------------------------------------------------------------

def ref_conv(x, taps, hist, first):
    """silu(causal conv) token by token; hist: the last K-1 inputs (oldest first), reset where first."""
    K = taps.shape[1]
    out = np.empty_like(x, dtype=np.float64)
    hist = hist.astype(np.float64).copy()
    for t in range(len(x)):
        if first[t]:
            hist[:] = 0.0
        window = np.concatenate([hist, x[t:t + 1].astype(np.float64)])       # (K, C)
        acc = (window * taps.T).sum(axis=0)
        out[t] = acc / (1.0 + np.exp(-acc))
        hist = window[1:]
    return out, hist[-(K - 1):] if K > 1 else hist[:0]


def ring_of(rows, n_past, d_conv):
    """The conv state ring (d_conv slots, position pos in slot pos % d_conv) holding `rows`, the
    inputs of the d_conv - 1 positions before n_past (oldest first); other slots NaN: never read."""
    ring = np.full((d_conv, rows.shape[1]), np.nan, np.float32)
    for k in range(1, d_conv):
        if n_past - k >= 0:
            ring[(n_past - k) % d_conv] = rows[d_conv - 1 - k]
    return ring


def rows_of(ring, n_end, n_rows, d_conv):
    """The inputs of the n_rows positions before n_end, oldest first, from a conv state ring."""
    return ring[[(n_end - k) % d_conv for k in range(n_rows, 0, -1)]]


def check_conv_state(ring, hist, n_end, seq_pos_last, d_conv):
    """The ring holds the last inputs of the batch's last sequence (hist, oldest first); slots of
    positions before that sequence are not written (no reader needs them)."""
    n_rows = min(d_conv - 1, seq_pos_last + 1)
    if n_rows:
        np.testing.assert_array_equal(rows_of(ring, n_end, n_rows, d_conv), hist[d_conv - 1 - n_rows:].astype(np.float32))


@pytest.mark.parametrize("channels,d_conv", [(40, 4), (300, 2), (8192, 4), (33, 16), (17, 1)])
def test_ssm_conv_carries_state(dev, kc, channels, d_conv):
    rng = np.random.default_rng(channels + d_conv)
    taps = rng.standard_normal((channels, d_conv)).astype(np.float32)
    w = upload(dev, taps)
    state, smem = host(dev, np.full((d_conv, channels), np.nan, np.float32))  # garbage: n_past 0
    step, stmem = step_buffer(dev)
    hist = np.zeros((d_conv - 1, channels))
    n_past = 0
    for n in (5, 1, 2, 9):          # batches continuing one sequence: the window spans batches
        x = rng.standard_normal((n, channels)).astype(np.float32)
        xv = upload(dev, x)
        out, omem = poisoned(dev, (n, channels))
        set_step(stmem, n_past, n)
        run(dev, lambda seq: dn.ssm_conv(seq, kc, xv, w, state, out, step, n, channels, d_conv))
        want, hist = ref_conv(x, taps, hist, starts(n_past, n, 0))
        np.testing.assert_allclose(omem, want, rtol=1e-5, atol=1e-5)
        n_past += n
        check_conv_state(smem, hist, n_past, n_past - 1, d_conv)


@pytest.mark.parametrize("channels,d_conv,seq_len,n_past,n", [
    (64, 4, 7, 4, 17),       # three sequences of 7 tokens back to back, the batch starting mid-sequence
    (40, 16, 50, 30, 203),   # more tokens than a workgroup's lanes take at once; channels not 32s
    (33, 2, 9, 0, 64),       # the batch ends on a sequence's first token
])
def test_ssm_conv_restarts_at_every_sequence(dev, kc, channels, d_conv, seq_len, n_past, n):
    rng = np.random.default_rng(channels + n)
    taps = rng.standard_normal((channels, d_conv)).astype(np.float32)
    w = upload(dev, taps)
    prev = rng.standard_normal((d_conv - 1, channels)).astype(np.float32)
    state, smem = host(dev, ring_of(prev, n_past, d_conv))
    step, stmem = step_buffer(dev)
    x = rng.standard_normal((n, channels)).astype(np.float32)
    xv = upload(dev, x)
    out, omem = poisoned(dev, (n, channels))
    set_step(stmem, n_past, n, seq_len)
    run(dev, lambda seq: dn.ssm_conv(seq, kc, xv, w, state, out, step, n, channels, d_conv))
    want, hist = ref_conv(x, taps, prev, starts(n_past, n, seq_len))
    np.testing.assert_allclose(omem, want, rtol=1e-5, atol=1e-5)
    check_conv_state(smem, hist, n_past + n, (n_past + n - 1) % seq_len, d_conv)


# -- the gated delta rule ------------------------------------------------------------------------

def ref_gdn(x, alpha, beta, dt, a, S, first, Hk, Hv, D, eps):
    """Token by token in float64 (models/hybrid.py): returns out [n][Hv*D] and the final state."""
    n = len(x)
    S = S.astype(np.float64).copy()
    q = x[:, :Hk * D].reshape(n, Hk, D).astype(np.float64)
    k = x[:, Hk * D:2 * Hk * D].reshape(n, Hk, D).astype(np.float64)
    v = x[:, 2 * Hk * D:].reshape(n, Hv, D).astype(np.float64)
    q = q / np.sqrt((q * q).sum(-1, keepdims=True) + eps)
    k = k / np.sqrt((k * k).sum(-1, keepdims=True) + eps)
    decay = np.exp(np.logaddexp(0.0, alpha.astype(np.float64) + dt) * a)
    b = 1.0 / (1.0 + np.exp(-beta.astype(np.float64)))
    out = np.empty((n, Hv, D))
    for t in range(n):
        if first[t]:
            S[:] = 0.0
        for h in range(Hv):
            kh = h % Hk
            S[h] *= decay[t, h]
            delta = b[t, h] * (v[t, h] - S[h].T @ k[t, kh])
            S[h] += np.outer(k[t, kh], delta)
            out[t, h] = S[h].T @ q[t, kh] / np.sqrt(D)
    return out.reshape(n, Hv * D), S


def gdn_inputs(rng, n, Hk, Hv, D):
    x = rng.standard_normal((n, (2 * Hk + Hv) * D)).astype(np.float32)
    alpha = rng.standard_normal((n, Hv)).astype(np.float32)
    beta = (rng.standard_normal((n, Hv)) * 2).astype(np.float32)
    return x, alpha, beta


class GDN:
    """One layer's DeltaNet on the device: weights, state, and a reference state beside it."""

    def __init__(self, dev, kc, Hk, Hv, D, seed, eps=1e-6):
        self.dev, self.kc, self.Hk, self.Hv, self.D, self.eps = dev, kc, Hk, Hv, D, eps
        self.rng = np.random.default_rng(seed)
        self.dt = (self.rng.standard_normal(Hv) * 0.5).astype(np.float32)
        # decays from ~0.999 to ~1e-4 per token: long memory and near-resets both
        self.a = (-np.exp(self.rng.uniform(np.log(0.002), np.log(8.0), Hv))).astype(np.float32)
        self.dtv, self.av = upload(dev, self.dt), upload(dev, self.a)
        self.S = np.full((Hv, D, D), np.nan)     # garbage until a sequence starts
        self.state, self.smem = host(dev, self.S.astype(np.float32))
        self.step, self.stmem = step_buffer(dev)

    def run(self, n, n_past, seq_len=0, chunked=None):
        x, alpha, beta = gdn_inputs(self.rng, n, self.Hk, self.Hv, self.D)
        xv, av_, bv = upload(self.dev, x), upload(self.dev, alpha), upload(self.dev, beta)
        out, omem = poisoned(self.dev, (n, self.Hv * self.D))
        set_step(self.stmem, n_past, n, seq_len)
        run(self.dev, lambda seq: dn.delta_net(seq, self.kc, xv, av_, bv, self.dtv, self.av, self.state, out,
                                               self.step, n, self.Hk, self.Hv, self.D, self.eps, chunked=chunked))
        want, self.S = ref_gdn(x, alpha, beta, self.dt, self.a, self.S, starts(n_past, n, seq_len), self.Hk, self.Hv,
                               self.D, self.eps)
        return omem.copy(), want


def close(got, want, what):
    scale = max(np.abs(want).max(), 1e-3)
    err = np.abs(got - want).max() / scale
    assert np.isfinite(got).all() and err < 2e-4, f"{what}: max error {err:.2e} of max |value| {scale:.3g}"


@pytest.mark.parametrize("Hk,Hv,D", [(2, 4, 128), (1, 3, 32), (2, 2, 16), (1, 2, 256)])
@pytest.mark.parametrize("chunked", [False, True], ids=["recurrent", "chunked"])
def test_gdn_carries_state_across_batches(dev, kc, Hk, Hv, D, chunked):
    """Batches continuing one sequence (n_past 0 with a garbage state first), both forms: a prompt's
    micro-batches (chunks of 64 with a partial last one) and decode steps."""
    g = GDN(dev, kc, Hk, Hv, D, seed=D + Hv)
    n_past = 0
    for n in ((70, 3, 64, 1) if chunked else (5, 1, 1, 9)):
        got, want = g.run(n, n_past, chunked=chunked)
        close(got, want, f"{n} tokens at {n_past}")
        close(g.smem, g.S, f"state after {n_past + n}")
        n_past += n


@pytest.mark.parametrize("chunked", [False, True], ids=["recurrent", "chunked"])
@pytest.mark.parametrize("n_past,n,seq_len", [(0, 150, 50), (10, 100, 40), (0, 96, 32)])
def test_gdn_restarts_at_every_sequence(dev, kc, chunked, n_past, n, seq_len):
    """Perplexity's parallel sequences: whole sequences back to back in a batch (sequence starts inside
    a chunk of 64 and on its edges); a batch starting mid-sequence continues the state."""
    g = GDN(dev, kc, 2, 4, 32, seed=n + seq_len)
    if n_past:
        got, want = g.run(n_past, 0, seq_len, chunked=chunked)     # the first tokens of sequence 0
        close(got, want, "lead-in")
    got, want = g.run(n, n_past, seq_len, chunked=chunked)
    close(got, want, f"{n} tokens of sequences of {seq_len}")
    close(g.smem, g.S, "state")


@pytest.mark.parametrize("cols", [4, 8, 16, 32])
@pytest.mark.parametrize("D", [12, 128, 256])
def test_gdn_chunk_scan_at_every_width(dev, monkeypatch, cols, D):
    """Every state-column split the host may pick (gdn_chunk_scan.comp's COLS: row groups of 8 to 64
    lanes, head dims that do not fill a row group), on a partial chunk after a whole one."""
    if 4 * cols * (D + dn.CHUNK) > (dev.info.max_shared_memory or 16384):
        pytest.skip(f"{cols} columns of {D} do not fit this device's shared memory")
    monkeypatch.setattr(dn, "scan_columns", lambda kc, head_dim: cols)
    g = GDN(dev, KernelCache(dev), 1, 2, D, seed=cols + D)
    for n, n_past in ((64, 0), (37, 64)):
        got, want = g.run(n, n_past, chunked=True)
        close(got, want, f"{n} tokens at {n_past}")
        close(g.smem, g.S, f"state after {n_past + n}")


def test_gdn_forms_agree_on_a_long_prompt(dev, kc):
    """The chunked form against the token-by-token kernel on the real head shape (Qwen3.6-35B-A3B:
    16 key / 32 value heads of 128; here 2 / 4): prompt of 300 tokens, then decode."""
    a = GDN(dev, kc, 2, 4, 128, seed=7)
    b = GDN(dev, kc, 2, 4, 128, seed=7)
    ga, wa = a.run(300, 0, chunked=True)
    gb, wb = b.run(300, 0, chunked=False)
    np.testing.assert_array_equal(wa, wb)
    close(ga, wa, "chunked")
    close(gb, wb, "recurrent")
    close(ga, gb, "chunked vs recurrent")


# -- one-token steps in one dispatch (gdn_decode.comp) -----------------------------------------------

class Layer:
    """One DeltaNet layer's middle (conv -> delta rule -> gated norm) on the device, its conv ring and
    state shared by the separate kernels (prompt batches) and the one-dispatch step (decode), and a
    float64 numpy copy beside it (ref_conv, ref_gdn, ref_rms)."""

    def __init__(self, dev, kc, Hk, Hv, D, d_conv, seed):
        self.dev, self.kc, self.Hk, self.Hv, self.D, self.K = dev, kc, Hk, Hv, D, d_conv
        self.C = (2 * Hk + Hv) * D
        self.eps, self.norm_eps = 1e-6, 1e-4      # different, so a mix-up shows
        rng = self.rng = np.random.default_rng(seed)
        self.taps = (rng.standard_normal((self.C, d_conv)) * 0.7).astype(np.float32)
        self.dt = (rng.standard_normal(Hv) * 0.5).astype(np.float32)
        self.a = (-np.exp(rng.uniform(np.log(0.002), np.log(8.0), Hv))).astype(np.float32)
        self.w = (1 + 0.2 * rng.standard_normal(D)).astype(np.float32)
        self.tapsv, self.dtv, self.av, self.wv = (upload(dev, v) for v in (self.taps, self.dt, self.a, self.w))
        # garbage until a sequence starts: the kernels must not read it
        self.ring, self.ring_mem = host(dev, np.full((d_conv, self.C), np.nan, np.float32))
        self.state, self.smem = host(dev, np.full((Hv, D, D), np.nan, np.float32))
        self.step, self.stmem = step_buffer(dev)
        self.hist = np.zeros((d_conv - 1, self.C))
        self.S = np.zeros((Hv, D, D))

    def run(self, n, n_past, seq_len=0, fused=False):
        """n tokens at n_past: one dispatch (fused, n == 1) or ssm_conv, delta_net, gated_norm."""
        rng, C, Hv, D = self.rng, self.C, self.Hv, self.D
        x = rng.standard_normal((n, C)).astype(np.float32)
        alpha = rng.standard_normal((n, Hv)).astype(np.float32)
        beta = (rng.standard_normal((n, Hv)) * 2).astype(np.float32)
        z = (rng.standard_normal((n, Hv * D)) * 2).astype(np.float32)
        xv, alv, bev, zv = (upload(self.dev, v) for v in (x, alpha, beta, z))
        out, omem = poisoned(self.dev, (n, Hv * D))
        set_step(self.stmem, n_past, n, seq_len)
        if fused:
            assert n == 1
            run(self.dev, lambda seq: dn.delta_net_step(
                seq, self.kc, xv, self.tapsv, self.ring, alv, bev, self.dtv, self.av, self.state, zv, self.wv, out,
                self.step, self.Hk, Hv, D, self.K, self.eps, self.norm_eps))
        else:
            conv, _ = poisoned(self.dev, (n, C))
            o, _ = poisoned(self.dev, (n, Hv * D))

            def record(seq):
                dn.ssm_conv(seq, self.kc, xv, self.tapsv, self.ring, conv, self.step, n, C, self.K)
                dn.delta_net(seq, self.kc, conv, alv, bev, self.dtv, self.av, self.state, o, self.step, n, self.Hk,
                             Hv, D, self.eps)
                dn.gated_norm(seq, self.kc, o, zv, self.wv, out, n, Hv, D, self.norm_eps)
            run(self.dev, record)
        first = starts(n_past, n, seq_len)
        conv_want, self.hist = ref_conv(x, self.taps, self.hist, first)
        o_want, self.S = ref_gdn(conv_want, alpha, beta, self.dt, self.a, self.S, first, self.Hk, Hv, D, self.eps)
        zz = z.astype(np.float64).reshape(n, Hv, D)
        want = ref_rms(o_want.reshape(n, Hv, D), self.w, self.norm_eps) * (zz / (1.0 + np.exp(-zz)))
        pos_last = (n_past + n - 1) % seq_len if seq_len else n_past + n - 1
        return omem.copy(), want.reshape(n, Hv * D), n_past + n, pos_last

    def check(self, n, n_past, seq_len=0, fused=False):
        got, want, n_end, pos_last = self.run(n, n_past, seq_len, fused)
        what = f"{'fused' if fused else 'separate'} {n} tokens at {n_past}"
        close(got, want, what)
        close(self.smem, self.S, f"state after {what}")
        check_conv_state(self.ring_mem, self.hist, n_end, pos_last, self.K)


@pytest.mark.parametrize("Hk,Hv,D,d_conv,rows", [
    (2, 4, 16, 4, None),      # the tiny models' shape: one slice of 16 rows
    (1, 3, 32, 2, 4),         # 3 value heads per key head, 8 slices of 4 rows
    (3, 6, 12, 16, 5),        # head_dim neither 2^n nor a multiple of the rows; 16 taps
    (2, 2, 16, 1, None),      # no conv history at all
    (2, 4, 128, 4, None),     # Qwen3.6's heads: 8 slices of 16 rows, 1024 threads
    (1, 2, 256, 4, None),     # the largest heads: 4 slices of 64 rows
])
def test_gdn_decode_step_equals_the_three_kernels(dev, monkeypatch, Hk, Hv, D, d_conv, rows):
    """One dispatch per token = conv + delta rule + gated norm: decode steps from a fresh sequence
    (garbage state and ring), after a prompt batch of the separate kernels (their ring and state
    carried in), more steps than the ring has slots, a prompt batch after them (the step's ring
    writes read back by ssm_conv), and a fresh sequence over a used state."""
    if rows is not None:
        monkeypatch.setenv("LLAMAVK_GDN_ROWS", str(rows))
    kc = KernelCache(dev)
    if not dn.decode_fusable(kc, D, d_conv):
        pytest.skip(f"heads of {D} do not fit one workgroup here")
    g = Layer(dev, kc, Hk, Hv, D, d_conv, seed=D + Hv + d_conv)
    g.check(1, 0, fused=True)
    g.check(1, 1, fused=True)
    g.check(5, 2)
    for i in range(7, 7 + d_conv + 2):
        g.check(1, i, fused=True)
    n_past = 9 + d_conv
    g.check(3, n_past)
    g.check(1, 0, fused=True)            # a new sequence at position 0: state and ring restart
    g.check(1, 1, fused=True)


@pytest.mark.parametrize("seq_len", [3, 5])
def test_gdn_decode_step_restarts_with_seq_len(dev, seq_len):
    """Steps of sequences of seq_len positions back to back (step seq_len): the state and the conv
    window restart at every multiple, with garbage of the previous sequence in both."""
    kc = KernelCache(dev)
    g = Layer(dev, kc, 2, 4, 16, 4, seed=seq_len)
    g.check(4, 0, seq_len)
    for n_past in range(4, 12):
        g.check(1, n_past, seq_len, fused=True)


def test_gdn_decode_is_off_with_the_switch(dev, monkeypatch):
    kc = KernelCache(dev)
    assert dn.decode_fusable(kc, 128, 4)
    monkeypatch.setenv("LLAMAVK_GDN_FUSE", "0")
    assert not dn.decode_fusable(kc, 128, 4)


# -- norms and gates -----------------------------------------------------------------------------

def ref_rms(x, w, eps):
    x = x.astype(np.float64)
    return x / np.sqrt((x * x).mean(-1, keepdims=True) + eps) * w


@pytest.mark.parametrize("n_tokens,n_heads,D", [(1, 32, 128), (7, 4, 16), (3, 2, 256)])
def test_gated_norm(dev, kc, n_tokens, n_heads, D):
    rng = np.random.default_rng(D)
    x = rng.standard_normal((n_tokens, n_heads, D)).astype(np.float32)
    z = rng.standard_normal((n_tokens, n_heads, D)).astype(np.float32) * 3
    w = (1 + 0.1 * rng.standard_normal(D)).astype(np.float32)
    out, omem = poisoned(dev, (n_tokens, n_heads * D))
    xv, zv, wv = upload(dev, x), upload(dev, z), upload(dev, w)
    run(dev, lambda seq: dn.gated_norm(seq, kc, xv, zv, wv, out, n_tokens, n_heads, D, 1e-6))
    want = ref_rms(x, w, 1e-6) * (z / (1.0 + np.exp(-z.astype(np.float64))))
    np.testing.assert_allclose(omem, want.reshape(n_tokens, -1), rtol=2e-5, atol=2e-6)


@pytest.mark.parametrize("n_tokens,n_heads,D", [(1, 16, 256), (5, 4, 32)])
def test_q_norm_and_output_gate(dev, kc, n_tokens, n_heads, D):
    """Gated attention: Q normed from the first half of each head's [q | gate], the attention output
    times sigmoid(gate)."""
    rng = np.random.default_rng(n_heads)
    qg = rng.standard_normal((n_tokens, n_heads, 2, D)).astype(np.float32) * 2
    w = (1 + 0.1 * rng.standard_normal(D)).astype(np.float32)
    att = rng.standard_normal((n_tokens, n_heads * D)).astype(np.float32)
    qgv, wv, av = upload(dev, qg), upload(dev, w), upload(dev, att)
    q, qmem = poisoned(dev, (n_tokens, n_heads * D))
    out, omem = poisoned(dev, (n_tokens, n_heads * D))
    run(dev, lambda seq: (dn.head_norm_strided(seq, kc, qgv, wv, q, n_tokens, n_heads, D, 2 * D, 1e-6),
                          dn.attn_gate(seq, kc, av, qgv, out, n_tokens, n_heads, D)))
    np.testing.assert_allclose(qmem, ref_rms(qg[:, :, 0], w, 1e-6).reshape(n_tokens, -1), rtol=2e-5, atol=2e-6)
    gate = qg[:, :, 1].reshape(n_tokens, -1).astype(np.float64)
    np.testing.assert_allclose(omem, att / (1.0 + np.exp(-gate)), rtol=2e-6, atol=1e-7)


# -- IMROPE for text -------------------------------------------------------------------------------

def ref_imrope(x, positions, head_dim, n_dims, base, sections):
    """ggml's IMROPE (GGML_ROPE_TYPE_IMROPE, ggml_mrope_cache_init) in numpy: pair i takes the time,
    height, width or extra position by its interleaved sector; text tokens have positions (p, p, p, 0);
    NEOX pairs (i, i + n_dims/2); the dims past n_dims unchanged."""
    n, nh = x.shape[0], x.shape[1] // head_dim
    xs = x.reshape(n, nh, head_dim).astype(np.float64)
    out = xs.copy()
    total = sum(sections)
    for t, p in enumerate(positions):
        pos = {"t": p, "h": p, "w": p, "e": 0}
        for i in range(n_dims // 2):
            sector = i % total
            if sector % 3 == 1 and sector < 3 * sections[1]:
                which = "h"
            elif sector % 3 == 2 and sector < 3 * sections[2]:
                which = "w"
            elif sector % 3 == 0 and sector < 3 * sections[0]:
                which = "t"
            else:
                which = "e"
            theta = pos[which] * base ** (-2.0 * i / n_dims)
            c, s = np.cos(theta), np.sin(theta)
            x0, x1 = xs[t, :, i], xs[t, :, i + n_dims // 2]
            out[t, :, i], out[t, :, i + n_dims // 2] = x0 * c - x1 * s, x0 * s + x1 * c
    return out.reshape(n, -1)


@pytest.mark.parametrize("n_tokens,n_past", [(1, 0), (7, 2000), (40, 0)])
def test_imrope_of_text_is_what_the_engine_turns(dev, kc, n_tokens, n_past):
    """Qwen3.5's IMROPE with its sections [11, 11, 10, 0] on 64 of 256 dims, for text positions, equals
    the engine's partial NEOX rotation (the rope kernel with the qwen35 config); sections leaving a
    pair unturned are refused by the config (tests/test_qwen35.py)."""
    from llamavk.kernels.rope import RopeParams, rope
    from llamavk.models import config_from_metadata

    from .test_qwen35 import hybrid_meta
    meta = hybrid_meta(**{"attention.key_length": 256, "rope.dimension_count": 64, "rope.freq_base": 1e7,
                          "attention.head_count": 4, "rope.dimension_sections": [11, 11, 10, 0]})
    cfg = config_from_metadata(meta)
    assert (cfg.rope_dim, cfg.head_dim, cfg.rope_neox) == (64, 256, True)
    rng = np.random.default_rng(n_tokens)
    x = rng.standard_normal((n_tokens, 4 * 256)).astype(np.float32)
    xv, mem = host(dev, x)
    step, smem = step_buffer(dev)
    set_step(smem, n_past, n_tokens)
    run(dev, lambda seq: rope(seq, kc, xv, step, n_tokens, 4, 256, RopeParams.from_config(cfg)))
    want = ref_imrope(x, np.arange(n_past, n_past + n_tokens), 256, 64, 1e7, [11, 11, 10, 0])
    np.testing.assert_allclose(mem, want, rtol=0, atol=4e-5 + 2e-7 * (n_past + n_tokens) * 4)
