"""A shared expert as one more slot of the routed experts' one-token products (qwen35moe decode:
fusion.fuse_shared_expert, moe_router.comp / matvec_id.comp SHEXP).

Kernels against numpy (gguf.quants dequantization in float64): the router writing the shared gate
sigmoid(w . x') beside the picked experts; the gate/up pair computing the shared slot from its own
matrices; the down product summing the shared slot with the routed ones and the residual; shared
widths below, equal to and above the routed experts', for every type whose loads matvec_id.comp
issues up front. Refusals: the types it loads unit by unit, mixed types, experts in several buffers,
the env switch. The rewrite: the one-token graph's FFN ops (paired and unpaired
shared gate/up) and where it must not apply. Models: tiny qwen35moe decode steps against
reference.ReferenceModel and against the unfused graph (LLAMAVK_SHEXP_FUSE=0), chained and not.
"""

from pathlib import Path

import numpy as np
import pytest
from gguf import GGMLQuantizationType as T

import llamavk
from llamavk.errors import LlamavkError
from llamavk.fusion import fuse_one_token
from llamavk.kernels import KernelCache, View, moe, upload_qweight
from llamavk.models import build_graph, load_model_file
from llamavk.quant import quant_info
from llamavk.reference import ReferenceModel, silu
from llamavk.vk import CommandSequence

from .test_kernels_matmul import host_f32, make_weight
from .test_moe import device_array, expert_weight, random_routes, reference_route, route_rows
from .vk_fixtures import chainable_stream_kernel, one_token_rows


@pytest.fixture(scope="module")
def kc(dev):
    return KernelCache(dev)


def shared_weight(dev, qtype, rows, cols, seed, max_chunk_bytes=None):
    raw, ref = make_weight(qtype, rows, cols, seed)
    return upload_qweight(dev, raw, qtype, rows, cols, max_chunk_bytes=max_chunk_bytes), ref


def shexp_route(ids, weights, n_expert, gate):
    """Route rows of n_used + 1 slots: the picked experts, then the shared one (id n_expert)."""
    n_tokens = len(ids)
    return route_rows(np.concatenate([ids, np.full((n_tokens, 1), n_expert)], 1),
                      np.concatenate([weights, np.broadcast_to(np.asarray(gate, np.float64).reshape(-1, 1), (n_tokens, 1))], 1))


@pytest.mark.parametrize("qtype", [T.F32, T.F16], ids=lambda t: t.name)
@pytest.mark.parametrize("n_tokens", [1, 3])
def test_router_writes_the_shared_gate(dev, kc, qtype, n_tokens):
    """The router's extra workgroup: slot n_used holds id n_expert and sigmoid(w_shexp . x'), x' the
    normed input; the picked slots are as without it (twice: the counts are back at 0)."""
    n_expert, cols, n_used = 70, 96, 5
    rng = np.random.default_rng(31)
    raw, wref = make_weight(qtype, n_expert, cols, 32)
    w = upload_qweight(dev, raw, qtype, n_expert, cols)
    nw = rng.uniform(0.05, 0.15, cols).astype(np.float32)
    wsh = rng.uniform(-3, 3, cols).astype(np.float32)
    for _ in range(2):
        x = rng.standard_normal((n_tokens, cols)).astype(np.float32)
        h = x.astype(np.float64) / np.sqrt((x.astype(np.float64) ** 2).mean(1, keepdims=True) + 1e-6) * nw
        ids, weights = reference_route(h @ wref.T, n_used, "softmax", True, 1.0)
        gate = 1.0 / (1.0 + np.exp(-(h @ wsh)))
        out = host_f32(dev, n_tokens * 2 * (n_used + 1))
        seq = CommandSequence(dev).begin()
        moe.router(seq, kc, w, device_array(dev, x), View.whole(out), n_tokens, n_used, "softmax", True, 1.0,
                   norm_w=device_array(dev, nw), eps=1e-6, shexp=device_array(dev, wsh))
        seq.end().run()
        got = out.array(np.float32, n_tokens * 2 * (n_used + 1)).reshape(n_tokens, 2 * (n_used + 1))
        np.testing.assert_array_equal(got[:, :n_used + 1].view(np.uint32),
                                      np.concatenate([ids, np.full((n_tokens, 1), n_expert)], 1))
        np.testing.assert_allclose(got[:, n_used + 1:-1], weights, rtol=1e-4, atol=1e-6)
        np.testing.assert_allclose(got[:, -1], gate, rtol=1e-4, atol=1e-6)
        assert 0.05 < gate.min() and gate.max() < 0.95     # the test's gate does not saturate


