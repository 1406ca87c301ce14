"""qwen3moe: Qwen3 mixture of experts (Qwen3-30B-A3B, Qwen3-235B-A22B). Qwen3's attention (per-head
Q/K RMS norm before NEOX RoPE, head_dim from `qwen3moe.attention.key_length`); every layer's FFN is a
mixture of `expert_count` SwiGLU experts of `expert_feed_forward_length`, `expert_used_count` per
token, chosen by a softmax router whose top-k weights are renormalized to sum 1 (llama.cpp's
build_moe_ffn with norm_w for this architecture). No shared expert."""

from ..graph import Graph
from .base import ModelConfig, WeightSpec, common_config, llama_like_specs, moe_config
from .forward import llama_like

ARCH = "qwen3moe"


def config(meta: dict) -> ModelConfig:
    return common_config(meta, ARCH, rope_neox=True, qkv_bias=False, qk_norm=True,
                         moe=moe_config(meta, ARCH, gating="softmax", norm=True))


def weight_specs(cfg: ModelConfig) -> list[WeightSpec]:
    return llama_like_specs(cfg)


def build_graph(cfg: ModelConfig, all_logits: bool = False) -> Graph:
    return llama_like(cfg, all_logits)
