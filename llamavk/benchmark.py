"""Timing primitives shared by `llamavk bench` and the benchmark scripts (llama-bench semantics).

pp: one prompt of n random tokens (BOS first) into an empty KV cache, in micro-batches.
tg: n single-token decodes, each replaying the recorded one-token step; the KV cache starts at
`depth` tokens. Times are wall-clock seconds including the wait for the GPU.
"""

from __future__ import annotations

import time

import numpy as np


def random_tokens(model, n: int, rng: np.random.Generator) -> list[int]:
    toks = [int(t) for t in rng.integers(0, model.config.n_vocab, n)]
    bos = model.tokenizer.bos_id
    if toks and bos is not None:
        toks[0] = bos
    return toks


def fill_depth(model, depth: int, rng) -> None:
    """Put `depth` tokens into the KV cache, untimed (llama-bench's -d)."""
    if depth:
        model._eval(random_tokens(model, depth, rng), 0, False)


def time_prompt(model, n: int, rng, depth: int = 0) -> float:
    fill_depth(model, depth, rng)
    tokens = random_tokens(model, n, rng)
    t0 = time.perf_counter()
    model._eval(tokens, depth, False)
    return time.perf_counter() - t0


def time_decode(model, n: int, rng, depth: int = 0) -> tuple[float, float]:
    """(wall seconds, host seconds) for n single-token steps starting at `depth`."""
    fill_depth(model, depth, rng)
    rt = model.runtime
    tokens = random_tokens(model, n, rng)
    host0 = rt.host_seconds
    t0 = time.perf_counter()
    for i, tok in enumerate(tokens):
        rt.run_batch("last", [tok], depth + i)
    return time.perf_counter() - t0, rt.host_seconds - host0
