"""RoPE recorder (shaders/rope.comp) and its static parameters."""

from __future__ import annotations

import math
import struct
from dataclasses import dataclass

from ..kv_cache import KVTypes
from .norm import _range

WG = 128


@dataclass(frozen=True)
class RopeParams:
    """Static RoPE parameters of a model, in ggml's terms (ggml_rope_ext).

    theta_extrap = pos * base^(-2i/dim) / freqs[i]; theta_interp = freq_scale * theta_extrap;
    ext_factor != 0 (YaRN): theta blends interp -> extrap by the ramp between the correction dims
    of beta_fast/beta_slow (from orig_ctx) and cos/sin are scaled by attn_factor * (1 + 0.1 ln(1/freq_scale));
    else cos/sin are scaled by attn_factor.
    """
    dim: int                      # rope_dim: dims of a head that rotate (<= head_dim, even)
    base: float = 10000.0
    neox: bool = False            # pairs (i, i + dim/2) instead of (2i, 2i + 1)
    freq_scale: float = 1.0       # 1 / scaling factor (linear and yarn)
    ext_factor: float = 0.0       # yarn blend strength (0: no yarn)
    attn_factor: float = 1.0
    beta_fast: float = 32.0
    beta_slow: float = 1.0
    orig_ctx: int = 0             # yarn: original training context
    freqs: object = None          # View/Buffer of dim/2 float32 frequency divisors (rope_freqs) or None

    @classmethod
    def from_config(cls, cfg, freqs_view=None, layer: int | None = None) -> "RopeParams":
        """From a llamavk.models.ModelConfig (+ the uploaded rope_freqs tensor, if the model has one);
        for a sliding-window layer with RoPE of its own (cfg.swa_rope(layer)), its own base and no
        scaling (gemma3)."""
        if cfg.swa_rope(layer):
            return cls(dim=cfg.rope_dim, base=cfg.rope_base_swa, neox=cfg.rope_neox, freqs=freqs_view)
        s = cfg.rope_scaling
        kw = dict(dim=cfg.rope_dim, base=cfg.rope_base, neox=cfg.rope_neox, freqs=freqs_view)
        if s is not None:
            kw.update(freq_scale=1.0 / s.factor, attn_factor=s.attn_factor, beta_fast=s.beta_fast,
                      beta_slow=s.beta_slow, orig_ctx=s.orig_ctx,
                      ext_factor=s.ext_factor if s.type == "yarn" else 0.0)
        return cls(**kw)

    def corr_dims(self) -> tuple[float, float]:
        """ggml_rope_yarn_corr_dims: the (low, high) pair-index range of the YaRN ramp."""
        if self.ext_factor == 0.0 or self.orig_ctx <= 0:
            return 0.0, 0.0

        def corr_dim(n_rot: float) -> float:
            return self.dim * math.log(self.orig_ctx / (n_rot * 2 * math.pi)) / (2 * math.log(self.base))

        low = max(0.0, math.floor(corr_dim(self.beta_fast)))
        high = min(self.dim - 1.0, math.ceil(corr_dim(self.beta_slow)))
        return float(low), float(high)

    def angles(self) -> tuple[float, ...]:
        """rope_common.glsl's float fields: log2_theta_scale, freq_scale, ext_factor, attn_factor,
        corr_low, corr_high."""
        low, high = self.corr_dims()
        return (-2.0 / self.dim * math.log2(self.base), self.freq_scale, self.ext_factor, self.attn_factor,
                low, high)

    def push(self, n_tokens: int, n_heads: int, head_dim: int) -> bytes:
        return struct.pack("<5I6f", n_tokens, n_heads, head_dim, self.dim, int(bool(self.neox)), *self.angles())


@dataclass(frozen=True)
class RopeOut:
    """Where a one-token Q, K or V product writes instead of rope_kv.comp (matvec_stream.comp ROPE):
    q rotated into its output; k rotated and v as f16 into row n_past of their KV cache."""
    kind: str                 # "q", "k" or "v"
    rope: RopeParams
    step: object              # the step-parameter View (n_past at run time)
    head_dim: int
    cache: object = None      # k, v: the cache View, [n_ctx][rows] f16
    n_ctx: int = 0

    MODES = {"q": 1, "k": 2, "v": 3}

    def push(self) -> bytes:
        """The stream kernel's push fields after eps."""
        return struct.pack("<4I6f", self.head_dim, self.rope.dim, int(bool(self.rope.neox)), self.n_ctx,
                           *self.rope.angles())


