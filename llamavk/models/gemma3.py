"""gemma3: Gemma 3 (270M-27B), text only.

Differences from llama (llama.cpp's gemma3 graph at 0c1e570 is the reference):
- the token embedding is multiplied by sqrt(n_embd) (the output matrix is the embedding, unscaled,
  when the file has no output.weight);
- sandwich norms: RMS norms before and after attention and the FFN (`post_attention_norm`,
  `post_ffw_norm`), each block's normed output added to the residual stream;
- the FFN is GeGLU: down(gelu_tanh(gate h) * up h);
- per-head RMS norm of Q and K before NEOX RoPE (as qwen3), head_dim from `attention.key_length`;
- sliding-window layers: with `gemma3.attention.sliding_window` = W > 0, layer i is local unless the
  pattern says global: `attention.sliding_window_pattern` (an integer n, default 6: every n-th layer,
  i % n == n - 1, is global; 0: all local) or a per-layer array of booleans. Local layers see the
  last W positions (their own included) and turn RoPE by `rope.freq_base_swa` (default 10000) without
  the model's RoPE scaling; global layers see everything, with `rope.freq_base` and its scaling;
- q is scaled by 1/sqrt(`attention.query_pre_attn_scalar`) where the file gives it (converters do
  not write it; llama.cpp does not read it), else as llama.cpp does: 1/sqrt(n_embd / n_head) for the
  62-layer 27B, 1/sqrt(head_dim) for the others (the two rules agree on every released Gemma 3);
- `final_logit_softcapping` c > 0 (where present): logits = c * tanh(logits / c).
The RMS norm weights are used as stored: the converter has already added Gemma's +1.
"""

from __future__ import annotations

import dataclasses
import math

from ..errors import LlamavkError
from ..graph import Graph
from .base import Meta, ModelConfig, WeightSpec, common_config, llama_like_specs
from .blocks import attention, swiglu_ffn, vec

ARCH = "gemma3"
DEFAULT_SWA_PATTERN = 6      # llama.cpp's rule for gemma3: 5 local layers, then a global one


def config(meta: dict) -> ModelConfig:
    cfg = common_config(meta, ARCH, rope_neox=True, qkv_bias=False, qk_norm=True)
    m = Meta(meta, ARCH)
    window = m.count("{arch}.attention.sliding_window", 0, minimum=0)
    swa_layers: tuple[bool, ...] = ()
    if window:
        swa_layers = _swa_layers(m, cfg.n_layer)
    pre_attn = m.number("{arch}.attention.query_pre_attn_scalar", None, positive=True)
    if pre_attn is not None:
        scale = 1.0 / math.sqrt(pre_attn)
    elif cfg.n_layer == 62:                          # llama.cpp: Gemma 3 27B
        scale = 1.0 / math.sqrt(cfg.n_embd // cfg.n_head)
    else:
        scale = 1.0 / math.sqrt(cfg.head_dim)
    return dataclasses.replace(
        cfg, sliding_window=window, swa_layers=swa_layers,
        rope_base_swa=m.number("{arch}.rope.freq_base_swa", 10000.0, positive=True),
        attn_scale=scale, final_logit_softcap=m.number("{arch}.final_logit_softcapping", 0.0))


def _swa_layers(m: Meta, n_layer: int) -> tuple[bool, ...]:
    key = "{arch}.attention.sliding_window_pattern"
    value = m.get(key, DEFAULT_SWA_PATTERN)
    if isinstance(value, list):
        if len(value) != n_layer or not all(isinstance(v, (bool, int)) for v in value):
            raise m._bad(key, value, f"one boolean per layer ({n_layer})")
        return tuple(bool(v) for v in value)
    n = m.count(key, DEFAULT_SWA_PATTERN, minimum=0)
    return tuple(n == 0 or i % n < n - 1 for i in range(n_layer))


def weight_specs(cfg: ModelConfig) -> list[WeightSpec]:
    if cfg.n_expert:
        raise LlamavkError(f"{ARCH} has no mixture-of-experts form")
    specs = llama_like_specs(cfg)
    for i in range(cfg.n_layer):
        specs += [WeightSpec(f"blk.{i}.post_attention_norm.weight", "attn_post_norm", i, (cfg.n_embd,)),
                  WeightSpec(f"blk.{i}.post_ffw_norm.weight", "ffn_post_norm", i, (cfg.n_embd,))]
    return specs


def build_graph(cfg: ModelConfig, all_logits: bool = False) -> Graph:
    g = Graph(cfg)
    E, V, eps = cfg.n_embd, cfg.n_vocab, cfg.rms_eps
    x = g.scale(g.embed(g.weight("token_embd.weight", V, E, "token_embd")), math.sqrt(E))
    for i in range(cfg.n_layer):
        g.layer = i
        b = f"blk.{i}."
        h = g.rms_norm(x, vec(g, b + "attn_norm.weight", E, "attn_norm", i), eps)
        a = attention(g, cfg, i, h, window=cfg.window(i), scale=cfg.attn_scale)
        x = g.add(x, g.rms_norm(a, vec(g, b + "post_attention_norm.weight", E, "attn_post_norm", i), eps))
        h = g.rms_norm(x, vec(g, b + "ffn_norm.weight", E, "ffn_norm", i), eps)
        f = swiglu_ffn(g, cfg, i, h, glu="geglu")
        x = g.add(x, g.rms_norm(f, vec(g, b + "post_ffw_norm.weight", E, "ffn_post_norm", i), eps))
    g.layer = None
    if not all_logits:
        x = g.last_row(x)
    x = g.rms_norm(x, vec(g, "output_norm.weight", E, "output_norm"), eps)
    out_name, role = ("token_embd.weight", "token_embd") if cfg.tied_output else ("output.weight", "output")
    logits = g.matmul(g.weight(out_name, V, E, role), x)
    if cfg.final_logit_softcap:
        logits = g.softcap(logits, cfg.final_logit_softcap)
    g.output(logits)
    return g
