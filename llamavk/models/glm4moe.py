"""glm4moe: Zhipu's GLM-4.5 / GLM-4.5-Air / GLM-4.6 / GLM-4.7 (llama.cpp's glm4-moe graph at 0c1e570 is
the reference).

A mixture of experts with llama-like pre-norm blocks, and:
- biases on Q, K and V; per-head Q/K RMS norms where the file has them (GLM-4.5's 355B, not Air);
- NEOX RoPE on the first `rope.dimension_count` dims of each head (half of them in the released files);
- the FFN norm is named `post_attention_norm`;
- the first `leading_dense_block_count` layers have a dense SwiGLU FFN of `feed_forward_length`;
- the router (DeepSeek-V3's): sigmoid of each logit (`expert_gating_func` 2, or absent), the
  `expert_used_count` largest of probability + `exp_probs_b.bias` (a bias per expert, for the choice
  only) chosen, weighted by their probabilities, renormalized (`expert_weights_norm`) and scaled
  (`expert_weights_scale`);
- `expert_shared_count` shared experts of `expert_feed_forward_length` each (one SwiGLU FFN of the
  summed width), added without a gate;
- the last `nextn_predict_layers` blocks are multi-token-prediction layers: in the file, not run
  (llama.cpp runs none either). They are not loaded, and the KV cache has none of them.
"""

from __future__ import annotations

import dataclasses

from ..errors import LlamavkError
from ..graph import Graph
from .base import Meta, ModelConfig, WeightSpec, common_config, llama_like_specs, moe_config
from .forward import llama_like

ARCH = "glm4moe"
# llama.cpp's llama_expert_gating_func_type: 0 (absent) is sigmoid for this architecture
GATING = {0: "sigmoid", 1: "softmax", 2: "sigmoid"}


def config(meta: dict) -> ModelConfig:
    m = Meta(meta, ARCH)
    func = m.count("{arch}.expert_gating_func", 0, minimum=0)
    if func not in GATING:
        raise LlamavkError(f"{ARCH}.expert_gating_func = {func}: llamavk supports 1 (softmax) and 2 (sigmoid)")
    norm = m.get("{arch}.expert_weights_norm", False)
    if not isinstance(norm, bool):
        raise m._bad("{arch}.expert_weights_norm", norm, "a bool")
    moe = moe_config(meta, ARCH, gating=GATING[func], norm=norm)
    moe["n_ff_shexp"] = m.count("{arch}.expert_shared_count", minimum=0) * moe["n_ff_exp"]
    cfg = common_config(meta, ARCH, rope_neox=True, qkv_bias=True, qk_norm=False, moe=moe)
    nextn = m.count("{arch}.nextn_predict_layers", 0, minimum=0)
    if nextn >= cfg.n_layer:
        raise LlamavkError(f"{ARCH}: nextn_predict_layers {nextn} leaves none of the {cfg.n_layer} blocks to run")
    return dataclasses.replace(cfg, n_layer=cfg.n_layer - nextn, shexp_gated=False, expert_sel_bias=True,
                               n_layer_dense_lead=m.count("{arch}.leading_dense_block_count", 0, minimum=0))


def refine_config(cfg: ModelConfig, tensor_names) -> ModelConfig:
    """Per-head Q/K norms where the file has them (llama.cpp loads them when present)."""
    return dataclasses.replace(cfg, qk_norm="blk.0.attn_q_norm.weight" in set(tensor_names))


def weight_specs(cfg: ModelConfig) -> list[WeightSpec]:
    return [dataclasses.replace(s, name=f"blk.{s.layer}.post_attention_norm.weight") if s.role == "ffn_norm" else s
            for s in llama_like_specs(cfg)]


def nextn_specs(cfg: ModelConfig, n_nextn: int) -> list[WeightSpec]:
    """The tensors of the multi-token-prediction blocks after the cfg.n_layer run ones, as llama.cpp's
    converter writes them (a block like the others, and the NextN head's projection and norms): what
    a file has and llamavk does not load (synthetic files write them, so that llama.cpp loads them)."""
    specs = []
    for i in range(cfg.n_layer, cfg.n_layer + n_nextn):
        block = dataclasses.replace(cfg, n_layer=i + 1, n_layer_dense_lead=min(cfg.n_layer_dense_lead, i))
        b, E = f"blk.{i}.", cfg.n_embd
        specs += [dataclasses.replace(s, layer=None) for s in weight_specs(block) if s.layer == i]
        specs += [WeightSpec(b + "nextn.eh_proj.weight", "nextn", None, (E, 2 * E)),
                  WeightSpec(b + "nextn.enorm.weight", "nextn", None, (E,)),
                  WeightSpec(b + "nextn.hnorm.weight", "nextn", None, (E,)),
                  WeightSpec(b + "nextn.shared_head_norm.weight", "nextn", None, (E,))]
    return specs


def build_graph(cfg: ModelConfig, all_logits: bool = False) -> Graph:
    return llama_like(cfg, all_logits, ffn_norm="post_attention_norm")
