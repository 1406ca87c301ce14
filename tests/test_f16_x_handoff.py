"""Prompt steps' hand-overs between ops. A residual add and the norm after it are one dispatch
(runtime._add_then_norm, norm.add_rms_norm): the same logits to the bit on a whole model.
Which prompt-step ops write the f16 x of the products after them (runtime._feeds_f16_products):
on devices whose prompt products read x as f16 (NV coopmat2) a norm, SwiGLU or attention whose every
reader is such a product, right after it, writes f16 and no f32 copy exists. llvmpipe has no such
products, so the rule is checked here with matmul.reads_x_f16 forced on (the kernels' f16 outputs:
test_kernels_ops.py; the whole path on a GPU: perplexity unchanged, docs/PERFORMANCE.md)."""

import pytest

import llamavk
from llamavk.kernels import matmul


def written(rt, op, n=64) -> int:
    """The values ops of these kinds write for n tokens (the runtime's sizes)."""
    if op.kind == "attention":
        return n * op.attrs.get("n_head", rt.cfg.n_head) * rt.cfg.head_dim
    return n * op.inputs[0].width if op.inputs else 0


def flagged(m, key, monkeypatch, reads_f16=True, rt=None):
    rt = rt or m.runtime
    monkeypatch.setattr(matmul, "reads_x_f16", lambda kc, w, n: reads_f16)
    ops = rt.batch_graphs[key].ops
    return [op for i, op in enumerate(ops) if rt._feeds_f16_products(ops, i, 64, ops, written(rt, op))]


def test_dense_layer_norms_swiglu_and_attention_hand_over_f16(synthetic_model, monkeypatch):
    with llamavk.load(str(synthetic_model("llama", "q4_0")), n_ctx=128) as m:
        n_layer = m.config.n_layer
        ops = flagged(m, "all", monkeypatch)
        kinds = [op.kind for op in ops]
        # per layer: the attention norm (Q/K/V), attention (O), the FFN norm (gate/up), SwiGLU (down);
        # then the output norm before the logits' product
        assert kinds.count("rms_norm") == 2 * n_layer + 1
        assert kinds.count("swiglu") == n_layer and kinds.count("attention") == n_layer
        assert all(op.kind in ("rms_norm", "swiglu", "attention") for op in ops)
        assert flagged(m, "all", monkeypatch, reads_f16=False) == []
        monkeypatch.setenv("LLAMAVK_CM2_X_SHARE", "0")
        assert flagged(m, "all", monkeypatch) == []


def test_a_norm_feeding_a_router_keeps_f32(synthetic_model, monkeypatch):
    """The MoE FFN norm is read by the router and the expert products too (not products reading f16
    x right after it): it stays f32; the attention norm still hands over."""
    with llamavk.load(str(synthetic_model("qwen3moe", "q4_0")), n_ctx=128) as m:
        ops = flagged(m, "all", monkeypatch)
        rt = m.runtime
        graph_ops = rt.batch_graphs["all"].ops
        for op in ops:
            readers = [o for o in graph_ops if op.out in o.inputs]
            assert readers and all(o.kind == "matmul" for o in readers)
        norms = [op for op in graph_ops if op.kind == "rms_norm" and op.layer is not None]
        ffn_norms = [op for op in norms if any(o.kind != "matmul" for o in graph_ops if op.out in o.inputs)]
        assert ffn_norms and not any(op in ops for op in ffn_norms)
        assert sum(op.kind == "rms_norm" for op in ops) >= m.config.n_layer


@pytest.mark.parametrize("arch", ["llama", "gemma3", "qwen35moe"])
def test_add_and_norm_in_one_dispatch_change_no_logit(synthetic_model, monkeypatch, arch):
    """A 40-token prompt (the batch graph) with the residual adds and the norms after them recorded
    as one dispatch each, against the two dispatches (LLAMAVK_ADD_NORM_FUSE=0): every logit equal."""
    import numpy as np
    path = str(synthetic_model(arch, "q8_0"))
    tokens = [int(t) for t in np.random.default_rng(4).integers(3, 400, 40)]
    got = {}
    for fuse in ("1", "0"):
        monkeypatch.setenv("LLAMAVK_ADD_NORM_FUSE", fuse)
        with llamavk.load(path, n_ctx=128) as m:
            got[fuse] = m.logits(tokens, all=True).copy()
    assert np.isfinite(got["1"]).all()
    np.testing.assert_array_equal(got["1"], got["0"])


def test_one_pass_only_where_the_arena_keeps_views_apart(dev):
    """runtime._one_pass_safe: an output may sit exactly on an input (in place: each row read before
    it is written) or apart from it, not over it at another offset (the arena reuses dead tensors'
    memory: -sm row's graphs put a norm's output over the add's input, and one dispatch for both gave
    wrong logits)."""
    from llamavk.kernels import View
    from llamavk.runtime import _one_pass_safe
    from llamavk.vk import Buffer
    buf, other = Buffer(dev, 4096), Buffer(dev, 4096)
    a, b = View(buf, 0, 1024), View(buf, 1024, 1024)
    assert _one_pass_safe([a, b], [View(buf, 2048, 1024)])              # apart
    assert _one_pass_safe([a, b], [View(buf, 0, 1024)])                 # in place on a
    assert _one_pass_safe([a, b], [View(other, 512, 1024)])             # another buffer
    assert not _one_pass_safe([a, b], [View(buf, 512, 1024)])           # over a and b, shifted
    assert not _one_pass_safe([a], [View(buf, 2048, 1024), View(buf, 2560, 1024)])   # outputs overlap


def test_a_head_split_hands_over_its_own_heads(synthetic_model, monkeypatch):
    """-sm tensor gives each device some heads: its attention writes n_tokens x its heads' width,
    less than the attention tensor's width, and the output projection reads that many. The hand-over
    holds only where the sizes agree (with the tensor's width, a reader would have asked for an x
    that was never written: wrong logits on a GPU before the sizes were checked)."""
    with llamavk.load(str(synthetic_model("llama", "q4_0")), n_ctx=128, devices="Vulkan0,Vulkan0",
                      split_mode="tensor", n_ubatch=64) as m:
        sub = m.runtime.runtimes[0]
        ops = sub.batch_graphs["all"].ops
        attn = [i for i, op in enumerate(ops) if op.kind == "attention"]
        assert attn and all(written(sub, ops[i]) < 64 * ops[i].out.width for i in attn)   # a share of the heads
        assert len(flagged(m, "all", monkeypatch, rt=sub)) > 0
        assert all(sub._feeds_f16_products(ops, i, 64, ops, written(sub, ops[i])) for i in attn)
        assert not any(sub._feeds_f16_products(ops, i, 64, ops, 64 * ops[i].out.width) for i in attn)
