"""gpt-oss: OpenAI's gpt-oss-20b / gpt-oss-120b (llama.cpp's openai-moe graph at 0c1e570 is the reference).

A mixture of experts with llama-like pre-norm blocks, and:
- biases on Q, K, V and the output projection;
- per query head an attention sink (`attn_sinks.weight`): one more logit in the head's softmax,
  not scaled, whose value is 0 -- a head can attend to nothing;
- sliding-window attention on the even layers (llama.cpp's pattern 2), `attention.sliding_window`
  positions, with the model's RoPE (NEOX, YaRN in the released files) on every layer;
- the FFN norm is named `post_attention_norm`;
- the router has a bias and picks the `expert_used_count` largest logits; their weights are the
  softmax over those logits alone (llama.cpp's SOFTMAX_WEIGHT gating: the renormalized softmax);
- every expert's gate, up and down products have a bias per expert, and the unit is
  swiglu_oai(g, u) = g' sigmoid(1.702 g') (u' + 1), g' = min(g, 7), u' = clamp(u, -7, 7).
"""

from __future__ import annotations

import dataclasses

from ..graph import Graph
from .base import Meta, ModelConfig, WeightSpec, common_config, llama_like_specs, moe_config
from .blocks import attention, moe_ffn, vec

ARCH = "gpt-oss"
OAI_ALPHA, OAI_LIMIT = 1.702, 7.0      # ggml_swiglu_oai's constants in llama.cpp's graph
SWA_PATTERN = 2                        # layer i is local when i % 2 == 0


def config(meta: dict) -> ModelConfig:
    cfg = common_config(meta, ARCH, rope_neox=True, qkv_bias=True, qk_norm=False,
                        moe=moe_config(meta, ARCH, gating="softmax", norm=True))
    # required, as llama.cpp requires it: without it the even layers would silently attend to everything
    window = Meta(meta, ARCH).count("{arch}.attention.sliding_window", minimum=0)
    swa = tuple(i % SWA_PATTERN < SWA_PATTERN - 1 for i in range(cfg.n_layer)) if window else ()
    return dataclasses.replace(cfg, sliding_window=window, swa_layers=swa, swa_rope_own=False,
                               expert_glu="swiglu_oai")


def weight_specs(cfg: ModelConfig) -> list[WeightSpec]:
    E, X, F = cfg.n_embd, cfg.n_expert, cfg.n_ff_exp
    specs = []
    for s in llama_like_specs(cfg):
        if s.role == "ffn_norm":
            s = dataclasses.replace(s, name=f"blk.{s.layer}.post_attention_norm.weight")
        specs.append(s)
    for i in range(cfg.n_layer):
        b = f"blk.{i}."
        specs += [WeightSpec(b + "attn_output.bias", "o_bias", i, (E,)),
                  WeightSpec(b + "attn_sinks.weight", "attn_sinks", i, (cfg.n_head,)),
                  WeightSpec(b + "ffn_gate_inp.bias", "router_bias", i, (X,)),
                  WeightSpec(b + "ffn_gate_exps.bias", "gate_exps_bias", i, (X, F)),
                  WeightSpec(b + "ffn_up_exps.bias", "up_exps_bias", i, (X, F)),
                  WeightSpec(b + "ffn_down_exps.bias", "down_exps_bias", i, (X, E))]
    return specs


def build_graph(cfg: ModelConfig, all_logits: bool = False) -> Graph:
    g = Graph(cfg)
    E, V, eps = cfg.n_embd, cfg.n_vocab, cfg.rms_eps
    x = g.embed(g.weight("token_embd.weight", V, E, "token_embd"))
    for i in range(cfg.n_layer):
        g.layer = i
        b = f"blk.{i}."
        h = g.rms_norm(x, vec(g, b + "attn_norm.weight", E, "attn_norm", i), eps)
        x = g.add(x, attention(g, cfg, i, h, window=cfg.window(i), sinks=True, o_bias=True))
        h = g.rms_norm(x, vec(g, b + "post_attention_norm.weight", E, "ffn_norm", i), eps)
        x = g.add(x, moe_ffn(g, cfg, i, h, biases=True, alpha=OAI_ALPHA, limit=OAI_LIMIT))
    g.layer = None
    if not all_logits:
        x = g.last_row(x)
    x = g.rms_norm(x, vec(g, "output_norm.weight", E, "output_norm"), eps)
    out_name, role = ("token_embd.weight", "token_embd") if cfg.tied_output else ("output.weight", "output")
    g.output(g.matmul(g.weight(out_name, V, E, role), x))
    return g