@pytest.mark.parametrize("n_tokens", [1, 3])
def test_router_writes_the_ungated_slot(dev, kc, n_tokens):
    """glm4moe's shared expert is not gated (moe_router.comp SHONE): slot n_used holds id n_expert and
    weight 1, beside a pick by probability + a bias per expert (SELB)."""
    n_expert, cols, n_used = 70, 96, 5
    rng = np.random.default_rng(33)
    raw, wref = make_weight(T.F32, n_expert, cols, 34)
    w = upload_qweight(dev, raw, T.F32, n_expert, cols)
    nw = rng.uniform(0.05, 0.15, cols).astype(np.float32)
    bias = (rng.standard_normal(n_expert) * 0.3).astype(np.float32)
    for _ in range(2):
        x = rng.standard_normal((n_tokens, cols)).astype(np.float32)
        h = x.astype(np.float64) / np.sqrt((x.astype(np.float64) ** 2).mean(1, keepdims=True) + 1e-6) * nw
        ids, weights = reference_route(h @ wref.T, n_used, "sigmoid", True, 2.5, bias)
        out = host_f32(dev, n_tokens * 2 * (n_used + 1))
        seq = CommandSequence(dev).begin()
        moe.router(seq, kc, w, device_array(dev, x), View.whole(out), n_tokens, n_used, "sigmoid", True, 2.5,
                   norm_w=device_array(dev, nw), eps=1e-6, sel_bias=device_array(dev, bias), shexp_one=True)
        seq.end().run()
        got = out.array(np.float32, n_tokens * 2 * (n_used + 1)).reshape(n_tokens, 2 * (n_used + 1))
        np.testing.assert_array_equal(got[:, :n_used + 1].view(np.uint32),
                                      np.concatenate([ids, np.full((n_tokens, 1), n_expert)], 1))
        np.testing.assert_allclose(got[:, n_used + 1:-1], weights, rtol=1e-4, atol=1e-6)
        np.testing.assert_array_equal(got[:, -1], 1.0)


def check(got, ref, what):
    assert np.isfinite(got).all(), f"{what}: some outputs were not written"
    err = np.linalg.norm(got - ref) / np.linalg.norm(ref)
    assert err < 1e-3, f"{what}: relative error {err:.2e}"


# every type whose expert loads matvec_id.comp issues up front (moe.MATVEC_ID_PRELOAD)
SHEXP_TYPES = [T.Q4_0, T.Q8_0, T.Q4_K, T.Q5_K, T.Q6_K, T.IQ4_NL, T.IQ4_XS, T.IQ2_XXS, T.IQ3_S, T.IQ1_M]


def block_cols(qtype, n):
    """n blocks' worth of columns: 32-weight blocks, or super-blocks of 256."""
    return n * quant_info(qtype).block_size


@pytest.mark.parametrize("qtype", SHEXP_TYPES, ids=lambda t: t.name)
@pytest.mark.parametrize("sh_rows", [64, 96, 160])      # the routed experts have 96 rows
@pytest.mark.parametrize("n_tokens", [1, 2])
def test_pair_computes_the_shared_slot(dev, kc, qtype, sh_rows, n_tokens):
    """Gate/up pair with the norm folded in: per token the routed slots' silu(G x') * (U x') rows,
    then the shared expert's, from its own matrices (another row count)."""
    n_expert, rows, cols, n_used = 6, 96, block_cols(qtype, 4 if quant_info(qtype).block_size == 32 else 1), 3
    rng = np.random.default_rng(sh_rows + n_tokens)
    g, gref = expert_weight(dev, qtype, n_expert, rows, cols, 1)
    u, uref = expert_weight(dev, qtype, n_expert, rows, cols, 2)
    gs, gsref = shared_weight(dev, qtype, sh_rows, cols, 3)
    us, usref = shared_weight(dev, qtype, sh_rows, cols, 4)
    ids, weights = random_routes(rng, n_tokens, n_expert, n_used)
    x = rng.standard_normal((n_tokens, cols)).astype(np.float32)
    nw = rng.uniform(0.5, 1.5, cols).astype(np.float32)
    h = x.astype(np.float64) / np.sqrt((x.astype(np.float64) ** 2).mean(-1, keepdims=True) + 1e-5) * nw
    ref = np.stack([np.concatenate([silu(gref[ids[t, s]] @ h[t]) * (uref[ids[t, s]] @ h[t]) for s in range(n_used)]
                                   + [silu(gsref @ h[t]) * (usref @ h[t])]) for t in range(n_tokens)])
    width = n_used * rows + sh_rows
    y = host_f32(dev, n_tokens * width)
    seq = CommandSequence(dev).begin()
    moe.matmul_id(seq, kc, g, device_array(dev, x), device_array(dev, shexp_route(ids, weights, n_expert, 0.5)),
                  View.whole(y), n_tokens, n_used + 1, False, norm=device_array(dev, nw), eps=1e-5, pair=u,
                  shexp=(gs, us))
    seq.end().run()
    check(y.array(np.float32, n_tokens * width).reshape(ref.shape).astype(np.float64), ref, qtype.name)


