"""Numpy reference forward pass: the oracle the Vulkan engine is tested against.

Written to be read top to bottom, not to be fast (llama2.c style). Weights are dequantized to float32
with gguf.quants.dequantize (once, then cached); all math is float32, the KV cache too (llama.cpp keeps
it in f16 by default, which moves logits by a few hundredths). With a quantized cache type
(Reference(..., type_k="q8_0") etc.) each K / V row goes through gguf.quants' quantization and back
as it enters the cache: what the engine's attention reads.

One transformer block, for every supported architecture:

    h = rms_norm(x) * attn_norm
    q, k, v = Wq h (+ bq), Wk h (+ bk), Wv h (+ bv)        biases: qwen2
    q, k = rms_norm_per_head(q) * q_norm, ... * k_norm      QK norm: qwen3
    q, k = rope(q, pos), rope(k, pos)                       pairs (2i,2i+1) llama; (i,i+d/2) qwen
    a = softmax(q k^T / sqrt(head_dim), causal) v           GQA: n_head/n_head_kv queries per KV head
    x = x + Wo a
    h = rms_norm(x) * ffn_norm
    x = x + Wdown (silu(Wgate h) * Wup h)                   dense FFN, or a mixture of experts:
    p = softmax(Wrouter h)  (sigmoid: sigmoid gating)       over the n_expert experts
    E = the n_expert_used largest p; w = p[E] (/ sum p[E] where expert_norm) * expert_weights_scale
    x = x + sum_{e in E} w_e Wdown_e (silu(Wgate_e h) * Wup_e h)
          (+ sigmoid(w_shexp . h) * shared expert's SwiGLU FFN of h, where the model has one)

glm4moe: the first n_layer_dense_lead layers keep the dense FFN; E = the n_expert_used largest
p + b (b: a bias per expert, for the choice only), w from p as above; the shared expert is not gated.
logits = Wout rms_norm(x) * output_norm                     Wout = token_embd when tied

The qwen35 hybrids (models/hybrid.py has the math) replace attention in their Gated DeltaNet layers
by `delta_net` (causal convolution and the gated delta rule, token by token, over a per-layer conv
state and recurrent state), and gate their attention output with sigmoid of the Q product's second
half; RoPE turns the first rope_dim dims of each head (partial rotary).

gemma3 differs: x = token_embd[tokens] * sqrt(n_embd); each block's output is RMS-normed (its
post-norm weight) before the residual add; the FFN is Wdown (gelu_tanh(Wgate h) * Wup h); q.k is
scaled by cfg.attn_scale; sliding-window layers (cfg.is_swa) see only the last cfg.sliding_window
positions and turn RoPE by cfg.rope_base_swa without scaling; logits = c tanh(logits / c) where
cfg.final_logit_softcap = c > 0.

gpt-oss differs: biases on Q/K/V, the output projection, the router and every expert's three
products (per expert); each query head's softmax has one more logit, its attention sink, with value
0; the experts' unit is swiglu_oai(g, u) = g' sigmoid(alpha g') (u' + 1), g' = min(g, limit),
u' = clamp(u, -limit, limit); the router's weights are the softmax over the chosen experts' logits
(the renormalized softmax); its even layers attend over a sliding window, with the model's RoPE.
"""

from __future__ import annotations

import dataclasses
import math

import numpy as np

from .errors import LlamavkError
from .models.base import ModelConfig, ModelFile
from .models.blocks import fused_rows
from .models.gpt_oss import OAI_ALPHA, OAI_LIMIT


def rms_norm(x: np.ndarray, weight: np.ndarray, eps: float) -> np.ndarray:
    """x / sqrt(mean(x^2) + eps) * weight, over the last axis."""
    mean_sq = np.mean(x.astype(np.float64) ** 2, axis=-1, keepdims=True)
    return (x / np.sqrt(mean_sq + eps)).astype(np.float32) * weight


def silu(x: np.ndarray) -> np.ndarray:
    with np.errstate(over="ignore"):   # exp(-x) -> inf for x << 0: x / inf = -0, the limit
        return x / (1.0 + np.exp(-x))


def gelu_tanh(x: np.ndarray) -> np.ndarray:
    """GELU, tanh approximation: 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))."""
    x64 = x.astype(np.float64)
    return (0.5 * x64 * (1.0 + np.tanh(math.sqrt(2.0 / math.pi) * (x64 + 0.044715 * x64 ** 3)))).astype(np.float32)


def swiglu_oai(g: np.ndarray, u: np.ndarray, alpha: float, limit: float) -> np.ndarray:
    """gpt-oss's gated unit (ggml_swiglu_oai)."""
    g = np.minimum(g, limit)
    return g / (1.0 + np.exp(-alpha * g)) * (np.clip(u, -limit, limit) + 1.0)


