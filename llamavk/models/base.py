"""What every architecture module produces: a ModelConfig (hyper-parameters) and WeightSpecs (tensors).

Conventions (see docs/MODELS.md):
- Matrix shapes are (rows, cols) = (out_features, in_features); a row is contiguous in the file, so
  y = W @ x computes one output per row. GGUF stores dims reversed (ne0 = cols first); we never expose
  that order.
- Vectors (norm weights, biases) have shape (n,).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from ..errors import LlamavkError
from ..gguf_file import GGUFFile
from ..quant import GGMLQuantizationType

ROLES = (
    "token_embd", "output_norm", "output",
    "attn_norm", "q", "k", "v", "o", "q_bias", "k_bias", "v_bias", "q_norm", "k_norm",
    "ffn_norm", "gate", "up", "down",
    "rope_freqs",  # optional Llama-3 style per-frequency divisors (n_rot/2,), shared by all layers
    # mixture of experts: the router (n_expert, n_embd), the experts' stacked matrices
    # (n_expert, rows, cols), and the optional shared expert with its sigmoid gate (1, n_embd)
    "router", "gate_exps", "up_exps", "down_exps", "gate_shexp", "up_shexp", "down_shexp", "router_shexp",
    # Gated DeltaNet layers (qwen35): the q|k|v input product, the output gate z, the causal
    # convolution's taps (conv channels, d_conv), dt bias and A per value head, the beta and alpha
    # products (value heads, n_embd), the gated norm (value head size), the output product
    "ssm_qkv", "ssm_z", "ssm_conv", "ssm_dt", "ssm_a", "ssm_beta", "ssm_alpha", "ssm_norm", "ssm_out",
    # qwen3next's fused forms of them: ssm_in = q|k|v|z and ssm_ba = beta|alpha, grouped per key head
    # (models/qwen3next.py)
    "ssm_in", "ssm_ba",
    # norms of a block's output before its residual add (gemma3: sandwich norms), shape (n_embd,)
    "attn_post_norm", "ffn_post_norm",
    # gpt-oss: the output projection's and the router's biases, each expert's biases (n_expert, rows),
    # and per query head the attention sink's logit (n_head,)
    "o_bias", "router_bias", "gate_exps_bias", "up_exps_bias", "down_exps_bias", "attn_sinks",
    # glm4moe (DeepSeek-V3's routing): per expert a bias added to its probability for the choice only
    # (`exp_probs_b.bias`, n_expert), not to the chosen experts' weights
    "expert_sel_bias",
    # tensors a file has and llamavk does not load (glm4moe's multi-token-prediction blocks)
    "nextn",
)
EXPERT_ROLES = frozenset({"gate_exps", "up_exps", "down_exps"})


@dataclass(frozen=True)
class RopeScaling:
    """Context-extension scaling of RoPE as llama.cpp reads it from `{arch}.rope.scaling.*`.

    type "linear": positions are multiplied by 1/factor.
    type "yarn": llama.cpp's YaRN (ggml rope_yarn): frequencies interpolated by 1/factor, blended back
    to extrapolation for the high-frequency dims between the beta_fast/beta_slow correction dims, and
    cos/sin multiplied by attn_factor * (1 + 0.1 ln(factor)).
    Llama-3 style scaling is not metadata: it is the optional `rope_freqs.weight` tensor (role
    "rope_freqs"), whose entries divide each frequency.
    """
    type: str                 # "linear" | "yarn"
    factor: float             # context extension factor (freq_scale = 1/factor)
    orig_ctx: int             # original training context (yarn)
    attn_factor: float = 1.0
    beta_fast: float = 32.0
    beta_slow: float = 1.0
    ext_factor: float = 1.0   # yarn blend strength (1.0 for yarn)


@dataclass(frozen=True)
class ModelConfig:
    arch: str
    n_vocab: int
    n_embd: int
    n_layer: int
    n_head: int
    n_head_kv: int
    head_dim: int
    n_ff: int
    n_ctx_train: int
    rms_eps: float
    rope_base: float
    rope_dim: int
    rope_neox: bool                   # True: rotate pairs (i, i + rope_dim/2); False: pairs (2i, 2i+1)
    rope_scaling: RopeScaling | None
    qkv_bias: bool
    qk_norm: bool
    tied_output: bool                 # no output.weight: token_embd is used as the output matrix
    # mixture of experts (n_expert 0: a dense FFN of n_ff)
    n_expert: int = 0
    n_expert_used: int = 0            # experts each token runs (top-k of the router)
    n_ff_exp: int = 0                 # one expert's FFN width
    expert_gating: str = "softmax"    # router probabilities: "softmax" or "sigmoid" over the experts
    expert_norm: bool = False         # the chosen experts' weights renormalized to sum 1
    expert_weights_scale: float = 1.0
    n_ff_shexp: int = 0               # the shared expert's FFN width (0: none)
    shexp_gated: bool = True          # the shared expert's output times sigmoid(w . h) (qwen2moe, qwen35moe);
                                      # False: added as it is (glm4moe)
    expert_sel_bias: bool = False     # the router's choice reads probability + a bias per expert (glm4moe)
    n_layer_dense_lead: int = 0       # the first layers have a dense FFN of n_ff instead of experts
    # the experts' gated unit: "swiglu" silu(g) u, or "swiglu_oai" (gpt-oss: ggml_swiglu_oai with
    # models/gpt_oss.py's alpha and limit)
    expert_glu: str = "swiglu"
    # Gated DeltaNet hybrids (qwen35, qwen35moe; models/qwen35.py): per layer, whether it is a linear-
    # attention (recurrent) layer; the shapes as llama.cpp reads them from `{arch}.ssm.*`
    recurrent_layers: tuple[bool, ...] = ()
    ssm_d_conv: int = 0               # causal convolution width (ssm.conv_kernel)
    ssm_d_state: int = 0              # key head size = value head size (ssm.state_size)
    ssm_n_group: int = 0              # key heads (ssm.group_count)
    ssm_dt_rank: int = 0              # value heads (ssm.time_step_rank)
    ssm_d_inner: int = 0              # value heads x value head size (ssm.inner_size)
    attn_output_gate: bool = False    # the Q product also gives each head a sigmoid gate of its output
    # qwen3next: value head h reads key head h // (Hv / Hk) (the heads of one key head side by side)
    # instead of h % Hk; beta and alpha come from one product (ssm_ba), and with ssm_fused_in q, k, v
    # and z from one too (ssm_in, the layout of most published files)
    ssm_grouped: bool = False
    ssm_fused_ba: bool = False
    ssm_fused_in: bool = False
    # sliding-window attention (gemma3): layer i with swa_layers[i] sees only the last
    # `sliding_window` positions (its own included) and turns RoPE by rope_base_swa, unscaled
    sliding_window: int = 0
    swa_layers: tuple[bool, ...] = ()
    rope_base_swa: float = 10000.0
    swa_rope_own: bool = True         # False: sliding-window layers turn RoPE as the others (gpt-oss)
    attn_scale: float = 0.0           # scale of q.k (0: 1/sqrt(head_dim))
    final_logit_softcap: float = 0.0  # logits = c * tanh(logits / c) (0: none)
    # mistral3's attention temperature scales q from this position on (0: never): the largest
    # context llamavk runs such a model with (models/mistral3.py)
    attn_temp_floor: int = 0

    def is_swa(self, layer: int | None) -> bool:
        """Whether `layer` is a sliding-window layer."""
        return self.sliding_window > 0 and layer is not None and layer < len(self.swa_layers) \
            and self.swa_layers[layer]

    def swa_rope(self, layer: int | None) -> bool:
        """Whether `layer` turns RoPE by rope_base_swa without scaling (gemma3's local layers)."""
        return self.swa_rope_own and self.is_swa(layer)

    def window(self, layer: int | None) -> int:
        """Positions layer `layer` attends to (its own included); 0: every earlier one."""
        return self.sliding_window if self.is_swa(layer) else 0

    @property
    def n_gqa(self) -> int:
        """Query heads per KV head."""
        return self.n_head // self.n_head_kv

    def is_moe(self, layer: int) -> bool:
        """Whether `layer`'s FFN is the mixture of experts (not one of the leading dense layers)."""
        return self.n_expert > 0 and layer >= self.n_layer_dense_lead

    def is_recurrent(self, layer: int) -> bool:
        """Whether `layer` is a Gated DeltaNet layer (recurrent state, no KV cache)."""
        return bool(self.recurrent_layers) and self.recurrent_layers[layer]


@dataclass(frozen=True)
class WeightSpec:
    name: str                 # GGUF tensor name, e.g. "blk.3.attn_q.weight"
    role: str                 # one of ROLES
    layer: int | None
    shape: tuple[int, ...]    # (rows, cols) = (out_features, in_features); (n,) for vectors
    optional: bool = False


# Largest dimension or count a metadata value may give: kernels take them as 32-bit push constants.
MAX_COUNT = 2**31 - 1
_MISSING = object()


class Meta:
    """Typed access to `{arch}.*` metadata keys, with one-line errors for missing keys and for values
    of the wrong type or range (a GGUF is untrusted input: a string where a number belongs, a head
    count of 0). `get` / `require` return values unchecked; `count`, `number` and `text` check them."""

    def __init__(self, metadata: dict[str, Any], arch: str):
        self.metadata, self.arch = metadata, arch

    def key(self, key: str) -> str:
        return key.format(arch=self.arch)

    def get(self, key: str, default: Any = None) -> Any:
        return self.metadata.get(self.key(key), default)

    def require(self, key: str) -> Any:
        k = self.key(key)
        if k not in self.metadata:
            raise LlamavkError(f"GGUF metadata key {k} is missing; the file is not a complete "
                               f"{self.arch} model")
        return self.metadata[k]

    def _value(self, key: str, default: Any) -> Any:
        return self.require(key) if default is _MISSING else self.get(key, default)

    def _bad(self, key: str, value: Any, want: str) -> LlamavkError:
        shown = repr(value) if len(repr(value)) <= 40 else repr(value)[:37] + "..."
        return LlamavkError(f"bad GGUF metadata: {self.key(key)} = {shown} ({type(value).__name__}); "
                            f"expected {want}")

    def count(self, key: str, default: Any = _MISSING, minimum: int = 1) -> int:
        """An integer in [minimum, MAX_COUNT] (a dimension, a count): not a bool, float or string."""
        v = self._value(key, default)
        if v is default and default is not _MISSING:
            return v
        if not isinstance(v, int) or isinstance(v, bool) or not minimum <= v <= MAX_COUNT:
            raise self._bad(key, v, f"an integer from {minimum} to {MAX_COUNT}")
        return v

    def number(self, key: str, default: Any = _MISSING, positive: bool = False) -> float:
        """A finite real number (an int or float value, not a bool or string); > 0 if positive."""
        v = self._value(key, default)
        if v is default and default is not _MISSING:
            return v
        if not isinstance(v, (int, float)) or isinstance(v, bool) or not math.isfinite(v) or \
                (positive and v <= 0):
            raise self._bad(key, v, "a positive number" if positive else "a finite number")
        return float(v)

    def text(self, key: str, default: Any = _MISSING) -> str:
        v = self._value(key, default)
        if v is default and default is not _MISSING:
            return v
        if not isinstance(v, str):
            raise self._bad(key, v, "a string")
        return v


def common_config(metadata: dict[str, Any], arch: str, *, rope_neox: bool, qkv_bias: bool,
                  qk_norm: bool, moe: dict[str, Any] | None = None) -> ModelConfig:
    """The hyper-parameters shared by llama-like architectures, read the way llama.cpp reads them;
    `moe`: the mixture-of-experts fields (moe_config) of an architecture that has them."""
    m = Meta(metadata, arch)
    n_embd = m.count("{arch}.embedding_length")
    n_head = m.count("{arch}.attention.head_count")
    n_head_kv = m.count("{arch}.attention.head_count_kv", n_head)
    head_dim = m.count("{arch}.attention.key_length", n_embd // n_head)
    n_vocab = m.count("{arch}.vocab_size", None)
    if n_vocab is None:
        tokens = metadata.get("tokenizer.ggml.tokens")
        if tokens is None:
            raise LlamavkError(f"GGUF metadata has neither {arch}.vocab_size nor tokenizer.ggml.tokens")
        if not isinstance(tokens, list):
            raise m._bad("tokenizer.ggml.tokens", tokens, "an array of strings")
        n_vocab = len(tokens)
    # a mixture of experts may have no dense FFN width (its experts' is expert_feed_forward_length)
    n_ff = m.get("{arch}.feed_forward_length") if moe else m.require("{arch}.feed_forward_length")
    if isinstance(n_ff, list):  # per-layer list in some converters; llama-likes use one value
        if not n_ff or any(v != n_ff[0] for v in n_ff):
            raise m._bad("{arch}.feed_forward_length", n_ff, f"one value for all layers of a {arch} model")
        n_ff = n_ff[0]          # its type and range: check_config
    else:
        n_ff = m.count("{arch}.feed_forward_length", 0 if moe else _MISSING, minimum=0 if moe else 1)
    return check_config(ModelConfig(
        arch=arch,
        n_vocab=n_vocab,
        n_embd=n_embd,
        n_layer=m.count("{arch}.block_count"),
        n_head=n_head,
        n_head_kv=n_head_kv,
        head_dim=head_dim,
        n_ff=n_ff,
        n_ctx_train=m.count("{arch}.context_length", 4096),
        rms_eps=m.number("{arch}.attention.layer_norm_rms_epsilon", 1e-5, positive=True),
        rope_base=m.number("{arch}.rope.freq_base", 10000.0, positive=True),
        rope_dim=m.count("{arch}.rope.dimension_count", head_dim),
        rope_neox=rope_neox,
        rope_scaling=rope_scaling(m),
        qkv_bias=qkv_bias,
        qk_norm=qk_norm,
        tied_output=False,  # decided by load_model_file from the tensors present
        **(moe or {}),
    ))


def check_config(cfg: ModelConfig) -> ModelConfig:
    """Invariants every architecture's config must hold, whatever the metadata said (values that
    came from defaults included): one-line errors instead of a crash or garbage later."""
    moe = cfg.n_expert > 0
    for name, lowest in (("n_vocab", 1), ("n_embd", 1), ("n_layer", 1), ("n_head", 1), ("n_head_kv", 1),
                         ("head_dim", 1), ("n_ff", 0 if moe else 1), ("n_ctx_train", 1), ("rope_dim", 1),
                         ("n_ff_exp", 1 if moe else 0), ("n_ff_shexp", 0)):
        v = getattr(cfg, name)
        if not isinstance(v, int) or isinstance(v, bool) or not lowest <= v <= MAX_COUNT:
            raise LlamavkError(f"bad GGUF metadata: {cfg.arch} model with {name} = {v!r}")
    if not isinstance(cfg.n_layer_dense_lead, int) or not 0 <= cfg.n_layer_dense_lead <= cfg.n_layer \
            or (cfg.n_layer_dense_lead and cfg.n_ff < 1):
        raise LlamavkError(f"bad GGUF metadata: {cfg.arch} model with {cfg.n_layer_dense_lead!r} leading dense "
                           f"layers of {cfg.n_layer}, feed_forward_length {cfg.n_ff}")
    if cfg.n_head % cfg.n_head_kv:
        raise LlamavkError(f"{cfg.arch}: head_count {cfg.n_head} is not a multiple of head_count_kv "
                           f"{cfg.n_head_kv}")
    if cfg.rope_dim % 2 or cfg.rope_dim > cfg.head_dim:
        raise LlamavkError(f"bad GGUF metadata: {cfg.arch} rope.dimension_count {cfg.rope_dim} must be "
                           f"even and at most the head size {cfg.head_dim}")
    for name in ("rms_eps", "rope_base", "rope_base_swa"):
        v = getattr(cfg, name)
        if not math.isfinite(v) or v <= 0:
            raise LlamavkError(f"bad GGUF metadata: {cfg.arch} model with {name} = {v!r}")
    for name in ("attn_scale", "final_logit_softcap"):
        v = getattr(cfg, name)
        if not math.isfinite(v) or v < 0:
            raise LlamavkError(f"bad GGUF metadata: {cfg.arch} model with {name} = {v!r}")
    if not isinstance(cfg.sliding_window, int) or not 0 <= cfg.sliding_window <= MAX_COUNT:
        raise LlamavkError(f"bad GGUF metadata: {cfg.arch} model with sliding_window = {cfg.sliding_window!r}")
    if cfg.swa_layers and len(cfg.swa_layers) != cfg.n_layer:
        raise LlamavkError(f"bad GGUF metadata: {cfg.arch} sliding-window pattern gives {len(cfg.swa_layers)} "
                           f"layers, the model has {cfg.n_layer}")
    return cfg


def moe_config(metadata: dict[str, Any], arch: str, *, gating: str, norm: bool) -> dict[str, Any]:
    """The mixture-of-experts fields of ModelConfig, read as llama.cpp reads them (`{arch}.expert_*`);
    `gating` and `norm` are what llama.cpp's graph for the architecture does."""
    m = Meta(metadata, arch)
    n_expert = m.count("{arch}.expert_count")
    n_used = m.count("{arch}.expert_used_count")
    if not 0 < n_used <= n_expert:
        raise LlamavkError(f"{arch}: expert_used_count {n_used} must be in 1..expert_count ({n_expert})")
    if n_used > MAX_EXPERTS_USED or n_expert > MAX_EXPERTS:
        raise LlamavkError(f"{arch}: {n_expert} experts, {n_used} used per token: llamavk supports at most "
                           f"{MAX_EXPERTS} experts and {MAX_EXPERTS_USED} used")
    n_ff_exp = m.count("{arch}.expert_feed_forward_length", None) or m.count("{arch}.feed_forward_length")
    scale = m.number("{arch}.expert_weights_scale", 0.0) or 1.0   # llama.cpp: 0 means unscaled
    return dict(n_expert=n_expert, n_expert_used=n_used, n_ff_exp=n_ff_exp, expert_gating=gating,
                expert_norm=norm, expert_weights_scale=scale,
                n_ff_shexp=m.count("{arch}.expert_shared_feed_forward_length", 0, minimum=0))


# The router kernel keeps every expert's probability of a token in shared memory and picks the used
# ones in registers (shaders/moe_route.comp).
MAX_EXPERTS = 1024
MAX_EXPERTS_USED = 32


def rope_scaling(m: Meta) -> RopeScaling | None:
    kind = m.text("{arch}.rope.scaling.type", None)
    factor = m.number("{arch}.rope.scaling.factor", None)
    if kind is None and factor is None:  # older files: rope.scale_linear
        lin = m.number("{arch}.rope.scale_linear", None, positive=True)
        if lin is not None and lin != 1.0:
            return RopeScaling("linear", lin, m.count("{arch}.context_length", 0, minimum=0))
        return None
    kind = (kind or "linear").lower()
    factor = factor or 1.0
    if kind == "none" or factor in (0.0, 1.0):
        return None
    if kind not in ("linear", "yarn"):
        raise LlamavkError(f"{m.arch}.rope.scaling.type = {kind!r} is not supported (linear, yarn)")
    if factor < 0:
        raise m._bad("{arch}.rope.scaling.factor", factor, "a positive number")
    return RopeScaling(
        type=kind,
        factor=factor,
        orig_ctx=m.count("{arch}.rope.scaling.original_context_length",
                         m.count("{arch}.context_length", 0, minimum=0), minimum=0),
        attn_factor=m.number("{arch}.rope.scaling.attn_factor", 1.0),
        beta_fast=m.number("{arch}.rope.scaling.yarn_beta_fast", 32.0),
        beta_slow=m.number("{arch}.rope.scaling.yarn_beta_slow", 1.0),
        ext_factor=m.number("{arch}.rope.scaling.yarn_ext_factor", 1.0) if kind == "yarn" else 0.0,
    )


def llama_like_specs(cfg: ModelConfig) -> list[WeightSpec]:
    """Tensors of a llama-style decoder: pre-norm attention + SwiGLU FFN (or a mixture of experts),
    optional biases / QK norm."""
    E, D, F = cfg.n_embd, cfg.head_dim, cfg.n_ff
    q_out, kv_out = cfg.n_head * D, cfg.n_head_kv * D
    specs = [
        WeightSpec("token_embd.weight", "token_embd", None, (cfg.n_vocab, E)),
        WeightSpec("output_norm.weight", "output_norm", None, (E,)),
    ]
    if not cfg.tied_output:
        specs.append(WeightSpec("output.weight", "output", None, (cfg.n_vocab, E)))
    specs.append(WeightSpec("rope_freqs.weight", "rope_freqs", None, (cfg.rope_dim // 2,), optional=True))
    for i in range(cfg.n_layer):
        b = f"blk.{i}."
        specs += [
            WeightSpec(b + "attn_norm.weight", "attn_norm", i, (E,)),
            WeightSpec(b + "attn_q.weight", "q", i, (q_out, E)),
            WeightSpec(b + "attn_k.weight", "k", i, (kv_out, E)),
            WeightSpec(b + "attn_v.weight", "v", i, (kv_out, E)),
            WeightSpec(b + "attn_output.weight", "o", i, (E, q_out)),
        ]
        if cfg.qkv_bias:
            specs += [
                WeightSpec(b + "attn_q.bias", "q_bias", i, (q_out,)),
                WeightSpec(b + "attn_k.bias", "k_bias", i, (kv_out,)),
                WeightSpec(b + "attn_v.bias", "v_bias", i, (kv_out,)),
            ]
        if cfg.qk_norm:
            specs += [
                WeightSpec(b + "attn_q_norm.weight", "q_norm", i, (D,)),
                WeightSpec(b + "attn_k_norm.weight", "k_norm", i, (D,)),
            ]
        specs.append(WeightSpec(b + "ffn_norm.weight", "ffn_norm", i, (E,)))
        specs += moe_specs(cfg, i) if cfg.is_moe(i) else [
            WeightSpec(b + "ffn_gate.weight", "gate", i, (F, E)),
            WeightSpec(b + "ffn_up.weight", "up", i, (F, E)),
            WeightSpec(b + "ffn_down.weight", "down", i, (E, F)),
        ]
    return specs


def moe_specs(cfg: ModelConfig, i: int) -> list[WeightSpec]:
    """A mixture-of-experts FFN's tensors as llama.cpp names them (GGUF ne [n_embd, n_ff_exp, n_expert]
    is numpy (n_expert, n_ff_exp, n_embd)), with the shared expert where the config has one."""
    b, E, X, F = f"blk.{i}.", cfg.n_embd, cfg.n_expert, cfg.n_ff_exp
    specs = [
        WeightSpec(b + "ffn_gate_inp.weight", "router", i, (X, E)),
        WeightSpec(b + "ffn_gate_exps.weight", "gate_exps", i, (X, F, E)),
        WeightSpec(b + "ffn_up_exps.weight", "up_exps", i, (X, F, E)),
        WeightSpec(b + "ffn_down_exps.weight", "down_exps", i, (X, E, F)),
    ]
    if cfg.expert_sel_bias:
        specs.append(WeightSpec(b + "exp_probs_b.bias", "expert_sel_bias", i, (X,)))
    if cfg.n_ff_shexp:
        S = cfg.n_ff_shexp
        if cfg.shexp_gated:
            specs.append(WeightSpec(b + "ffn_gate_inp_shexp.weight", "router_shexp", i, (E,)))
        specs += [
            WeightSpec(b + "ffn_gate_shexp.weight", "gate_shexp", i, (S, E)),
            WeightSpec(b + "ffn_up_shexp.weight", "up_shexp", i, (S, E)),
            WeightSpec(b + "ffn_down_shexp.weight", "down_shexp", i, (E, S)),
        ]
    return specs


class ModelFile:
    """A GGUF model opened and checked: config, weight specs, memory-mapped tensors."""

    def __init__(self, path: Path, gguf_file: GGUFFile, config: ModelConfig,
                 weights: dict[str, WeightSpec]):
        self.path = path
        self.gguf = gguf_file
        self.config = config
        self.metadata = gguf_file.metadata
        self.weights = weights

    def tensor_type(self, name: str) -> GGMLQuantizationType:
        return self.gguf.tensor_type(name)

    def raw(self, name: str) -> np.ndarray:
        """The memory-mapped data as stored (no copy): uint8 blocks, or f32/f16 elements."""
        return self.gguf.tensor_data(name)

    def dequantize(self, name: str) -> np.ndarray:
        """float32 copy with shape WeightSpec.shape."""
        raw, qtype = self.raw(name), self.tensor_type(name)
        # Every load converts the norm weights, stored as F32 (or F16 / BF16): done here, so that
        # loading a model does not import the `gguf` package (start-up time) for them.
        if qtype == GGMLQuantizationType.F32:
            data = raw
        elif qtype == GGMLQuantizationType.F16:
            data = raw.astype(np.float32)
        elif qtype == GGMLQuantizationType.BF16:     # bfloat16: the high half of a float32
            data = (np.ascontiguousarray(raw).view(np.uint16).astype(np.uint32) << 16).view(np.float32)
        else:
            from gguf.quants import dequantize

            data = dequantize(raw, qtype)
        return np.asarray(data, dtype=np.float32).reshape(self.weights[name].shape)

    def layer_weights(self, layer: int | None) -> dict[str, WeightSpec]:
        """role -> spec for one layer (None: the global tensors)."""
        return {s.role: s for s in self.weights.values() if s.layer == layer}

    def __repr__(self) -> str:
        c = self.config
        return (f"ModelFile({self.path.name}: {c.arch}, {c.n_layer} layers, dim {c.n_embd}, "
                f"{c.n_head}/{c.n_head_kv} heads, ffn {c.n_ff}, vocab {c.n_vocab})")
