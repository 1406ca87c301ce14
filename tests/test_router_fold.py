"""A mixture of experts' router folded into the one-token product that writes its input
(matvec_stream.comp ROUTER, moe.FoldedRouter, fusion.fuse_router_into_products).

Kernel: the product's y against numpy (gguf.quants-dequantized weights, float64), the route row (ids
and weights) against a numpy router + top-k over the y the GPU wrote (so that both read the same x),
and against the unfused router dispatch (moe_router.comp) over that y: the same experts. Shapes: 8 to
128 experts, 2 to 8 chosen, rows not multiples of a workgroup's rows (several workgroups write y),
row blocks per workgroup (STEPS), column parts (KSPLIT > 1: on llvmpipe two dispatches, PHASE 1 / 2),
a shared expert's gate (qwen35moe), sigmoid gating without renormalization, no FFN norm. Each case
runs twice: the workgroup count must be back at 0.

Models: the tiny qwen3moe / qwen35moe decode step with the router in the output projection (and
qwen35moe's DeltaNet output product): logits against the numpy reference and the unfused step
(LLAMAVK_ROUTER_FUSE=0), and one dispatch fewer per MoE layer.
"""

from dataclasses import replace

import numpy as np
import pytest
from gguf import GGMLQuantizationType as T

import llamavk
from llamavk.errors import LlamavkError
from llamavk.kernels import KernelCache, View, moe, upload_qweight
from llamavk.kernels import matmul as mm
from llamavk.kernels.matmul import MatvecConfig, matmul
from llamavk.models import load_model_file
from llamavk.reference import ReferenceModel
from llamavk.vk import Buffer, CommandSequence

from .test_kernels_matmul import make_weight
from .test_moe import reference_route
from .vk_fixtures import chainable_stream_kernel, one_token_rows


@pytest.fixture(scope="module")
def kc(dev):
    return KernelCache(dev)


def check_route(route, h, wr, n_used, half, gating, renorm, scale, gate, n_expert, sel_bias=None):
    """The route row written (ids, then weights from `half`; with a shared expert's gate: its slot
    n_expert and sigmoid(h . gate) last) against numpy's router over h, in float64 (sel_bias: picked
    by probability + it); -> numpy's ids."""
    ids, weights = reference_route((h @ wr.T.astype(np.float64))[None], n_used, gating, renorm, scale, sel_bias)
    got = route.array(np.float32, 2 * half)
    np.testing.assert_array_equal(got[:n_used].view(np.uint32), ids[0])
    np.testing.assert_allclose(got[half:half + n_used], weights[0], rtol=1e-4, atol=1e-6)
    if gate is not None:
        assert got[n_used].view(np.uint32) == n_expert
        np.testing.assert_allclose(got[-1], 1.0 / (1.0 + np.exp(-(h @ gate))), rtol=1e-4)
    return ids


def f32(dev, a):
    a = np.ascontiguousarray(a, np.float32)
    buf = Buffer(dev, max(4, a.nbytes), host_visible=True)
    buf.array(np.float32, a.size)[:] = a.reshape(-1)
    return buf


