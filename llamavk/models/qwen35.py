"""qwen35: Qwen3.5 / Qwen3.6 dense (0.8B ... 27B): Gated DeltaNet + gated attention layers, dense
SwiGLU FFN. See hybrid.py."""

from ..graph import Graph
from .base import ModelConfig, WeightSpec
from .hybrid import hybrid_config, hybrid_graph, hybrid_specs

ARCH = "qwen35"


def config(meta: dict) -> ModelConfig:
    return hybrid_config(meta, ARCH, moe=False)


def weight_specs(cfg: ModelConfig) -> list[WeightSpec]:
    return hybrid_specs(cfg)


def build_graph(cfg: ModelConfig, all_logits: bool = False) -> Graph:
    return hybrid_graph(cfg, all_logits)