@pytest.mark.parametrize("qtype", SHEXP_TYPES, ids=lambda t: t.name)
@pytest.mark.parametrize("sh_blocks", [2, 3, 5])        # the routed experts' down products take 3 blocks
@pytest.mark.parametrize("stage", ["1", "0"])           # x' staged in shared memory, or from memory
def test_down_sums_the_shared_slot(dev, kc, monkeypatch, qtype, sh_blocks, stage):
    """Summing down product: residual + sum_s w_s D[id_s] x_s + gate * D_shared x_shared, x per token
    the routed slots' rows then the shared one's (its own width), for two tokens."""
    monkeypatch.setenv("LLAMAVK_MVID_STAGE", stage)
    sh_cols = block_cols(qtype, sh_blocks)
    n_expert, rows, cols, n_used, n_tokens = 6, 37, block_cols(qtype, 3), 4, 2
    rng = np.random.default_rng(sh_blocks)
    d, dref = expert_weight(dev, qtype, n_expert, rows, cols, 5)
    ds, dsref = shared_weight(dev, qtype, rows, sh_cols, 6)
    ids, weights = random_routes(rng, n_tokens, n_expert, n_used)
    gate = rng.uniform(0.1, 0.9, n_tokens)
    x = rng.standard_normal((n_tokens, n_used * cols + sh_cols)).astype(np.float32)
    res = rng.standard_normal((n_tokens, rows)).astype(np.float32)
    xs = x.astype(np.float64)
    ref = np.stack([res[t] + sum(weights[t, s] * (dref[ids[t, s]] @ xs[t, s * cols:(s + 1) * cols])
                                 for s in range(n_used)) + gate[t] * (dsref @ xs[t, n_used * cols:])
                    for t in range(n_tokens)])
    assert (moe.matvec_id_staged(kc, n_used * cols + sh_cols, 1, True) > 0) == (stage == "1")
    y = host_f32(dev, n_tokens * rows)
    seq = CommandSequence(dev).begin()
    moe.matmul_id(seq, kc, d, device_array(dev, x), device_array(dev, shexp_route(ids, weights, n_expert, gate)),
                  View.whole(y), n_tokens, n_used + 1, True, sum_slots=True, residual=device_array(dev, res),
                  shexp=(ds, None))
    seq.end().run()
    check(y.array(np.float32, n_tokens * rows).reshape(ref.shape).astype(np.float64), ref, qtype.name)


def test_shared_slot_variants_match_the_preloaded_types():
    # the slot's code is compiled only into mul_mv_id_<type>_shexp: one per type moe.py lets take it
    scope = {}
    exec((Path(__file__).parent.parent / "shaders" / "variants_matmul.py").read_text(), scope)
    shexp = {name for name in scope["VARIANTS"] if name.startswith("mul_mv_id_") and name.endswith("_shexp")}
    assert shexp == {f"mul_mv_id_{t}_shexp" for t in moe.MATVEC_ID_PRELOAD}
    assert all(scope["VARIANTS"][n][1].get("SHEXP_SLOT") == "1" for n in shexp)


