"""Random-weight GGUF models of any supported architecture, written fast.

`write_synthetic_model(path, preset, qtype, arch, seed)` writes a complete, loadable GGUF: metadata, a
small SentencePiece-style tokenizer, and random weights. Quantized weights are random blocks built
directly as bytes (random payload, f16 scales chosen so each matrix has std ~ 1/sqrt(in_features)),
never quantized from floats. To write a 70B file at disk speed, each (type, scale) gets one pool of
ready blocks (at most POOL_BYTES) and tensors are streamed out of it sequentially, wrapping around:
models smaller than the pool get fully independent weights, larger ones repeat the pool's bytes.
Nothing but the pools is held in memory.

Presets 1b/8b/32b/70b are exactly the shapes of SPEC §10's llama.cpp reference runs (vocab 32000, rope
base 500000, separate output matrix, norms f32, every 2-D weight of the chosen type).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path

import gguf
import numpy as np
from gguf import GGMLQuantizationType as T

from .errors import LlamavkError
from .models import ARCHITECTURES, arch_module, config_from_metadata
from .models.base import ModelConfig, WeightSpec
from .quant import quant_info, qtype_from_name, tensor_nbytes

SYNTHETIC_TYPES = ("f32", "f16", "q8_0", "q4_0", "q4_1", "q5_0", "q5_1", "q2_k", "q3_k", "q4_k", "q5_k",
                   "q6_k", "iq4_nl", "iq4_xs", "mxfp4", "iq2_xxs", "iq2_xs", "iq2_s", "iq3_xxs", "iq3_s", "iq1_s",
                   "iq1_m", "tq1_0", "tq2_0")
# Mixes as llama-quantize writes them: name -> (the experts' type, every other matrix's). mxfp4_moe
# (LLAMA_FTYPE_MOSTLY_MXFP4_MOE, the released gpt-oss GGUFs' layout): MXFP4 experts, Q8_0 attention,
# embeddings and output; the router and biases f32 as always.
SYNTHETIC_MIXES = {"mxfp4_moe": ("mxfp4", "q8_0")}
# The K-quant _M mixes (Q4_K_M, Q5_K_M: most published K-quant files): name -> the base type; Q6_K for
# the output matrix and, on the layers that get more bits (_more_bits), attn_v and the FFN's down
# matrices (dense, experts', shared expert's). llama-quantize's main rule for these mixes; its special
# cases (8-expert models, grouped-query attention at narrower types) are left out.
SYNTHETIC_KM_MIXES = {"q4_k_m": "q4_k", "q5_k_m": "q5_k"}
KM_WIDER_ROLES = ("v", "down", "down_exps", "down_shexp")
SYNTHETIC_NAMES = SYNTHETIC_TYPES + tuple(SYNTHETIC_MIXES) + tuple(SYNTHETIC_KM_MIXES)
MOE_ARCHS = ("qwen3moe", "qwen35moe", "qwen2moe", "qwen3next", "gpt-oss", "glm4moe")
HYBRID_ARCHS = ("qwen35", "qwen35moe", "qwen3next")    # Gated DeltaNet + gated attention (models/hybrid.py)
POOL_BYTES = 64 << 20


@dataclass(frozen=True)
class Preset:
    n_embd: int
    n_layer: int
    n_ff: int
    n_head: int
    n_head_kv: int
    n_vocab: int = 32000
    head_dim: int | None = None   # None: n_embd // n_head (tiny qwen3 uses 2x that, as Qwen3 does)
    n_ctx: int = 4096
    rope_base: float = 500000.0
    rms_eps: float = 1e-5
    tied_output: bool = False
    arch: str = "llama"           # the architecture a synthetic:PRESET-TYPE name without -ARCH gets
    n_expert: int = 0             # mixture of experts (arch qwen3moe): experts, used per token, width
    n_expert_used: int = 0
    n_ff_exp: int = 0
    n_ff_shexp: int = 0           # a shared expert of this width (0: none)
    # glm4moe: dense FFN layers before the experts' (n_layer counts them), multi-token-prediction
    # blocks after the run ones (n_layer counts them too: the file's block_count), the router's scale
    dense_lead: int = 0
    nextn: int = 0
    expert_weights_scale: float = 1.0
    qk_norm: bool = False         # glm4moe: per-head Q/K norms (GLM-4.5's 355B; the file's tensors decide)
    # Gated DeltaNet hybrids (arch qwen35, qwen35moe): key head size, key heads, value heads, conv taps,
    # every full_attention_interval-th layer attends; RoPE on rope_dim dims of each head (None: all)
    ssm_d_state: int = 0
    ssm_n_group: int = 0
    ssm_dt_rank: int = 0
    ssm_d_conv: int = 4
    full_attention_interval: int = 4
    ssm_fused_in: bool = True     # qwen3next: q|k|v|z in ssm_in (most published files), else attn_qkv + attn_gate
    rope_dim: int | None = None
    sliding_window: int = 0       # gemma3: positions a local layer sees (0: every layer global)
    swa_pattern: int = 6          # gemma3: every swa_pattern-th layer is global
    logit_softcap: float = 0.0    # gemma3: final logit soft-capping (0: none)
    query_pre_attn_scalar: int = 0  # gemma3: q.k scaled by 1/sqrt(this) (0: not in the file)
    # Peaked models (the llama.cpp oracle tests): random weights give near-uniform attention and
    # near-uniform token distributions, which a wrong RoPE or a missing bias hardly moves. qk_gain
    # multiplies q and k (their matrices and biases; with QK norm, the norm weights), so attention
    # scores grow by qk_gain^2; output_gain multiplies the output matrix, so logits grow by it.
    qk_gain: float = 1.0
    output_gain: float = 1.0
    # RoPE scaling written into the file ("": none; "yarn", "linear"), mistral3's YaRN multiplier and
    # attention temperature (0: not in the file)
    rope_scaling: str = ""
    rope_factor: float = 1.0
    rope_orig_ctx: int = 0
    yarn_log_mul: float = 0.0
    attn_temp_scale: float = 0.0


PRESETS: dict[str, Preset] = {
    # tests: small, rows not powers of two (vocab 500, ffn 160); K-quants switch to dim 256/ffn 512
    "tiny": Preset(n_embd=64, n_layer=2, n_ff=160, n_head=4, n_head_kv=2, n_vocab=500, n_ctx=512),
    # tests: 10 experts, 3 per token, expert rows 96 (not a multiple of 64); K-quants: dim 256, 256
    "tiny-moe": Preset(n_embd=64, n_layer=2, n_ff=160, n_head=4, n_head_kv=2, n_vocab=500, n_ctx=512,
                       arch="qwen3moe", n_expert=10, n_expert_used=3, n_ff_exp=96),
    "1b": Preset(n_embd=2048, n_layer=16, n_ff=8192, n_head=32, n_head_kv=8),
    "8b": Preset(n_embd=4096, n_layer=32, n_ff=14336, n_head=32, n_head_kv=8),
    "32b": Preset(n_embd=5120, n_layer=64, n_ff=27648, n_head=40, n_head_kv=8),
    "70b": Preset(n_embd=8192, n_layer=80, n_ff=28672, n_head=64, n_head_kv=8),
    # Qwen3-30B-A3B's shape (SPEC §10): 128 experts of 768, 8 per token, head_dim 128, vocab 151936
    "30b-a3b": Preset(n_embd=2048, n_layer=48, n_ff=6144, n_head=32, n_head_kv=4, n_vocab=151936,
                      head_dim=128, rope_base=1e6, rms_eps=1e-6, arch="qwen3moe", n_expert=128,
                      n_expert_used=8, n_ff_exp=768),
    # tests: the qwen35 hybrids, 3 DeltaNet layers then gated attention; 2 key heads and 4 value heads
    # of 16 (the tiled value-head order exercised), attention heads of 32 with RoPE on 8 dims
    "tiny-qwen35": Preset(n_embd=64, n_layer=4, n_ff=160, n_head=4, n_head_kv=2, n_vocab=500, n_ctx=512,
                          head_dim=32, rope_dim=8, rope_base=1e7, rms_eps=1e-6, arch="qwen35", ssm_d_state=16,
                          ssm_n_group=2, ssm_dt_rank=4),
    "tiny-qwen35moe": Preset(n_embd=64, n_layer=4, n_ff=160, n_head=4, n_head_kv=2, n_vocab=500, n_ctx=512,
                             head_dim=32, rope_dim=8, rope_base=1e7, rms_eps=1e-6, arch="qwen35moe",
                             ssm_d_state=16, ssm_n_group=2, ssm_dt_rank=4, n_expert=10, n_expert_used=3,
                             n_ff_exp=96, n_ff_shexp=64),
    # tests: qwen3next (Qwen3-Next), the tiny-qwen35moe shape: 2 key heads, 4 value heads side by side
    "tiny-qwen3next": Preset(n_embd=64, n_layer=4, n_ff=160, n_head=4, n_head_kv=2, n_vocab=500, n_ctx=512,
                             head_dim=32, rope_dim=8, rope_base=1e7, rms_eps=1e-6, arch="qwen3next",
                             ssm_d_state=16, ssm_n_group=2, ssm_dt_rank=4, n_expert=10, n_expert_used=3,
                             n_ff_exp=96, n_ff_shexp=64),
    # Qwen3.5-0.8B's published shape: 24 layers (18 DeltaNet, 16/16 heads of 128; 6 attention, 8/2 heads
    # of 256, RoPE on 64 dims), ffn 3584, vocab 248320, tied embeddings
    "0.8b": Preset(n_embd=1024, n_layer=24, n_ff=3584, n_head=8, n_head_kv=2, n_vocab=248320, n_ctx=262144,
                   head_dim=256, rope_dim=64, rope_base=1e7, rms_eps=1e-6, tied_output=True, arch="qwen35",
                   ssm_d_state=128, ssm_n_group=16, ssm_dt_rank=16),
    # gpt-oss-20b's published shape: dim 2880 (not a multiple of 256), 24 layers, 64 query / 8 KV heads of
    # 64, 32 experts of 2880, 4 used, windows of 128 on the even layers, YaRN x32 from 4096, vocab 201088
    "gpt-oss-20b": Preset(n_embd=2880, n_layer=24, n_ff=2880, n_head=64, n_head_kv=8, n_vocab=201088,
                          n_ctx=131072, head_dim=64, rope_base=150000.0, arch="gpt-oss", n_expert=32,
                          n_expert_used=4, n_ff_exp=2880, sliding_window=128, rope_scaling="yarn",
                          rope_factor=32.0, rope_orig_ctx=4096),
    # GLM-4.5-Air's published shape: dim 4096, 46 layers (the first dense, ffn 10944) + 1 NextN block,
    # 96 query / 8 KV heads of 128 with RoPE on 64 dims, 128 experts of 1408, 8 used + a shared expert
    # of 1408, vocab 151552, rope base 1e6 (make_synthetic_model.py --layers N: N - 1 of its layers and the
    # NextN block; GLM-4.5's 355B: 92 + 1 layers, 160 experts, QK norms)
    "glm-4.5-air": Preset(n_embd=4096, n_layer=47, n_ff=10944, n_head=96, n_head_kv=8, n_vocab=151552,
                          n_ctx=131072, head_dim=128, rope_dim=64, rope_base=1e6, arch="glm4moe", n_expert=128,
                          n_expert_used=8, n_ff_exp=1408, n_ff_shexp=1408, dense_lead=1, nextn=1),
    # Qwen3.6-35B-A3B's (= Qwen3.5-35B-A3B's) published shape: dim 2048, 40 layers (30 DeltaNet, 16 key /
    # 32 value heads of 128, 4 taps; 10 attention, 16/2 heads of 256, RoPE on 64), 256 experts of 512,
    # 8 used + a shared expert of 512, vocab 248320, rope base 1e7, router f32 (SPEC §10's MoE rules)
    "35b-a3b": Preset(n_embd=2048, n_layer=40, n_ff=0, n_head=16, n_head_kv=2, n_vocab=248320, n_ctx=262144,
                      head_dim=256, rope_dim=64, rope_base=1e7, rms_eps=1e-6, arch="qwen35moe", n_expert=256,
                      n_expert_used=8, n_ff_exp=512, n_ff_shexp=512, ssm_d_state=128, ssm_n_group=16,
                      ssm_dt_rank=32),
}
TINY_KQUANT = dict(n_embd=256, n_ff=512)
TINY_PRESETS = ("tiny", "tiny-moe", "tiny-qwen35", "tiny-qwen35moe", "tiny-qwen3next")


def tiny_preset(arch: str) -> str:
    """The test preset of an architecture."""
    if arch in HYBRID_ARCHS:
        return f"tiny-{arch}"
    return "tiny-moe" if arch in MOE_ARCHS else "tiny"
# tiny gemma3: local layers see 24 positions (test prompts are longer), every other layer is global
TINY_GEMMA3 = dict(sliding_window=24, swa_pattern=2)
# tiny gpt-oss: its even layers see 24 positions (llama.cpp requires the key for this architecture)
TINY_GPT_OSS = dict(sliding_window=24)
# tiny glm4moe: a dense layer, two of experts and a NextN block; a shared expert. Router weights
# unscaled, as GLM-4.5-Air's: GLM-4.5's 2.5 magnifies every pick that rounding flips, and llama.cpp's
# 8-bit activations flip enough that its Q4_0 scores drift from llamavk's by up to 0.28 in ln PPL over
# 12 seeds (0.07 unscaled; f32 the same to 1e-4 either way)
TINY_GLM4MOE = dict(n_layer=4, dense_lead=1, nextn=1)

# llama_ftype of a file whose every matrix is that type (38: MXFP4_MOE). Where llama.cpp has several
# mixes of one K-quant (Q3_K_S/M/L, Q5_K_S/M), the one llama.cpp's loader guesses from the most common
# tensor type when general.file_type is absent: Q2_K 10, Q3_K_M 12, Q4_K_M 15, Q5_K_M 17.
_FILE_TYPE = {T.F32: 0, T.F16: 1, T.Q4_0: 2, T.Q4_1: 3, T.Q8_0: 7, T.Q5_0: 8, T.Q5_1: 9, T.Q2_K: 10,
              T.Q3_K: 12, T.Q4_K: 15, T.Q5_K: 17, T.Q6_K: 18, T.IQ4_NL: 25, T.IQ4_XS: 30, T.MXFP4: 38,
              T.IQ2_XXS: 19, T.IQ2_XS: 20, T.IQ3_XXS: 23, T.IQ1_S: 24, T.IQ3_S: 26, T.IQ2_S: 28, T.IQ1_M: 31,
              T.TQ1_0: 36, T.TQ2_0: 37}
# Root mean square of the IQ4_NL levels and of MXFP4's doubled E2M1 values (quants.glsl's tables),
# for scales that give random blocks the requested std.
_IQ4NL_RMS, _MXFP4_RMS = 67.44, 5.852
# The lattice types' weight std for d = 1 with every other bit random, jitter included (sqrt(13/12) x
# the rms of gguf.quants.dequantize over 20,000 such blocks): d = std / this.
_LATTICE_RMS = {T.IQ2_XXS: 55.4, T.IQ2_XS: 58.2, T.IQ2_S: 58.7, T.IQ3_XXS: 148.3, T.IQ3_S: 146.0,
                T.IQ1_S: 7.48, T.IQ1_M: 7.50}


@dataclass(frozen=True)
class PlannedTensor:
    spec: WeightSpec
    qtype: T
    nbytes: int
    std: float          # matrices: the weights' target standard deviation; vectors: _vector's gain


@dataclass(frozen=True)
class SyntheticPlan:
    config: ModelConfig
    metadata: dict      # key -> value, all but general.architecture (the writer adds it)
    tensors: list[PlannedTensor]

    @property
    def total_bytes(self) -> int:
        return sum(t.nbytes for t in self.tensors)

    @property
    def n_params(self) -> int:
        return sum(int(np.prod(t.spec.shape)) for t in self.tensors)


# ----------------------------------------------------------------------------------------------
# plan: config, metadata and the tensor list, without writing anything (also the "dry run")
# ----------------------------------------------------------------------------------------------

def _more_bits(layer: int, n_layer: int) -> bool:
    """The layers a K-quant _M mix gives Q6_K: the first and last eighth, and every third between."""
    return layer < n_layer // 8 or layer >= 7 * n_layer // 8 or (layer - n_layer // 8) % 3 == 2


def synthetic_plan(preset: str = "tiny", qtype: str = "q4_0", arch: str | None = None,
                   **overrides) -> SyntheticPlan:
    """arch None: the preset's own (llama, or qwen3moe for the mixture-of-experts presets)."""
    if preset not in PRESETS:
        raise LlamavkError(f"unknown synthetic preset {preset!r}; choose one of {', '.join(PRESETS)}")
    if qtype.lower() not in SYNTHETIC_NAMES:
        raise LlamavkError(f"synthetic models support types {', '.join(SYNTHETIC_NAMES)}, not {qtype!r}")
    p = PRESETS[preset]
    arch = arch or p.arch
    arch_module(arch)  # unknown architecture -> error listing the supported ones
    if bool(p.n_expert) != (arch in MOE_ARCHS) or bool(p.ssm_d_state) != (arch in HYBRID_ARCHS):
        raise LlamavkError(f"synthetic preset {preset!r} does not fit architecture {arch!r} "
                           f"(mixture-of-experts presets go with {', '.join(MOE_ARCHS)}, DeltaNet hybrid "
                           f"presets with {', '.join(HYBRID_ARCHS)})")
    km = qtype.lower() in SYNTHETIC_KM_MIXES
    base = SYNTHETIC_KM_MIXES.get(qtype.lower(), qtype)
    expert_name, other_name = SYNTHETIC_MIXES.get(qtype.lower(), (base, base))
    wtype, otype = qtype_from_name(expert_name), qtype_from_name(other_name)
    info = max(quant_info(wtype), quant_info(otype), key=lambda i: i.block_size)
    if preset in TINY_PRESETS and info.block_size == 256:
        p = dataclasses.replace(p, **TINY_KQUANT, **({"n_ff_exp": 256} if p.n_expert else {}),
                                **({"n_ff_shexp": 256} if p.n_ff_shexp else {}),
                                **({"ssm_d_state": 64, "head_dim": 128, "rope_dim": 32} if p.ssm_d_state else {}))
    if preset in TINY_PRESETS and arch in ("qwen3", "qwen3moe", "gemma3"):
        p = dataclasses.replace(p, head_dim=2 * p.n_embd // p.n_head)
    if arch == "qwen2moe" and not p.n_ff_shexp:      # its shared expert is not optional
        p = dataclasses.replace(p, n_ff_shexp=p.n_ff_exp)
    if preset in TINY_PRESETS and arch == "gemma3":
        p = dataclasses.replace(p, **TINY_GEMMA3)
    if preset in TINY_PRESETS and arch == "gpt-oss":
        p = dataclasses.replace(p, **TINY_GPT_OSS)
    if preset in TINY_PRESETS and arch == "glm4moe":
        p = dataclasses.replace(p, **TINY_GLM4MOE, n_ff_shexp=p.n_ff_shexp or p.n_ff_exp)
    unknown = set(overrides) - {f.name for f in dataclasses.fields(Preset)}
    if unknown:
        raise LlamavkError(f"unknown synthetic model overrides: {', '.join(sorted(unknown))}")
    p = dataclasses.replace(p, **overrides)
    head_dim = p.head_dim or p.n_embd // p.n_head
    if arch == "glm4moe" and p.rope_dim is None:     # RoPE on half of each head, as the released models
        p = dataclasses.replace(p, rope_dim=head_dim // 2)
    for what, n in (("n_embd", p.n_embd), ("n_ff", p.n_ff), ("n_head*head_dim", p.n_head * head_dim),
                    ("n_ff_exp", p.n_ff_exp), ("n_ff_shexp", p.n_ff_shexp),
                    ("ssm value heads x head size", p.ssm_dt_rank * p.ssm_d_state)):
        if n % info.block_size:
            raise LlamavkError(f"{what} = {n} is not a multiple of the {info.name} block size "
                               f"{info.block_size}")
    if p.n_vocab < 260:
        raise LlamavkError("synthetic models need n_vocab >= 260 (3 control + 256 byte tokens + 1)")

    meta = _metadata(arch, p, head_dim, wtype, preset)
    names = [] if p.tied_output else ["output.weight"]
    if arch == "qwen3next" and p.ssm_fused_in:     # the layout models/qwen3next.py picks by tensor names
        names.append("blk.0.ssm_in.weight")
    if arch == "glm4moe" and p.qk_norm:            # likewise models/glm4moe.py's Q/K norms
        names.append("blk.0.attn_q_norm.weight")
    cfg = config_from_metadata({"general.architecture": arch, **meta}, names)
    E = cfg.n_embd
    std_by_role = {
        # gemma3 multiplies its embedding by sqrt(n_embd): rows of std 1 after that, as its blocks' normed outputs
        "token_embd": 1 / np.sqrt(E) if arch == "gemma3" else 1.0, "output": 2.0 / np.sqrt(E),
        "q": 1 / np.sqrt(E), "k": 1 / np.sqrt(E), "v": 1 / np.sqrt(E),
        "o": 1 / np.sqrt(cfg.n_head * cfg.head_dim),
        "gate": 1 / np.sqrt(E), "up": 1 / np.sqrt(E), "down": 1 / np.sqrt(max(cfg.n_ff, 1)),
        # router logits of std ~1.5: distinct experts win per token, none takes every token
        "router": 1.5 / np.sqrt(E), "gate_exps": 1 / np.sqrt(E), "up_exps": 1 / np.sqrt(E),
        "down_exps": 1 / np.sqrt(max(cfg.n_ff_exp, 1)), "gate_shexp": 1 / np.sqrt(E),
        "up_shexp": 1 / np.sqrt(E), "down_shexp": 1 / np.sqrt(max(cfg.n_ff_shexp, 1)),
        # DeltaNet: convolution taps of std 0.5 (d_conv of them), products as above
        "ssm_qkv": 1 / np.sqrt(E), "ssm_z": 1 / np.sqrt(E), "ssm_beta": 1 / np.sqrt(E),
        "ssm_alpha": 1 / np.sqrt(E), "ssm_conv": 0.5, "ssm_in": 1 / np.sqrt(E), "ssm_ba": 1 / np.sqrt(E),
        "ssm_out": 1 / np.sqrt(max(cfg.ssm_dt_rank * cfg.ssm_d_state, 1)),
        # gpt-oss's per-expert biases (f32 tables): gate and up ones of std 4, so that swiglu_oai's
        # limit of 7 clips some of their sums
        "gate_exps_bias": 4.0, "up_exps_bias": 4.0, "down_exps_bias": 0.1,
    }
    std_by_role["output"] *= p.output_gain
    if not cfg.qk_norm:     # with QK norm, the norm weights carry the gain
        std_by_role["q"] *= p.qk_gain
        std_by_role["k"] *= p.qk_gain
    tensors = []
    if (p.nextn or p.dense_lead) and arch != "glm4moe":
        raise LlamavkError(f"synthetic {arch} models have no NextN blocks or leading dense layers (glm4moe has)")
    file_only = arch_module(arch).nextn_specs(cfg, p.nextn) if p.nextn else []   # glm4moe's NextN blocks
    std_by_role["nextn"] = 1 / np.sqrt(2 * E)
    for spec in arch_module(arch).weight_specs(cfg) + file_only:
        if spec.optional:
            continue
        # every matrix of the chosen type (a mix: the experts' or the others') but the router and the
        # convolution taps, which stay f32 as converters write them
        t = (wtype if spec.role.endswith("_exps") else otype) if len(spec.shape) >= 2 and \
            spec.role not in ("router", "ssm_conv") and not spec.role.endswith("_bias") else T.F32
        if km and t != T.F32 and (spec.role == "output" or (
                spec.role in KM_WIDER_ROLES and _more_bits(spec.layer or 0, cfg.n_layer))):
            t = T.Q6_K
        scale = std_by_role.get(spec.role, 0.0) if len(spec.shape) >= 2 else \
            (p.qk_gain if spec.role in ("q_norm", "k_norm", "q_bias", "k_bias") else 1.0)
        tensors.append(PlannedTensor(spec, t, tensor_nbytes(t, spec.shape), float(scale)))
    return SyntheticPlan(cfg, meta, tensors)


def _metadata(arch: str, p: Preset, head_dim: int, wtype: T, preset: str) -> dict:
    tokens, scores, types = synthetic_vocab(p.n_vocab)
    meta = {
        "general.type": "model",
        "general.name": f"synthetic-{preset}-{wtype.name.lower()}",
        "general.file_type": _FILE_TYPE.get(wtype, 0),
        "general.quantization_version": gguf.GGML_QUANT_VERSION,
        f"{arch}.vocab_size": p.n_vocab,
        f"{arch}.context_length": p.n_ctx,
        f"{arch}.embedding_length": p.n_embd,
        f"{arch}.block_count": p.n_layer,
        f"{arch}.feed_forward_length": p.n_ff,
        f"{arch}.attention.head_count": p.n_head,
        f"{arch}.attention.head_count_kv": p.n_head_kv,
        f"{arch}.attention.layer_norm_rms_epsilon": p.rms_eps,
        f"{arch}.rope.freq_base": p.rope_base,
        f"{arch}.rope.dimension_count": p.rope_dim or head_dim,
    }
    if p.rope_scaling:
        meta.update({f"{arch}.rope.scaling.type": p.rope_scaling, f"{arch}.rope.scaling.factor": p.rope_factor})
        if p.rope_orig_ctx:
            meta[f"{arch}.rope.scaling.original_context_length"] = p.rope_orig_ctx
    if p.yarn_log_mul:
        meta[f"{arch}.rope.scaling.yarn_log_multiplier"] = p.yarn_log_mul
    if p.attn_temp_scale:
        meta[f"{arch}.attention.temperature_scale"] = p.attn_temp_scale
    if p.n_ff == 0:            # a mixture of experts without a dense FFN width
        del meta[f"{arch}.feed_forward_length"]
    if p.n_expert:
        meta.update({f"{arch}.expert_count": p.n_expert, f"{arch}.expert_used_count": p.n_expert_used,
                     f"{arch}.expert_feed_forward_length": p.n_ff_exp})
        if p.n_ff_shexp and arch != "glm4moe":       # glm4moe: shared experts of the experts' width (below)
            meta[f"{arch}.expert_shared_feed_forward_length"] = p.n_ff_shexp
    if arch == "glm4moe":
        meta.update({f"{arch}.expert_shared_count": p.n_ff_shexp // p.n_ff_exp,
                     f"{arch}.leading_dense_block_count": p.dense_lead, f"{arch}.nextn_predict_layers": p.nextn,
                     f"{arch}.expert_gating_func": 2, f"{arch}.expert_weights_norm": True,
                     f"{arch}.expert_weights_scale": p.expert_weights_scale})
    if p.ssm_d_state:          # the DeltaNet layers, as llama.cpp's converter writes them
        meta.update({f"{arch}.ssm.conv_kernel": p.ssm_d_conv, f"{arch}.ssm.state_size": p.ssm_d_state,
                     f"{arch}.ssm.group_count": p.ssm_n_group, f"{arch}.ssm.time_step_rank": p.ssm_dt_rank,
                     f"{arch}.ssm.inner_size": p.ssm_dt_rank * p.ssm_d_state,
                     f"{arch}.full_attention_interval": p.full_attention_interval})
        if arch != "qwen3next":   # plain NEOX RoPE there, IMROPE's sections in Qwen3.5
            meta[f"{arch}.rope.dimension_sections"] = _rope_sections((p.rope_dim or head_dim) // 2)
    if head_dim != p.n_embd // p.n_head or arch in ("qwen3", "qwen3moe", "gemma3") + HYBRID_ARCHS:
        meta[f"{arch}.attention.key_length"] = head_dim
        meta[f"{arch}.attention.value_length"] = head_dim
    if arch == "gpt-oss":
        meta[f"{arch}.attention.sliding_window"] = p.sliding_window
    if arch == "gemma3":
        if p.sliding_window:
            meta[f"{arch}.attention.sliding_window"] = p.sliding_window
            meta[f"{arch}.attention.sliding_window_pattern"] = p.swa_pattern
        if p.logit_softcap:
            meta[f"{arch}.final_logit_softcapping"] = float(p.logit_softcap)
        if p.query_pre_attn_scalar:
            meta[f"{arch}.attention.query_pre_attn_scalar"] = p.query_pre_attn_scalar
    meta.update({
        "tokenizer.ggml.model": "llama",
        "tokenizer.ggml.pre": "default",
        "tokenizer.ggml.tokens": tokens,
        "tokenizer.ggml.scores": scores,
        "tokenizer.ggml.token_type": types,
        "tokenizer.ggml.unknown_token_id": 0,
        "tokenizer.ggml.bos_token_id": 1,
        "tokenizer.ggml.eos_token_id": 2,
        "tokenizer.ggml.add_bos_token": True,
        "tokenizer.ggml.add_eos_token": False,
        "tokenizer.ggml.add_space_prefix": True,
    })
    return meta


def _rope_sections(pairs: int) -> list[int]:
    """IMROPE sections covering `pairs` rotated pairs the way Qwen3.5's [11, 11, 10] covers 32."""
    t = -(-pairs // 3)
    h = -(-(pairs - t) // 2)
    return [t, h, pairs - t - h, 0]


def synthetic_vocab(n_vocab: int) -> tuple[list[str], list[float], list[int]]:
    """A SentencePiece-style vocabulary: <unk> <s> </s>, <0x00>..<0xFF>, then printable pieces.

    Pieces: "▁", single printable ASCII characters, "▁"+letter, then all 2- and 3-letter lowercase
    strings with and without "▁". Every piece can be built by merging shorter ones, so an SPM
    tokenizer reaches it. Scores decrease with id; token types: 1 normal, 2 unknown, 3 control, 6 byte.
    """
    tokens = ["<unk>", "<s>", "</s>"] + [f"<0x{b:02X}>" for b in range(256)]
    types = [2, 3, 3] + [6] * 256
    letters = "abcdefghijklmnopqrstuvwxyz"

    def pieces():
        yield "\u2581"
        yield from (chr(c) for c in range(33, 127))
        yield from ("\u2581" + c for c in letters)
        for n in (2, 3, 4):
            words = [""]
            for _ in range(n):
                words = [w + c for w in words for c in letters]
            for w in words:
                yield w
                yield "\u2581" + w

    gen = pieces()
    while len(tokens) < n_vocab:
        tokens.append(next(gen))
        types.append(1)
    scores = [0.0] * 259 + [-float(i) for i in range(n_vocab - 259)]
    return tokens[:n_vocab], scores[:n_vocab], types[:n_vocab]


# ----------------------------------------------------------------------------------------------
# random blocks
# ----------------------------------------------------------------------------------------------

# Every block's scales are multiplied by a jitter j ~ U(0.5, 1.5) (blocks of unequal magnitude, as in
# real weights): E[j^2] = 1 + 1/12. The divisors below are the RMS of a dequantized value for d = 1,
# this factor included, so d = j * std / divisor gives values of RMS std.
_JITTER_MS = 13 / 12
_F16_MIN_NORMAL = 2.0 ** -14


def _uniform_moments(n: int) -> tuple[float, float]:
    """Mean and mean square of an integer uniform on 0..n-1: (n-1)/2 and (n-1)(2n-1)/6."""
    return (n - 1) / 2, (n - 1) * (2 * n - 1) / 6


def _scale_min_rms(n_scale: int, n_q: int) -> float:
    """RMS of w = sc q - E[q] m (the super-block d = 1, dmin = E[q] d), jitter included, for sub-block
    scales sc and mins m uniform on 0..n_scale-1 and quants q uniform on 0..n_q-1, all independent.

    E[sc] = E[m], so E[w] = E[q] (E[sc] - E[m]) = 0 and E[w^2] = Var(sc q) + E[q]^2 Var(m) with
    Var(sc q) = E[sc^2] E[q^2] - (E[sc] E[q])^2. (Q4_K's divisors 269 and 66 are this for 64 and 16
    scale values, 16 quants.)"""
    s1, s2 = _uniform_moments(n_scale)
    q1, q2 = _uniform_moments(n_q)
    return float(np.sqrt(_JITTER_MS * (s2 * q2 - (s1 * q1) ** 2 + q1 ** 2 * (s2 - s1 ** 2))))


def _scale_bits(std: float, rms_of_bits, max_bits: int) -> int:
    """The most random bits (max_bits down to 1) of the sub-block scales for which the f16 super-block
    scale d = jitter * std / rms_of_bits(bits) stays a normal number at the smallest jitter (0.5):
    all bits for tiny models' stds, fewer for the small stds of large models (a subnormal d would
    lose precision, and real files rarely hold one)."""
    for bits in range(max_bits, 1, -1):
        if 0.5 * std / rms_of_bits(bits) >= _F16_MIN_NORMAL:
            return bits
    return 1


def _pack_k_scales(sc: np.ndarray, m: np.ndarray) -> np.ndarray:
    """Q4_K/Q5_K's 12 bytes of eight 6-bit scales and eight 6-bit mins (n, 8 each) per block: bytes 0-3
    the low 6 bits of sc[0:4] and the top 2 bits of sc[4:8], bytes 4-7 the same for m, bytes 8-11
    the low nibbles of sc[4:8] (low half) and m[4:8] (high half)."""
    sc, m = sc.astype(np.uint8), m.astype(np.uint8)
    return np.concatenate([sc[:, :4] | (sc[:, 4:] >> 4) << 6, m[:, :4] | (m[:, 4:] >> 4) << 6,
                           (sc[:, 4:] & 0x0F) | (m[:, 4:] & 0x0F) << 4], axis=1)


def _pack_q3_k_scales(s: np.ndarray) -> np.ndarray:
    """Q3_K's 12 bytes of sixteen 6-bit scales s (n, 16; stored as s, used as s - 32): byte i (0-7) holds
    the low nibbles of s[i] (low half) and s[i + 8] (high half); byte 8 + j holds the top 2 bits of
    s[j], s[j + 4], s[j + 8], s[j + 12] at bits 0-1, 2-3, 4-5, 6-7."""
    s = s.astype(np.uint8)
    low = (s[:, :8] & 0x0F) | (s[:, 8:] & 0x0F) << 4
    top = (s >> 4).reshape(-1, 4, 4) << (2 * np.arange(4, dtype=np.uint8))[None, :, None]
    return np.concatenate([low, np.bitwise_or.reduce(top, axis=1)], axis=1)


def random_blocks(rng: np.random.Generator, qtype: T, n_blocks: int, std: float) -> np.ndarray:
    """`n_blocks` random blocks of `qtype` as a flat uint8 array, values with roughly this std.

    Payload bits are uniform; scales are f16 in a sane range, never NaN/inf.
    """
    info = quant_info(qtype)
    if qtype in (T.F32, T.F16):
        vals = rng.standard_normal(n_blocks, dtype=np.float32) * np.float32(std)
        return vals.astype(np.float16 if qtype == T.F16 else np.float32).view(np.uint8)
    blocks = rng.integers(0, 256, (n_blocks, info.type_size), dtype=np.uint8)
    jitter = rng.uniform(0.5, 1.5, n_blocks).astype(np.float32)

    def put_f16(col: int, values: np.ndarray) -> None:
        blocks[:, col:col + 2] = values.astype(np.float16).view(np.uint8).reshape(-1, 2)

    if qtype == T.Q8_0:       # d, int8 q[32]: w = d q
        put_f16(0, jitter * std / 73.6)
    elif qtype == T.Q4_0:     # d, nibbles[16]: w = d (q - 8)
        put_f16(0, jitter * std / 4.61)
    elif qtype == T.Q4_1:     # d, m, nibbles[16]: w = d q + m
        # q uniform on 0..15: E[q] = 7.5, Var(q) = (16^2 - 1) / 12 = 21.25; m = -7.5 d centres the mean;
        # divisor sqrt(13/12 * 21.25) = 4.80
        d = jitter * std / np.sqrt(_JITTER_MS * 21.25)
        put_f16(0, d)
        put_f16(2, -7.5 * d)
    elif qtype == T.Q5_0:     # d, qh u32 (the 5th bits), nibbles[16]: w = d (q - 16)
        # q uniform on 0..31: E[(q - 16)^2] = Var(q) + 1/4 = (32^2 - 1) / 12 + 1/4 = 85.5, mean -d/2
        # (-0.05 std); divisor sqrt(13/12 * 85.5) = 9.62
        put_f16(0, jitter * std / np.sqrt(_JITTER_MS * 85.5))
    elif qtype == T.Q5_1:     # d, m, qh u32 (the 5th bits), nibbles[16]: w = d q + m
        # q uniform on 0..31: Var(q) = 85.25, m = -15.5 d centres the mean; divisor sqrt(13/12 * 85.25) = 9.61
        d = jitter * std / np.sqrt(_JITTER_MS * 85.25)
        put_f16(0, d)
        put_f16(2, -15.5 * d)
    elif qtype == T.Q2_K:     # scales[16] (sc | m << 4), 2-bit q[256] in 64 bytes, d, dmin: w = d sc q - dmin m
        # 16 sub-blocks of 16; dmin = E[q] d = 1.5 d centres the mean (E[sc] = E[m]); with all 4 bits of
        # sc and m random the divisor is _scale_min_rms(16, 4) = 14.44 (d normal for std >= 0.0018;
        # below that, fewer bits)
        bits = _scale_bits(std, lambda b: _scale_min_rms(1 << b, 4), 4)
        mask = np.uint8((1 << bits) - 1)
        blocks[:, 0:16] &= mask | mask << 4
        d = jitter * std / _scale_min_rms(1 << bits, 4)
        put_f16(80, d)
        put_f16(82, 1.5 * d)
    elif qtype == T.Q3_K:     # hmask[32], 2-bit low q in 64 bytes, 12 bytes of 6-bit scales, d: w = d (s - 32) q
        # q = low 2 bits - 4 (hmask bit clear) or + 0 (set): uniform on -4..3, E[q^2] = 44/8 = 5.5.
        # s - 32 uniform on -2^(bits-1)..2^(bits-1)-1: E[(s - 32)^2] = (4^bits - 1) / 12 + 1/4, 341.5
        # for all 6 bits (divisor sqrt(13/12 * 5.5 * 341.5) = 45.1: d normal for std >= 0.0055), 85.5
        # for 5 (-16..15, top bits 01 or 10; 22.6: std >= 0.0028); mean E[s - 32] E[q] d = d / 4 (0.006 std)
        def rms(b: int) -> float:
            return float(np.sqrt(_JITTER_MS * 5.5 * ((4 ** b - 1) / 12 + 0.25)))
        bits = _scale_bits(std, rms, 6)
        half = 1 << (bits - 1)
        blocks[:, 96:108] = _pack_q3_k_scales(rng.integers(32 - half, 32 + half, (n_blocks, 16)))
        put_f16(108, jitter * std / rms(bits))
    elif qtype == T.Q5_K:     # d, dmin, 12 bytes of 6-bit scales/mins, qh[32], nibbles[128]: w = d sc q - dmin m
        # q = nibble | qh bit << 4, uniform on 0..31; dmin = E[q] d = 15.5 d centres the mean. Divisor
        # _scale_min_rms(2^bits, 32): 548 for 6 random bits of sc and m (d normal for std >= 0.067:
        # tiny models' embedding and output), 273 for 5 (std >= 0.033: tiny models' matrices), 135 for
        # 4 (std >= 0.0165), 66 for 3, 31 for 2 (std >= 0.0038: a 70B's 0.0059)
        bits = _scale_bits(std, lambda b: _scale_min_rms(1 << b, 32), 6)
        sc, m = rng.integers(0, 1 << bits, (2, n_blocks, 8))
        blocks[:, 4:16] = _pack_k_scales(sc, m)
        d = jitter * std / _scale_min_rms(1 << bits, 32)
        put_f16(0, d)
        put_f16(2, 15.5 * d)
    elif qtype == T.Q4_K:     # d, dmin, 12 bytes of 6-bit scales/mins, nibbles[128]: w = d sc q - dmin m
        # 6-bit sub-block scales and mins over all of 0..63, so that their top bits (packed apart
        # from the low ones) matter in every model-level test; where that would make the f16 d
        # subnormal (the smaller stds of large models), 0..15, keeping d as large as it can be.
        # Divisors: the std of d sc q - dmin m for d = 1, jitter included.
        full = 0.5 * std / 269.0 >= 2.0 ** -14
        if not full:
            blocks[:, 4:12] &= 0x0F
        d = jitter * std / (269.0 if full else 66.0)
        put_f16(0, d)
        put_f16(2, d * 7.5)       # centres the mean: E[sc q] = 7.5 * E[m] (E[sc] = E[m])
    elif qtype == T.Q6_K:     # ql[128], qh[64], int8 scales[16], d: w = d sc (q - 32)
        blocks[:, 192:208] = rng.integers(-16, 17, (n_blocks, 16), dtype=np.int8).view(np.uint8)
        put_f16(208, jitter * std / 175.0)
    elif qtype == T.IQ4_NL:   # d, nibbles[16]: w = d KV_IQ4NL[q]
        put_f16(0, jitter * std / _IQ4NL_RMS)
    elif qtype == T.IQ4_XS:   # d, scales_h u16, scales_l[4], nibbles[128]: w = d (ls - 32) KV_IQ4NL[q]
        # high 2 bits of every 6-bit sub-block scale 1 or 2: ls - 32 in -16..15 (rms 9.2), so d stays a
        # normal f16 for the small stds of large models
        high = rng.integers(1, 3, (n_blocks, 8), dtype=np.uint16) << (2 * np.arange(8, dtype=np.uint16))
        blocks[:, 2:4] = high.sum(axis=1, dtype=np.uint16).view(np.uint8).reshape(-1, 2)
        put_f16(0, jitter * std / (_IQ4NL_RMS * 9.2))
    elif qtype == T.MXFP4:    # e, nibbles[16]: w = 2^(e - 128) KV_MXFP4[q]; powers of two only
        e = np.rint(np.log2(jitter * std / _MXFP4_RMS)) + 128
        blocks[:, 0] = np.clip(e, 2, 254).astype(np.uint8)
    elif qtype in _LATTICE_RMS:   # d first (IQ1_M: spread over its scale words), random indices, signs, scales
        d = (jitter * std / _LATTICE_RMS[qtype]).astype(np.float16).view(np.uint16)
        if qtype == T.IQ1_M:      # the f16 d's nibbles in the top nibbles of the 4 scale words at byte 48
            words = blocks[:, 48:56].copy().view(np.uint16) & np.uint16(0x0FFF)
            for k in range(4):
                words[:, k] |= ((d >> np.uint16(4 * k)) & np.uint16(0xF)) << np.uint16(12)
            blocks[:, 48:56] = words.view(np.uint8)
        else:
            blocks[:, 0:2] = d.view(np.uint8).reshape(-1, 2)
    elif qtype in (T.TQ1_0, T.TQ2_0):   # trits q - 1 in -1..1, uniform: E[(q - 1)^2] = 2/3; d last
        if qtype == T.TQ2_0:      # 2-bit fields 0..2 (llama.cpp never writes 3)
            q = rng.integers(0, 3, (n_blocks, 64, 4), dtype=np.uint8) << (2 * np.arange(4, dtype=np.uint8))
            blocks[:, :64] = q.sum(axis=2, dtype=np.uint8)
        put_f16(info.type_size - 2, jitter * std / np.sqrt(_JITTER_MS * 2 / 3))
    else:
        raise LlamavkError(f"synthetic weights of type {qtype.name} are not implemented")
    return blocks.reshape(-1)


class _Pools:
    """One pool of random blocks per (type, std); tensors take consecutive bytes, wrapping around."""

    def __init__(self, rng: np.random.Generator, needed: dict[tuple[T, float], int]):
        self.rng, self.needed, self.pools, self.cursor = rng, needed, {}, {}

    def stream(self, qtype: T, std: float, nbytes: int):
        key = (qtype, std)
        if key not in self.pools:
            info = quant_info(qtype)
            n_blocks = min(self.needed[key], POOL_BYTES) // info.type_size
            self.pools[key] = random_blocks(self.rng, qtype, n_blocks, std)
            self.cursor[key] = 0
        pool, pos = self.pools[key], self.cursor[key]
        while nbytes > 0:
            n = min(nbytes, pool.size - pos)
            yield memoryview(pool[pos:pos + n])
            nbytes -= n
            pos = (pos + n) % pool.size
        self.cursor[key] = pos


# ----------------------------------------------------------------------------------------------
# write
# ----------------------------------------------------------------------------------------------

def write_synthetic_model(path: str | Path, preset: str = "tiny", qtype: str = "q4_0",
                          arch: str | None = None, seed: int = 0, metadata: dict | None = None,
                          **overrides) -> Path:
    """Write a random-weight GGUF and return its path. Overrides: any Preset field; metadata: keys
    written instead of the plan's (another vocabulary, say; None drops a key)."""
    plan = synthetic_plan(preset, qtype, arch, **overrides)
    path = Path(path)
    rng = np.random.default_rng(seed)

    writer = gguf.GGUFWriter(path, plan.config.arch)
    meta = {**plan.metadata, **(metadata or {})}
    for key, value in meta.items():
        if value is None:
            continue
        elif isinstance(value, bool):
            writer.add_bool(key, value)
        elif isinstance(value, int):
            writer.add_uint32(key, value)
        elif isinstance(value, float):
            writer.add_float32(key, value)
        elif isinstance(value, str):
            writer.add_string(key, value)
        else:  # lists: the element type follows the first element (int -> i32, float -> f32)
            writer.add_array(key, value)
    for t in plan.tensors:
        writer.add_tensor_info(t.spec.name, t.spec.shape, np.dtype(np.float32), t.nbytes,
                               raw_dtype=t.qtype)

    needed: dict[tuple[T, float], int] = {}
    for t in plan.tensors:
        if len(t.spec.shape) >= 2:
            needed[(t.qtype, t.std)] = needed.get((t.qtype, t.std), 0) + t.nbytes
    pools = _Pools(rng, needed)
    try:
        writer.write_header_to_file()
        writer.write_kv_data_to_file()
        writer.write_ti_data_to_file()
        fout = writer.fout[0]
        for t in plan.tensors:
            writer.write_padding(fout, fout.tell())
            if len(t.spec.shape) >= 2:
                for chunk in pools.stream(t.qtype, t.std, t.nbytes):
                    fout.write(chunk)
            else:
                fout.write(_vector(rng, t.spec, plan.config.arch, t.std).tobytes())
            writer.write_padding(fout, t.nbytes)
    finally:
        writer.close()
    return path


def _vector(rng: np.random.Generator, spec: WeightSpec, arch: str = "llama", gain: float = 1.0) -> np.ndarray:
    """f32 norm weights around gain (+-10%); biases small (std 0.1 gain). gemma3's Q/K norms around
    2.0 gain: q.k scores of std ~4, so attention is peaked and which positions a layer sees (RoPE,
    window) matters."""
    if arch == "gemma3" and spec.role in ("q_norm", "k_norm"):
        return (gain * (2.0 + 0.2 * rng.standard_normal(spec.shape))).astype(np.float32)
    if spec.role == "expert_sel_bias":   # glm4moe: +-0.3 against probabilities in (0, 1): it moves choices
        return (0.3 * rng.standard_normal(spec.shape)).astype(np.float32)
    if spec.role.endswith("_bias"):
        return (rng.standard_normal(spec.shape) * (0.1 * gain)).astype(np.float32)
    if spec.role == "attn_sinks":        # gpt-oss: 3 +- 2, a sizable share of a head's softmax (a peaked
        # tiny model scored without its sinks moves by 3%)
        return (3.0 + 2.0 * rng.standard_normal(spec.shape)).astype(np.float32)
    if spec.role == "router_shexp":      # the shared expert's gate: logits of std ~1
        return (rng.standard_normal(spec.shape) / np.sqrt(spec.shape[0])).astype(np.float32)
    if spec.role == "ssm_dt":            # DeltaNet decay: softplus(alpha + dt) * a, a = -exp(A_log) < 0;
        return (rng.standard_normal(spec.shape) * 0.5).astype(np.float32)
    if spec.role == "ssm_a":             # per-token decays from ~0.97 to ~0.25: the state remembers
        return (-np.exp(rng.uniform(np.log(0.05), np.log(2.0), spec.shape))).astype(np.float32)
    return (gain * (1.0 + 0.1 * rng.standard_normal(spec.shape))).astype(np.float32)


def parse_synthetic_name(name: str) -> tuple[str, str, str]:
    """'synthetic:8b-q4_0', 'synthetic:tiny-q4_k-qwen3' or 'synthetic:30b-a3b-q4_0' -> (preset, qtype,
    arch); presets may contain dashes, the type follows the preset."""
    body = (name.split(":", 1)[1] if name.startswith("synthetic:") else name).lower()
    for preset in sorted(PRESETS, key=len, reverse=True):
        if body.startswith(preset + "-"):
            parts = body[len(preset) + 1:].split("-", 1)     # an architecture may hold a dash (gpt-oss)
            if 1 <= len(parts) <= 2 and parts[0] in SYNTHETIC_NAMES:
                arch = parts[1] if len(parts) == 2 else PRESETS[preset].arch
                arch_module(arch)
                return preset, parts[0], arch
    raise LlamavkError(f"bad synthetic model name {name!r}: expected synthetic:PRESET-TYPE[-ARCH] "
                       f"with PRESET in {', '.join(PRESETS)} and TYPE in {', '.join(SYNTHETIC_NAMES)}")


def synthetic_model_path(name: str, cache_dir: str | Path | None = None, seed: int = 0) -> Path:
    """The GGUF for `synthetic:PRESET-TYPE[-ARCH]`, written once into cache_dir (default
    ~/.cache/llamavk/synthetic) and reused afterwards."""
    preset, qtype, arch = parse_synthetic_name(name)
    cache = Path(cache_dir) if cache_dir else Path.home() / ".cache" / "llamavk" / "synthetic"
    cache.mkdir(parents=True, exist_ok=True)
    path = cache / f"{preset}-{qtype}-{arch}-s{seed}.gguf"
    if not path.is_file():
        tmp = path.with_suffix(".gguf.part")
        write_synthetic_model(tmp, preset, qtype, arch, seed=seed)
        tmp.replace(path)
    return path


def describe_plan(plan: SyntheticPlan) -> str:
    c = plan.config
    ffn = f"{c.n_expert} experts of {c.n_ff_exp}, {c.n_expert_used} used" if c.n_expert else f"ffn {c.n_ff}"
    if c.n_ff_shexp:
        ffn += f" + a shared expert of {c.n_ff_shexp}"
    if c.recurrent_layers:
        ffn += (f", {sum(c.recurrent_layers)} DeltaNet layers ({c.ssm_n_group}/{c.ssm_dt_rank} heads of "
                f"{c.ssm_d_state})")
    return (f"{c.arch}: dim {c.n_embd}, {c.n_layer} layers, {ffn}, heads {c.n_head}/"
            f"{c.n_head_kv}, head_dim {c.head_dim}, vocab {c.n_vocab}; {plan.n_params / 1e9:.2f}B "
            f"params, {plan.total_bytes / 2**30:.2f} GiB of tensor data")


__all__ = ["PRESETS", "SYNTHETIC_TYPES", "SYNTHETIC_MIXES", "SYNTHETIC_KM_MIXES", "SYNTHETIC_NAMES", "Preset",
           "tiny_preset", "SyntheticPlan", "synthetic_plan", "write_synthetic_model", "synthetic_vocab",
           "parse_synthetic_name", "synthetic_model_path", "random_blocks", "describe_plan", "ARCHITECTURES"]