def softmax(x: np.ndarray) -> np.ndarray:
    e = np.exp(x - np.max(x, axis=-1, keepdims=True))
    return e / np.sum(e, axis=-1, keepdims=True)


def rope_cos_sin(cfg: ModelConfig, positions: np.ndarray, freq_factors: np.ndarray | None = None,
                 swa: bool = False) -> tuple[np.ndarray, np.ndarray]:
    """cos and sin tables, shape (n_pos, rope_dim/2), as ggml's rope computes them.

    theta[p, i] = p * base^(-2i/rope_dim) / freq_factors[i], then rope scaling (linear or YaRN).
    swa: a sliding-window layer's, with base cfg.rope_base_swa and no scaling.
    """
    if swa:
        cfg = dataclasses.replace(cfg, rope_base=cfg.rope_base_swa, rope_scaling=None)
    half = cfg.rope_dim // 2
    i = np.arange(half, dtype=np.float64)
    inv_freq = cfg.rope_base ** (-2.0 * i / cfg.rope_dim)
    if freq_factors is not None:
        inv_freq = inv_freq / freq_factors.astype(np.float64)
    theta = positions.astype(np.float64)[:, None] * inv_freq[None, :]
    mscale = 1.0
    s = cfg.rope_scaling
    if s is not None:
        freq_scale = 1.0 / s.factor
        theta_interp = theta * freq_scale
        if s.type == "linear" or s.ext_factor == 0.0:
            theta = theta_interp
        else:  # yarn: blend interpolated and extrapolated angles across the correction dims
            def corr_dim(n_rot: float) -> float:
                return (cfg.rope_dim * math.log(s.orig_ctx / (n_rot * 2 * math.pi))
                        / (2 * math.log(cfg.rope_base)))
            low = max(0.0, math.floor(corr_dim(s.beta_fast)))
            high = min(cfg.rope_dim - 1.0, math.ceil(corr_dim(s.beta_slow)))
            y = (i - low) / max(0.001, high - low)          # i = i0 / 2 in ggml's terms
            ramp_mix = (1.0 - np.clip(y, 0.0, 1.0)) * s.ext_factor
            theta = theta_interp * (1.0 - ramp_mix) + theta * ramp_mix
            mscale = 1.0 + 0.1 * math.log(1.0 / freq_scale)
        mscale *= s.attn_factor
    return (np.cos(theta) * mscale).astype(np.float32), (np.sin(theta) * mscale).astype(np.float32)


def kv_round_trip(x: np.ndarray, cache_type: str) -> np.ndarray:
    """x (tokens, heads, head_dim) as a KV cache of `cache_type` gives it back: f32 unchanged, f16
    rounded, q8_0 / q4_0 / q4_1 / q5_0 / q5_1 quantized by gguf.quants in blocks of 32 along head_dim
    and dequantized."""
    if cache_type == "f32":
        return x
    if cache_type == "f16":
        return x.astype(np.float16).astype(np.float32)
    from gguf import GGMLQuantizationType
    from gguf.quants import dequantize, quantize

    qtype = GGMLQuantizationType[cache_type.upper()]
    flat = np.ascontiguousarray(x, dtype=np.float32).reshape(-1, x.shape[-1])
    return dequantize(quantize(flat, qtype), qtype).reshape(x.shape).astype(np.float32)


def apply_rope(x: np.ndarray, cos: np.ndarray, sin: np.ndarray, neox: bool) -> np.ndarray:
    """Rotate x (n_tok, n_heads, head_dim); only the first rope_dim = 2*cos.shape[1] dims turn.

    neox=False (llama): pairs (2i, 2i+1).  neox=True (qwen2/qwen3): pairs (i, i + rope_dim/2).
    """
    half = cos.shape[1]
    out = x.copy()
    if neox:
        x0, x1 = x[..., :half], x[..., half:2 * half]
    else:
        x0, x1 = x[..., 0:2 * half:2], x[..., 1:2 * half:2]
    c, s = cos[:, None, :], sin[:, None, :]   # broadcast over heads
    r0 = x0 * c - x1 * s
    r1 = x0 * s + x1 * c
    if neox:
        out[..., :half], out[..., half:2 * half] = r0, r1
    else:
        out[..., 0:2 * half:2], out[..., 1:2 * half:2] = r0, r1
    return out


