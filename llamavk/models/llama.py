"""llama: Llama 2/3, Mistral, SmolLM2, TinyLlama.

Normal RoPE (adjacent pairs (2i, 2i+1)): HF->GGUF conversion permutes the rows of attn_q/attn_k so
that this ordering is right; the weights are used as stored. Optional `rope_freqs.weight` carries
Llama-3.1 frequency scaling.
"""

from ..graph import Graph
from .base import ModelConfig, WeightSpec, common_config, llama_like_specs
from .forward import llama_like

ARCH = "llama"


def config(meta: dict) -> ModelConfig:
    return common_config(meta, ARCH, rope_neox=False, qkv_bias=False, qk_norm=False)


def weight_specs(cfg: ModelConfig) -> list[WeightSpec]:
    return llama_like_specs(cfg)


def build_graph(cfg: ModelConfig, all_logits: bool = False) -> Graph:
    return llama_like(cfg, all_logits)
