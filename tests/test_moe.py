"""Mixture of experts (qwen3moe): the kernels against numpy, the model against the numpy reference.

Kernels: the router's top-k (softmax and sigmoid gating, renormalized or not, scaled), the products
with each token's chosen experts in both forms (matrix-vector for decode with its fused norm / SwiGLU
input / weighted sum + residual; tiled and grouped by expert for prompts), experts cut into several
buffers, the weighted sum and the shared expert's sigmoid gate. Expert weights come from the same
generator as the dense kernel tests (gguf.quants quantization or random valid blocks), the reference
is gguf.quants.dequantize in float64. Outputs are poisoned with NaN: every element must be written.

Models: tiny qwen3moe files (10 experts of 96 rows, 3 per token: rows not multiples of the kernels'
row blocks) of several types, with and without a shared expert: all-token logits of a prompt
(grouped products) and one-token decode steps against reference.ReferenceModel.
"""

from pathlib import Path

import numpy as np
import pytest
from gguf import GGMLQuantizationType as T

import llamavk
from llamavk.errors import LlamavkError
from llamavk.kernels import KernelCache, View, moe, selection, upload_qweight
from llamavk.kernels.matmul import type_suffix
from llamavk.models import load_model_file
from llamavk.quant import quant_info
from llamavk.reference import ReferenceModel, silu, softmax
from llamavk.vk import Buffer, CommandSequence

from .test_kernels_matmul import LATTICE_TYPES, host_f32, make_weight, small_cols
from .vk_fixtures import chainable_stream_kernel, one_token_rows

TYPES = [T.Q4_0, T.Q8_0, T.Q4_K, T.Q5_K, T.Q6_K, T.F16, T.Q4_1, T.Q5_0, T.Q5_1, T.IQ4_NL, T.IQ4_XS, T.MXFP4,
         *LATTICE_TYPES, T.TQ1_0, T.TQ2_0]


@pytest.fixture(scope="module")
def kc(dev):
    return KernelCache(dev)


def device_array(dev, a):
    a = np.ascontiguousarray(a)
    buf = Buffer(dev, max(a.nbytes, 4))
    buf.write(a)
    return View.whole(buf)


def route_rows(ids, weights):
    """Route tensor rows as the kernels read them: ids as uint32 bits, then weights (float32)."""
    return np.concatenate([np.asarray(ids, np.uint32).view(np.float32), np.asarray(weights, np.float32)], axis=1)


def reference_route(logits, n_used, gating, norm, scale, sel_bias=None):
    """sel_bias (glm4moe): the pick ranks probability + sel_bias; the weights stay the probabilities."""
    x = logits.astype(np.float64)
    probs = softmax(x) if gating == "softmax" else 1.0 / (1.0 + np.exp(-x))
    keys = probs if sel_bias is None else probs + sel_bias.astype(np.float64)
    ids = np.argsort(-keys, axis=1, kind="stable")[:, :n_used]
    w = np.take_along_axis(probs, ids, axis=1)
    if norm:
        w = w / w.sum(axis=1, keepdims=True)
    return ids, w * scale


@pytest.mark.parametrize("gating,norm,scale", [("softmax", True, 1.0), ("softmax", False, 2.5),
                                               ("sigmoid", True, 1.0), ("sigmoid", False, 1.0)])
@pytest.mark.parametrize("n_expert,n_used", [(70, 6), (300, 8), (5, 5)])
def test_route(dev, kc, gating, norm, scale, n_expert, n_used):
    n_tokens = 5
    logits = np.random.default_rng(n_expert + n_used).standard_normal((n_tokens, n_expert)).astype(np.float32) * 2
    out = host_f32(dev, n_tokens * 2 * n_used)
    seq = CommandSequence(dev).begin()
    moe.route(seq, kc, device_array(dev, logits), View.whole(out), n_tokens, n_expert, n_used, gating, norm, scale)
    seq.end().run()
    got = out.array(np.float32, n_tokens * 2 * n_used).reshape(n_tokens, 2 * n_used)
    ids, w = reference_route(logits, n_used, gating, norm, scale)
    np.testing.assert_array_equal(got[:, :n_used].view(np.uint32), ids)     # most probable first
    np.testing.assert_allclose(got[:, n_used:], w, rtol=2e-5, atol=1e-7)


