"""Recorders of the qwen35 hybrids' own ops (shaders/ssm_conv.comp, gdn_*.comp, head_norm.comp,
attn_gate.comp): Gated DeltaNet's causal convolution and gated delta rule over a layer's carried
state, its gated per-head norm, and the gated attention's Q norm and output gate.

The gated delta rule per value head h (state S, key size x value size D x D):
    S = exp(g_t) S;  S += k_t (beta_t (v_t - S^T k_t))^T;  o_t = S^T q_t / sqrt(D)
Decode and short batches run it token by token (gdn_recurrent.comp); one-token steps run the
convolution, the rule and the gated norm in one dispatch (gdn_decode.comp, delta_net_step). Longer
batches run the chunked form (chunks of CHUNK tokens), exact up to rounding: within a chunk
starting from S0, with G_r the cumulative log decay, the new values
u_r = beta_r (v_r - (decayed state)^T k_r) satisfy
    (I + L) U = diag(beta) V - diag(beta exp(G)) K S0,   L[r][s] = beta_r exp(G_r - G_s) k_r.k_s (s < r)
so U = Ub - W S0 with Ub = (I + L)^-1 diag(beta) V and W = (I + L)^-1 diag(beta exp(G)) K, and
    o_r = exp(G_r) q_r^T S0 / sqrt(D) + sum_{s<=r} exp(G_r - G_s) (q_r.k_s) u_s / sqrt(D)
    S_next = exp(G_last) S0 + sum_s exp(G_last - G_s) k_s u_s^T.
gdn_chunk_prep.comp computes every chunk's W, Ub and the output/state factors at once (chunks in
parallel); gdn_chunk_scan.comp then walks the chunks in order, carrying S0. A sequence that starts
inside a chunk (perplexity's parallel sequences) splits it into segments that do not see each other
or S0 (the state restarts at 0 where a sequence starts).

The kernels read n_past and seq_len from the step buffer: a batch at n_past 0 starts from a zero
state whatever the buffer holds, so a recording replays for fresh sequences without host work.
"""

from __future__ import annotations

import math
import os
import struct

from ..errors import LlamavkError
from ..vk import Buffer
from . import View, groups_2d
from .norm import _pow2_ceil, _range

CHUNK = 64               # gdn_chunk_*.comp CH
CHUNKED_FROM = 16        # batches of at least this many tokens take the chunked form
CONV_CHANNELS = 32      # ssm_conv.comp CHANNELS x TOKENS: a workgroup's channels and tokens
CONV_TOKENS = 64
GDN_WG = 256
PREP_WG = 256           # gdn_chunk_prep.comp: CH * CH = 16 pairs per thread (PAIRS)


def state_bytes(n_v_heads: int, head_dim: int) -> int:
    """A DeltaNet layer's recurrent state: one D x D matrix per value head, float32."""
    return 4 * n_v_heads * head_dim * head_dim


def conv_state_bytes(channels: int, d_conv: int) -> int:
    """A layer's convolution state: a ring of d_conv slots of every channel's input, float32, the
    input at position pos in slot pos % d_conv (shaders/ssm_conv_common.glsl). The window needs the
    last d_conv - 1; the extra slot lets a one-token step write its input where no reader of the
    same step looks (delta_net_step: several workgroups read one key head's channels)."""
    return 4 * d_conv * channels


