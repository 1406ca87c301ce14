"""Timing primitives shared by `llamavk bench` and the benchmark scripts (llama-bench semantics).

pp: one prompt of n random tokens (BOS first when the model adds BOS, as llama-bench's test_prompt)
evaluated in micro-batches. tg: n single-token decodes, each replaying the recorded one-token step.
Depth (-d): tokens put into the KV cache first, untimed. A fresh KV cache is just n_past = 0: every
step overwrites the cache rows it attends to, so nothing has to be cleared between repetitions.
Times are wall-clock and include the wait for the GPU (each step waits for its own completion).
"""

from __future__ import annotations

import time

import numpy as np


def random_tokens(model, n: int, rng: np.random.Generator, bos_first: bool = True) -> list[int]:
    toks = [int(t) for t in rng.integers(0, model.config.n_vocab, n)]
    tok = model.tokenizer
    if toks and bos_first and tok.add_bos and tok.bos_id is not None:
        toks[0] = tok.bos_id
    return toks


def prompt(model, n: int, rng, n_past: int = 0) -> None:
    """Evaluate a prompt of n random tokens after n_past cached ones (micro-batched, last logits)."""
    if n:
        model._eval(random_tokens(model, n, rng), n_past, False, short_ok=False)


def decode(model, n: int, rng, n_past: int = 0) -> None:
    """n single-token steps starting at position n_past."""
    run_batch = model.runtime.run_batch
    for i, tok in enumerate(random_tokens(model, n, rng, bos_first=False)):
        run_batch("last", [tok], n_past + i)


def fill_depth(model, depth: int, rng) -> None:
    """Put `depth` tokens into the KV cache, untimed (llama-bench's -d)."""
    prompt(model, depth, rng, 0)


def timed(model, n_prompt: int, n_gen: int, n_past: int, rng) -> int:
    """Nanoseconds for a prompt of n_prompt tokens then n_gen single-token decodes, after n_past
    cached tokens: the timed part of a llama-bench repetition (pp, tg and pp+tg tests alike)."""
    t0 = time.perf_counter_ns()
    prompt(model, n_prompt, rng, n_past)
    decode(model, n_gen, rng, n_past + n_prompt)
    return time.perf_counter_ns() - t0


def time_test(model, n_prompt: int, n_gen: int, depth: int, rng) -> int:
    """One llama-bench repetition in nanoseconds: fill `depth` (untimed), then timed()."""
    fill_depth(model, depth, rng)
    return timed(model, n_prompt, n_gen, depth, rng)


def time_prompt(model, n: int, rng, depth: int = 0) -> float:
    """Seconds for a prompt of n tokens at `depth`."""
    return time_test(model, n, 0, depth, rng) / 1e9


def time_decode(model, n: int, rng, depth: int = 0) -> tuple[float, float]:
    """(wall seconds, host seconds) for n single-token steps starting at `depth`."""
    fill_depth(model, depth, rng)
    rt = model.runtime
    host0 = rt.host_seconds
    t0 = time.perf_counter()
    decode(model, n, rng, depth)
    return time.perf_counter() - t0, rt.host_seconds - host0