@pytest.mark.parametrize("qtype", [T.F32, T.F16], ids=lambda t: t.name)
@pytest.mark.parametrize("gating,norm", [("softmax", True), ("sigmoid", False)])
def test_router_product_and_pick_in_one_dispatch(dev, kc, qtype, gating, norm):
    """moe_router.comp: the router's product (the FFN norm folded in) and the top-k, for a few tokens,
    twice in a row (the per-token counts must be back at 0 after a run)."""
    n_tokens, n_expert, cols, n_used = 3, 70, 96, 5
    rng = np.random.default_rng(21)
    raw, wref = make_weight(qtype, n_expert, cols, 22)
    w = upload_qweight(dev, raw, qtype, n_expert, cols)
    assert moe.router_ok(w)
    nw = rng.uniform(0.05, 0.15, cols).astype(np.float32)   # logits of std ~1: sigmoid does not saturate
    for rep in range(2):
        x = rng.standard_normal((n_tokens, cols)).astype(np.float32)
        h = x.astype(np.float64) / np.sqrt((x.astype(np.float64) ** 2).mean(1, keepdims=True) + 1e-5) * nw
        ids, weights = reference_route(h @ wref.T, n_used, gating, norm, 1.5)
        out = host_f32(dev, n_tokens * 2 * n_used)
        seq = CommandSequence(dev).begin()
        moe.router(seq, kc, w, device_array(dev, x), View.whole(out), n_tokens, n_used, gating, norm, 1.5,
                   norm_w=device_array(dev, nw), eps=1e-5)
        seq.end().run()
        got = out.array(np.float32, n_tokens * 2 * n_used).reshape(n_tokens, 2 * n_used)
        np.testing.assert_array_equal(got[:, :n_used].view(np.uint32), ids)
        np.testing.assert_allclose(got[:, n_used:], weights, rtol=1e-4, atol=1e-6)


@pytest.mark.parametrize("gating,norm,scale,bias_std", [("sigmoid", True, 2.5, 0.3), ("softmax", True, 1.0, 0.02),
                                                        ("sigmoid", False, 1.0, 3.0)])
@pytest.mark.parametrize("n_expert,n_used", [(128, 8), (10, 3), (300, 8)])
def test_route_with_selection_bias(dev, kc, gating, norm, scale, bias_std, n_expert, n_used):
    """moe_route.comp SELB (glm4moe): experts picked by probability + a bias per expert (of either
    sign; std 3: every key of some negative, where the unbiased pick's "chosen" mark -1 would win),
    weighted by their probabilities. The bias must change picks, else the case proves nothing."""
    n_tokens = 5
    rng = np.random.default_rng(n_expert + n_used)
    logits = rng.standard_normal((n_tokens, n_expert)).astype(np.float32) * 2
    bias = (rng.standard_normal(n_expert) * bias_std).astype(np.float32)
    out = host_f32(dev, n_tokens * 2 * n_used)
    seq = CommandSequence(dev).begin()
    moe.route(seq, kc, device_array(dev, logits), View.whole(out), n_tokens, n_expert, n_used, gating, norm, scale,
              sel_bias=device_array(dev, bias))
    seq.end().run()
    got = out.array(np.float32, n_tokens * 2 * n_used).reshape(n_tokens, 2 * n_used)
    ids, w = reference_route(logits, n_used, gating, norm, scale, bias)
    assert (ids != reference_route(logits, n_used, gating, norm, scale)[0]).any()
    np.testing.assert_array_equal(got[:, :n_used].view(np.uint32), ids)
    np.testing.assert_allclose(got[:, n_used:], w, rtol=2e-5, atol=1e-7)


@pytest.mark.parametrize("gating", ["sigmoid", "softmax"])
def test_router_with_selection_bias(dev, kc, gating):
    """moe_router.comp SELB: the product, then the pick by probability + bias, weights without it."""
    n_tokens, n_expert, cols, n_used = 3, 70, 96, 6
    rng = np.random.default_rng(31)
    raw, wref = make_weight(T.F32, n_expert, cols, 32)
    w = upload_qweight(dev, raw, T.F32, n_expert, cols)
    nw = rng.uniform(0.05, 0.15, cols).astype(np.float32)
    bias = (rng.standard_normal(n_expert) * (0.3 if gating == "sigmoid" else 0.02)).astype(np.float32)
    for rep in range(2):
        x = rng.standard_normal((n_tokens, cols)).astype(np.float32)
        h = x.astype(np.float64) / np.sqrt((x.astype(np.float64) ** 2).mean(1, keepdims=True) + 1e-5) * nw
        ids, weights = reference_route(h @ wref.T, n_used, gating, True, 2.5, bias)
        assert (ids != reference_route(h @ wref.T, n_used, gating, True, 2.5)[0]).any()
        out = host_f32(dev, n_tokens * 2 * n_used)
        seq = CommandSequence(dev).begin()
        moe.router(seq, kc, w, device_array(dev, x), View.whole(out), n_tokens, n_used, gating, True, 2.5,
                   norm_w=device_array(dev, nw), eps=1e-5, sel_bias=device_array(dev, bias))
        seq.end().run()
        got = out.array(np.float32, n_tokens * 2 * n_used).reshape(n_tokens, 2 * n_used)
        np.testing.assert_array_equal(got[:, :n_used].view(np.uint32), ids)
        np.testing.assert_allclose(got[:, n_used:], weights, rtol=1e-4, atol=1e-6)


