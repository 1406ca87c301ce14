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

import gguf
import numpy as np

from ..errors import LlamavkError
from ..gguf_file import GGUFFile

ROLES = (
    "token_embd", "output_norm", "output",
    "attn_norm", "q", "k", "v", "o", "q_bias", "k_bias", "v_bias", "q_norm", "k_norm",
    "ffn_norm", "gate", "up", "down",
    "rope_freqs",  # optional Llama-3 style per-frequency divisors (n_rot/2,), shared by all layers
)


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

    @property
    def n_gqa(self) -> int:
        """Query heads per KV head."""
        return self.n_head // self.n_head_kv


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
                  qk_norm: bool) -> ModelConfig:
    """The hyper-parameters shared by llama-like architectures, read the way llama.cpp reads them."""
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
    n_ff = m.require("{arch}.feed_forward_length")
    if isinstance(n_ff, list):  # per-layer list in some converters; llama-likes use one value
        if not n_ff or any(v != n_ff[0] for v in n_ff):
            raise m._bad("{arch}.feed_forward_length", n_ff, f"one value for all layers of a {arch} model")
        n_ff = n_ff[0]          # its type and range: check_config
    else:
        n_ff = m.count("{arch}.feed_forward_length")
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
    ))


def check_config(cfg: ModelConfig) -> ModelConfig:
    """Invariants every architecture's config must hold, whatever the metadata said (values that
    came from defaults included): one-line errors instead of a crash or garbage later."""
    for name in ("n_vocab", "n_embd", "n_layer", "n_head", "n_head_kv", "head_dim", "n_ff", "n_ctx_train",
                 "rope_dim"):
        v = getattr(cfg, name)
        if not isinstance(v, int) or isinstance(v, bool) or not 1 <= v <= MAX_COUNT:
            raise LlamavkError(f"bad GGUF metadata: {cfg.arch} model with {name} = {v!r}")
    if cfg.n_head % cfg.n_head_kv:
        raise LlamavkError(f"{cfg.arch}: head_count {cfg.n_head} is not a multiple of head_count_kv "
                           f"{cfg.n_head_kv}")
    if cfg.rope_dim % 2 or cfg.rope_dim > cfg.head_dim:
        raise LlamavkError(f"bad GGUF metadata: {cfg.arch} rope.dimension_count {cfg.rope_dim} must be "
                           f"even and at most the head size {cfg.head_dim}")
    for name in ("rms_eps", "rope_base"):
        v = getattr(cfg, name)
        if not math.isfinite(v) or v <= 0:
            raise LlamavkError(f"bad GGUF metadata: {cfg.arch} model with {name} = {v!r}")
    return cfg


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
    """Tensors of a llama-style decoder: pre-norm attention + SwiGLU FFN, optional biases / QK norm."""
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
        specs += [
            WeightSpec(b + "ffn_norm.weight", "ffn_norm", i, (E,)),
            WeightSpec(b + "ffn_gate.weight", "gate", i, (F, E)),
            WeightSpec(b + "ffn_up.weight", "up", i, (F, E)),
            WeightSpec(b + "ffn_down.weight", "down", i, (E, F)),
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

    def tensor_type(self, name: str) -> gguf.GGMLQuantizationType:
        return self.gguf.tensor_type(name)

    def raw(self, name: str) -> np.ndarray:
        """The memory-mapped data as stored (no copy): uint8 blocks, or f32/f16 elements."""
        return self.gguf.tensor_data(name)

    def dequantize(self, name: str) -> np.ndarray:
        """float32 copy with shape WeightSpec.shape."""
        data = gguf.quants.dequantize(self.raw(name), self.tensor_type(name))
        return np.asarray(data, dtype=np.float32).reshape(self.weights[name].shape)

    def layer_weights(self, layer: int | None) -> dict[str, WeightSpec]:
        """role -> spec for one layer (None: the global tensors)."""
        return {s.role: s for s in self.weights.values() if s.layer == layer}

    def __repr__(self) -> str:
        c = self.config
        return (f"ModelFile({self.path.name}: {c.arch}, {c.n_layer} layers, dim {c.n_embd}, "
                f"{c.n_head}/{c.n_head_kv} heads, ffn {c.n_ff}, vocab {c.n_vocab})")
