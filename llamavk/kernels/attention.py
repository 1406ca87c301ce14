"""KV-cache store and flash attention recorders (shaders/kv_store.comp, attention*.comp).

Attention is always one dispatch. When the grid (row blocks x KV heads) already has enough
workgroups (prefill) each workgroup covers the whole causal KV range; else (decode) the KV range is
split over up to a fixed number of workgroups and the last one of each (row block, KV head) to finish
merges the partial results. The split count is fixed at record time (from n_ctx, the head counts and
the device: `split_plan`); each split's KV chunk, and so how many splits are active, is computed by
the shader from n_kv at execution time, so the recording stays valid as the cache grows. Decode (at
most 4 query rows per KV head) uses a variant of the kernel that keeps a whole block's K and V loads
in flight (attention_dec_*).

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
from .selection import ATTENTION_SPLITS, device_kind

KV_WG = 256
ATTN_WG = 128          # workgroup size = KV positions per block
MAX_SPLITS = 128      # <= ATTN_WG: the merging workgroup gives one thread to each split


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


# Split policy (GPU numbers: H100, 7.2B decode, 8 KV heads). The recording is replayed while n_kv grows,
# so the grid (n_splits workgroups per row block and KV head) is fixed at record time from n_ctx and
# the shader picks the active splits at run time: chunk = max(roundup(n_kv / n_splits, WG), min_chunk).
# - Short contexts wanted few splits with the first kernel (merging partial results cost a few us:
#   n_kv ~600, 1 split 263 t/s, 6 splits 253), hence min_chunk; with the decode kernel (a block's K and
#   V loads in flight together) one block per split measured best on the H100: n_kv 600 256.7 t/s
#   (min_chunk 256: 247.2, 1024: 225.1), n_kv 4096 249.4 (256: 240.8), so GPUs use min_chunk = WG.
# - Long contexts want many: each workgroup's KV blocks are latency bound, and 5 splits x 8 KV heads
#   = 40 workgroups left most of a 132-SM GPU idle at n_kv 4096; n_splits is sized for
#   the target workgroup count (several per SM; Vulkan does not tell the SM count), the chunk shrinks to
#   min_chunk as n_kv grows (4096 positions: 32 splits of 128 -> 256 workgroups).
# Workgroups of inactive splits exit at once; a single active split writes the output directly.
# The numbers per kind of device: selection.ATTENTION_SPLITS.


def _env_int(name: str) -> int | None:
    value = os.environ.get(name)
    return int(value) if value else None


def _round_chunk(positions: int) -> int:
    return max(ATTN_WG, -(-int(positions) // ATTN_WG) * ATTN_WG)


def split_plan(kc, n_ctx: int, n_head_kv: int, n_row_blocks: int) -> tuple[int, int]:
    """(n_splits, min_chunk): the split-KV grid size recorded for n_ctx and the minimum KV positions
    per active split (policy above). Overrides for experiments: LLAMAVK_ATTN_SPLITS=N (grid size,
    capped at MAX_SPLITS and at the splits n_ctx can use), LLAMAVK_ATTN_MIN_CHUNK=P (positions,
    rounded up to a multiple of ATTN_WG; 128 = the plain ceil(n_kv / n_splits) chunks)."""
    target, default_chunk = ATTENTION_SPLITS[device_kind(kc)]
    min_chunk = _round_chunk(_env_int("LLAMAVK_ATTN_MIN_CHUNK") or default_chunk)
    want = _env_int("LLAMAVK_ATTN_SPLITS") or -(-target // max(1, n_head_kv * n_row_blocks))
    return max(1, min(want, -(-n_ctx // min_chunk), MAX_SPLITS)), min_chunk


def _decode_variant(kc, br: int, head_dim: int) -> str | None:
    """Name stem of the decode kernel (all of a block's K and V loads in flight) when it applies:
    BR 4 (at most 4 query rows per KV head), head_dim a multiple of 32 up to 128, subgroups of at
    least 4 lanes (its K rows are shared by 4 lanes of a subgroup). LLAMAVK_ATTN_DECODE=0 falls back
    to the generic kernel, =late loads V after the scores (fewer registers)."""
    mode = os.environ.get("LLAMAVK_ATTN_DECODE", "1")
    if mode == "0" or br != 4 or head_dim % 32 or head_dim > 128:
        return None
    if (kc.info.subgroup_min or kc.info.subgroup_size or 0) < 4:
        return None
    return "attention_dec_vlate" if mode == "late" else "attention_dec"


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
              head_dim: int, n_ctx: int, n_splits: int | None = None, min_chunk: int | None = None) -> None:
    """out = softmax(q k^T / sqrt(head_dim), causal) v, per query head h over KV head h // (n_head/n_head_kv).

    q, out: [n_tokens][n_head * head_dim] f32; k_cache, v_cache: [n_ctx][n_head_kv * head_dim] f16.
    Token t attends to cache positions 0 .. n_past + t (n_past, n_kv from the step buffer at run time);
    with a step seq_len L > 0 (STEP_SEQ_LEN), row p = n_past + t attends to rows p // L * L .. p only.
    `n_splits` overrides the split-KV count (tests, tuning; 1 = single dispatch) and `min_chunk` the
    minimum KV positions per active split (rounded up to a multiple of ATTN_WG); with `n_splits` given
    and no `min_chunk`, every split is used (chunks of ceil(n_kv / n_splits) rounded to ATTN_WG).
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
        n_splits, plan_chunk = split_plan(kc, n_ctx, n_head_kv, n_rb)
        min_chunk = plan_chunk if min_chunk is None else min_chunk
    min_chunk = _round_chunk(min_chunk or ATTN_WG)
    n_splits = max(1, min(int(n_splits), MAX_SPLITS, -(-n_ctx // min_chunk)))
    scale = 1.0 / math.sqrt(head_dim)
    push = struct.pack("<5If", n_tokens, n_head, n_head_kv, n_splits, min_chunk, scale)
    spec = (ATTN_WG, head_dim)
    grid = (n_rb, n_head_kv, n_splits)
    ins = [_range(q), _range(k_cache), _range(v_cache), _range(step)]
    dec = _decode_variant(kc, br, head_dim)
    if n_splits == 1:
        kernel = kc.get(f"{dec}_f16" if dec else f"attention_f16_br{br}", "rrrrw", push_size=24, spec=spec)
        seq.dispatch(kernel, ins + [_range(out)], grid, push)
        return
    scratch = _scratch(kc, n_splits, n_tokens * n_head, head_dim, n_rb * n_head_kv)
    kernel = kc.get(f"{dec}_split_f16" if dec else f"attention_split_f16_br{br}", "rrrrwwww", push_size=24,
                    spec=spec)
    seq.dispatch(kernel, ins + [_range(out)] + scratch, grid, push)
