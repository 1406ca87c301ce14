"""RoPE's context parameters from the command line (llama.cpp's --rope-freq-base, --rope-freq-scale,
--rope-scale, --rope-scaling, --yarn-orig-ctx, --yarn-ext-factor, --yarn-attn-factor, --yarn-beta-fast,
--yarn-beta-slow), resolved against the model's as llama_context resolves them:

- base: the option's where given (not 0), else the model's;
- frequency scale: the option's (--rope-scale N is 1/N) where given, else the model's (1 without
  scaling metadata); --rope-scaling none forces 1;
- the scaling type: the option's, else the model's (linear where the file names none);
- YaRN's blend (ext factor): the option's where not negative, else 1 for yarn and 0 otherwise --
  whatever the type, a non-zero blend is YaRN's ramp (ggml_rope_ext takes it as given);
- YaRN's original context: the option's where not 0, else the model's, else its training context;
- the correction betas: the options' where not negative, else the model's (32 and 1 by default);
- the attention factor (cos and sin multiplied by it): with YaRN's blend off, the option's where not
  negative (else 1) times the model's; with it on, the model's alone -- llama_context replaces the
  option by the scale's own mscale, which the kernels apply as ggml does (1 + 0.1 ln(1 / scale)).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from .errors import UsageError
from .models.base import ModelConfig, RopeScaling

SCALING_TYPES = ("none", "linear", "yarn")


@dataclass(frozen=True)
class RopeOptions:
    freq_base: float = 0.0        # 0: the model's
    freq_scale: float = 0.0       # 0: the model's
    scaling: str | None = None    # none | linear | yarn; None: the model's
    yarn_orig_ctx: int = 0        # 0: the model's
    yarn_ext_factor: float = -1.0  # negative: 1 for yarn, else 0
    yarn_beta_fast: float = -1.0  # negative: the model's
    yarn_beta_slow: float = -1.0
    yarn_attn_factor: float = -1.0  # negative: 1 (ignored where YaRN's blend is on)

    def __post_init__(self):
        if self.scaling is not None and self.scaling not in SCALING_TYPES:
            raise UsageError(f"--rope-scaling {self.scaling!r}: expected none, linear or yarn")
        if self.freq_base < 0 or self.freq_scale < 0 or self.yarn_orig_ctx < 0:
            raise UsageError("--rope-freq-base, --rope-freq-scale and --yarn-orig-ctx cannot be negative")

    @property
    def given(self) -> bool:
        return self != RopeOptions()


def rope_options(freq_base: float = 0.0, freq_scale: float = 0.0, scale: float = 0.0, **kw) -> RopeOptions:
    """The options from run's / perplexity's flags (--rope-scale N: a frequency scale of 1/N)."""
    if scale < 0:
        raise UsageError("--rope-scale cannot be negative")
    if scale and not freq_scale:
        freq_scale = 1.0 / scale
    return RopeOptions(freq_base=freq_base, freq_scale=freq_scale, **kw)


def apply_rope_options(cfg: ModelConfig, opts: RopeOptions) -> ModelConfig:
    """The configuration with RoPE's parameters resolved from the options and the model's."""
    if not opts.given:
        return cfg
    s = cfg.rope_scaling
    base = opts.freq_base or cfg.rope_base
    kind = opts.scaling or (s.type if s is not None else "linear")
    freq_scale = opts.freq_scale or (1.0 / s.factor if s is not None else 1.0)
    if kind == "none":
        freq_scale = 1.0
    ext = opts.yarn_ext_factor if opts.yarn_ext_factor >= 0 else (1.0 if kind == "yarn" else 0.0)
    attn = s.attn_factor if s is not None else 1.0
    if ext == 0.0 and opts.yarn_attn_factor >= 0:
        attn *= opts.yarn_attn_factor
    if freq_scale == 1.0 and ext == 0.0 and attn == 1.0:
        return dataclasses.replace(cfg, rope_base=base, rope_scaling=None)
    scaling = RopeScaling(
        type="yarn" if ext != 0.0 else "linear",
        factor=1.0 / freq_scale,
        orig_ctx=opts.yarn_orig_ctx or (s.orig_ctx if s is not None and s.orig_ctx else cfg.n_ctx_train),
        attn_factor=attn,
        beta_fast=opts.yarn_beta_fast if opts.yarn_beta_fast >= 0 else (s.beta_fast if s is not None else 32.0),
        beta_slow=opts.yarn_beta_slow if opts.yarn_beta_slow >= 0 else (s.beta_slow if s is not None else 1.0),
        ext_factor=ext)
    return dataclasses.replace(cfg, rope_base=base, rope_scaling=scaling)