def test_shared_slot_only_where_the_kernels_can(dev, kc, monkeypatch):
    """shexp_slot_ok: the preloaded types (moe.MATVEC_ID_PRELOAD) of the experts' types, each in one buffer; the shared
    expert's input width the experts'. matmul_id refuses what it cannot do with one line."""
    E, R, n_expert = 64, 96, 4

    def mats(qtype=T.Q4_0, sh_type=None, chunk=None, sh_rows=64, E=E, R=R):
        sh_type = sh_type or qtype
        gate = expert_weight(dev, qtype, n_expert, R, E, 1, chunk)[0]
        up = expert_weight(dev, qtype, n_expert, R, E, 2, chunk)[0]
        down = expert_weight(dev, qtype, n_expert, E, R, 3, chunk)[0]
        return (gate, up, down, shared_weight(dev, sh_type, sh_rows, E, 4)[0],
                shared_weight(dev, sh_type, sh_rows, E, 5)[0], shared_weight(dev, sh_type, E, sh_rows, 6)[0])

    good = mats()
    assert moe.shexp_slot_ok(*good)
    assert moe.shexp_slot_ok(*mats(T.Q8_0, sh_rows=256))
    assert moe.shexp_slot_ok(*mats(T.Q4_K, sh_rows=256, E=256, R=256))
    assert not moe.shexp_slot_ok(*mats(T.Q3_K, sh_rows=256, E=256, R=256))   # no pair: loads unit by unit
    assert not moe.shexp_slot_ok(*mats(T.Q4_0, T.Q8_0))                 # one kernel variant: one type
    assert not moe.shexp_slot_ok(*mats(chunk=R * 36 * 2))               # experts in two buffers
    monkeypatch.setenv("LLAMAVK_SHEXP_FUSE", "0")
    assert not moe.shexp_slot_ok(*good)
    gate, up, _, gs, _, _ = good
    y = host_f32(dev, 4 * R + 64)
    route = device_array(dev, shexp_route(np.array([[0, 1, 2]]), np.ones((1, 3)), n_expert, 0.5))
    x = device_array(dev, np.ones((1, E), np.float32))
    with pytest.raises(LlamavkError, match="shared expert slot"):      # a pair needs the shared pair too
        moe.matmul_id(CommandSequence(dev), kc, gate, x, route, View.whole(y), 1, 4, False, pair=up,
                      shexp=(gs, None))


def ffn_ops(graph, layer):
    """The ops of a layer from its FFN on (after the mixer's output projection)."""
    ops = [op for op in graph.ops if op.layer == layer]
    last_mixer = max(i for i, op in enumerate(ops) if op.kind == "matmul" and op.inputs[0].role in ("o", "ssm_out"))
    return ops[last_mixer + 1:]


def describe(op):
    return (op.kind, op.inputs[0].role if op.inputs and op.inputs[0].kind == "weight" else None,
            tuple(sorted(op.attrs)))


@pytest.fixture(scope="module")
def tiny_config(tmp_path_factory):
    from llamavk.synthetic import tiny_preset, write_synthetic_model
    path = tmp_path_factory.mktemp("shexp") / "tiny-qwen35moe.gguf"
    write_synthetic_model(path, tiny_preset("qwen35moe"), "q4_0", "qwen35moe", seed=1)
    return load_model_file(path).config


@pytest.mark.parametrize("pair_shared", [True, False], ids=["shared-paired", "shared-unpaired"])
def test_rewrite_of_the_one_token_ffn(tiny_config, pair_shared):
    """The one-token graph's FFN: router (norm folded, shared gate), gate/up pair with the shared slot,
    down + sum with the shared slot and the residual. Whether the shared gate and up were a pair
    (GPUs) or two products and a swiglu (elsewhere) does not matter. Routes and pair outputs are one
    slot wider."""
    cfg = tiny_config
    graph = build_graph(cfg)
    can_pair = (lambda g, u: True) if pair_shared else (lambda g, u: g.experts > 0)
    one = fuse_one_token(graph, can_pair, lambda w: False, can_shexp=lambda *w: True)
    for layer in range(cfg.n_layer):
        ops = ffn_ops(one, layer)
        assert [describe(op) for op in ops] == [
            ("matmul", "router", ("eps", "norm", "route", "shexp_gate")),
            ("matmul_id", "gate_exps", ("eps", "norm", "pair", "shexp", "shexp_pair")),
            ("matmul_id", "down_exps", ("residual", "shexp", "sum"))]
        router, pair, down = ops
        assert router.attrs["shexp_gate"].role == "router_shexp" and router.attrs["route"]["n_used"] == 3
        assert (pair.attrs["shexp"].role, pair.attrs["shexp_pair"].role, down.attrs["shexp"].role) == \
            ("gate_shexp", "up_shexp", "down_shexp")
        assert router.out is pair.inputs[2] is down.inputs[2] and router.out.width == 2 * (3 + 1)
        assert pair.out is down.inputs[1] and pair.out.width == 3 * cfg.n_ff_exp + cfg.n_ff_shexp
    kinds = {op.kind for op in one.ops}
    assert "scale_sigmoid" not in kinds and "moe_sum" not in kinds and "moe_route" not in kinds
    assert "rms_norm" not in kinds      # every norm went into its products (the FFN's too)
    assert len(graph.ops) - len(one.ops) >= 8 * cfg.n_layer


