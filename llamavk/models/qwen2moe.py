"""qwen2moe: Qwen1.5-MoE-A2.7B, Qwen2-57B-A14B. Qwen2's attention (Q/K/V biases, NEOX RoPE); every
FFN a mixture of `expert_count` SwiGLU experts, `expert_used_count` per token, chosen by a softmax
router whose top-k weights are used as they are (llama.cpp's build_moe_ffn without norm_w for this
architecture), plus a shared expert gated by sigmoid(ffn_gate_inp_shexp . h). Widths as llama.cpp
reads them: an expert's `expert_feed_forward_length` (else feed_forward_length / expert_used_count),
the shared expert's `expert_shared_feed_forward_length` (else feed_forward_length)."""

import dataclasses

from ..graph import Graph
from .base import Meta, ModelConfig, WeightSpec, check_config, common_config, llama_like_specs, moe_config
from .forward import llama_like

ARCH = "qwen2moe"


def config(meta: dict) -> ModelConfig:
    cfg = common_config(meta, ARCH, rope_neox=True, qkv_bias=True, qk_norm=False,
                        moe=moe_config(meta, ARCH, gating="softmax", norm=False))
    m = Meta(meta, ARCH)
    n_ff = cfg.n_ff or 0
    n_ff_exp = m.count("{arch}.expert_feed_forward_length", 0, minimum=0) or n_ff // cfg.n_expert_used
    return check_config(dataclasses.replace(cfg, n_ff_exp=n_ff_exp, n_ff_shexp=cfg.n_ff_shexp or n_ff))


def weight_specs(cfg: ModelConfig) -> list[WeightSpec]:
    return llama_like_specs(cfg)


def build_graph(cfg: ModelConfig, all_logits: bool = False) -> Graph:
    return llama_like(cfg, all_logits)
