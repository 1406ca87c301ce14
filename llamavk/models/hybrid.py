"""The Qwen3.5 / Qwen3.6 hybrids (qwen35, qwen35moe): hyper-parameters, tensors and forward graph.

Three of every four layers (as `{arch}.attention.recurrent_layers` or `full_attention_interval` say)
are Gated DeltaNet layers: linear attention with a recurrent state per sequence instead of a KV cache.
The others are gated full attention. Every layer is pre-norm (attn_norm before the mixer,
post_attention_norm before the FFN) with both residual adds, as in llama; the FFN is dense SwiGLU
(qwen35) or a mixture of experts with a gated shared expert (qwen35moe). Read from llama.cpp's
src/models/qwen35.cpp, qwen35moe.cpp and delta-net-base.cpp (commit 0c1e570), written here anew:

Gated attention (blocks.gated_attention): attn_q gives per head [q | gate] (2 x head_dim); q and k
get per-head RMS norms, then RoPE on the first rope_dim dims (NEOX pairs; llama.cpp's IMROPE, which
for text positions turns every pair as NEOX does when the rope sections cover them); causal GQA
attention; the output times sigmoid(gate), then attn_output.

Gated DeltaNet (blocks.gated_delta_net), per token, Hk key heads and Hv value heads of size D (value
head h reads key head h % Hk: llama.cpp's converter reorders the value heads into this tiled order):
    qkv = attn_qkv h;  z = attn_gate h;  b = ssm_beta h;  a = ssm_alpha h
    qkv = silu(causal_conv(qkv, ssm_conv1d))          d_conv taps over this and the previous tokens
    q, k, v = split(qkv);  q, k = q / sqrt(|q|^2 + eps), k / ...   (eps = rms_eps)
    decay = exp(softplus(a + ssm_dt.bias) * ssm_a);  beta = sigmoid(b)          per value head
    S = decay S;  S += k (beta (v - S^T k))^T;  o = S^T q / sqrt(D)              S: D x D per value head
    o = rms_norm_per_head(o) * ssm_norm * silu(z);  out = ssm_out o
"""

from __future__ import annotations

import dataclasses
from typing import Any

from ..errors import LlamavkError
from ..graph import Graph
from .base import MAX_COUNT, Meta, ModelConfig, WeightSpec, common_config, moe_config, moe_specs
from .blocks import gated_attention, gated_delta_net
from .forward import llama_like

# The DeltaNet kernels keep a head's state column in registers and its key in shared memory
# (shaders/gdn_*.comp): head sizes up to this many values.
MAX_SSM_HEAD = 256
MAX_CONV = 16