def test_rewrite_of_the_ungated_shared_expert(tmp_path):
    """glm4moe: add(moe_sum, shared down) becomes the same three products, the router writing the
    shared slot's weight 1 (attr shexp_one, no gate vector); the dense first layer keeps its FFN."""
    from llamavk.synthetic import tiny_preset, write_synthetic_model
    path = tmp_path / "tiny-glm4moe.gguf"
    write_synthetic_model(path, tiny_preset("glm4moe"), "q4_0", "glm4moe", seed=1)
    cfg = load_model_file(path).config
    one = fuse_one_token(build_graph(cfg), lambda g, u: True, lambda w: False, can_shexp=lambda *w: True)
    assert [describe(op)[:2] for op in ffn_ops(one, 0)] == [("matmul", "gate"), ("matmul", "down")]
    for layer in range(1, cfg.n_layer):
        ops = ffn_ops(one, layer)
        assert [describe(op) for op in ops] == [
            ("matmul", "router", ("eps", "norm", "route", "shexp_one")),
            ("matmul_id", "gate_exps", ("eps", "norm", "pair", "shexp", "shexp_pair")),
            ("matmul_id", "down_exps", ("residual", "shexp", "sum"))]
        assert "sel_bias" in ops[0].attrs["route"] and ops[0].out.width == 2 * (3 + 1)
    assert not any(op.kind in ("add", "moe_sum", "moe_route") for op in one.ops if op.layer)


def test_rewrite_keeps_the_graph_where_it_cannot(tiny_config):
    """Refused by the device (can_shexp False), or without the routed pair: the shared branch stays
    as it is (scale_sigmoid, its products, the add) in every layer."""
    graph = build_graph(tiny_config)
    for can_pair, can_shexp in [(lambda g, u: True, lambda *w: False), (lambda g, u: False, lambda *w: True)]:
        one = fuse_one_token(graph, can_pair, lambda w: False, can_shexp=can_shexp) \
            or fuse_one_token(graph, lambda g, u: True, lambda w: False)
        assert sum(op.kind == "scale_sigmoid" for op in one.ops) == tiny_config.n_layer
        assert not any("shexp" in op.attrs or "shexp_gate" in op.attrs for op in one.ops)


def decode_rows(path, prompt, **env):
    with llamavk.load(path, n_ctx=32, warn=lambda m: None) as m:
        return one_token_rows(m.runtime, prompt), m.runtime


# The fused and unfused steps run different products: on devices with integer dot products the
# unfused shared expert's matrix-vector kernel quantizes x to two int8 levels (matvec_stream.comp
# DOT8), the expert slot multiplies in f32. Measured on an H100: 1.4e-4 - 1.6e-4 of max|logit|
# (llvmpipe, f32 both: ~1e-6).
PATHS_TOL = 5e-4


@pytest.mark.parametrize("arch,qtype,overrides", [
    ("qwen35moe", "q4_0", {}), ("qwen35moe", "q8_0", {"n_ff_shexp": 128}), ("qwen35moe", "q4_k", {}),
    ("qwen35moe", "q6_k", {}), ("qwen35moe", "iq4_xs", {}), ("glm4moe", "q8_0", {}), ("glm4moe", "q4_k", {})],
    ids=["q4_0-shared-narrower", "q8_0-shared-wider", "q4_k", "q6_k", "iq4_xs", "glm4moe-q8_0", "glm4moe-q4_k"])
