"""KV-cache store and flash attention recorders (shaders/kv_store.comp, attention*.comp).

Attention is always one dispatch. When the grid (row blocks x KV heads) already has enough
workgroups (prefill) each workgroup covers the whole causal KV range; else (decode) the KV range is
split over up to a fixed number of workgroups and the last one of each (row block, KV head) to finish
merges the partial results. The split count is fixed at record time (from n_ctx, the head counts and
the device: `split_plan`); each split's KV chunk, and so how many splits are active, is computed by
the shader from n_kv at execution time, so the recording stays valid as the cache grows. One-token
steps and other batches of at most 4 query rows per KV head use a kernel shaped for latency
(shaders/attention_decode.comp: blocks of 32 positions, the next block's loads in flight during
this one's arithmetic, no block-wide softmax reductions). Prompts with one split run on cooperative
matrices where the device has them (shaders/attention_coop.comp, selection.attention_coop_ok); over
a quantized cache, each layer's K and V rows are dequantized into f16 copies for it first.

Attention sinks (gpt-oss: `sinks`): one f32 logit per query head joins each row's softmax as one more
key of value 0, once (by the merge where several splits are active), unscaled. They run the
"_sinks" variant of whichever kernel the plan picks (the name with "_sinks" appended; shader define
SINKS), the sinks bound last: Vulkan bindings are numbered 0 .. n-1 (vk/kernel.py), so binding 5,
6 (a decode kernel with CHAIN / WAIT), 8 (split) or 9 (split with CHAIN / WAIT).

Scratch for the split path (partial outputs, their softmax max/sum, and one completion counter per
(row block, KV head), zeroed at allocation and reset by the kernel after each use) is allocated on
first use and cached on the KernelCache (`kc.shared("attention splits", shape, ...)`): every recording on
that device with that shape shares it, layers included (the sequence's barriers order the reuse).
Sequences that share a KernelCache must therefore not run concurrently, as with any other shared
activation buffer. The buffers are freed with the device.
"""

from __future__ import annotations

import math
import os
import struct
from dataclasses import dataclass

import numpy as np

from .. import kv_cache
from ..kv_cache import KVTypes
from ..vk import Buffer
from . import filled_buffer, groups_2d
from . import selection
from .norm import _range
from .selection import ATTENTION_COOP_ROWS, ATTENTION_SPLITS, attention_coop_ok, decode_attention_rows, device_kind

KV_WG = 256
KV_COPY_GROUPS = 1024  # workgroups of kv_dequant.comp at most (each loops over the rows)
ATTN_WG = 128          # workgroup size = KV positions per block of attention.comp
DEC_BLOCK = ATTN_WG // 4   # KV positions per block of attention_decode.comp (4 lanes per K row)
MAX_SPLITS = 128      # splits per (row block, KV head) at most: the merge folds them one after another