def hybrid_config(metadata: dict[str, Any], arch: str, moe: bool) -> ModelConfig:
    """ModelConfig of a qwen35 / qwen35moe file, read as llama.cpp's loader reads it."""
    m = Meta(metadata, arch)
    moe_fields = None
    if moe:
        moe_fields = moe_config(metadata, arch, gating="softmax", norm=True)
        # llama.cpp's qwen35moe does not read expert_weights_scale: the weights are never scaled
        moe_fields["expert_weights_scale"] = 1.0
        # llama.cpp's qwen35moe always has the shared expert: its width defaults to feed_forward_length
        if not moe_fields["n_ff_shexp"]:
            moe_fields["n_ff_shexp"] = m.count("{arch}.feed_forward_length", 0, minimum=0)
            if not moe_fields["n_ff_shexp"]:
                raise LlamavkError(f"GGUF metadata key {arch}.expert_shared_feed_forward_length is missing; "
                                   f"the file is not a complete {arch} model")
    cfg = common_config(metadata, arch, rope_neox=True, qkv_bias=False, qk_norm=True, moe=moe_fields)
    # the multi-token-prediction block(s) at the end of the file are not part of the forward pass
    n_all = cfg.n_layer
    nextn = m.count("{arch}.nextn_predict_layers", 0, minimum=0)
    if nextn >= n_all:
        raise LlamavkError(f"bad GGUF metadata: {arch}.nextn_predict_layers = {nextn} leaves no layers of "
                           f"{n_all}")
    n_layer = n_all - nextn
    value_length = m.count("{arch}.attention.value_length", cfg.head_dim)
    if value_length != cfg.head_dim:
        raise LlamavkError(f"{arch}: attention.value_length {value_length} differs from key_length "
                           f"{cfg.head_dim} (llama.cpp requires them equal)")
    recurrent = recurrent_layers(m, n_all, n_layer)
    d_state = m.count("{arch}.ssm.state_size")
    n_group = m.count("{arch}.ssm.group_count")
    dt_rank = m.count("{arch}.ssm.time_step_rank")
    d_inner = m.count("{arch}.ssm.inner_size")
    d_conv = m.count("{arch}.ssm.conv_kernel")
    if dt_rank % n_group:
        raise LlamavkError(f"{arch}: ssm.time_step_rank {dt_rank} (value heads) is not a multiple of "
                           f"ssm.group_count {n_group} (key heads)")
    if d_inner != dt_rank * d_state:
        raise LlamavkError(f"{arch}: ssm.inner_size {d_inner} is not ssm.time_step_rank x ssm.state_size "
                           f"({dt_rank} x {d_state}): value heads must be as large as key heads")
    if d_state > MAX_SSM_HEAD or d_state % 4 or d_conv > MAX_CONV:
        raise LlamavkError(f"{arch}: DeltaNet heads of {d_state} values and convolutions of {d_conv} taps: "
                           f"llamavk supports heads of a multiple of 4 up to {MAX_SSM_HEAD} values and up to "
                           f"{MAX_CONV} taps")
    if (2 * n_group + dt_rank) * d_state > MAX_COUNT:
        raise LlamavkError(f"bad GGUF metadata: {arch} DeltaNet of {n_group}/{dt_rank} heads of {d_state}")
    check_rope_sections(m, cfg.rope_dim)
    return dataclasses.replace(cfg, n_layer=n_layer, recurrent_layers=recurrent, ssm_d_conv=d_conv,
                               ssm_d_state=d_state, ssm_n_group=n_group, ssm_dt_rank=dt_rank,
                               ssm_d_inner=d_inner, attn_output_gate=True)


def recurrent_layers(m: Meta, n_all: int, n_layer: int) -> tuple[bool, ...]:
    """Which layers are DeltaNet layers: `{arch}.attention.recurrent_layers` (one bool per block), else
    every layer but each full_attention_interval-th (default 4: layers 3, 7, ... attend)."""
    flags = m.get("{arch}.attention.recurrent_layers")
    if flags is not None:
        if not isinstance(flags, list) or len(flags) != n_all or not all(isinstance(f, bool) for f in flags):
            raise m._bad("{arch}.attention.recurrent_layers", flags, f"{n_all} booleans, one per block")
        return tuple(flags[:n_layer])
    interval = m.count("{arch}.full_attention_interval", 4)
    return tuple((i + 1) % interval != 0 for i in range(n_layer))


