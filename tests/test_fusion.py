"""The decode fusion pass: what it folds, and that it leaves the original graph alone."""

from llamavk.fusion import fuse_for_matvec, fuse_glu_pairs, fuse_one_token, fuse_rope_kv
from llamavk.models import build_graph
from llamavk.models.base import ModelConfig


def cfg(**kw):
    base = dict(arch="llama", n_vocab=100, n_embd=64, n_layer=3, n_head=4, n_head_kv=2, head_dim=16, n_ff=96,
                n_ctx_train=128, rms_eps=1e-5, rope_base=1e4, rope_dim=16, rope_neox=False, rope_scaling=None,
                qkv_bias=False, qk_norm=False, tied_output=False)
    base.update(kw)
    return ModelConfig(**base)


def kinds(g):
    return [op.kind for op in g.ops]


def test_norms_swiglu_and_residual_adds_fold_into_matmuls():
    g = build_graph(cfg())
    before = kinds(g)
    f = fuse_for_matvec(g)
    assert kinds(g) == before                       # original untouched
    assert "rms_norm" not in kinds(f) and "add" not in kinds(f) and "swiglu" not in kinds(f)
    per_layer = [op for op in f.ops if op.layer == 1]
    assert [op.kind for op in per_layer] == ["matmul"] * 3 + ["rope", "rope", "attention", "matmul"] + \
        ["matmul", "matmul", "matmul"]
    qkv = per_layer[:3]
    assert all(op.attrs["norm"].role == "attn_norm" for op in qkv)
    assert per_layer[6].attrs["residual"] is not None
    down = per_layer[9]
    assert down.inputs[0].role == "down" and down.inputs[1] is per_layer[7].out
    assert down.attrs["glu"] is per_layer[8].out and down.attrs["residual"] is not None
    assert f.logits is g.logits and f.ops[-1].attrs["norm"].role == "output_norm"


def test_rope_folds_into_attention():
    g = build_graph(cfg())
    f = fuse_rope_kv(g)
    assert "rope" in kinds(g) and "rope" not in kinds(f)
    attn = [op for op in f.ops if op.kind == "attention"]
    assert len(attn) == 3 and all(op.attrs["rope"] for op in attn)
    decode = fuse_for_matvec(f)
    assert [op.kind for op in decode.ops if op.layer == 1] == ["matmul"] * 3 + ["attention"] + ["matmul"] * 4


def test_qk_norm_and_biases_survive():
    f = fuse_for_matvec(build_graph(cfg(arch="qwen3", qk_norm=True, qkv_bias=True)))
    assert kinds(f).count("head_norm") == 2 * 3
    q = next(op for op in f.ops if op.kind == "matmul" and op.inputs[0].role == "q")
    assert len(q.inputs) == 3 and q.inputs[2].role == "q_bias" and "norm" in q.attrs


def test_gate_and_up_pair_where_the_device_can():
    g = fuse_rope_kv(build_graph(cfg()))
    asked = []
    f = fuse_for_matvec(fuse_glu_pairs(g, lambda a, b: asked.append((a.role, b.role)) or True))
    assert set(asked) == {("gate", "up")} and len(asked) == 3
    per_layer = [op for op in f.ops if op.layer == 1]
    assert [op.kind for op in per_layer] == ["matmul"] * 3 + ["attention"] + ["matmul"] * 3
    pair, down = per_layer[5], per_layer[6]
    assert pair.inputs[0].role == "gate" and pair.attrs["pair"].role == "up"
    assert pair.attrs["norm"].role == "ffn_norm"
    assert down.inputs[1] is pair.out and "glu" not in down.attrs and down.attrs["residual"] is not None
    # a device that cannot: the graph is the plain decode fusion
    assert kinds(fuse_for_matvec(fuse_glu_pairs(g, lambda a, b: False))) == kinds(fuse_for_matvec(g))


def test_rope_and_kv_store_into_the_qkv_products_where_the_device_can():
    g = fuse_rope_kv(build_graph(cfg()))
    f = fuse_one_token(g, lambda a, b: True, lambda w: w.role in ("q", "k", "v"))
    per_layer = [op for op in f.ops if op.layer == 1]
    assert [op.kind for op in per_layer] == ["matmul"] * 3 + ["attention"] + ["matmul"] * 3   # 5 stages
    assert [op.attrs.get("rope") for op in per_layer[:3]] == ["q", "k", "v"]
    attn = per_layer[3]
    assert attn.attrs["kv_stored"] and not attn.attrs["rope"]
    # qwen3's head norms sit between the products and RoPE: nothing to fold
    q3 = fuse_rope_kv(build_graph(cfg(arch="qwen3", qk_norm=True)))
    assert not any(op.attrs.get("kv_stored") for op in fuse_one_token(q3, lambda a, b: True, lambda w: True).ops)
    # a device whose kernels can do neither: no separate one-token graph
    assert fuse_one_token(g, lambda a, b: False, lambda w: False) is None


def test_delta_net_middle_into_one_op_for_one_token_steps():
    """qwen35: a DeltaNet layer's conv, delta rule and gated norm become one delta_net_step op taking
    the raw q|k|v product, where the device can; the gated attention layers keep their ops."""
    from llamavk.models import config_from_metadata

    from .test_qwen35 import hybrid_meta

    c = config_from_metadata(hybrid_meta())
    g = fuse_rope_kv(build_graph(c))
    asked = []
    f = fuse_one_token(g, lambda a, b: False, lambda w: False,
                       can_fuse_gdn=lambda head_dim, d_conv: asked.append((head_dim, d_conv)) or True)
    assert asked == [(16, 4)] * sum(c.recurrent_layers)
    layer0 = [op for op in f.ops if op.layer == 0]
    # q|k|v, z, beta, alpha products (one stage), the step, ssm_out (+ residual), the FFN
    assert [op.kind for op in layer0][:6] == ["matmul"] * 4 + ["delta_net_step", "matmul"]
    step = layer0[4]
    roles = [t.role for t in step.inputs]
    assert roles == [None, "ssm_conv", None, None, "ssm_dt", "ssm_a", None, "ssm_norm"]
    products = {op.inputs[0].role: op.out for op in layer0[:4]}
    assert step.inputs[0] is products["ssm_qkv"] and step.inputs[6] is products["ssm_z"]
    assert step.inputs[2] is products["ssm_alpha"] and step.inputs[3] is products["ssm_beta"]
    assert (step.attrs["n_k_heads"], step.attrs["n_v_heads"], step.attrs["head_dim"]) == (2, 4, 16)
    assert (step.attrs["channels"], step.attrs["d_conv"]) == ((2 * 2 + 4) * 16, 4)
    assert step.attrs["eps"] == step.attrs["norm_eps"] == c.rms_eps
    assert layer0[5].inputs[0].role == "ssm_out" and layer0[5].inputs[1] is step.out
    assert "residual" in layer0[5].attrs
    assert not {"ssm_conv", "delta_net", "gated_norm"} & set(kinds(f))
    assert "ssm_conv" in kinds(g)                                   # original untouched
    attn = [op.kind for op in f.ops if op.layer == 3]
    assert "attention" in attn and "delta_net_step" not in attn
    # a device that cannot (or LLAMAVK_GDN_FUSE=0): the three ops stay
    assert fuse_one_token(g, lambda a, b: False, lambda w: False) is None