def test_route_ties_take_the_lower_expert(dev, kc):
    logits = np.zeros((1, 9), np.float32)
    logits[0, [2, 7]] = 1.0           # two equal winners, then seven equal others
    out = host_f32(dev, 8)
    seq = CommandSequence(dev).begin()
    moe.route(seq, kc, device_array(dev, logits), View.whole(out), 1, 9, 4, "softmax", True, 1.0)
    seq.end().run()
    got = out.array(np.float32, 8)
    assert list(got[:4].view(np.uint32)) == [2, 7, 0, 1]


def expert_weight(dev, qtype, n_expert, rows, cols, seed, max_chunk_bytes=None):
    raw, ref = make_weight(qtype, n_expert * rows, cols, seed)
    w = upload_qweight(dev, raw, qtype, n_expert * rows, cols, max_chunk_bytes=max_chunk_bytes, experts=n_expert)
    return w, ref.reshape(n_expert, rows, cols)


def random_routes(rng, n_tokens, n_expert, n_used):
    ids = np.stack([rng.permutation(n_expert)[:n_used] for _ in range(n_tokens)])
    return ids, rng.uniform(0.1, 1.0, (n_tokens, n_used))


def run_matmul_id(dev, kc, qtype, n_tokens, *, n_expert=7, rows=37, n_used=3, xslot=False, norm=False,
                  glu=False, sum_slots=False, residual=False, chunk_experts=None, pair=False, seed=0, cols=None):
    rng = np.random.default_rng(seed)
    if cols is None:
        cols = small_cols(qtype) if quant_info(qtype).block_size > 1 else 96   # expert rows: multiples of 32
    info = quant_info(qtype)
    max_chunk = chunk_experts * rows * info.row_bytes(cols) if chunk_experts else None
    w, wref = expert_weight(dev, qtype, n_expert, rows, cols, seed, max_chunk)
    if chunk_experts:
        assert len(w.chunks) == -(-n_expert // chunk_experts)
    ids, weights = random_routes(rng, n_tokens, n_expert, n_used)
    x = rng.standard_normal((n_tokens, n_used if xslot else 1, cols)).astype(np.float32)
    xin = x.astype(np.float64)
    kw = {}
    if norm:
        nw = rng.uniform(0.5, 1.5, cols).astype(np.float32)
        kw.update(norm=device_array(dev, nw), eps=1e-5)
        xin = xin / np.sqrt((xin ** 2).mean(-1, keepdims=True) + 1e-5) * nw
    if glu:
        up = rng.standard_normal(x.shape).astype(np.float32)
        kw["glu"] = device_array(dev, up)
        xin = silu(xin) * up
    out_rows = 1 if sum_slots else n_used
    ref = np.stack([[wref[ids[t, s]] @ xin[t, s if xslot else 0] for s in range(n_used)] for t in range(n_tokens)])
    if pair:
        p, pref = expert_weight(dev, qtype, n_expert, rows, cols, seed + 100, max_chunk)
        kw["pair"] = p
        ref = silu(ref) * np.stack([[pref[ids[t, s]] @ xin[t, s if xslot else 0] for s in range(n_used)]
                                    for t in range(n_tokens)])
    if sum_slots:
        ref = (ref * weights[:, :, None]).sum(1, keepdims=True)
        kw["sum_slots"] = True
    if residual:
        res = rng.standard_normal((n_tokens, out_rows, rows)).astype(np.float32)
        kw["residual"] = device_array(dev, res)
        ref = ref + res
    groups = moe.group_scratch(kc, n_expert, n_tokens) if n_tokens > moe.MATVEC_MAX_TOKENS else None
    route_view = device_array(dev, route_rows(ids, weights))
    y = host_f32(dev, n_tokens * out_rows * rows)
    seq = CommandSequence(dev).begin()
    if groups is not None:
        moe.group(seq, kc, route_view, groups, n_tokens, n_used, n_expert)
    moe.matmul_id(seq, kc, w, device_array(dev, x), route_view, View.whole(y), n_tokens, n_used, xslot,
                  groups=groups, **kw)
    seq.end().run()
    got = y.array(np.float32, n_tokens * out_rows * rows).reshape(ref.shape).astype(np.float64)
    assert np.isfinite(got).all(), "some outputs were not written"
    err = np.linalg.norm(got - ref) / np.linalg.norm(ref)
    # cooperative matrices multiply f16-rounded weights and activations (2^-11 relative each)
    assert err < (3e-3 if groups is not None and selection.has_coopmat(kc) else 1e-3), \
        f"{qtype.name}: relative error {err:.2e}"


@pytest.mark.parametrize("qtype", TYPES, ids=lambda t: t.name)
def test_matmul_id_decode(dev, kc, qtype):
    run_matmul_id(dev, kc, qtype, 1, seed=1)                                      # gate/up: x per token
    run_matmul_id(dev, kc, qtype, 3, norm=True, seed=2)                           # + the RMS norm folded in
    run_matmul_id(dev, kc, qtype, 2, xslot=True, glu=True, seed=3)                # down: x per slot, SwiGLU in
    run_matmul_id(dev, kc, qtype, 3, xslot=True, glu=True, sum_slots=True, residual=True, seed=4)
    run_matmul_id(dev, kc, qtype, 4, n_used=1, xslot=True, sum_slots=True, seed=5)
    if type_suffix(qtype) in moe.MATVEC_ID_PRELOAD:                                # gate and up as one product
        run_matmul_id(dev, kc, qtype, 2, norm=True, pair=True, seed=6)
        run_matmul_id(dev, kc, qtype, 1, pair=True, chunk_experts=3, seed=7)


def test_matmul_id_sum_subgroups_per_slot_rule():
    # workgroups of at least 256 threads: gpt-oss's 4 slots (subgroup 32) 2 subgroups a slot, 8 slots 1;
    # llvmpipe's 8-lane subgroups more; never past the device's workgroup size
    assert moe.matvec_id_sum_sps(4, 32, 1024) == 2
    assert moe.matvec_id_sum_sps(8, 32, 1024) == 1
    assert moe.matvec_id_sum_sps(3, 8, 1024) == 10
    assert moe.matvec_id_sum_sps(4, 64, 128) == 1


def test_matmul_id_pair_workgroup_rule():
    # doubled until x's loads before the weights' (XFIRST) take at most 4 vec4s a lane, at most 256
    assert moe.matvec_id_pair_wg(2048, 128) == 128      # 30B-A3B: 512 vec4s
    assert moe.matvec_id_pair_wg(2880, 128) == 256      # gpt-oss: 720
    assert moe.matvec_id_pair_wg(8192, 128) == 256
    assert moe.matvec_id_pair_wg(2880, 128, max_wg=128) == 128    # Vulkan's minimum workgroup limit


@pytest.mark.parametrize("sps", ["1", "2", "3", "4"])
@pytest.mark.parametrize("qtype", [T.Q4_0, T.MXFP4, T.Q4_K], ids=lambda t: t.name)
def test_matmul_id_decode_sum_subgroups_per_slot(dev, kc, qtype, sps, monkeypatch):
    """The slot-summing down product by 1-4 subgroups a slot (matvec_id.comp SUM: slot sg / SPS, rows
    from (sg % SPS) G RJ), 37 rows (the last workgroup's rows part past the end), x staged or not."""
    monkeypatch.setenv("LLAMAVK_MVID_SPS", sps)
    for stage in ("0", "1"):
        monkeypatch.setenv("LLAMAVK_MVID_STAGE", stage)
        run_matmul_id(dev, kc, qtype, 2, n_used=4, xslot=True, sum_slots=True, residual=True, seed=31)
        run_matmul_id(dev, kc, qtype, 1, n_used=3, xslot=True, glu=True, sum_slots=True, seed=32)


def test_matmul_id_decode_mxfp4_gpt_oss_rows(dev, kc):
    """MXFP4 experts on gpt-oss's 2880-wide rows (90 blocks: 32 lanes of 3, the last 6 lanes idle),
    every E2M1 code (the subnormal 0.5, -0) through e2m1_dot: the gate/up pair with the norm, the
    down product summing 4 slots."""
    run_matmul_id(dev, kc, T.MXFP4, 1, n_used=4, norm=True, pair=True, seed=33, cols=2880)
    run_matmul_id(dev, kc, T.MXFP4, 1, n_used=4, xslot=True, sum_slots=True, residual=True, seed=34, cols=2880)


@pytest.mark.parametrize("cols", [768, 2048])
@pytest.mark.parametrize("qtype", [T.Q4_K, T.Q5_K, T.Q6_K, T.IQ4_NL, T.IQ4_XS, T.IQ2_XXS, T.IQ2_S, T.IQ3_XXS,
                                   T.IQ1_M], ids=lambda t: t.name)
def test_matmul_id_decode_preloaded_units(dev, kc, qtype, cols, monkeypatch):
    """The preloaded K-quant units (matvec_id.comp KUNIT: Q4_K's, Q5_K's and Q6_K's quarters, 64
    weights), the lattice types' quarters (IQ_UNIT, iq_unit.glsl) and IQ4_NL's blocks and IQ4_XS's
    sub-blocks on wider rows: 768 (the 30B-A3B's down product: 12 quarters, 4 lanes of 3 per row; 24
    sub-blocks), 2048 (its gate/up: a quarter per lane, several rows per lane)."""
    tpr, c, rj = moe.matvec_id_split(qtype.name.lower(), cols, kc.info.subgroup_size or 32, False)
    assert tpr * c == cols // moe.MATVEC_ID_UNIT.get(qtype.name.lower(), (32, 1))[0]
    run_matmul_id(dev, kc, qtype, 1, norm=True, pair=True, seed=21, cols=cols)
    run_matmul_id(dev, kc, qtype, 1, xslot=True, glu=True, sum_slots=True, residual=True, seed=22, cols=cols)
    run_matmul_id(dev, kc, qtype, 2, seed=23, cols=cols)
    for stage in ("0", "1"):   # x' from memory (rows too wide to stage), and staged
        monkeypatch.setenv("LLAMAVK_MVID_STAGE", stage)
        run_matmul_id(dev, kc, qtype, 1, norm=True, pair=True, seed=24, cols=cols)
        run_matmul_id(dev, kc, qtype, 2, xslot=True, glu=True, seed=25, cols=cols)


@pytest.mark.parametrize("stage", ["0", "1"])
@pytest.mark.parametrize("qtype", [T.Q4_0, T.Q8_0, T.Q4_K, T.Q5_K, T.Q6_K, T.IQ4_NL, T.IQ4_XS, T.F16, T.IQ2_XS,
                                   T.IQ3_S, T.IQ1_S], ids=lambda t: t.name)
def test_matmul_id_decode_x_staged_or_not(dev, kc, qtype, stage, monkeypatch):
    # 0: x' read straight from memory, as for rows too wide to stage in shared memory (matvec_id.comp
    # XS 0); 1: staged for every product, plain x included
    monkeypatch.setenv("LLAMAVK_MVID_STAGE", stage)
    assert (moe.matvec_id_staged(kc, 256, 1, fused=False) > 0) == (stage == "1")
    run_matmul_id(dev, kc, qtype, 3, seed=11)
    run_matmul_id(dev, kc, qtype, 3, norm=True, seed=12)
    run_matmul_id(dev, kc, qtype, 3, xslot=True, glu=True, sum_slots=True, residual=True, seed=13)
    if type_suffix(qtype) in moe.MATVEC_ID_PRELOAD:
        run_matmul_id(dev, kc, qtype, 2, norm=True, pair=True, seed=14)


def test_matmul_id_stages_x_where_it_fits(kc):
    assert moe.matvec_id_staged(kc, 2048, 1) == 512                   # 8 KiB: one token's row
    assert moe.matvec_id_staged(kc, 768, 4, True, True) == 768        # a down product's 4 slot rows (SwiGLU in)
    assert moe.matvec_id_staged(kc, 768, 4, True, False) == 768       # plain x: staged too by default
    assert moe.matvec_id_staged(kc, 8192, 8) == 0                     # 256 KiB: from memory


@pytest.mark.parametrize("form", ["cpu", "portable"])
@pytest.mark.parametrize("qtype", TYPES, ids=lambda t: t.name)
def test_matmul_id_prompt(dev, kc, qtype, form, monkeypatch):
    # 4 experts x 2 slots over 150 tokens: ~75 tokens per expert (two token tiles of 64), 70 rows
    # (two row tiles): partial tiles both ways; and a batch where some experts get no token at all.
    # Software devices run both their own kernel (matmul_cpu.comp MUL_MAT_ID) and the portable tiles.
    if form == "portable":
        monkeypatch.setattr(selection, "_SKIP_MOE", selection._SKIP_MOE | {"mul_mm_cpu_id"})
    elif not kc.info.is_cpu:
        pytest.skip("matmul_cpu.comp runs on software devices")
    cols = small_cols(qtype) if quant_info(qtype).block_size > 1 else 96
    if not selection.has_coopmat(kc):
        want = "mul_mm_cpu_id" if form == "cpu" else "mul_mm_id"
        assert selection.moe_product_kernel(kc, cols, qtype.name.lower()) == want
    run_matmul_id(dev, kc, qtype, 150, n_expert=4, rows=70, n_used=2, seed=6)
    run_matmul_id(dev, kc, qtype, 23, n_expert=40, rows=37, n_used=2, xslot=True, seed=7)


@pytest.mark.parametrize("n_tokens", [2, 40])
def test_matmul_id_experts_in_several_buffers(dev, kc, n_tokens):
    run_matmul_id(dev, kc, T.Q4_0, n_tokens, n_expert=7, chunk_experts=3, seed=8)
    run_matmul_id(dev, kc, T.Q8_0, n_tokens, n_expert=7, chunk_experts=2, xslot=True, seed=9)
    # a lattice type's grid follows each buffer's experts (kernels.GRID_TAIL_ALIGN)
    run_matmul_id(dev, kc, T.IQ2_XS, n_tokens, n_expert=7, chunk_experts=3, seed=10)


def test_matmul_id_sum_needs_one_buffer(dev, kc):
    with pytest.raises(LlamavkError, match="one chunk"):
        run_matmul_id(dev, kc, T.Q4_0, 1, xslot=True, sum_slots=True, chunk_experts=3, seed=10)


def test_moe_sum_and_shared_gate(dev, kc):
    rng = np.random.default_rng(11)
    n_tokens, n_used, width, cols = 6, 3, 70, 64
    ids, weights = random_routes(rng, n_tokens, 9, n_used)
    y = rng.standard_normal((n_tokens, n_used, width)).astype(np.float32)
    out = host_f32(dev, n_tokens * width)
    seq = CommandSequence(dev).begin()
    moe.moe_sum(seq, kc, device_array(dev, y), device_array(dev, route_rows(ids, weights)), View.whole(out),
                n_tokens, n_used, width)
    seq.end().run()
    np.testing.assert_allclose(out.array(np.float32, n_tokens * width).reshape(n_tokens, width),
                               (y * weights[:, :, None]).sum(1), rtol=1e-5, atol=1e-5)
    shared = rng.standard_normal((n_tokens, width)).astype(np.float32)
    x = rng.standard_normal((n_tokens, cols)).astype(np.float32)
    gw = rng.standard_normal(cols).astype(np.float32) / 8
    out2 = host_f32(dev, n_tokens * width)
    seq = CommandSequence(dev).begin()
    moe.scale_sigmoid(seq, kc, device_array(dev, shared), device_array(dev, x), device_array(dev, gw),
                      View.whole(out2), n_tokens, width, cols)
    seq.end().run()
    want = shared / (1.0 + np.exp(-(x.astype(np.float64) @ gw)))[:, None]
    np.testing.assert_allclose(out2.array(np.float32, n_tokens * width).reshape(n_tokens, width), want,
                               rtol=1e-5, atol=1e-6)


# -- models ---------------------------------------------------------------------------------------

MODEL_CASES = [("q4_0", {}), ("q8_0", {"n_ff_shexp": 64}), ("q4_k", {}), ("q5_k", {}), ("q6_k", {}), ("iq4_nl", {}),
               ("iq4_xs", {}), ("mxfp4", {}), ("mxfp4", {"n_ff_shexp": 64}), ("f16", {})]


@pytest.mark.parametrize("qtype,overrides", MODEL_CASES, ids=[c[0] + ("-shexp" if c[1] else "") for c in MODEL_CASES])
def test_tiny_moe_matches_reference(synthetic_model, qtype, overrides):
    path = synthetic_model("qwen3moe", qtype, seed=3, **overrides)
    mf = load_model_file(path)
    c = mf.config
    assert (c.arch, c.n_expert, c.n_expert_used, c.expert_gating, c.expert_norm) == ("qwen3moe", 10, 3, "softmax", True)
    assert mf.weights["blk.1.ffn_down_exps.weight"].shape == (10, c.n_embd, c.n_ff_exp)
    assert bool(c.n_ff_shexp) == bool(overrides)
    ref = ReferenceModel(mf)
    prompt = [int(t) for t in np.random.default_rng(4).integers(3, c.n_vocab, 40)]
    want = ref.logits(prompt)
    scale = np.abs(want).max()
    with llamavk.load(path, n_ctx=64, warn=lambda m: None) as m:
        got = m.logits(prompt, all=True)                      # 40 tokens: grouped expert products
        assert np.abs(got - want).max() < 3e-3 * scale
        m.logits(prompt[:30])
        for i in range(30, 34):                               # one-token steps: the fused decode form
            m.runtime.run_batch("last", [prompt[i]], i)
            assert np.abs(m.runtime.logits(1)[0] - want[i]).max() < 3e-3 * scale
        got_tokens = list(m.generate(prompt[:12], n=5, temp=0))
    # the reference's greedy tokens, up to the first near tie of its two best logits (within 1e-4 of
    # the logits' scale: rounding may pick either; measured 7e-5 in the MXFP4 model with a shared expert)
    logits, want_tokens = ref.logits(prompt[:12])[-1], []
    for _ in range(5):
        top2 = np.sort(logits)[-2:]
        if top2[1] - top2[0] < 1e-4 * scale:
            break
        want_tokens.append(int(np.argmax(logits)))
        logits = ref.forward([want_tokens[-1]])[-1]
    assert got_tokens[:len(want_tokens)] == want_tokens


def test_moe_decode_reads_only_chosen_experts(synthetic_model):
    """The one-token step runs the MoE as fused matrix-vector forms: the router product picking the
    experts itself, gate and up as one product with the norm folded in, writing silu(gate) * up; the
    down product with the weighted sum and the residual add folded in."""
    with llamavk.load(synthetic_model("qwen3moe", "q4_0", seed=3), n_ctx=32, warn=lambda m: None) as m:
        ops = [op for op in m.runtime.fused_one["last"].ops if op.layer == 0]
    kinds = [op.kind for op in ops]
    assert "moe_sum" not in kinds and "swiglu" not in kinds and "moe_route" not in kinds
    # the router's own product, or folded into the output projection where the device's kernel can
    # (GPUs with the stream kernel: test_router_fold.py)
    router = next((op for op in ops if op.kind == "matmul" and op.inputs[0].role == "router"), None)
    if router is None:
        router = next(op for op in ops if "router" in op.attrs)
        assert router.inputs[0].role == "o" and router.attrs["router"]["norm"] is not None
    else:
        assert "route" in router.attrs and "norm" in router.attrs
    ids = [op for op in ops if op.kind == "matmul_id"]
    assert [op.inputs[0].role for op in ids] == ["gate_exps", "down_exps"]
    assert ids[0].attrs["pair"].role == "up_exps" and "norm" in ids[0].attrs
    assert {"sum", "residual"} <= set(ids[1].attrs) and "glu" not in ids[1].attrs


@pytest.mark.parametrize("qtype", ["q4_0", "q4_k", "q5_k", "q6_k", "iq4_nl", "iq4_xs", "mxfp4", "iq2_xxs", "iq1_s"])
def test_moe_decode_chained_experts_equal_unchained(synthetic_model, monkeypatch, portable_attention, qtype):
    """Edges e and r (kernels/chain.py): the down product recorded without a barrier after the gate/up
    pair, the router after the output projection, each waiting in its shader for its producer's
    workgroup count. On a software device the wait is met at once, so the logits must be the same
    bits as unchained; each producer counts every workgroup. (The router as a dispatch of its own:
    folded into the output projection, test_router_fold.py, it has no edge to chain.)"""
    chainable_stream_kernel(monkeypatch)
    monkeypatch.setenv("LLAMAVK_ROUTER_FUSE", "0")
    path = synthetic_model("qwen3moe", qtype, seed=3)
    prompt = [int(t) for t in np.random.default_rng(4).integers(3, 500, 8)]
    got = {}
    for chain in ("0", "er"):
        monkeypatch.setenv("LLAMAVK_CHAIN", chain)
        with llamavk.load(path, n_ctx=32, warn=lambda m: None) as m:
            rt = m.runtime
            got[chain] = one_token_rows(rt, prompt)
            chains = rt.chains[("last", 1, 0, False)]
            if chain == "er":
                assert [op.inputs[0].role for op, _ in chains] == ["o", "gate_exps"] * rt.cfg.n_layer
                words = np.frombuffer(chains[0][1].counters[0].read(), dtype=np.uint32)
                assert all(words[w.slot] == w.n > 0 for _, w in chains)
            else:
                assert chains == []
    assert np.array_equal(got["0"], got["er"])


def test_moe_metadata_errors():
    from llamavk.models import config_from_metadata
    meta = {"general.architecture": "qwen3moe", "qwen3moe.embedding_length": 64, "qwen3moe.block_count": 1,
            "qwen3moe.attention.head_count": 4, "qwen3moe.vocab_size": 100, "qwen3moe.expert_count": 8,
            "qwen3moe.expert_used_count": 9, "qwen3moe.expert_feed_forward_length": 32}
    with pytest.raises(LlamavkError, match="expert_used_count 9"):
        config_from_metadata(meta)
    meta["qwen3moe.expert_used_count"] = 2
    cfg = config_from_metadata(meta)
    assert (cfg.n_expert, cfg.n_expert_used, cfg.n_ff_exp, cfg.n_ff) == (8, 2, 32, 0)
    del meta["qwen3moe.expert_count"]
    with pytest.raises(LlamavkError, match="is missing"):
        config_from_metadata(meta)


@pytest.mark.parametrize("qtype", [T.Q4_0, T.Q8_0, T.Q4_K, T.Q6_K, T.F16, T.IQ4_NL, T.IQ4_XS, T.MXFP4, T.Q5_K,
                                   T.Q2_K, T.Q4_1, T.Q5_0, T.Q5_1, T.BF16, T.F32], ids=lambda t: t.name)
def test_matmul_id_prompt_coopmat(dev, kc, qtype):
    """The cooperative-matrix form of the grouped expert products (GPUs with VK_KHR_cooperative_matrix):
    partial 128-row and 64-token tiles, several token tiles for one expert, experts in two buffers; the
    tiles of 64-row and of 32-row subgroup parts (shaders/variants_matmul.py _SUB32)."""
    if not selection.has_coopmat(kc):
        pytest.skip(f"{dev.info.name} has no cooperative matrices of shape {selection.COOPMAT_SHAPE}")
    cols = small_cols(qtype) if quant_info(qtype).block_size > 1 else 96
    assert selection.moe_product_kernel(kc, cols, qtype.name.lower()) == "mul_mm_coop_id"
    run_matmul_id(dev, kc, qtype, 150, n_expert=4, rows=140, n_used=2, seed=12)
    run_matmul_id(dev, kc, qtype, 40, n_expert=9, rows=37, n_used=3, xslot=True, chunk_experts=5, seed=13)


def test_expert_tiles_reading_x_as_f16_are_the_variants_compiled_so():
    """moe.matmul_id converts a batch's x to f16 for the cooperative-matrix expert tiles of exactly the
    types whose kernel reads it so (shaders/variants_matmul.py X_F16); the super-block steps only where
    the type has dequant_run_f16_sb (the shader refuses to compile otherwise); and each variant's tile,
    whatever its subgroups' parts, is the one moe.MOE_TILES sizes the grid by."""
    scope = {}
    exec((Path(__file__).parent.parent / "shaders" / "variants_matmul.py").read_text(), scope)
    tiles = {name.removeprefix("mul_mm_coop_id_"): defs for name, (_, defs) in scope["VARIANTS"].items()
             if name.startswith("mul_mm_coop_id_")}
    assert {t for t, defs in tiles.items() if defs.get("X_F16") == "1"} == moe.COOP_ID_X_F16
    assert {t for t, defs in tiles.items() if defs.get("SB_STEPS") == "1"} == {"q4_k", "q5_k", "q6_k", "iq4_xs"}
    # every type's tile, of 64-row or of 32-row subgroup parts, is the 128 x 64 one the grid is sized by
    # (matmul_coop.comp: BM = 16 MT WARPS_M, BN = 32 WARPS_N; defaults MT 4, WARPS_M 2, WARPS_N 4)
    for t, defs in tiles.items():
        shape = (16 * int(defs.get("MT", 4)) * int(defs.get("WARPS_M", 2)), 32 * int(defs.get("WARPS_N", 4)))
        assert shape == moe.MOE_TILES["mul_mm_coop_id"], t
    assert {t for t, defs in tiles.items() if defs.get("MT") == "2"} >= {"q5_k", "q6_k", "f16"}


def test_decode_attention_and_rope_kv_waiting_in_their_shaders_equal_unchained(synthetic_model, monkeypatch,
                                                                               portable_attention):
    """Edges k, q, m, p and e (kernels/chain.py): qwen3's rope_kv (Q/K norms, RoPE, KV store) counts its
    workgroups and the decode attention, recorded without a barrier after it, waits in its shader (k);
    the Q/K/V products count on one shared counter and rope_kv waits for all three (q); the experts'
    summing down product counts and the next layer's Q/K/V products wait for it (m); the experts'
    gate/up pair waits for the output projection that picks the experts, before it reads the route (p);
    with p, the down product chained to that pair (e) reads the route after its wait too (else it may
    read it before the output projection wrote it: wrong logits on an H100 with LLAMAVK_CHAIN=1). On a
    software device the waits are met at once: the same logits bits as with the barriers, one barrier
    fewer per layer and edge (and one more per step, before the counters are zeroed)."""
    chainable_stream_kernel(monkeypatch)
    path = synthetic_model("qwen3moe", "q4_0", seed=3)
    prompt = [int(t) for t in np.random.default_rng(5).integers(3, 500, 8)]
    got, barriers = {}, {}
    for chain in ("0", "k", "kq", "kqm", "kqmp", "kqmpe"):
        monkeypatch.setenv("LLAMAVK_CHAIN", chain)
        with llamavk.load(path, n_ctx=64, warn=lambda m: None) as m:
            rt = m.runtime
            got[chain] = one_token_rows(rt, prompt)
            barriers[chain] = sum(seq.n_barriers for seq in rt.recordings[("last", 1, 0, False)])
            names = [name for name, _ in rt.kc._kernels]
            assert any(n.startswith("attention_dec") and "_wait" in n for n in names) == (chain != "0")
            # edge p: the pair reads the route after its wait, and so does the down product chained to
            # it (it may start before the output projection has written the route: a race on GPUs)
            rwait = {spec[6] for name, spec in rt.kc._kernels if name.startswith("mul_mv_id") and spec[15]}
            assert rwait == ({False, True} if "pe" in chain else {False} if "p" in chain else set())   # spec 6: SUM
            assert any(n.startswith("rope_kv") and "_wait" in n for n in names) == ("q" in chain)
    n_layer = rt.cfg.n_layer
    assert barriers["k"] == barriers["0"] - n_layer + 1 and barriers["kq"] == barriers["0"] - 2 * n_layer + 1
    assert barriers["kqm"] == barriers["kq"] - (n_layer - 1)   # the last down is followed by the output row's copy
    assert barriers["kqmp"] == barriers["kqm"] - n_layer
    assert barriers["kqmpe"] == barriers["kqmp"] - n_layer
    assert all(np.array_equal(got["0"], got[c]) for c in ("k", "kq", "kqm", "kqmp", "kqmpe"))