# (type, rows of x, cols, experts, chosen, gating, renormalized, scale, FFN norm, shared gate, config)
CASES = {
    "q4_0-8x2": (T.Q4_0, 37, 416, 8, 2, "softmax", True, 1.0, True, False, MatvecConfig(64, 2, 1, 1, "stream")),
    "q8_0-70x6-sigmoid-steps": (T.Q8_0, 100, 416, 70, 6, "sigmoid", False, 2.5, False, False,
                                MatvecConfig(64, 2, 1, 1, "stream", steps=3)),
    "q4_k-128x8-shexp": (T.Q4_K, 37, 768, 128, 8, "softmax", True, 1.0, True, True, MatvecConfig(64, 2, 1, 1, "stream")),
    "q4_0-10x3-parts-shexp": (T.Q4_0, 37, 4096, 10, 3, "softmax", True, 1.0, True, True,
                              MatvecConfig(64, 2, 32, 1, "stream", xfirst=1)),
    "q4_0-128x8-dp-steps": (T.Q4_0, 200, 1024, 128, 8, "softmax", True, 1.0, True, False,
                            MatvecConfig(64, 2, 1, 1, "stream_dp", steps=2)),
    "q6_k-16x4-dp-shexp": (T.Q6_K, 37, 512, 16, 4, "softmax", True, 1.0, True, True,
                           MatvecConfig(64, 2, 1, 1, "stream_dp")),
    "q5_k-16x4-dp-shexp": (T.Q5_K, 37, 768, 16, 4, "softmax", True, 1.0, True, True,
                           MatvecConfig(64, 2, 1, 1, "stream_dp")),
    "q3_k-16x4-dp-shexp": (T.Q3_K, 37, 1280, 16, 4, "softmax", True, 1.0, True, True,
                           MatvecConfig(64, 2, 1, 1, "stream_dp")),
    "q2_k-16x4-dp-shexp": (T.Q2_K, 37, 1280, 16, 4, "softmax", True, 1.0, True, True,
                           MatvecConfig(64, 2, 1, 1, "stream_dp")),
    # half-super-block units (matvec_stream.comp HALF_BLOCK)
    "q2_k-16x4-dp-half-shexp": (T.Q2_K, 37, 1280, 16, 4, "softmax", True, 1.0, True, True,
                                MatvecConfig(64, 2, 1, 1, "stream_dp_half")),
    "q3_k-8x2-half-steps": (T.Q3_K, 100, 1280, 8, 2, "softmax", True, 1.0, True, False,
                            MatvecConfig(64, 2, 1, 1, "stream_half", steps=3)),
    "iq4_nl-16x4-dp-shexp": (T.IQ4_NL, 37, 416, 16, 4, "softmax", True, 1.0, True, True,
                             MatvecConfig(64, 2, 1, 1, "stream_dp")),
    "mxfp4-8x2-steps": (T.MXFP4, 100, 416, 8, 2, "softmax", True, 1.0, True, False,
                        MatvecConfig(64, 2, 1, 1, "stream", steps=3)),
    "iq4_xs-16x4-dp-shexp": (T.IQ4_XS, 37, 768, 16, 4, "softmax", True, 1.0, True, True,
                             MatvecConfig(64, 2, 1, 1, "stream_dp")),
    "q4_1-16x4-dp-shexp": (T.Q4_1, 37, 416, 16, 4, "softmax", True, 1.0, True, True,
                           MatvecConfig(64, 2, 1, 1, "stream_dp")),
    "q5_0-8x2-steps": (T.Q5_0, 100, 416, 8, 2, "softmax", True, 1.0, True, False,
                       MatvecConfig(64, 2, 1, 1, "stream", steps=3)),
    "q5_1-16x4-dp-shexp": (T.Q5_1, 37, 416, 16, 4, "softmax", True, 1.0, True, True,
                           MatvecConfig(64, 2, 1, 1, "stream_dp")),
}
# LLAMAVK_ROUTER_FUSE=late: each block's router weights loaded after its arithmetic
# (REARLY off); the other cases run early (with its matrix loads)
CASES["q8_0-70x6-sigmoid-steps-late"] = CASES["q8_0-70x6-sigmoid-steps"]
CASES["q4_0-10x3-parts-shexp-late"] = CASES["q4_0-10x3-parts-shexp"]
# LLAMAVK_ROUTER_FUSE=ahead (the default): every row block's router weights of a workgroup loaded first (RAHEAD)
CASES["q4_0-10x3-steps-shexp-ahead"] = (T.Q4_0, 100, 416, 10, 3, "softmax", True, 1.0, True, True,
                                        MatvecConfig(64, 2, 1, 1, "stream", steps=3))
CASES["q4_0-128x8-dp-steps-ahead"] = CASES["q4_0-128x8-dp-steps"]
# glm4moe's router: sigmoid, picked by probability + a bias per expert (RSELB), renormalized, scaled
CASES["q8_0-70x8-sigmoid-steps-selb"] = (T.Q8_0, 100, 416, 70, 8, "sigmoid", True, 2.5, True, False,
                                         MatvecConfig(64, 2, 1, 1, "stream", steps=3))
CASES["q4_0-128x8-dp-steps-selb-ahead"] = (T.Q4_0, 200, 1024, 128, 8, "sigmoid", True, 1.0, True, False,
                                           MatvecConfig(64, 2, 1, 1, "stream_dp", steps=2))
# ... with its ungated shared expert: slot n_used of weight 1 (RSH1)
CASES["q4_k-128x8-selb-sh1"] = (T.Q4_K, 37, 768, 128, 8, "sigmoid", True, 2.5, True, False,
                                MatvecConfig(64, 2, 1, 1, "stream"))


