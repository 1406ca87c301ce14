"""The typer options of llama.cpp's flags, shared by run, perplexity and bench; what they mean and the
checks are in llamavk/llamacpp_compat.py."""

from __future__ import annotations

import typer

GPU_LAYERS = typer.Option(None, "--gpu-layers", "--n-gpu-layers", "-ngl",
                          help="llama.cpp's layers on the GPU: llamavk keeps every layer there, so -1, all, "
                               "auto or at least the model's layer count (e.g. 99).")
FLASH_ATTN = typer.Option(None, "--flash-attn", "-fa",
                          help="on, auto or 1: llamavk's attention is always a flash-attention kernel.")
CACHE_TYPE_K = typer.Option("f16", "--cache-type-k", "-ctk", help="KV cache type for K: f16, q8_0, q4_0, q4_1, q5_0 or q5_1.")
CACHE_TYPE_V = typer.Option("f16", "--cache-type-v", "-ctv", help="KV cache type for V: f16, q8_0, q4_0, q4_1, q5_0 or q5_1.")
THREADS = typer.Option(None, "--threads", "-t", help="Accepted for llama.cpp command lines; no effect "
                                                      "(the GPUs compute, the CPU only orchestrates).")
NO_WARMUP = typer.Option(False, "--no-warmup", help="Accepted for llama.cpp command lines; no effect.")
MLOCK = typer.Option(False, "--mlock", help="Accepted for llama.cpp command lines; no effect.")
NO_MMAP = typer.Option(False, "--no-mmap", help="Accepted for llama.cpp command lines; no effect.")
OVERRIDE_KV = typer.Option(None, "--override-kv",
                           help="KEY=TYPE:VALUE, repeatable: a GGUF metadata value replaced before the model is "
                                "read (TYPE int, float, bool or str), as llama.cpp's.")


ROPE_FREQ_BASE = typer.Option(0.0, "--rope-freq-base", help="RoPE base frequency (0: the model's).")
ROPE_FREQ_SCALE = typer.Option(0.0, "--rope-freq-scale",
                               help="RoPE frequency scale: the context expands by 1/N (0: the model's).")
ROPE_SCALE = typer.Option(0.0, "--rope-scale", help="RoPE context scaling factor N (a frequency scale of 1/N).")
ROPE_SCALING = typer.Option(None, "--rope-scaling", help="none, linear or yarn (default: the model's, else linear).")
YARN_ORIG_CTX = typer.Option(0, "--yarn-orig-ctx", help="YaRN: the original context (0: the model's training context).")
YARN_EXT_FACTOR = typer.Option(-1.0, "--yarn-ext-factor", help="YaRN: the extrapolation mix (negative: 1 for yarn).")
YARN_BETA_FAST = typer.Option(-1.0, "--yarn-beta-fast", help="YaRN: the low correction dim (negative: the model's).")
YARN_BETA_SLOW = typer.Option(-1.0, "--yarn-beta-slow", help="YaRN: the high correction dim (negative: the model's).")
YARN_ATTN_FACTOR = typer.Option(-1.0, "--yarn-attn-factor",
                                help="RoPE's cos/sin scale without YaRN's blend (negative: 1; with it: its own).")


def rope(freq_base, freq_scale, scale, scaling, orig_ctx, ext_factor, beta_fast, beta_slow, attn_factor):
    """The RoPE flags as rope_options.RopeOptions."""
    from ..rope_options import rope_options
    return rope_options(freq_base, freq_scale, scale, scaling=scaling, yarn_orig_ctx=orig_ctx,
                        yarn_ext_factor=ext_factor, yarn_beta_fast=beta_fast, yarn_beta_slow=beta_slow,
                        yarn_attn_factor=attn_factor)


def kv_overrides(values) -> list:
    """--override-kv's values as (key, value) pairs (a UsageError for a malformed one)."""
    from ..kv_override import parse_kv_override
    return [parse_kv_override(v) for v in values or ()]