def check_rope_sections(m: Meta, rope_dim: int) -> None:
    """`{arch}.rope.dimension_sections` (IMROPE's time/height/width/extra sections): text tokens have
    the same time, height and width position and extra position 0, so a pair turns as NEOX RoPE when
    its interleaved section is one of the first three, and not at all otherwise. llamavk turns every
    pair: sections that leave some unturned (no published model has them) are refused."""
    sections = m.get("{arch}.rope.dimension_sections")
    if sections is None:
        return
    if not isinstance(sections, list) or not 1 <= len(sections) <= 4 or \
            not all(isinstance(v, int) and not isinstance(v, bool) and 0 <= v <= MAX_COUNT for v in sections):
        raise m._bad("{arch}.rope.dimension_sections", sections, "up to 4 non-negative integers")
    s = (list(sections) + [0, 0, 0])[:4]
    total = sum(s)
    if total == 0:
        raise m._bad("{arch}.rope.dimension_sections", sections, "sections that are not all 0")
    for i in range(rope_dim // 2):
        sector = i % total
        turns = (sector % 3 == 0 and sector < 3 * s[0]) or (sector % 3 == 1 and sector < 3 * s[1]) or \
            (sector % 3 == 2 and sector < 3 * s[2])
        if not turns:
            raise LlamavkError(f"{m.arch}: rope.dimension_sections {sections} leave RoPE pair {i} of "
                               f"{rope_dim // 2} unturned for text: not supported")


def hybrid_specs(cfg: ModelConfig) -> list[WeightSpec]:
    """The tensors of a qwen35 / qwen35moe file as llama.cpp names them."""
    E, D, H = cfg.n_embd, cfg.head_dim, cfg.n_head
    Dk, Hk, Hv = cfg.ssm_d_state, cfg.ssm_n_group, cfg.ssm_dt_rank
    conv = 2 * Hk * Dk + Hv * Dk
    specs = [WeightSpec("token_embd.weight", "token_embd", None, (cfg.n_vocab, E)),
             WeightSpec("output_norm.weight", "output_norm", None, (E,))]
    if not cfg.tied_output:
        specs.append(WeightSpec("output.weight", "output", None, (cfg.n_vocab, E)))
    for i in range(cfg.n_layer):
        b = f"blk.{i}."
        specs += [WeightSpec(b + "attn_norm.weight", "attn_norm", i, (E,)),
                  WeightSpec(b + "post_attention_norm.weight", "ffn_norm", i, (E,))]
        if cfg.is_recurrent(i):
            if cfg.ssm_fused_in:
                specs.append(WeightSpec(b + "ssm_in.weight", "ssm_in", i, (conv + Hv * Dk, E)))
            else:
                specs += [WeightSpec(b + "attn_qkv.weight", "ssm_qkv", i, (conv, E)),
                          WeightSpec(b + "attn_gate.weight", "ssm_z", i, (Hv * Dk, E))]
            if cfg.ssm_fused_ba:
                specs.append(WeightSpec(b + "ssm_ba.weight", "ssm_ba", i, (2 * Hv, E)))
            else:
                specs += [WeightSpec(b + "ssm_beta.weight", "ssm_beta", i, (Hv, E)),
                          WeightSpec(b + "ssm_alpha.weight", "ssm_alpha", i, (Hv, E))]
            specs += [
                WeightSpec(b + "ssm_conv1d.weight", "ssm_conv", i, (conv, cfg.ssm_d_conv)),
                WeightSpec(b + "ssm_dt.bias", "ssm_dt", i, (Hv,)),
                WeightSpec(b + "ssm_a", "ssm_a", i, (Hv,)),
                WeightSpec(b + "ssm_norm.weight", "ssm_norm", i, (Dk,)),
                WeightSpec(b + "ssm_out.weight", "ssm_out", i, (E, Hv * Dk)),
            ]
        else:
            specs += [
                WeightSpec(b + "attn_q.weight", "q", i, (H * 2 * D, E)),       # [q | gate] per head
                WeightSpec(b + "attn_k.weight", "k", i, (cfg.n_head_kv * D, E)),
                WeightSpec(b + "attn_v.weight", "v", i, (cfg.n_head_kv * D, E)),
                WeightSpec(b + "attn_output.weight", "o", i, (E, H * D)),
                WeightSpec(b + "attn_q_norm.weight", "q_norm", i, (D,)),
                WeightSpec(b + "attn_k_norm.weight", "k_norm", i, (D,)),
            ]
        specs += moe_specs(cfg, i) if cfg.n_expert else [
            WeightSpec(b + "ffn_gate.weight", "gate", i, (cfg.n_ff, E)),
            WeightSpec(b + "ffn_up.weight", "up", i, (cfg.n_ff, E)),
            WeightSpec(b + "ffn_down.weight", "down", i, (E, cfg.n_ff)),
        ]
    return specs


def hybrid_graph(cfg: ModelConfig, all_logits: bool = False) -> Graph:
    """The llama-like forward pass with each layer's mixer a Gated DeltaNet or gated attention; the
    FFN norm is stored as post_attention_norm."""
    def mixer(g, cfg, i, h):
        return (gated_delta_net if cfg.is_recurrent(i) else gated_attention)(g, cfg, i, h)

    return llama_like(cfg, all_logits, mixer=mixer, ffn_norm="post_attention_norm")
