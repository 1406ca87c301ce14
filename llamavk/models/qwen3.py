"""qwen3: Qwen3 dense. Llama layout, no biases, per-head RMS norm of Q and K (attn_q_norm /
attn_k_norm, shape (head_dim,)) applied before RoPE; NEOX RoPE; head_dim from
`qwen3.attention.key_length` (it need not equal n_embd / n_head)."""

from ..graph import Graph
from .base import ModelConfig, WeightSpec, common_config, llama_like_specs
from .forward import llama_like

ARCH = "qwen3"


def config(meta: dict) -> ModelConfig:
    return common_config(meta, ARCH, rope_neox=True, qkv_bias=False, qk_norm=True)


def weight_specs(cfg: ModelConfig) -> list[WeightSpec]:
    return llama_like_specs(cfg)


def build_graph(cfg: ModelConfig, all_logits: bool = False) -> Graph:
    return llama_like(cfg, all_logits)