def kv_store(seq, kc, src, cache, step, n_tokens: int, width: int, cache_type: str = "f16") -> None:
    """cache[n_past + t, :] = src[t, :] as cache_type (f16, or q8_0 / q4_0 blocks: kv_cache.py) for
    t < n_tokens (n_past from the step buffer at run time). cache: n_ctx rows of `width` values;
    rows past n_ctx are dropped."""
    if n_tokens <= 0:
        return
    if n_tokens > 65535:
        raise ValueError("kv_store: at most 65535 tokens per call")
    crange = _range(cache)
    n_ctx = crange[2] // kv_cache.row_bytes(cache_type, width)
    push = struct.pack("<III", width, n_tokens, n_ctx)
    if cache_type == "f16":
        kernel = kc.get("kv_store_f16", "rrw", push_size=12, spec=(KV_WG,))
        groups = (width + KV_WG - 1) // KV_WG
    else:
        if width % 32:
            raise ValueError(f"kv_store: a {cache_type} cache needs a width that is a multiple of 32, not {width}")
        kernel = kc.get("kv_store_q", "rrw", push_size=12, spec=(KV_WG, kv_cache.type_code(cache_type)))
        groups = (width // 32 + KV_WG - 1) // KV_WG
    seq.dispatch(kernel, [_range(src), _range(step), crange], (groups, n_tokens, 1), push)


# Split policy. The recording is replayed while n_kv grows, so the grid (n_splits workgroups per row
# block and KV head) is fixed at record time from n_ctx and the shader picks the active splits at run
# time: chunk = max(roundup(n_kv / n_splits, block), min_chunk).
# - Merging splits costs a few us (the partials' stores, an atomic and the last workgroup's loads:
#   H100, 7.2B shapes, attention alone: 1 block of 32 positions 5.4 us per stage, 2 splits of 32 10.0),
#   while each further 32-position block of one workgroup costs ~1 us. So a split takes at least
#   min_chunk = 128 positions (4 blocks): tg128 on the 7.2B Q4_0 344.3 t/s (min_chunk 64: 336.1, 256:
#   345.0), at depth 4096 305.4 (64: 302.6).
# - Long contexts want many splits: each workgroup's blocks run one after the other, and 8 KV heads
#   leave most of a 132-SM GPU idle with one split each; n_splits is sized for the target workgroup
#   count (several per SM; Vulkan does not tell the SM count), e.g. 33 splits x 8 heads at n_ctx 4224.
# Workgroups of inactive splits exit at once; a single active split writes the output directly.
# The numbers per kind of device: selection.ATTENTION_SPLITS.


def _env_int(name: str) -> int | None:
    value = os.environ.get(name)
    return int(value) if value else None


def _round_chunk(positions: int, block: int = ATTN_WG) -> int:
    return max(block, -(-int(positions) // block) * block)


def split_plan(kc, n_ctx: int, n_head_kv: int, n_row_blocks: int, block: int = ATTN_WG) -> tuple[int, int]:
    """(n_splits, min_chunk): the split-KV grid size recorded for n_ctx and the minimum KV positions
    per active split (policy above). Overrides for experiments: LLAMAVK_ATTN_SPLITS=N (grid size,
    capped at MAX_SPLITS and at the splits n_ctx can use), LLAMAVK_ATTN_MIN_CHUNK=P (positions,
    rounded up to a multiple of the kernel's `block`; one block = the plain ceil(n_kv / n_splits)
    chunks)."""
    target, default_chunk = ATTENTION_SPLITS[device_kind(kc)]
    min_chunk = _round_chunk(_env_int("LLAMAVK_ATTN_MIN_CHUNK") or default_chunk, block)
    want = _env_int("LLAMAVK_ATTN_SPLITS") or -(-target // max(1, n_head_kv * n_row_blocks))
    return max(1, min(want, -(-n_ctx // min_chunk), MAX_SPLITS)), min_chunk


def _use_decode_kernel(kc, n_tokens: int, rows: int, head_dim: int) -> bool:
    """attention_decode.comp applies to one-token steps and to batches of at most 4 query rows per KV
    head (its row blocks are 4 rows), head_dim a multiple of 32 up to 256, and subgroups of at least 4
    lanes (4 lanes of a subgroup share a K row). LLAMAVK_ATTN_DECODE=0 keeps attention.comp (A/B)."""
    if os.environ.get("LLAMAVK_ATTN_DECODE", "1") == "0" or (n_tokens > 1 and rows > 4):
        return False
    if head_dim % 32 or head_dim > 256:
        return False
    return (kc.info.subgroup_min or kc.info.subgroup_size or 0) >= 4


def _scratch(kc, n_splits: int, n_rows: int, head_dim: int, n_counters: int):
    opart, ml, counters = kc.shared("attention splits", (n_splits, n_rows, head_dim, n_counters), lambda: (
        Buffer(kc.device, n_splits * n_rows * head_dim * 4), Buffer(kc.device, n_splits * n_rows * 8),
        filled_buffer(kc.device, np.zeros(n_counters, dtype=np.uint32))))
    return [(opart, 0, n_splits * n_rows * head_dim * 4), (ml, 0, n_splits * n_rows * 8), (counters, 0, 4 * n_counters)]


@dataclass(frozen=True)
class AttentionPlan:
    kernel: str          # shader variant
    grid: tuple
    n_splits: int        # > 1: the split kernel, with its scratch bindings
    min_chunk: int
    spec: tuple


def plan(kc, n_tokens: int, n_head: int, n_head_kv: int, head_dim: int, n_ctx: int,
         n_splits: int | None = None, min_chunk: int | None = None, window: int = 0,
         kv_types: KVTypes = KVTypes(), decode_rows: int = 4, in_shader_sync: bool = False) -> AttentionPlan:
    """Which attention kernel runs a batch of n_tokens, on what grid, with how many KV splits
    (arguments as for `attention`). Sliding-window layers (window > 0) never take the
    cooperative-matrix kernel: its window gave wrong rows on an H100 (tests/test_gemma3.py's
    70-token windowed cases), so they run the flash kernel, checked there and on llvmpipe.
    Quantized caches neither: the cooperative-matrix kernel reads f16 only, so the plan for them is
    the flash kernels' KV_QUANT variants (`_kvq` names, the K and V types as specialization
    constants 2 and 3); `attention` instead runs the cooperative-matrix kernel over f16 copies of
    their rows where an f16 cache would take it (coop_over_f16_copies). `decode_rows`: the decode
    kernel's query rows per workgroup for one token (1, 2 or 4: decode_form). Software devices run
    decode over an f16 cache on attention_cpu.comp too (selection.cpu_attention_ok: its loads are few
    and wide, the decode kernel's a loop over the lanes there), but where the step waits or counts in
    the shader (`in_shader_sync`: the decode kernel alone does)."""
    if head_dim % 4 or head_dim // 4 > ATTN_WG:
        raise ValueError(f"attention: head_dim {head_dim} must be a multiple of 4 and at most {4 * ATTN_WG}")
    if n_head % n_head_kv:
        raise ValueError(f"attention: n_head {n_head} is not a multiple of n_head_kv {n_head_kv}")
    rows = n_tokens * (n_head // n_head_kv)
    dec = _use_decode_kernel(kc, n_tokens, rows, head_dim)
    if dec and not in_shader_sync and not kv_types.quantized and selection.cpu_attention_ok(kc, head_dim):
        dec = False
    br = 4 if rows <= 4 or dec else 8
    if dec and n_tokens == 1:
        br = decode_rows
    n_rb = -(-rows // br)
    if n_rb > 65535:
        raise ValueError("attention: too many query rows for one call")
    block = DEC_BLOCK if dec else ATTN_WG
    if n_splits is None:
        # the decode kernel's splits as for 4-row blocks whatever its rows per workgroup (BR):
        # fewer rows make more workgroups of the same KV positions, not longer splits
        n_splits, plan_chunk = split_plan(kc, n_ctx, n_head_kv, -(-rows // 4) if dec else n_rb, block)
        min_chunk = plan_chunk if min_chunk is None else min_chunk
    min_chunk = _round_chunk(min_chunk or block, block)
    n_splits = max(1, min(int(n_splits), MAX_SPLITS, -(-n_ctx // min_chunk)))
    codes = kv_types.codes if kv_types.quantized else ()
    spec = (ATTN_WG, head_dim) + codes
    if dec:   # attention_decode.comp: the cache types (ids 2, 3; f16 variants ignore them), rows (4)
        spec = (ATTN_WG, head_dim) + (codes or (0, 0)) + (br,)
    if kv_types.quantized:
        kv_types.check_head_dim(head_dim)
        name = "attention_dec_kvq" if dec else f"attention_kvq_br{br}"
        if n_splits == 1:
            return AttentionPlan(name, (n_rb, n_head_kv, 1), 1, min_chunk, spec)
        return AttentionPlan(name.replace("attention_", "attention_split_") if not dec else "attention_dec_split_kvq",
                             (n_rb, n_head_kv, n_splits), n_splits, min_chunk, spec)
    if n_splits == 1 and not dec and not window and attention_coop_ok(kc, head_dim, rows):
        return AttentionPlan(f"attention_coop_f16_hd{head_dim}", (-(-rows // ATTENTION_COOP_ROWS), n_head_kv, 1),
                             1, min_chunk, ())
    if not dec and selection.cpu_attention_ok(kc, head_dim):   # blocks of 8 rows
        name = "attention_cpu_f16_br8" if n_splits == 1 else "attention_cpu_split_f16_br8"
        return AttentionPlan(name, (-(-rows // 8), n_head_kv, n_splits), n_splits, min_chunk,
                             (selection.cpu_product_lanes(kc), head_dim))
    if n_splits == 1:
        return AttentionPlan("attention_dec_f16" if dec else f"attention_f16_br{br}", (n_rb, n_head_kv, 1),
                             1, min_chunk, spec)
    return AttentionPlan("attention_dec_split_f16" if dec else f"attention_split_f16_br{br}",
                         (n_rb, n_head_kv, n_splits), n_splits, min_chunk, spec)


def decode_form(kc, n_tokens: int, n_head: int, n_head_kv: int, head_dim: int, span: int,
                long_context: bool = False) -> tuple[int, int]:
    """(query rows per workgroup, the positions its split grid is planned for) of the decode kernel in
    a step: one token -- 1 row up to selection.decode_attention_rows' limit of n_kv, 4 beyond it.
    The runtime records a one-token step for each side of the limit where they differ and picks one by
    n_kv when it submits (Runtime.prepare): `long_context` (n_kv past the limit) takes the 4-row form,
    its grid planned for the whole span; else the 1-row form, planned for at most the limit's
    positions. Both are right at any n_kv (a split's positions follow n_kv at run time): the form is
    a speed choice. Batches of a few tokens: 4 rows.
    Why one form per recording: two forms recorded in one step, each leaving at once where the other
    works, cost the form recorded second 2-4% of its decode (H200, 7.2B Q4_0 tg128) for the other's
    idle workgroups."""
    if n_tokens != 1 or not _use_decode_kernel(kc, 1, n_head // max(1, n_head_kv), head_dim):
        return 4, span
    rows, limit = decode_attention_rows(kc)
    if rows == 4 or (long_context and span > limit):
        return 4, span
    return rows, min(span, limit)


def long_context_from(kc, n_tokens: int, n_head: int, n_head_kv: int, head_dim: int, span: int) -> int | None:
    """The n_kv past which a step of `attention` with these arguments takes another decode form when
    recorded with long_context (decode_form); None where it takes the same at every n_kv."""
    if decode_form(kc, n_tokens, n_head, n_head_kv, head_dim, span) == \
            decode_form(kc, n_tokens, n_head, n_head_kv, head_dim, span, True):
        return None
    return decode_attention_rows(kc)[1]


def coop_over_f16_copies(kc, n_tokens: int, n_head: int, n_head_kv: int, head_dim: int, span: int,
                         n_splits: int | None = None, min_chunk: int | None = None, window: int = 0,
                         kv_types: KVTypes = KVTypes()) -> bool:
    """Whether `attention` over these quantized caches dequantizes their rows 0 .. n_kv into f16 copies
    first (shaders/kv_dequant.comp, one copy of K and V shared by every layer) and runs the cooperative-
    matrix prompt kernel over them: where an f16 cache would take that kernel. Why: the flash kernel's
    quantized variant, what else runs, read pp512 at d4096 at 0.40x llama.cpp's (H200, 7.2B Q4_0, q8_0
    K and V); the copy costs a pass over the rows per layer. LLAMAVK_ATTN_KVQ_COPY=0: the flash kernel."""
    return kv_types.quantized and os.environ.get("LLAMAVK_ATTN_KVQ_COPY", "1") != "0" and plan(
        kc, n_tokens, n_head, n_head_kv, head_dim, span, n_splits, min_chunk, window).kernel.startswith(
        "attention_coop")


def _f16_copies(seq, kc, k_cache, v_cache, step, width: int, n_ctx: int, kv_types: KVTypes) -> tuple:
    """Record the f16 copies of rows 0 .. n_kv of both caches (then a barrier); their ranges. Sized
    for the largest (n_ctx, width) recorded on this device, shared by every layer and step (the
    sequence's barriers order the reuse)."""
    nbytes = n_ctx * width * 2
    bufs = kc.shared("kv f16 copies", (n_ctx, width), lambda: (Buffer(kc.device, nbytes), Buffer(kc.device, nbytes)))
    # a capped grid looping over the rows: a grid for n_ctx rows would be mostly workgroups past n_kv
    groups = min(-(-(n_ctx * width // 8) // KV_WG), KV_COPY_GROUPS)
    out = []
    for cache, name, buf in ((k_cache, kv_types.k, bufs[0]), (v_cache, kv_types.v, bufs[1])):
        if name == "f16":
            out.append(cache)
            continue
        kernel = kc.get("kv_dequant_f16", "rrw", push_size=8, spec=(KV_WG, kv_cache.type_code(name)))
        seq.dispatch(kernel, [_range(cache), _range(step), (buf, 0, nbytes)], groups_2d(groups),
                     struct.pack("<2I", width, n_ctx))
        out.append((buf, 0, nbytes))
    seq.barrier()
    return tuple(out)


def visible_span(n_ctx: int, window: int, n_tokens: int) -> int:
    """The positions a batch of n_tokens can see: a sliding window's (window + n_tokens - 1), else
    the context's."""
    return min(n_ctx, window + n_tokens - 1) if window else n_ctx


def waits_ok(kc, n_tokens: int, n_head: int, n_head_kv: int, head_dim: int) -> bool:
    """Whether `attention` with these arguments can wait in its shader for its producer (the rope_kv
    before it, or the Q/K/V products that rotate and store K and V themselves): the decode kernel
    (f16 or quantized caches), one token."""
    return n_tokens == 1 and \
        _use_decode_kernel(kc, n_tokens, n_head // max(1, n_head_kv), head_dim)


def writes_f16_ok(kc, n_tokens: int, n_head: int, n_head_kv: int, head_dim: int, n_ctx: int, window: int = 0,
                  kv_types: KVTypes = KVTypes()) -> bool:
    """Whether `attention` with these arguments can write its output as f16 (out_f16): the
    cooperative-matrix prompt kernel can."""
    span = visible_span(n_ctx, window, n_tokens)
    if coop_over_f16_copies(kc, n_tokens, n_head, n_head_kv, head_dim, span, window=window, kv_types=kv_types):
        return True
    return plan(kc, n_tokens, n_head, n_head_kv, head_dim, span, window=window,
                kv_types=kv_types).kernel.startswith("attention_coop")


def attention(seq, kc, q, k_cache, v_cache, out, step, n_tokens: int, n_head: int, n_head_kv: int,
              head_dim: int, n_ctx: int, n_splits: int | None = None, min_chunk: int | None = None,
              signal=None, scale: float = 0.0, window: int = 0, kv_types: KVTypes = KVTypes(),
              out_f16: bool = False, wait=None, sinks=None, long_context: bool = False) -> int:
    """out = softmax(scale q k^T, causal) v, per query head h over KV head h // (n_head/n_head_kv);
    scale 0: 1/sqrt(head_dim). `sinks` (gpt-oss; a View, Buffer or (buffer, offset, nbytes)):
    f32[n_head], head h's logit s_h joined to each of its rows' softmax as a key of value 0:
    out = sum_j e^(s_j - M) v_j / (sum_j e^(s_j - M) + e^(s_h - M)), M = max(max_j s_j, s_h), s_h
    not multiplied by scale. It does not change which kernel runs (plan, writes_f16_ok, waits_ok).

    q, out: [n_tokens][n_head * head_dim] f32; k_cache, v_cache: [n_ctx][n_head_kv * head_dim] of
    kv_types.k / kv_types.v (f16, or q8_0 / q4_0 blocks: kv_cache.py), read directly.
    Token t attends to cache positions 0 .. n_past + t (n_past, n_kv from the step buffer at run time);
    with a step seq_len L > 0 (STEP_SEQ_LEN), row p = n_past + t attends to rows p // L * L .. p only;
    window W > 0 (sliding-window layers): to rows p - W + 1 .. p only, and the work is that of the
    window, not of the context (the splits share the positions the batch can see).
    `n_splits` overrides the split-KV count (tests, tuning; 1 = single dispatch) and `min_chunk` the
    minimum KV positions per active split (rounded up to the kernel's block); with `n_splits` given
    and no `min_chunk`, every split is used (chunks of ceil(n_kv / n_splits) rounded to the kernel's
    block: ATTN_WG positions, DEC_BLOCK for the decode kernel).
    `out_f16`: out holds f16 values (the cooperative-matrix kernel only: writes_f16_ok).
    `signal` (a chain.Signal): where the decode kernel runs, every workgroup counts itself done there
    (attention_decode.comp CHAIN) for a next dispatch that waits in its shader. Returns how many
    workgroups count (0: none, so the next dispatch must not wait).
    `wait` (a chain.Wait; where waits_ok): recorded without a barrier after the producer that counts
    there (rope_kv, or the Q/K/V products), the decode kernel waits for that count in its shader
    (attention_decode.comp WAIT).
    `long_context`: the step runs at n_kv past the decode kernel's limit for 1-row workgroups, so
    takes its 4-row form (decode_form; right at any n_kv, fastest there).
    """
    if n_tokens <= 0:
        return 0
    if window < 0:
        raise ValueError(f"attention: window {window} must be >= 0")
    if sinks is not None and _range(sinks)[2] < 4 * n_head:
        raise ValueError(f"attention: sinks of {_range(sinks)[2]} bytes, not f32[{n_head}]")
    # a sliding window: the split grid is sized for the positions the batch can see (n_kv - base in
    # attention_split.glsl: window + n_tokens - 1 at most), not for the context
    span = visible_span(n_ctx, window, n_tokens)
    if signal is None and wait is None and coop_over_f16_copies(kc, n_tokens, n_head, n_head_kv, head_dim, span,
                                                                n_splits, min_chunk, window, kv_types):
        k16, v16 = _f16_copies(seq, kc, k_cache, v_cache, step, n_head_kv * head_dim, n_ctx, kv_types)
        return attention(seq, kc, q, k16, v16, out, step, n_tokens, n_head, n_head_kv, head_dim, n_ctx, n_splits,
                         min_chunk, scale=scale, window=window, out_f16=out_f16, sinks=sinks)
    # a form for short contexts splits only the positions it works on (its grid no larger)
    rows, plan_span = decode_form(kc, n_tokens, n_head, n_head_kv, head_dim, span, long_context)
    pl = plan(kc, n_tokens, n_head, n_head_kv, head_dim, plan_span, n_splits, min_chunk, window, kv_types, rows,
              in_shader_sync=wait is not None or signal is not None)
    chained = signal is not None and pl.kernel.startswith("attention_dec")
    dec_one = pl.kernel.startswith("attention_dec") and n_tokens == 1
    if wait is not None and not dec_one:
        raise ValueError("attention: a wait in the shader takes the decode kernel, one token")
    push = struct.pack("<5IfI", n_tokens, n_head, n_head_kv, pl.n_splits, pl.min_chunk,
                       scale or 1.0 / math.sqrt(head_dim), window)
    if chained:
        push += struct.pack("<I", signal.slot)
    if wait is not None:
        push += struct.pack("<2I", wait.slot, wait.n)
    name = pl.kernel
    if out_f16:
        if not pl.kernel.startswith("attention_coop"):
            raise ValueError(f"attention: {pl.kernel} writes f32 only")
        name += "_to_f16"
    if chained:
        name = name.replace("_kvq", "_chain_kvq") if kv_types.quantized else name.replace("_f16", "_chain_f16")
    if wait is not None:
        name = name.replace("_kvq", "_wait_kvq") if kv_types.quantized else name.replace("_f16", "_wait_f16")
    bindings = ("rrrrwwww" if pl.n_splits > 1 else "rrrrw") + ("w" if chained or wait is not None else "")
    if name.startswith("attention_cpu"):   # K and V as texels (the shader's header says why)
        bindings = "rtt" + bindings[3:]
    bufs = [_range(q), _range(k_cache), _range(v_cache), _range(step), _range(out)]
    if pl.n_splits > 1:
        bufs += _scratch(kc, pl.n_splits, n_tokens * n_head, head_dim, pl.grid[0] * n_head_kv)
    if chained or wait is not None:
        bufs.append((signal or wait).counters)
    if sinks is not None:   # the last binding, whatever its number (module docstring)
        name += "_sinks"
        bindings += "r"
        bufs.append(_range(sinks))
    kernel = kc.get(name, bindings, push_size=len(push), spec=pl.spec)
    seq.dispatch(kernel, bufs, pl.grid, push, chained=wait is not None)
    return pl.grid[0] * pl.grid[1] * pl.grid[2] if chained else 0
