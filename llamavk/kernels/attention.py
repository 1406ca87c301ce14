"""KV-cache store and flash attention recorders (shaders/kv_store.comp, attention*.comp).

Attention is always one dispatch. When the grid (row blocks x KV heads) already has enough
workgroups (prefill) each workgroup covers the whole causal KV range; else (decode) the KV range is
split over a fixed number of workgroups and the last one of each (row block, KV head) to finish merges
the partial results. The split count is fixed at record time (from n_ctx, the head counts and the
device); each split's KV chunk is computed by the shader from n_kv at execution time, so the
recording stays valid as the cache grows.

Scratch for the split path (partial outputs, their softmax max/sum, and one completion counter per
(row block, KV head), zeroed at allocation and reset by the kernel after each use) is allocated on
first use and cached on the KernelCache (`kc._attention_scratch`, keyed by shape): every recording on
that device with that shape shares it, layers included (the sequence's barriers order the reuse).
Sequences that share a KernelCache must therefore not run concurrently, as with any other shared
activation buffer. The buffers are freed with the device.
"""

from __future__ import annotations

import math
import os
import struct

import numpy as np

from ..vk import Buffer
from .norm import _range

KV_WG = 256
ATTN_WG = 128          # workgroup size = KV positions per block
MAX_SPLITS = 64       # <= ATTN_WG: the merging workgroup gives one thread to each split


def kv_store(seq, kc, src, cache, step, n_tokens: int, width: int) -> None:
    """cache[n_past + t, :] = f16(src[t, :]) for t < n_tokens (n_past from the step buffer at run time).
    cache: [n_ctx][width] float16; rows past n_ctx are dropped."""
    if n_tokens <= 0:
        return
    if n_tokens > 65535:
        raise ValueError("kv_store: at most 65535 tokens per call")
    crange = _range(cache)
    n_ctx = crange[2] // (2 * width)
    kernel = kc.get("kv_store_f16", "rrw", push_size=12, spec=(KV_WG,))
    seq.dispatch(kernel, [_range(src), _range(step), crange], ((width + KV_WG - 1) // KV_WG, n_tokens, 1),
                 struct.pack("<III", width, n_tokens, n_ctx))


# Each split gets at least this many KV blocks of the context: merging partial results costs more
# than a few sequential blocks (H100, 7.2B decode at n_kv ~600: 1 split 263 t/s, 6 splits 253).
MIN_BLOCKS_PER_SPLIT = 8


def choose_splits(kc, n_ctx: int, n_head_kv: int, n_row_blocks: int) -> int:
    """Split-KV count: enough workgroups to fill the device, but at least MIN_BLOCKS_PER_SPLIT KV
    blocks of the context per split. LLAMAVK_ATTN_SPLITS overrides it (experiments)."""
    forced = os.environ.get("LLAMAVK_ATTN_SPLITS")
    if forced:
        return max(1, min(int(forced), -(-n_ctx // ATTN_WG), MAX_SPLITS))
    target = 8 if kc.info.is_cpu else 512
    want = -(-target // max(1, n_head_kv * n_row_blocks))
    return max(1, min(want, -(-n_ctx // (ATTN_WG * MIN_BLOCKS_PER_SPLIT)), MAX_SPLITS))


def _scratch(kc, n_splits: int, n_rows: int, head_dim: int, n_counters: int):
    cache = kc.__dict__.setdefault("_attention_scratch", {})
    key = (n_splits, n_rows, head_dim, n_counters)
    bufs = cache.get(key)
    if bufs is None:
        counters = Buffer(kc.device, 4 * n_counters)
        counters.write(np.zeros(n_counters, dtype=np.uint32))
        bufs = (Buffer(kc.device, n_splits * n_rows * head_dim * 4), Buffer(kc.device, n_splits * n_rows * 8),
                counters)
        cache[key] = bufs
    opart, ml, counters = bufs
    return [(opart, 0, n_splits * n_rows * head_dim * 4), (ml, 0, n_splits * n_rows * 8), (counters, 0, 4 * n_counters)]


def attention(seq, kc, q, k_cache, v_cache, out, step, n_tokens: int, n_head: int, n_head_kv: int,
              head_dim: int, n_ctx: int, n_splits: int | None = None) -> None:
    """out = softmax(q k^T / sqrt(head_dim), causal) v, per query head h over KV head h // (n_head/n_head_kv).

    q, out: [n_tokens][n_head * head_dim] f32; k_cache, v_cache: [n_ctx][n_head_kv * head_dim] f16.
    Token t attends to cache positions 0 .. n_past + t (n_past, n_kv from the step buffer at run time);
    with a step seq_len L > 0 (STEP_SEQ_LEN), row p = n_past + t attends to rows p // L * L .. p only.
    `n_splits` overrides the split-KV count (tests, tuning); 1 = single dispatch.
    """
    if n_tokens <= 0:
        return
    if head_dim % 4 or head_dim // 4 > ATTN_WG:
        raise ValueError(f"attention: head_dim {head_dim} must be a multiple of 4 and at most {4 * ATTN_WG}")
    if n_head % n_head_kv:
        raise ValueError(f"attention: n_head {n_head} is not a multiple of n_head_kv {n_head_kv}")
    n_gqa = n_head // n_head_kv
    rows = n_tokens * n_gqa
    br = 4 if rows <= 4 else 8
    n_rb = -(-rows // br)
    if n_rb > 65535:
        raise ValueError("attention: too many query rows for one call")
    if n_splits is None:
        n_splits = choose_splits(kc, n_ctx, n_head_kv, n_rb)
    n_splits = max(1, min(int(n_splits), MAX_SPLITS, -(-n_ctx // ATTN_WG)))
    scale = 1.0 / math.sqrt(head_dim)
    push = struct.pack("<4If", n_tokens, n_head, n_head_kv, n_splits, scale)
    spec = (ATTN_WG, head_dim)
    grid = (n_rb, n_head_kv, n_splits)
    ins = [_range(q), _range(k_cache), _range(v_cache), _range(step)]
    if n_splits == 1:
        kernel = kc.get(f"attention_f16_br{br}", "rrrrw", push_size=20, spec=spec)
        seq.dispatch(kernel, ins + [_range(out)], grid, push)
        return
    scratch = _scratch(kc, n_splits, n_tokens * n_head, head_dim, n_rb * n_head_kv)
    kernel = kc.get(f"attention_split_f16_br{br}", "rrrrwwww", push_size=20, spec=spec)
    seq.dispatch(kernel, ins + [_range(out)] + scratch, grid, push)
