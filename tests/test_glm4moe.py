"""glm4moe (GLM-4.5 / 4.6 / 4.7): its config, tiny synthetic models against the numpy reference.

Tiny glm4moe files (tests/conftest.py synthetic_model): a dense first layer, two layers of 10 experts
(3 used) with a shared expert, a sigmoid router whose pick reads probability + a bias of std 0.3 per
expert, renormalized and scaled by 2.5, RoPE on half of each head, Q/K/V biases, and a NextN block in
the file that is not run. Against reference.ReferenceModel: prompts in micro-batches, one-token steps,
greedy decoding, every split mode. The pick's kernels: tests/test_moe.py and tests/test_router_fold.py
(selection bias cases); llama.cpp's CPU scores: tests/test_llamacpp_oracle.py (ORACLE_CASES).
"""

from __future__ import annotations

import numpy as np
import pytest

from llamavk.models import config_from_metadata, load_model_file
from llamavk.models.glm4moe import weight_specs
from llamavk.reference import ReferenceModel

from .test_engine import (assert_greedy_matches_reference, assert_prompt_logits_match_reference,
                          assert_split_mode_matches_none, one_token_logits, quiet_load)
from .test_models import assert_metadata_error


def glm45_air_meta(**kw) -> dict:
    """GLM-4.5-Air's hyper-parameters as its GGUF gives them (no tokenizer: vocab_size instead)."""
    a = "glm4moe"
    meta = {"general.architecture": a, f"{a}.vocab_size": 151552, f"{a}.context_length": 131072,
            f"{a}.embedding_length": 4096, f"{a}.block_count": 47, f"{a}.feed_forward_length": 10944,
            f"{a}.attention.head_count": 96, f"{a}.attention.head_count_kv": 8,
            f"{a}.attention.key_length": 128, f"{a}.attention.value_length": 128,
            f"{a}.attention.layer_norm_rms_epsilon": 1e-5, f"{a}.rope.freq_base": 1e6,
            f"{a}.rope.dimension_count": 64, f"{a}.expert_count": 128, f"{a}.expert_used_count": 8,
            f"{a}.expert_feed_forward_length": 1408, f"{a}.expert_shared_count": 1,
            f"{a}.leading_dense_block_count": 1, f"{a}.expert_weights_scale": 1.0, f"{a}.expert_weights_norm": True,
            f"{a}.expert_gating_func": 2, f"{a}.nextn_predict_layers": 1}
    meta.update(kw)
    return meta


def test_config_of_glm45_air():
    cfg = config_from_metadata(glm45_air_meta(), ["output.weight"])
    assert cfg.n_layer == 46                       # the 47th block is the NextN one: not run
    assert (cfg.n_embd, cfg.n_head, cfg.n_head_kv, cfg.head_dim, cfg.rope_dim) == (4096, 96, 8, 128, 64)
    assert (cfg.n_expert, cfg.n_expert_used, cfg.n_ff_exp, cfg.n_ff_shexp, cfg.n_ff) == (128, 8, 1408, 1408, 10944)
    assert cfg.expert_gating == "sigmoid" and cfg.expert_norm and cfg.expert_sel_bias and not cfg.shexp_gated
    assert cfg.rope_neox and cfg.qkv_bias and not cfg.qk_norm
    assert [cfg.is_moe(i) for i in range(3)] == [False, True, True]
    names = {s.name: s for s in weight_specs(cfg)}
    assert names["blk.0.ffn_gate.weight"].shape == (10944, 4096) and "blk.0.ffn_gate_inp.weight" not in names
    assert names["blk.1.exp_probs_b.bias"].shape == (128,) and names["blk.1.ffn_up_shexp.weight"].shape == (1408, 4096)
    assert "blk.1.ffn_gate_inp_shexp.weight" not in names          # the shared expert has no gate
    assert names["blk.5.post_attention_norm.weight"].role == "ffn_norm" and "blk.5.ffn_norm.weight" not in names
    assert not any(n.startswith("blk.46.") for n in names)
    # GLM-4.5 (355B) has per-head Q/K norms: picked by the tensors present; gating 0 (absent) is sigmoid
    big = config_from_metadata(glm45_air_meta(**{"glm4moe.expert_gating_func": 0, "glm4moe.expert_weights_scale": 2.5}),
                               ["output.weight", "blk.0.attn_q_norm.weight"])
    assert big.qk_norm and big.expert_gating == "sigmoid" and big.expert_weights_scale == 2.5


@pytest.mark.parametrize("key,value,message", [
    ("glm4moe.expert_gating_func", 3, "expert_gating_func = 3"),
    ("glm4moe.nextn_predict_layers", 47, "leaves none of the 47 blocks"),
    ("glm4moe.leading_dense_block_count", 47, "47 leading dense layers of 46"),
    ("glm4moe.expert_weights_norm", "yes", "expected a bool"),
    ("glm4moe.expert_shared_count", None, "expert_shared_count is missing"),
    ("glm4moe.feed_forward_length", None, "leading dense layers of 46, feed_forward_length 0"),
])
def test_bad_glm4moe_metadata_is_a_one_line_error(key, value, message):
    assert_metadata_error(glm45_air_meta(), key, value, message)


# -- tiny models against the numpy reference ------------------------------------------------------


@pytest.mark.parametrize("qtype,qk_norm", [("f16", False), ("q8_0", False), ("q4_0", False), ("q4_k", False),
                                           ("q8_0", True)])
def test_logits_match_reference(synthetic_model, qtype, qk_norm):
    """A 40-token prompt in micro-batches of 16: |dlogit| <= 0.003 max|logit|; with per-head Q/K norms
    (GLM-4.5's 355B) too."""
    path = synthetic_model("glm4moe", qtype, **({"qk_norm": True} if qk_norm else {}))
    cfg = load_model_file(path).config
    assert cfg.n_layer == 3 and cfg.qk_norm == qk_norm      # 4 blocks in the file, the NextN one not run
    assert_prompt_logits_match_reference(path)


@pytest.mark.parametrize("qtype", ["q8_0", "q4_k"])
def test_one_token_steps(synthetic_model, qtype):
    """30 one-token steps against the reference: the router picks with the selection bias itself
    (its route attrs carry it into the router's kernel: moe_router.comp SELB, or the product writing
    its input, matvec_stream.comp RSELB)."""
    path = synthetic_model("glm4moe", qtype)
    tokens = [int(t) for t in np.random.default_rng(11).integers(0, 500, 30)]
    ref = ReferenceModel(load_model_file(path)).logits(tokens)
    with quiet_load(path, n_ctx=64) as m:
        ops = [op for op in m.runtime.fused_one["last"].ops if op.layer == 1]
        assert "moe_route" not in [op.kind for op in ops]
        routes = [op.attrs.get("route") or op.attrs["router"]["route"] for op in ops
                  if "route" in op.attrs or "router" in op.attrs]
        assert len(routes) == 1 and "sel_bias" in routes[0]
        got = one_token_logits(m.runtime, tokens)
    assert np.abs(got - ref).max() <= 0.003 * np.abs(ref).max()


def test_greedy_decode(synthetic_model):
    assert_greedy_matches_reference(synthetic_model("glm4moe", "q8_0"), 30)


@pytest.mark.parametrize("mode", ["layer", "row", "tensor", "graph"])
def test_split_modes(synthetic_model, mode):
    """Every split mode gives -sm none's logits and greedy tokens: the dense layer and the shared
    expert cut like a dense FFN, the selection bias read whole by each device's router."""
    assert_split_mode_matches_none(synthetic_model("glm4moe", "q8_0"), mode)
