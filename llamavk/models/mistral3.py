"""mistral3: Ministral 3 and later Mistral text models. Llama's layers (normal RoPE, no biases), read
as llama.cpp's mistral3 graph reads them, plus two things of its own:

- YaRN's `rope.scaling.yarn_log_multiplier` (mscale_all_dim): cos and sin are multiplied by
  (1 + 0.1 ln f) / (1 + 0.1 m ln f) for factor f instead of (1 + 0.1 ln f) (llama.cpp's
  llama_context), so with m = 1 YaRN leaves their magnitude alone;
- Llama 4's attention temperature (`attention.temperature_scale` beta): q of position p multiplied by
  1 + beta ln(floor(p / L) + 1), L the original context (`rope.scaling.original_context_length`).
  That is exactly 1 below L; llamavk supports contexts up to L and refuses larger ones at load
  (ModelConfig.attn_temp_floor), rather than scaling q in every attention path.
"""

import dataclasses
import math

from ..errors import LlamavkError
from ..graph import Graph
from .base import Meta, ModelConfig, WeightSpec, common_config, llama_like_specs
from .forward import llama_like

ARCH = "mistral3"


def config(meta: dict) -> ModelConfig:
    m = Meta(meta, ARCH)
    if m.count("{arch}.expert_count", 0, minimum=0):
        raise LlamavkError(f"{ARCH}: a mixture of experts is not supported (dense models only)")
    cfg = common_config(meta, ARCH, rope_neox=False, qkv_bias=False, qk_norm=False)
    rs = cfg.rope_scaling
    log_mul = m.number("{arch}.rope.scaling.yarn_log_multiplier", 0.0)
    if rs is not None and rs.type == "yarn" and log_mul and rs.factor > 1.0:
        rs = dataclasses.replace(rs, attn_factor=rs.attn_factor / (1.0 + 0.1 * log_mul * math.log(rs.factor)))
    temp = m.number("{arch}.attention.temperature_scale", 0.0)
    floor = m.count("{arch}.rope.scaling.original_context_length", cfg.n_ctx_train) if temp else 0
    return dataclasses.replace(cfg, rope_scaling=rs, attn_temp_floor=floor)


def weight_specs(cfg: ModelConfig) -> list[WeightSpec]:
    return llama_like_specs(cfg)


def build_graph(cfg: ModelConfig, all_logits: bool = False) -> Graph:
    return llama_like(cfg, all_logits)