@pytest.mark.parametrize("case", list(CASES))
def test_router_in_product(dev, kc, monkeypatch, case):
    qtype, rows, cols, n_expert, n_used, gating, renorm, scale, with_norm, with_shexp, cfg = CASES[case]
    if cfg.kernel.startswith("stream_dp") and not kc.device.features.get("int_dot"):
        cfg = replace(cfg, kernel=cfg.kernel.replace("stream_dp", "stream"))
    monkeypatch.setattr(mm, "_MATVEC_ENV", {"*": cfg})
    late, ahead = case.endswith("-late"), case.endswith("-ahead")
    monkeypatch.setenv("LLAMAVK_ROUTER_FUSE", "late" if late else "ahead" if ahead else "early")
    name = mm.type_suffix(qtype)
    _, rows_per_wg, parts, steps = mm._matvec_spec(kc, cfg, name, cols, 1, False, True, False)
    assert -(-rows // (rows_per_wg * steps)) > 1          # several workgroups write y
    assert (parts > 1) == (cfg.ks > 1) and (steps > 1) == (cfg.steps > 1)
    rng = np.random.default_rng(sum(map(ord, case)))
    eps = 1e-6
    raw, w = make_weight(qtype, rows, cols, seed=rng.integers(1000))
    qw = upload_qweight(dev, raw, qtype, rows, cols)
    # router logits of std ~1.5 (as the synthetic models'): distinct experts win
    # (no norm: over x's own scale, w x' of std ~3 sqrt(cols) std(w), so that sigmoids do not saturate)
    x_scale = 1.0 if with_norm else 3 * np.sqrt(cols) * w.std()
    wr = (rng.standard_normal((n_expert, rows)) * 1.5 / np.sqrt(rows) / x_scale).astype(np.float32)
    rw = upload_qweight(dev, wr.view(np.uint8).reshape(n_expert, -1), T.F32, n_expert, rows)
    nw = rng.uniform(0.5, 1.5, rows).astype(np.float32)
    gate = (rng.standard_normal(rows) / np.sqrt(rows)).astype(np.float32)
    sel = (rng.standard_normal(n_expert) * 0.3).astype(np.float32) if "-selb" in case else None
    one = case.endswith("-sh1")              # an ungated shared expert's slot
    assert moe.router_fold_ok(kc, qw, rw, n_used, with_shexp, sel is not None)
    half = n_used + (with_shexp or one)
    norm_v = View.whole(f32(dev, nw)) if with_norm else None
    gate_v = View.whole(f32(dev, gate)) if with_shexp else None
    sel_v = View.whole(f32(dev, sel)) if sel is not None else None
    moved = 0     # routes the selection bias changed (else the case proves nothing about it)
    for rep in range(2):   # the count must be back at 0 for the second run
        x = (rng.standard_normal(cols) * 3).astype(np.float32)
        res = rng.standard_normal(rows).astype(np.float32)
        Y = f32(dev, np.full(rows, np.nan))
        route = f32(dev, np.full(2 * half, np.nan))
        folded = moe.FoldedRouter(rw, View.whole(route), n_used, gating, renorm, scale, norm_v, eps, gate_v,
                                  sel_bias=sel_v, shexp_one=one)
        seq = CommandSequence(dev).begin()
        matmul(seq, kc, qw, View.whole(f32(dev, x)), View.whole(Y), 1, residual=View.whole(f32(dev, res)),
               router=folded)
        seq.end().run()
        y = Y.array(np.float32, rows).copy()
        want = res + w @ x.astype(np.float64)
        tol = 1e-4 if cfg.kernel.startswith("stream_dp") else 1e-5
        assert np.abs(y - want).max() <= tol * np.abs(want).max()
        # the route from the y written, in float64
        yd = y.astype(np.float64)
        h = yd / np.sqrt((yd ** 2).mean() + eps) * nw if with_norm else yd
        ids = check_route(route, h, wr, n_used, half, gating, renorm, scale, gate if with_shexp else None,
                          n_expert, sel)
        if one:
            assert route.array(np.float32, 2 * half)[n_used].view(np.uint32) == n_expert
            assert route.array(np.float32, 2 * half)[-1] == 1.0
        if sel is not None:
            plain = reference_route((h @ wr.T.astype(np.float64))[None], n_used, gating, renorm, scale)[0]
            moved += not np.array_equal(ids, plain)
        counts = kc._shared["router fold count"][0]
        assert (np.frombuffer(counts.read(), dtype=np.uint32) == 0).all()
        # the router's own dispatch (moe_router.comp) over the same y: the same experts and weights
        unfused = f32(dev, np.full(2 * half, np.nan))
        seq = CommandSequence(dev).begin()
        moe.router(seq, kc, rw, View.whole(Y), View.whole(unfused), 1, n_used, gating, renorm, scale,
                   norm_w=norm_v, eps=eps, shexp=gate_v, sel_bias=sel_v, shexp_one=one)
        seq.end().run()
        other = unfused.array(np.float32, 2 * half)
        got = route.array(np.float32, 2 * half)
        np.testing.assert_array_equal(got[:half].view(np.uint32), other[:half].view(np.uint32))
        np.testing.assert_allclose(got[half:], other[half:], rtol=1e-5, atol=1e-7)
    assert moved or sel is None
    specs = [spec for kname, spec in kc._kernels if kname.startswith("mul_mv_stream") and "_router_" in kname]
    assert any(spec[20] == n_expert and spec[28] == (not late and not ahead) and spec[31] == ahead
               and spec[33] == (sel is not None) and spec[34] == one for spec in specs)


# The last workgroup's pick (matvec_stream.comp RTAIL, LLAMAVK_ROUTER_TAIL): route rows against
# numpy's softmax or sigmoid, stable top-k (of equal scores the lower expert first) and
# renormalization, for the rank tail (default) and the serial one. (rows of x, experts, chosen,
# gating, renormalized, scale, shared gate, groups of experts with one router row: tied scores)
PICKS = {
    "8x1": (37, 8, 1, "softmax", True, 1.0, False, ()),
    "8x8-all": (37, 8, 8, "softmax", True, 1.0, False, ()),
    "33x5-ties": (100, 33, 5, "softmax", True, 1.0, False, ((3, 17, 32), (5, 6))),
    "64x8-ties-sigmoid": (61, 64, 8, "sigmoid", True, 1.0, False, ((40, 2), (63, 31, 33, 0))),
    "100x4-no-renorm": (77, 100, 4, "softmax", False, 2.5, False, ((99, 98), (50, 0))),
    "128x8-ties": (100, 128, 8, "softmax", True, 1.0, False, ((127, 0, 64, 96, 31), (1, 2))),
    "256x8-shexp-ties": (100, 256, 8, "softmax", True, 1.0, True, ((200, 10, 255), (7, 8, 9))),
}


@pytest.mark.parametrize("tail", ["rank", "serial"])
@pytest.mark.parametrize("case", list(PICKS))
def test_router_pick(dev, kc, monkeypatch, case, tail):
    """The route row of the folded router against numpy over the y the product wrote: ids equal,
    weights within float rounding. A tie group's rows are one vector (the same logits to the bit:
    every expert's sum runs the same operations), scaled so that one of the two groups scores on top
    and the other at the bottom: ties decide places within the chosen. Rows of x not a multiple of a
    workgroup's rows; each case runs twice (the count back at 0)."""
    rows, n_expert, n_used, gating, renorm, scale, with_shexp, ties = PICKS[case]
    cfg = MatvecConfig(128, 2, 1, 1, "stream")
    monkeypatch.setattr(mm, "_MATVEC_ENV", {"*": cfg})
    monkeypatch.setenv("LLAMAVK_ROUTER_TAIL", tail)
    cols = 1024
    rng = np.random.default_rng(sum(map(ord, case)))
    raw, w = make_weight(T.Q8_0, rows, cols, seed=rng.integers(1000))
    qw = upload_qweight(dev, raw, T.Q8_0, rows, cols)
    assert rows % mm._matvec_spec(kc, cfg, "q8_0", cols, 1, False, True, False)[1]
    wr = (rng.standard_normal((n_expert, rows)) * 1.5 / np.sqrt(rows)).astype(np.float32)
    v = wr[ties[0][0]] * 4 if ties else None
    for sign, group in zip((1, -1), ties):
        wr[list(group)] = sign * v
    rw = upload_qweight(dev, wr.view(np.uint8).reshape(n_expert, -1), T.F32, n_expert, rows)
    nw = rng.uniform(0.5, 1.5, rows).astype(np.float32)
    gate = (rng.standard_normal(rows) / np.sqrt(rows)).astype(np.float32)
    assert moe.router_fold_ok(kc, qw, rw, n_used, with_shexp)
    half = n_used + with_shexp
    norm_v, gate_v = View.whole(f32(dev, nw)), View.whole(f32(dev, gate)) if with_shexp else None
    eps = 1e-6
    tied_chosen = 0
    for rep in range(2):
        x = (rng.standard_normal(cols) * 3).astype(np.float32)
        Y = f32(dev, np.full(rows, np.nan))
        route = f32(dev, np.full(2 * half, np.nan))
        folded = moe.FoldedRouter(rw, View.whole(route), n_used, gating, renorm, scale, norm_v, eps, gate_v)
        seq = CommandSequence(dev).begin()
        matmul(seq, kc, qw, View.whole(f32(dev, x)), View.whole(Y), 1, router=folded)
        seq.end().run()
        yd = Y.array(np.float32, rows).astype(np.float64)
        h = yd / np.sqrt((yd ** 2).mean() + eps) * nw
        ids = check_route(route, h, wr, n_used, half, gating, renorm, scale, gate if with_shexp else None, n_expert)
        chosen = ids[0].tolist()
        tied_chosen += sum(len(set(g) & set(chosen)) >= 2 for g in ties)
        counts = kc._shared["router fold count"][0]
        assert (np.frombuffer(counts.read(), dtype=np.uint32) == 0).all()
    assert tied_chosen or not ties   # ties decided places among the chosen (the ids above: in order)
    specs = [spec for kname, spec in kc._kernels if kname.startswith("mul_mv_stream") and "_router_" in kname]
    assert any(spec[20] == n_expert and spec[29] == (tail == "rank") for spec in specs)


def test_router_pick_nan(dev, kc, monkeypatch):
    """A NaN x (garbage in) still gives a route of valid, distinct expert ids (the rank tail ranks
    NaN scores below every number, of equals the lower expert first): the expert products read only
    existing experts."""
    monkeypatch.setattr(mm, "_MATVEC_ENV", {"*": MatvecConfig(64, 2, 1, 1, "stream")})
    monkeypatch.setenv("LLAMAVK_ROUTER_TAIL", "rank")
    raw, _ = make_weight(T.Q4_0, 37, 416, seed=7)
    qw = upload_qweight(dev, raw, T.Q4_0, 37, 416)
    wr = np.random.default_rng(7).standard_normal((40, 37)).astype(np.float32)
    rw = upload_qweight(dev, wr.view(np.uint8).reshape(40, -1), T.F32, 40, 37)
    route = f32(dev, np.zeros(2 * 6))
    folded = moe.FoldedRouter(rw, View.whole(route), 6, "softmax", True, 1.0, None, 1e-6, None)
    seq = CommandSequence(dev).begin()
    matmul(seq, kc, qw, View.whole(f32(dev, np.full(416, np.nan))), View.whole(f32(dev, np.zeros(37))), 1,
           router=folded)
    seq.end().run()
    np.testing.assert_array_equal(route.array(np.float32, 12)[:6].view(np.uint32), np.arange(6))


def test_router_tail_knob(monkeypatch):
    monkeypatch.setenv("LLAMAVK_ROUTER_TAIL", "fast")
    with pytest.raises(LlamavkError, match="LLAMAVK_ROUTER_TAIL='fast': rank or serial"):
        moe.router_tail_mode()
    # the partials' loads in flight: 30B-A3B's shape (512 threads, 129 columns, 128 writers) in one
    # round of 9; qwen35moe's (258 columns) in two of 10; the serial tail's 8
    assert moe.router_tail_loads(512, 129, 128, 1) == 9
    assert moe.router_tail_loads(512, 258, 128, 1) == 10
    assert moe.router_tail_loads(512, 129, 128, 0) == 8


def test_router_fold_refusals(dev, kc, monkeypatch):
    """Where the stream kernel cannot take the router, router_fold_ok says no (the graph keeps the
    router's dispatch): another kernel, a router of f16 or over other rows, chunked rows, the knob."""
    monkeypatch.setattr(mm, "_MATVEC_ENV", {"*": MatvecConfig(64, 2, 1, 1, "stream")})
    raw, _ = make_weight(T.Q4_0, 37, 416, seed=5)
    qw = upload_qweight(dev, raw, T.Q4_0, 37, 416)
    wr = np.zeros((8, 37), np.float32)
    rw = upload_qweight(dev, wr.view(np.uint8).reshape(8, -1), T.F32, 8, 37)
    assert moe.router_fold_ok(kc, qw, rw, 2, False)
    assert not moe.router_fold_ok(kc, qw, rw, 9, False)                      # more chosen than experts
    raw16, _ = make_weight(T.F16, 8, 37, seed=6)
    assert not moe.router_fold_ok(kc, qw, upload_qweight(dev, raw16, T.F16, 8, 37), 2, False)
    rw_other = upload_qweight(dev, np.zeros((8, 38), np.float32).view(np.uint8).reshape(8, -1), T.F32, 8, 38)
    assert not moe.router_fold_ok(kc, qw, rw_other, 2, False)               # not x's rows
    chunked = upload_qweight(dev, raw, T.Q4_0, 37, 416, max_chunk_bytes=raw.shape[1] * 5)
    assert not moe.router_fold_ok(kc, chunked, rw, 2, False)                 # x over several dispatches
    monkeypatch.setenv("LLAMAVK_ROUTER_FUSE", "0")
    assert not moe.router_fold_ok(kc, qw, rw, 2, False)
    monkeypatch.setenv("LLAMAVK_ROUTER_FUSE", "yes")
    with pytest.raises(LlamavkError, match="LLAMAVK_ROUTER_FUSE='yes': 0, early, late or ahead"):
        moe.router_fold_ok(kc, qw, rw, 2, False)
    monkeypatch.delenv("LLAMAVK_ROUTER_FUSE")
    monkeypatch.setattr(mm, "_MATVEC_ENV", {"*": MatvecConfig(64, 2, 1, 1, "base")})
    assert not moe.router_fold_ok(kc, qw, rw, 2, False)                      # not the stream kernel


def decode_rows(path, prompt):
    """The one-token step's logits for each token of prompt, and the step's dispatches and its ops."""
    with llamavk.load(path, n_ctx=32, warn=lambda m: None) as m:
        rt = m.runtime
        rows = one_token_rows(rt, prompt)
        dispatches = sum(s.n_dispatches for s in rt.recordings[("last", 1, 0, False)])
        return rows, dispatches, rt.fused_one["last"].ops, rt.cfg


@pytest.mark.parametrize("arch,qtype", [("qwen3moe", "q4_0"), ("qwen3moe", "q4_k"), ("qwen35moe", "q4_0"),
                                        ("qwen35moe", "q8_0"), ("gpt-oss", "q8_0"), ("gpt-oss", "mxfp4"),
                                        ("glm4moe", "q8_0"), ("glm4moe", "q4_k")])
def test_decode_with_router_in_product(synthetic_model, monkeypatch, arch, qtype):
    """The one-token step with each MoE layer's router in the product writing its input (the output
    projection; qwen35moe's DeltaNet layers: ssm_out, with the shared expert's gate; gpt-oss's router
    with its bias, after an output projection with a bias of its own; glm4moe's picking by probability +
    a bias per expert, with its ungated shared expert's slot, after a dense first layer): logits equal
    the numpy reference and the unfused step's (the same experts: another pick moves a logit by far
    more), one dispatch fewer per layer."""
    chainable_stream_kernel(monkeypatch)
    path = synthetic_model(arch, qtype, seed=3)
    prompt = [int(t) for t in np.random.default_rng(4).integers(3, 500, 6)]
    want = ReferenceModel(load_model_file(path)).logits(prompt)
    scale = np.abs(want).max()
    got, n_fused, ops, cfg = decode_rows(path, prompt)
    monkeypatch.setenv("LLAMAVK_ROUTER_FUSE", "0")
    plain, n_plain, plain_ops, _ = decode_rows(path, prompt)
    folded = [op for op in ops if "router" in op.attrs]
    n_moe = cfg.n_layer - cfg.n_layer_dense_lead
    assert len(folded) == n_moe and not any("route" in op.attrs for op in ops)
    assert {op.inputs[0].role for op in folded} == ({"o", "ssm_out"} if arch == "qwen35moe" else {"o"})
    assert all(("shexp_gate" in op.attrs["router"] and op.attrs["router"]["shexp_gate"] is not None)
               == (arch == "qwen35moe") for op in folded)
    assert all((op.attrs["router"]["bias"] is not None) == (arch == "gpt-oss") for op in folded)   # its bias
    assert all(("sel_bias" in op.attrs["router"]["route"]) == op.attrs["router"]["shexp_one"] == (arch == "glm4moe")
               for op in folded)
    assert not any("router" in op.attrs for op in plain_ops)
    assert n_plain - n_fused == n_moe, (n_plain, n_fused)
    assert np.abs(got - want).max() < 3e-3 * scale
    # 1e-5 on llvmpipe; on NVIDIA the products take x as two int8 levels (DOT8), so the router's
    # other summation order moves a weight by an ulp, which can move a later int8 rounding: the H100
    # measured 4.3e-5 (same experts: another pick moves a logit by far more)
    assert np.abs(got - plain).max() < 5e-4 * scale
