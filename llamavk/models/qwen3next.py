"""qwen3next: Qwen3-Next (80B-A3B), the Gated DeltaNet hybrid before Qwen3.5 (see hybrid.py): the
qwen35moe layers with three differences, read from llama.cpp's src/models/qwen3next.cpp (0c1e570):

- a value head's key head: the value heads of one key head lie side by side (h reads h // (Hv / Hk);
  llama.cpp repeats each key head in place), not tiled as Qwen3.5's converter orders them;
- beta and alpha come from one product, `ssm_ba`, per key head [beta of its r value heads | alpha of
  them] (r = Hv / Hk);
- q, k, v and the output gate z come from `ssm_in`, per key head [q | k | v of its value heads | z of
  them] (the layout most published files have), or from `attn_qkv` and `attn_gate` as in qwen35.
The fused matrices are not rearranged: each product reads its rows of them (blocks.fused_rows,
graph.Tensor.gathered). RoPE is plain NEOX on rope.dimension_count dims (no IMROPE sections); every
layer has the routed experts and the sigmoid-gated shared expert."""

import dataclasses

from ..graph import Graph
from .base import ModelConfig, WeightSpec
from .hybrid import hybrid_config, hybrid_graph, hybrid_specs

ARCH = "qwen3next"


def config(meta: dict) -> ModelConfig:
    cfg = hybrid_config(meta, ARCH, moe=True)
    return dataclasses.replace(cfg, ssm_grouped=True, ssm_fused_ba=True)


def refine_config(cfg: ModelConfig, tensor_names) -> ModelConfig:
    """Whether the file keeps q|k|v|z fused in ssm_in (llama.cpp loads either layout)."""
    names = set(tensor_names)
    fused = any(f"blk.{i}.ssm_in.weight" in names for i in range(cfg.n_layer) if cfg.is_recurrent(i))
    return dataclasses.replace(cfg, ssm_fused_in=fused)


def weight_specs(cfg: ModelConfig) -> list[WeightSpec]:
    return hybrid_specs(cfg)


def build_graph(cfg: ModelConfig, all_logits: bool = False) -> Graph:
    return hybrid_graph(cfg, all_logits)