class ReferenceModel:
    """Float32 numpy evaluation of a ModelFile.

    logits(tokens): fresh evaluation, one row of logits per token (causal).
    forward(tokens, start_pos): incremental evaluation with a KV cache; start_pos may rewind the cache.
    """

    def __init__(self, model_file: ModelFile, type_k: str = "f32", type_v: str = "f32"):
        self.model = model_file
        self.type_k, self.type_v = type_k, type_v
        self.cfg = model_file.config
        self.gemma = self.cfg.arch == "gemma3"   # embedding scale, GeGLU (the rest: config / weights)
        self._cache: dict[str, np.ndarray] = {}
        self.reset()

    # -- weights -------------------------------------------------------------------------------

    def weight(self, role: str, layer: int | None = None) -> np.ndarray | None:
        """The dequantized float32 weight of a role (None if the optional tensor is absent)."""
        if role == "output" and self.cfg.tied_output:
            role = "token_embd"
        name = None
        for spec in self.model.weights.values():
            if spec.role == role and spec.layer == layer:
                name = spec.name
                break
        if name is None:
            return self._fused_part(role, layer)
        if name not in self._cache:
            self._cache[name] = self.model.dequantize(name)
        return self._cache[name]

    def _fused_part(self, role: str, layer: int | None) -> np.ndarray | None:
        """qwen3next's q|k|v, z, beta and alpha matrices: their rows of ssm_in / ssm_ba."""
        fused = {"ssm_qkv": "ssm_in", "ssm_z": "ssm_in", "ssm_beta": "ssm_ba", "ssm_alpha": "ssm_ba"}.get(role)
        whole = self.weight(fused, layer) if fused is not None else None
        if whole is None:
            return None
        return np.concatenate([whole[a:b] for a, b in fused_rows(self.cfg)[role]])

    # -- KV cache --------------------------------------------------------------------------------

    def reset(self) -> None:
        c = self.cfg
        empty = np.zeros((0, c.n_head_kv, c.head_dim), dtype=np.float32)
        self.k_cache = [empty] * c.n_layer   # per layer: (n_past, n_head_kv, head_dim)
        self.v_cache = [empty] * c.n_layer
        # DeltaNet layers: the last d_conv - 1 convolution inputs and the state S (value heads,
        # key dim, value dim), float64
        channels = (2 * c.ssm_n_group + c.ssm_dt_rank) * c.ssm_d_state
        self.conv_state = [np.zeros((max(c.ssm_d_conv - 1, 0), channels)) for _ in range(c.n_layer)]
        self.ssm_state = [np.zeros((c.ssm_dt_rank, c.ssm_d_state, c.ssm_d_state)) for _ in range(c.n_layer)]
        self.n_past = 0

    # -- forward ---------------------------------------------------------------------------------

    def logits(self, tokens: list[int]) -> np.ndarray:
        """(n_tokens, n_vocab) float32 logits for every position of a fresh sequence."""
        self.reset()
        return self.forward(tokens, 0)

    def forward(self, tokens: list[int], start_pos: int | None = None) -> np.ndarray:
        """Evaluate `tokens` at positions start_pos.. (default: after the cached ones)."""
        c = self.cfg
        if start_pos is None:
            start_pos = self.n_past
        if not 0 <= start_pos <= self.n_past:
            raise LlamavkError(f"start_pos {start_pos} is beyond the {self.n_past} cached tokens")
        if c.recurrent_layers and start_pos != self.n_past:
            if start_pos:
                raise LlamavkError(f"a recurrent state cannot rewind from {self.n_past} to {start_pos} tokens")
            self.reset()
        tokens = np.asarray(tokens, dtype=np.int64)
        if tokens.size and (tokens.min() < 0 or tokens.max() >= c.n_vocab):
            raise LlamavkError(f"token id out of range [0, {c.n_vocab})")
        n = len(tokens)
        positions = np.arange(start_pos, start_pos + n)
        freqs = self.weight("rope_freqs")
        tables = {swa: rope_cos_sin(c, positions, freqs, swa) for swa in (False, True)}

        x = self.weight("token_embd")[tokens]                      # (n, n_embd)
        if self.gemma:
            x = x * np.float32(math.sqrt(c.n_embd))
        for layer in range(c.n_layer):
            cos, sin = tables[c.swa_rope(layer)]
            if c.is_recurrent(layer):
                x = x + self.post_norm(layer, "attn_post_norm", self.delta_net(layer, x))
            else:
                x = x + self.post_norm(layer, "attn_post_norm", self.attention(layer, x, cos, sin, start_pos))
            x = x + self.post_norm(layer, "ffn_post_norm", self.feed_forward(layer, x))
        self.n_past = start_pos + n

        x = rms_norm(x, self.weight("output_norm"), c.rms_eps)
        logits = (x @ self.weight("output").T).astype(np.float32)  # (n, n_vocab)
        if c.final_logit_softcap:
            cap = c.final_logit_softcap
            logits = (cap * np.tanh(logits.astype(np.float64) / cap)).astype(np.float32)
        return logits

    def post_norm(self, layer: int, role: str, y: np.ndarray) -> np.ndarray:
        """A block's output, RMS-normed by its post-norm weight where the model has one (gemma3)."""
        w = self.weight(role, layer)
        return y if w is None else rms_norm(y, w, self.cfg.rms_eps)

    def attention(self, layer: int, x: np.ndarray, cos: np.ndarray, sin: np.ndarray,
                  start_pos: int) -> np.ndarray:
        c, w = self.cfg, (lambda role: self.weight(role, layer))
        n = x.shape[0]
        h = rms_norm(x, w("attn_norm"), c.rms_eps)
        q, k, v = h @ w("q").T, h @ w("k").T, h @ w("v").T
        if c.qkv_bias:
            q, k, v = q + w("q_bias"), k + w("k_bias"), v + w("v_bias")
        gate = None
        if c.attn_output_gate:                      # qwen35: [q | gate] per head
            qg = q.reshape(n, c.n_head, 2, c.head_dim)
            q, gate = qg[:, :, 0], qg[:, :, 1].reshape(n, c.n_head * c.head_dim)
        q = q.reshape(n, c.n_head, c.head_dim)
        k = k.reshape(n, c.n_head_kv, c.head_dim)
        v = v.reshape(n, c.n_head_kv, c.head_dim)
        if c.qk_norm:
            q = rms_norm(q, w("q_norm"), c.rms_eps)
            k = rms_norm(k, w("k_norm"), c.rms_eps)
        q = apply_rope(q, cos, sin, c.rope_neox)
        k = apply_rope(k, cos, sin, c.rope_neox)

        k, v = kv_round_trip(k, self.type_k), kv_round_trip(v, self.type_v)
        # append to the cache (dropping anything at or after start_pos: rewind)
        keys = np.concatenate([self.k_cache[layer][:start_pos], k])     # (n_kv_len, n_head_kv, hd)
        values = np.concatenate([self.v_cache[layer][:start_pos], v])
        self.k_cache[layer], self.v_cache[layer] = keys, values

        n_kv = keys.shape[0]
        q_pos = np.arange(start_pos, start_pos + n)
        mask = np.arange(n_kv)[None, :] > q_pos[:, None]                 # (n, n_kv): future keys
        if c.is_swa(layer):                                              # and those out of the window
            mask |= np.arange(n_kv)[None, :] <= q_pos[:, None] - c.sliding_window
        scale = c.attn_scale or 1.0 / math.sqrt(c.head_dim)
        sinks = w("attn_sinks")                                          # gpt-oss: one more logit per head
        out = np.empty((n, c.n_head, c.head_dim), dtype=np.float32)
        for head in range(c.n_head):
            kv_head = head // c.n_gqa                                    # GQA: shared KV head
            scores = (q[:, head, :] @ keys[:, kv_head, :].T) * scale     # (n, n_kv)
            scores = np.where(mask, -np.inf, scores)
            if sinks is None:
                out[:, head, :] = softmax(scores) @ values[:, kv_head, :]
            else:                                                        # the sink's value is 0
                p = softmax(np.concatenate([scores, np.full((n, 1), sinks[head], np.float32)], axis=1))
                out[:, head, :] = p[:, :-1] @ values[:, kv_head, :]
        out = out.reshape(n, c.n_head * c.head_dim)
        if gate is not None:
            out = out / (1.0 + np.exp(-gate))
        out = out @ w("o").T
        return out if w("o_bias") is None else out + w("o_bias")

    def delta_net(self, layer: int, x: np.ndarray) -> np.ndarray:
        """A Gated DeltaNet layer's mixer (before the residual add), token by token over the layer's
        conv and recurrent state, in float64."""
        c, w = self.cfg, (lambda role: self.weight(role, layer))
        n, D, Hk, Hv = x.shape[0], c.ssm_d_state, c.ssm_n_group, c.ssm_dt_rank
        h = rms_norm(x, w("attn_norm"), c.rms_eps).astype(np.float64)
        qkv, z = h @ w("ssm_qkv").T, h @ w("ssm_z").T
        beta = 1.0 / (1.0 + np.exp(-(h @ w("ssm_beta").T)))                          # (n, Hv)
        decay = np.exp(np.logaddexp(0.0, h @ w("ssm_alpha").T + w("ssm_dt")) * w("ssm_a"))
        # causal convolution: tap d_conv - 1 multiplies the current token
        taps = w("ssm_conv").astype(np.float64)                                     # (channels, d_conv)
        window = np.concatenate([self.conv_state[layer], qkv])
        K = c.ssm_d_conv
        conv = np.stack([(window[t:t + K] * taps.T).sum(axis=0) for t in range(n)])
        self.conv_state[layer] = window[n:] if K > 1 else window[:0]
        conv = conv / (1.0 + np.exp(-conv))                                         # silu
        q = conv[:, :Hk * D].reshape(n, Hk, D)
        k = conv[:, Hk * D:2 * Hk * D].reshape(n, Hk, D)
        v = conv[:, 2 * Hk * D:].reshape(n, Hv, D)
        q = q / np.sqrt((q * q).sum(-1, keepdims=True) + c.rms_eps)
        k = k / np.sqrt((k * k).sum(-1, keepdims=True) + c.rms_eps)
        S = self.ssm_state[layer]                                                   # (Hv, D_k, D_v)
        out = np.empty((n, Hv, D))
        for t in range(n):
            for hv in range(Hv):
                kh = hv // (Hv // Hk) if c.ssm_grouped else hv % Hk   # grouped or tiled value heads
                S[hv] *= decay[t, hv]
                delta = beta[t, hv] * (v[t, hv] - S[hv].T @ k[t, kh])
                S[hv] += np.outer(k[t, kh], delta)
                out[t, hv] = S[hv].T @ q[t, kh] / math.sqrt(D)
        out = out / np.sqrt((out * out).mean(-1, keepdims=True) + c.rms_eps) * w("ssm_norm")
        out = out.reshape(n, Hv * D) * (z / (1.0 + np.exp(-z)))
        return (out @ w("ssm_out").T).astype(np.float32)

    def feed_forward(self, layer: int, x: np.ndarray) -> np.ndarray:
        c, w = self.cfg, (lambda role: self.weight(role, layer))
        h = rms_norm(x, w("ffn_norm"), c.rms_eps)
        if c.is_moe(layer):
            return self.experts(layer, h)
        act = gelu_tanh if self.gemma else silu
        return (act(h @ w("gate").T) * (h @ w("up").T)) @ w("down").T

    def experts(self, layer: int, h: np.ndarray) -> np.ndarray:
        """The mixture of experts of one layer for normalized inputs h (n, n_embd)."""
        c, w = self.cfg, (lambda role: self.weight(role, layer))
        logits = (h @ w("router").T).astype(np.float64)                 # (n, n_expert)
        if w("router_bias") is not None:
            logits = logits + w("router_bias")
        probs = softmax(logits) if c.expert_gating == "softmax" else 1.0 / (1.0 + np.exp(-logits))
        sel_bias = w("expert_sel_bias")          # glm4moe: ranks probability + bias, weighs by probability
        score = probs if sel_bias is None else probs + sel_bias
        chosen = np.argsort(-score, axis=1, kind="stable")[:, :c.n_expert_used]
        weights = np.take_along_axis(probs, chosen, axis=1)
        if c.expert_norm:
            weights = weights / weights.sum(axis=1, keepdims=True)
        weights = weights * c.expert_weights_scale
        gate, up, down = w("gate_exps"), w("up_exps"), w("down_exps")    # (n_expert, rows, cols)
        zero = np.zeros((c.n_expert, 1), np.float32)                     # the biases, where the model has them
        bg, bu, bd = (zero if w(r) is None else w(r) for r in ("gate_exps_bias", "up_exps_bias", "down_exps_bias"))
        out = np.zeros_like(h)
        for t in range(h.shape[0]):
            for e, weight in zip(chosen[t], weights[t]):
                g, u = gate[e] @ h[t] + bg[e], up[e] @ h[t] + bu[e]
                y = swiglu_oai(g, u, OAI_ALPHA, OAI_LIMIT) if c.expert_glu == "swiglu_oai" else silu(g) * u
                out[t] += np.float32(weight) * (down[e] @ y + bd[e])
        if c.n_ff_shexp:
            shared = (silu(h @ w("gate_shexp").T) * (h @ w("up_shexp").T)) @ w("down_shexp").T
            out += shared / (1.0 + np.exp(-(h @ w("router_shexp"))))[:, None] if c.shexp_gated else shared
        return out

    def generate_greedy(self, tokens: list[int], n: int) -> list[int]:
        """Greedy continuation of `n` tokens (uses the KV cache)."""
        logits = self.logits(tokens)
        out = []
        for _ in range(n):
            nxt = int(np.argmax(logits[-1]))
            out.append(nxt)
            logits = self.forward([nxt])
        return out