def ssm_conv(seq, kc, x, w, state, out, step, n_tokens: int, channels: int, d_conv: int) -> None:
    """out = silu(causal conv(x)) over [n_tokens][channels], the window's earlier inputs from (and
    the batch's last d_conv - 1 inputs back into) `state` (conv_state_bytes: a ring)."""
    if n_tokens <= 0:
        return
    if not 1 <= d_conv <= 16:
        raise LlamavkError(f"ssm_conv: {d_conv} taps (1..16 supported)")
    kernel = kc.get("ssm_conv_f32", "rrrww", push_size=12)
    seq.dispatch(kernel, [_range(step), _range(x), _range(w), _range(state), _range(out)],
                 ((channels + CONV_CHANNELS - 1) // CONV_CHANNELS, (n_tokens + CONV_TOKENS - 1) // CONV_TOKENS, 1), struct.pack("<3I", n_tokens, channels, d_conv))


def _gdn_push(n_tokens, n_k_heads, n_v_heads, head_dim, eps) -> bytes:
    return struct.pack("<4If", n_tokens, n_k_heads, n_v_heads, head_dim, float(eps))


def _check_heads(n_k_heads: int, n_v_heads: int, head_dim: int) -> None:
    if n_v_heads % n_k_heads:
        raise LlamavkError(f"delta_net: {n_v_heads} value heads are not a multiple of {n_k_heads} key heads")
    if head_dim > 256 or head_dim % 4 or head_dim < 4:
        raise LlamavkError(f"delta_net: heads of {head_dim} values (a multiple of 4 up to 256 supported)")


def delta_net(seq, kc, x, alpha, beta, dt, a, state, out, step, n_tokens: int, n_k_heads: int, n_v_heads: int,
              head_dim: int, eps: float, chunked: bool | None = None, grouped: bool = False) -> None:
    """out[t] = the gated delta rule's output for token t (module docstring), state carried in
    `state` ([Hv][D][D]). x: [n_tokens][(2 Hk + Hv) D] = [q | k | v] after the convolution; alpha,
    beta: [n_tokens][Hv] raw products; dt, a: [Hv]. chunked: force the form (None: by n_tokens).
    grouped: value head h reads key head h // (Hv / Hk), not h % Hk (gdn_common.glsl GROUPED)."""
    if n_tokens <= 0:
        return
    _check_heads(n_k_heads, n_v_heads, head_dim)
    if chunked is None:
        chunked = n_tokens >= CHUNKED_FROM
    push = _gdn_push(n_tokens, n_k_heads, n_v_heads, head_dim, eps)
    if not chunked:
        cols = 32 if head_dim > 16 else 16
        wg = max(GDN_WG, cols)
        kernel = kc.get("gdn_recurrent_f32", "rrrrrrww", push_size=len(push), spec=_grouped_spec((wg, cols), grouped))
        seq.dispatch(kernel, [_range(v) for v in (step, x, alpha, beta, dt, a, state, out)],
                     (n_v_heads, (head_dim + cols - 1) // cols, 1), push)
        return
    n_chunks = (n_tokens + CHUNK - 1) // CHUNK
    scratch = _chunk_scratch(kc, n_chunks * n_v_heads * (4 * CHUNK * head_dim + CHUNK * CHUNK + 4) * 4)
    prep = kc.get("gdn_chunk_prep_f32", "rrrrrrw", push_size=len(push), spec=_grouped_spec((PREP_WG,), grouped))
    seq.dispatch(prep, [_range(v) for v in (step, x, alpha, beta, dt, a, scratch)], (n_chunks, n_v_heads, 1), push)
    cols = scan_columns(kc, head_dim)
    scan = kc.get("gdn_chunk_scan_f32", "rrww", push_size=len(push), spec=(GDN_WG, cols, head_dim))
    seq.dispatch(scan, [_range(v) for v in (step, scratch, state, out)],
                 (n_v_heads, (head_dim + cols - 1) // cols, 1), push)


def _grouped_spec(spec: tuple, grouped: bool) -> tuple:
    """A kernel's specialization constants with GROUPED (constant 3, gdn_common.glsl) where it is set:
    ids the kernel does not use are padded with 0 (Vulkan ignores them); tiled kernels keep theirs."""
    return tuple(spec) + (0,) * (3 - len(spec)) + (1,) if grouped else tuple(spec)


def scan_columns(kc, head_dim: int) -> int:
    """State columns per workgroup of gdn_chunk_scan.comp (its COLS): 32, or fewer for heads of
    fewer values or where shared memory (COLS x (head_dim + CHUNK) floats) does not hold them. At most
    GDN_WG / 8 (the kernel's row groups of COLS lanes: at least 8). GPUs take 16 for heads of 128:
    twice the workgroups (H100, 35B-A3B shape, 512 tokens: 204 against 212 µs per layer; llvmpipe
    runs a few workgroups at a time and prefers 32)."""
    cols = min(32, _pow2_ceil(head_dim)) if head_dim < 128 or (head_dim == 128 and kc.info.is_cpu) else 16
    limit = kc.info.max_shared_memory or 16384
    while cols > 4 and 4 * cols * (head_dim + CHUNK) > limit:
        cols //= 2
    return cols


def _chunk_scratch(kc, nbytes: int) -> View:
    """The chunked form's per-chunk factors: one buffer per device, shared by every layer (the
    recording's barriers order a layer's use after the previous one's), grown to the largest batch."""
    max_range = kc.info.max_storage_buffer_range or (1 << 31)
    if nbytes > max_range:
        raise LlamavkError(f"delta_net: a batch needs {nbytes >> 20} MiB of chunk scratch, more than one "
                           f"buffer may hold here ({max_range >> 20} MiB): use a smaller -ub")
    buf = kc.shared("delta rule chunks", None, lambda: Buffer(kc.device, nbytes), fits=lambda b: b.size >= nbytes)
    return View(buf, 0, nbytes)


DECODE_ROWS = 16      # gdn_decode.comp ROWS: state rows per thread (D = 128: 8 slices, 1024 threads)
MAX_DECODE_ROWS = 64


def decode_layout(kc, head_dim: int) -> tuple[int, int] | None:
    """(workgroup size, state rows per thread) of gdn_decode.comp for heads of head_dim: the
    workgroup holds a whole head (head_dim columns x slices), each thread DECODE_ROWS rows
    (LLAMAVK_GDN_ROWS=N for experiments), fewer slices where the device's workgroups are smaller;
    None where no layout fits (the unfused kernels then run)."""
    text = os.environ.get("LLAMAVK_GDN_ROWS") or str(DECODE_ROWS)
    if not text.isdigit() or int(text) < 1:
        raise LlamavkError(f"LLAMAVK_GDN_ROWS={text}: a number of rows (1 or more) expected")
    rows = int(text)
    limit = min(1024, kc.info.max_workgroup_invocations or 1024)
    slices = min(math.ceil(head_dim / rows), limit // head_dim)
    if slices < 1:
        return None
    rows = math.ceil(head_dim / slices)
    wg = head_dim * slices
    shared = 4 * (3 * head_dim + 5 * wg)
    if rows > MAX_DECODE_ROWS or shared > (kc.info.max_shared_memory or 16384):
        return None
    return wg, rows


def decode_fusable(kc, head_dim: int, d_conv: int) -> bool:
    """Whether a one-token step's convolution, delta rule and gated norm run as one dispatch
    (delta_net_step) on this device: LLAMAVK_GDN_FUSE=0 turns it off (A/B against the three
    dispatches)."""
    if os.environ.get("LLAMAVK_GDN_FUSE", "1") == "0":
        return False
    return 1 <= d_conv <= 16 and head_dim % 4 == 0 and 4 <= head_dim <= 256 \
        and decode_layout(kc, head_dim) is not None


def delta_net_step(seq, kc, qkv, taps, conv_state, alpha, beta, dt, a, state, z, norm_w, out, step,
                   n_k_heads: int, n_v_heads: int, head_dim: int, d_conv: int, eps: float,
                   norm_eps: float, grouped: bool = False) -> None:
    """One token through a DeltaNet layer's middle in one dispatch (gdn_decode.comp): ssm_conv of the
    raw [q | k | v] product `qkv` (conv_state: its ring), delta_net over `state`, gated_norm with z
    and norm_w into `out` ([Hv * D]); the same as those three recorders' dispatches."""
    _check_heads(n_k_heads, n_v_heads, head_dim)
    if not 1 <= d_conv <= 16:
        raise LlamavkError(f"ssm_conv: {d_conv} taps (1..16 supported)")
    layout = decode_layout(kc, head_dim)
    if layout is None:
        raise LlamavkError(f"delta_net: no one-dispatch layout for heads of {head_dim} on this device")
    wg, rows = layout
    push = struct.pack("<4I2f", n_k_heads, n_v_heads, head_dim, d_conv, float(eps), float(norm_eps))
    kernel = kc.get("gdn_decode_f32", "rrrwrrrrwrrw", push_size=len(push), spec=_grouped_spec((wg, head_dim, rows), grouped))
    seq.dispatch(kernel, [_range(v) for v in (step, qkv, taps, conv_state, alpha, beta, dt, a, state, z, norm_w,
                                               out)], (n_v_heads, 1, 1), push)


def gated_norm(seq, kc, x, z, w, out, n_tokens: int, n_heads: int, head_dim: int, eps: float) -> None:
    """out[t, h] = rms_norm(x[t, h]) * w * silu(z[t, h]) per head of head_dim values."""
    _head_rows(seq, kc, "head_norm_gated_f32", [x, w, z, out], n_tokens * n_heads, head_dim, head_dim, eps)


def head_norm_strided(seq, kc, x, w, out, n_tokens: int, n_heads: int, head_dim: int, stride: int,
                      eps: float) -> None:
    """out[t, h] = rms_norm(x[t, h * stride : h * stride + head_dim]) * w: the Q half of each head's
    [q | gate] (gated attention), written densely ([n_tokens][n_heads * head_dim])."""
    _head_rows(seq, kc, "head_norm_strided_f32", [x, w, out], n_tokens * n_heads, head_dim, stride, eps)


def _head_rows(seq, kc, name: str, views, n_rows: int, n_cols: int, in_stride: int, eps: float) -> None:
    if n_rows <= 0:
        return
    sg = max(1, kc.info.subgroup_size or 32)
    wg = min(256, max(sg, _pow2_ceil((n_cols + 3) // 4)))
    kernel = kc.get(name, "r" * (len(views) - 1) + "w", push_size=16, spec=(wg,))
    seq.dispatch(kernel, [_range(v) for v in views], groups_2d(n_rows),
                 struct.pack("<2IfI", n_rows, n_cols, float(eps), in_stride))


def attn_gate(seq, kc, a, qg, out, n_tokens: int, n_heads: int, head_dim: int) -> None:
    """out = a * sigmoid(the gate half of each head's [q | gate] in qg)."""
    n = n_tokens * n_heads * head_dim
    if n <= 0:
        return
    kernel = kc.get("attn_gate_f32", "rrw", push_size=8)
    seq.dispatch(kernel, [_range(a), _range(qg), _range(out)], groups_2d((n + 255) // 256),
                 struct.pack("<2I", n, head_dim))


__all__ = ["CHUNK", "CHUNKED_FROM", "attn_gate", "conv_state_bytes", "decode_fusable", "delta_net",
           "delta_net_step", "gated_norm", "head_norm_strided", "ssm_conv", "state_bytes"]