def test_decode_with_the_shared_slot_matches_reference(synthetic_model, monkeypatch, arch, qtype, overrides):
    """Tiny qwen35moe (routed experts 96 wide, the shared one 64 or 128; 256 for the 256-weight block
    types), and tiny glm4moe (its shared expert ungated: a slot of weight 1, after a dense first layer):
    one-token steps with the shared expert folded in against the numpy reference and against the
    unfused graph."""
    path = synthetic_model(arch, qtype, seed=3, **overrides)
    prompt = [int(t) for t in np.random.default_rng(4).integers(3, 500, 6)]
    want = ReferenceModel(load_model_file(path)).logits(prompt)
    scale = np.abs(want).max()
    got = {}
    for fuse in ("1", "0"):
        monkeypatch.setenv("LLAMAVK_SHEXP_FUSE", fuse)
        got[fuse], rt = decode_rows(path, prompt)
        one = rt.fused_one["last"]
        n_moe = rt.cfg.n_layer - rt.cfg.n_layer_dense_lead
        assert sum("shexp" in op.attrs for op in one.ops) == (2 * n_moe if fuse == "1" else 0)
        assert np.abs(got[fuse] - want).max() < 3e-3 * scale
    assert np.abs(got["1"] - got["0"]).max() < PATHS_TOL * scale


def test_decode_chained_with_the_shared_slot(synthetic_model, monkeypatch, portable_attention):
    """Edges e and r (kernels/chain.py) with the shared slot: the router (its extra workgroup too)
    waiting for the output projection, the down product for the pair. On a software device the
    waits are met at once: the same bits as unchained. (The router as a dispatch of its own: folded
    into the product writing its input, test_router_fold.py, it has no edge to chain.)"""
    chainable_stream_kernel(monkeypatch)
    monkeypatch.setenv("LLAMAVK_ROUTER_FUSE", "0")
    path = synthetic_model("qwen35moe", "q4_0", seed=3)
    prompt = [int(t) for t in np.random.default_rng(5).integers(3, 500, 5)]
    got = {}
    for chain in ("0", "er"):
        monkeypatch.setenv("LLAMAVK_CHAIN", chain)
        got[chain], rt = decode_rows(path, prompt)
        roles = [op.inputs[0].role for op, _ in rt.chains[("last", 1, 0, False)]]
        assert roles == ([] if chain == "0" else ["gate_exps"] * 3 + ["o", "gate_exps"])
    assert np.array_equal(got["0"], got["er"])


@pytest.mark.parametrize("mode", ["tensor", "graph"])
def test_split_decode_with_the_shared_slot(synthetic_model, mode):
    """Tensor / graph splits: each device holds row / column parts of the experts and of the shared
    expert (whole 32-column units), or of one of them only. A device holding both takes the shared
    slot; the others keep their ops. The decode logits are -sm none's up to float rounding (measured
    9e-7 of max|logit| on llvmpipe; PATHS_TOL where the unfused products take int8 x)."""
    path = synthetic_model("qwen35moe", "q8_0", seed=3)
    prompt = [int(t) for t in np.random.default_rng(6).integers(3, 500, 4)]
    want, _ = decode_rows(path, prompt)
    for n_dev, ts in [(2, None), (3, [2, 1, 1])]:
        with llamavk.load(path, n_ctx=32, warn=lambda m: None, devices=",".join(["Vulkan0"] * n_dev),
                          split_mode=mode, tensor_split=ts) as m:
            fused = []
            for rt in m.runtime.runtimes:
                ops = rt.fused_one["last"].ops
                roles = {w.role for w in rt.fused_one["last"].weights.values()}
                n_shexp = sum("shexp" in op.attrs for op in ops)
                assert n_shexp == (2 * rt.cfg.n_layer if {"gate_exps", "gate_shexp"} <= roles else 0)
                fused.append(n_shexp > 0)
            assert all(fused) if n_dev == 2 else fused == [True, False, False]
            rows = []
            for i, t in enumerate(prompt):
                m.runtime.run_batch("last", [t], i)
                rows.append(m.runtime.logits(1)[0].copy())
        assert np.abs(np.array(rows) - want).max() < PATHS_TOL * np.abs(want).max(), f"{n_dev} devices"
