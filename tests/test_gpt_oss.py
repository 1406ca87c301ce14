"""gpt-oss: its kernels, its config, tiny synthetic models against the numpy reference.

Kernels: swiglu_oai (the clamps on both sides of the limit, large negative gates) and add_id (each
slot's expert bias, the ids read from route rows as the router writes them) against numpy; outputs
poisoned with NaN first. Attention sinks: tests/test_kernels_attention_sinks.py.

Models: tiny gpt-oss files (biases everywhere, attention sinks of 3 +- 2, windows of 24 positions on
the even layers, per-expert gate/up biases of std 4 so that swiglu_oai's limit clips) against
reference.ReferenceModel: prompts in several micro-batches, and greedy decoding past the windows.
llama.cpp's CPU scores: tests/test_llamacpp_oracle.py (ORACLE_CASES).
"""

from __future__ import annotations

import numpy as np
import pytest

import llamavk
from llamavk.kernels import KernelCache
from llamavk.kernels.elementwise import swiglu_oai
from llamavk.kernels.moe import add_id
from llamavk.models import config_from_metadata, load_model_file
from llamavk.models.gpt_oss import OAI_ALPHA, OAI_LIMIT, weight_specs
from llamavk.reference import ReferenceModel
from llamavk.reference import swiglu_oai as ref_swiglu_oai

from .test_engine import (assert_greedy_matches_reference, assert_prompt_logits_match_reference,
                          assert_split_mode_matches_none, one_token_logits)
from .test_models import assert_metadata_error
from .test_kernels_ops import poisoned, run, upload


@pytest.fixture(scope="module")
def kc(dev):
    return KernelCache(dev)


# -- kernels -------------------------------------------------------------------------------------

@pytest.mark.parametrize("n", [1, 1000, 70001])
def test_swiglu_oai(dev, kc, n):
    rng = np.random.default_rng(n)
    g = (rng.standard_normal(n) * 6).astype(np.float32)          # beyond the limit on both sides
    u = (rng.standard_normal(n) * 6).astype(np.float32)
    g[:min(n, 4)] = [-200.0, 200.0, 7.5, -7.5][:min(n, 4)]        # exp(-alpha g) past f32 range: no NaN
    want = ref_swiglu_oai(g.astype(np.float64), u.astype(np.float64), OAI_ALPHA, OAI_LIMIT)
    assert (np.abs(u) > OAI_LIMIT).sum() > n // 20 or n < 100     # the clamps are exercised
    out, mem = poisoned(dev, n)
    run(dev, lambda s: swiglu_oai(s, kc, upload(dev, g), upload(dev, u), out, n, OAI_ALPHA, OAI_LIMIT))
    np.testing.assert_allclose(mem, want, rtol=2e-5, atol=2e-6)
    out, mem = poisoned(dev, n)                                   # another alpha and limit
    run(dev, lambda s: swiglu_oai(s, kc, upload(dev, g), upload(dev, u), out, n, 1.0, 3.0))
    np.testing.assert_allclose(mem, ref_swiglu_oai(g.astype(np.float64), u.astype(np.float64), 1.0, 3.0),
                               rtol=2e-5, atol=2e-6)


@pytest.mark.parametrize("n_tokens,n_used,rows,n_expert", [(1, 4, 2880, 32), (5, 3, 96, 10), (40, 1, 7, 3)])
def test_add_id(dev, kc, n_tokens, n_used, rows, n_expert):
    rng = np.random.default_rng(rows)
    y = rng.standard_normal((n_tokens, n_used, rows)).astype(np.float32)
    bias = rng.standard_normal((n_expert, rows)).astype(np.float32)
    ids = np.stack([rng.permutation(n_expert)[:n_used] for _ in range(n_tokens)]).astype(np.uint32)
    route = np.concatenate([ids.view(np.float32), rng.random((n_tokens, n_used), dtype=np.float32)], axis=1)
    out, mem = poisoned(dev, y.size)
    run(dev, lambda s: add_id(s, kc, upload(dev, y), upload(dev, bias), upload(dev, route), out, n_tokens,
                              n_used, rows, n_expert))
    np.testing.assert_array_equal(mem.reshape(y.shape), y + bias[ids])


# -- config --------------------------------------------------------------------------------------

def gpt_oss_20b_meta(**kw) -> dict:
    """gpt-oss-20b's hyper-parameters as its GGUF gives them (no tokenizer: vocab_size instead)."""
    a = "gpt-oss"
    meta = {"general.architecture": a, f"{a}.vocab_size": 201088, f"{a}.context_length": 131072,
            f"{a}.embedding_length": 2880, f"{a}.block_count": 24, f"{a}.feed_forward_length": 2880,
            f"{a}.attention.head_count": 64, f"{a}.attention.head_count_kv": 8,
            f"{a}.attention.key_length": 64, f"{a}.attention.value_length": 64,
            f"{a}.attention.layer_norm_rms_epsilon": 1e-5, f"{a}.rope.freq_base": 150000.0,
            f"{a}.rope.scaling.type": "yarn", f"{a}.rope.scaling.factor": 32.0,
            f"{a}.rope.scaling.original_context_length": 4096, f"{a}.attention.sliding_window": 128,
            f"{a}.expert_count": 32, f"{a}.expert_used_count": 4, f"{a}.expert_feed_forward_length": 2880}
    meta.update(kw)
    return meta


