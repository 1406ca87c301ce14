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
OVERRIDE_KV = typer.Option(None, "--override-kv",
                           help="KEY=TYPE:VALUE, repeatable: a GGUF metadata value replaced before the model is "
                                "read (TYPE int, float, bool or str), as llama.cpp's.")


def kv_overrides(values) -> list:
    """--override-kv's values as (key, value) pairs (a UsageError for a malformed one)."""
    from ..kv_override import parse_kv_override
    return [parse_kv_override(v) for v in values or ()]

