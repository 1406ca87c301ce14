"""qwen2: Qwen2 / Qwen2.5. Llama layout plus Q/K/V biases; NEOX RoPE (pairs (i, i + rope_dim/2))."""

from ..graph import Graph
from .base import ModelConfig, WeightSpec, common_config, llama_like_specs
from .forward import llama_like

ARCH = "qwen2"


def config(meta: dict) -> ModelConfig:
    return common_config(meta, ARCH, rope_neox=True, qkv_bias=True, qk_norm=False)


def weight_specs(cfg: ModelConfig) -> list[WeightSpec]:
    return llama_like_specs(cfg)


def build_graph(cfg: ModelConfig, all_logits: bool = False) -> Graph:
    return llama_like(cfg, all_logits)