def test_config_of_gpt_oss_20b():
    cfg = config_from_metadata(gpt_oss_20b_meta(), ["output.weight"])
    assert (cfg.n_embd, cfg.n_head, cfg.n_head_kv, cfg.head_dim, cfg.n_expert, cfg.n_expert_used, cfg.n_ff_exp) == \
        (2880, 64, 8, 64, 32, 4, 2880)
    assert cfg.rope_neox and cfg.qkv_bias and not cfg.qk_norm and cfg.expert_glu == "swiglu_oai"
    assert cfg.expert_gating == "softmax" and cfg.expert_norm       # the softmax over the chosen logits
    assert cfg.rope_scaling.type == "yarn" and cfg.rope_scaling.factor == 32.0 and cfg.rope_scaling.orig_ctx == 4096
    # even layers local (llama.cpp's pattern 2), with the model's RoPE; odd layers global
    assert [cfg.window(i) for i in range(4)] == [128, 0, 128, 0]
    assert not any(cfg.swa_rope(i) for i in range(cfg.n_layer))
    names = {s.name: s for s in weight_specs(cfg)}
    assert names["blk.3.post_attention_norm.weight"].role == "ffn_norm" and "blk.3.ffn_norm.weight" not in names
    assert names["blk.0.attn_sinks.weight"].shape == (64,)
    assert names["blk.0.ffn_gate_exps.bias"].shape == (32, 2880)
    assert names["blk.0.ffn_down_exps.bias"].shape == (32, 2880)
    assert names["blk.0.ffn_gate_inp.bias"].shape == (32,) and names["blk.0.attn_output.bias"].shape == (2880,)


@pytest.mark.parametrize("key,value,message", [
    ("gpt-oss.attention.sliding_window", None, "sliding_window is missing"),
    ("gpt-oss.attention.sliding_window", "128", "expected an integer"),
    ("gpt-oss.expert_used_count", 33, "expert_used_count 33 must be in 1..expert_count"),
])
def test_bad_gpt_oss_metadata_is_a_one_line_error(key, value, message):
    assert_metadata_error(gpt_oss_20b_meta(), key, value, message)


# -- tiny models against the numpy reference ------------------------------------------------------

def quiet(path, **kw):
    return llamavk.load(path, warn=lambda m: None, **kw)


@pytest.mark.parametrize("qtype", ["f16", "q8_0", "mxfp4", "q4_k"])
def test_logits_match_reference(synthetic_model, qtype):
    """A 40-token prompt in micro-batches of 16 (the 24-position windows reach into earlier
    micro-batches' KV rows): |dlogit| <= 0.003 max|logit|, as for the other architectures."""
    assert_prompt_logits_match_reference(synthetic_model("gpt-oss", qtype))


@pytest.mark.parametrize("qtype", ["q8_0", "mxfp4", "q4_k", "mxfp4_moe"])
def test_one_token_steps_fold_the_biases(synthetic_model, qtype):
    """One-token steps, 30 of them (past the 24-position windows), against the reference: there the
    router adds its bias itself, gate and up are one product with their biases and swiglu_oai in its
    epilogue, and the down product sums its slots with theirs (fusion.py) -- all of that checked here."""
    path = synthetic_model("gpt-oss", qtype)
    tokens = [int(t) for t in np.random.default_rng(11).integers(0, 500, 30)]
    ref = ReferenceModel(load_model_file(path)).logits(tokens)
    with quiet(path, n_ctx=64) as m:
        ops = [op for op in m.runtime.fused_one["last"].ops if op.layer == 1]
        kinds = [op.kind for op in ops]
        assert "add_id" not in kinds and "moe_route" not in kinds
        pair = next(op for op in ops if op.kind == "matmul_id" and "pair" in op.attrs)
        assert pair.attrs["oai"] == (OAI_ALPHA, OAI_LIMIT) and "pair_bias" in pair.attrs
        assert "swiglu_oai" not in kinds
        assert any(op.kind == "matmul_id" and op.attrs.get("sum") and "bias" in op.attrs for op in ops)
        got = one_token_logits(m.runtime, tokens)
    assert np.abs(got - ref).max() <= 0.003 * np.abs(ref).max()


@pytest.mark.parametrize("qtype", ["q8_0", "mxfp4"])
def test_greedy_decode_past_the_window(synthetic_model, qtype):
    """12 prompt tokens, then 40 one-token steps: the local layers' windows slide past the start."""
    assert_greedy_matches_reference(synthetic_model("gpt-oss", qtype), 40)


@pytest.mark.parametrize("mode", ["layer", "row", "tensor", "graph"])
def test_split_modes(synthetic_model, mode):
    """Every split mode gives -sm none's logits and greedy tokens: the sinks cut by heads, the output
    projection's and the down experts' biases added once to the partial sums, the gate / up experts'
    biases cut with the expert rows (tensor, graph)."""
    assert_split_mode_matches_none(synthetic_model("gpt-oss", "q8_0"), mode)