def rope(seq, kc, x, step, n_tokens: int, n_heads: int, head_dim: int, rope: RopeParams) -> None:
    """Rotate x = [n_tokens][n_heads * head_dim] in place; token t sits at position n_past + t,
    n_past read from the step buffer when the sequence runs (record once, replay at any n_past);
    with a step seq_len L > 0 (STEP_SEQ_LEN), at position (n_past + t) % L."""
    if n_tokens <= 0:
        return
    if rope.dim % 2 or not 0 < rope.dim <= head_dim:
        raise ValueError(f"rope dim {rope.dim} must be even and at most head_dim {head_dim}")
    if n_tokens > 65535:
        raise ValueError("rope: at most 65535 tokens per call")
    pairs = n_heads * (rope.dim // 2)
    groups = ((pairs + WG - 1) // WG, n_tokens, 1)
    push = rope.push(n_tokens, n_heads, head_dim)
    if rope.freqs is None:
        kernel = kc.get("rope_f32", "rw", push_size=len(push), spec=(WG,))
        buffers = [_range(step), _range(x)]
    else:
        kernel = kc.get("rope_freqs_f32", "rrw", push_size=len(push), spec=(WG,))
        buffers = [_range(step), _range(rope.freqs), _range(x)]
    seq.dispatch(kernel, buffers, groups, push)


def rope_kv(seq, kc, q, k, v, k_cache, v_cache, step, n_tokens: int, n_heads: int, n_heads_kv: int,
            head_dim: int, rope: RopeParams, n_ctx: int, q_norm=None, k_norm=None, eps: float = 0.0,
            kv_types: KVTypes = KVTypes(), signal=None, wait=None) -> int:
    """One dispatch: rotate q in place, write rotate(k) and v into the caches at row n_past + t
    (shaders/rope_kv.comp; the angle of row p is that of position p % L with a step seq_len L > 0),
    as f16 or, per kv_types, q8_0 / q4_0 blocks (kv_cache.py).
    Equivalent to rope(q), rope(k), kv_store(k), kv_store(v). q_norm, k_norm (float32 [head_dim],
    rope.dim == head_dim): each head of q and k RMS-normed with these weights first (qwen3).
    signal (a chain.Signal): every workgroup counts itself done there, for the decode attention
    waiting in its shader (attention_decode.comp WAIT). Returns how many workgroups count (0 without
    a signal). wait (a chain.Wait): recorded without a barrier after the Q/K/V products that count
    there, it waits for them in its shader (rope_kv.comp WAIT)."""
    if n_tokens <= 0:
        return 0
    if rope.dim % 2 or not 0 < rope.dim <= head_dim:
        raise ValueError(f"rope dim {rope.dim} must be even and at most head_dim {head_dim}")
    half = rope.dim // 2
    quant = kv_types.quantized
    if quant:
        kv_types.check_head_dim(head_dim)
    push = rope.push(n_tokens, n_heads, head_dim) + struct.pack("<2I", n_heads_kv, n_ctx)
    tensors = [_range(q), _range(k), _range(v), _range(k_cache), _range(v_cache)]
    freqs = [] if rope.freqs is None else [_range(rope.freqs)]
    suffix = ("_f32" if rope.freqs is None else "_freqs_f32") if not quant else \
        ("_kvq" if rope.freqs is None else "_freqs_kvq")
    types = kv_types.codes if quant else ()
    kv_width = n_heads_kv * head_dim
    if q_norm is not None:
        if rope.dim != head_dim or half > 1024 or (quant and head_dim > 512):
            raise ValueError("rope_kv: the per-head norm needs rope_dim == head_dim (at most 512 with a "
                             "quantized cache)")
        wg = max(kc.info.subgroup_size or 32, 1 << (half - 1).bit_length())
        # a quantized v: 2 wg values a workgroup (rope_kv.comp)
        v_groups = _ceil(kv_width, 2 * wg if kv_types.v != "f16" else wg)
        groups = (n_heads + n_heads_kv + v_groups, n_tokens, 1)
        return _dispatch(seq, kc, "rope_kv_norm" + suffix, "r" * (1 + len(freqs)) + "wrrwwrr", (wg,) + types,
                         [_range(step)] + freqs + tensors + [_range(q_norm), _range(k_norm)], groups,
                         push + struct.pack("<f", eps), signal, wait)
    k_items = n_heads_kv * half + n_heads_kv * (head_dim - rope.dim)
    if quant:   # runs of workgroups, each uniform: q pairs, k, v (2 WG values of a quantized cache)
        k_groups = _ceil(kv_width, 2 * WG) if kv_types.k != "f16" else _ceil(k_items, WG)
        v_groups = _ceil(kv_width, 2 * WG) if kv_types.v != "f16" else _ceil(kv_width, WG)
        n_groups = _ceil(n_heads * half, WG) + k_groups + v_groups
    else:
        n_groups = _ceil(n_heads * half + k_items + kv_width, WG)
    return _dispatch(seq, kc, "rope_kv" + suffix, "r" * (1 + len(freqs)) + "wrrww", (WG,) + types,
                     [_range(step)] + freqs + tensors, (n_groups, n_tokens, 1), push, signal, wait)


def _ceil(n: int, d: int) -> int:
    return (n + d - 1) // d


def _dispatch(seq, kc, name: str, bindings: str, spec: tuple, bufs: list, groups: tuple, push: bytes, signal,
              wait) -> int:
    """Record rope_kv.comp's variant `name`; with a signal its CHAIN form, with a wait its WAIT form
    (the counters bound last; the signal's slot, then the wait's slot and count pushed last). Returns
    the workgroups that count (0: none)."""
    if signal is not None or wait is not None:
        tail = "_kvq" if name.endswith("_kvq") else "_f32"
        name = name[:-len(tail)] + ("_wait" if wait is not None else "") + ("_chain" if signal is not None else "") \
            + tail
        bindings += "w"
        bufs = bufs + [(signal or wait).counters]
        push += (struct.pack("<I", signal.slot) if signal is not None else b"") + \
            (struct.pack("<2I", wait.slot, wait.n) if wait is not None else b"")
    seq.dispatch(kc.get(name, bindings, push_size=len(push), spec=spec), bufs, groups, push, chained=wait is not None)
    return groups[0] * groups[1] * groups[2] if signal is not None else 0
