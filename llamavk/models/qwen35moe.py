"""qwen35moe: Qwen3.5 / Qwen3.6 mixture of experts (35B-A3B, 122B-A10B): the qwen35 layers (see
hybrid.py) with a mixture-of-experts FFN: softmax router, the top `expert_used_count` weights
renormalized to sum 1 (llama.cpp's build_moe_ffn with norm_w for this architecture), plus a shared
expert of `expert_shared_feed_forward_length` gated by sigmoid(ffn_gate_inp_shexp . h)."""

from ..graph import Graph
from .base import ModelConfig, WeightSpec
from .hybrid import hybrid_config, hybrid_graph, hybrid_specs

ARCH = "qwen35moe"


def config(meta: dict) -> ModelConfig:
    return hybrid_config(meta, ARCH, moe=True)


def weight_specs(cfg: ModelConfig) -> list[WeightSpec]:
    return hybrid_specs(cfg)


def build_graph(cfg: ModelConfig, all_logits: bool = False) -> Graph:
    return hybrid_graph(cfg, all_logits)
