"""RMS norm recorder (shaders/rms_norm.comp)."""

from __future__ import annotations

import struct

from . import groups_2d


def _range(v):
    """A View, a Buffer (whole) or a (buffer, offset, nbytes) tuple -> (buffer, offset, nbytes)."""
    if hasattr(v, "range"):
        return v.range
    if isinstance(v, tuple):
        return v
    return (v, 0, v.size)


def _pow2_ceil(n: int) -> int:
    return 1 << max(0, (int(n) - 1).bit_length())


def _row_wg(kc, n_cols: int) -> int:
    """Threads of a one-row workgroup: at least one subgroup, at most 512, about 4 columns each."""
    return min(512, max(max(1, kc.info.subgroup_size or 32), _pow2_ceil((n_cols + 3) // 4)))


def _spec(kc, n_cols: int) -> tuple[int, bool]:
    """rms_norm.comp's specialization: the workgroup (_row_wg; software devices one subgroup, which
    loops over the row: SmolLM2's prompt norms on llvmpipe 5x faster than by 256 threads with
    VEC4's loads), VEC4 where rows are whole vec4s."""
    wg = max(1, kc.info.subgroup_size or 32) if kc.info.is_cpu else _row_wg(kc, n_cols)
    return wg, n_cols % 4 == 0


def rms_norm(seq, kc, x, out, n_rows: int, n_cols: int, eps: float, weight=None, out_f16: bool = False) -> None:
    """out[r, :] = x[r, :] / sqrt(mean(x[r, :]^2) + eps) (* weight), r < n_rows; out may be x.

    One workgroup per row, sized to the row (at least one subgroup, at most 512 threads, about
    4 columns per thread): per-head Q/K norm (rows = n_tokens * n_heads, cols = head_dim) gets
    one or two subgroups per head, [n_tokens][n_embd] rows get 512 threads.
    `weight`: float32 vector of n_cols (View or Buffer) or None. out_f16: out holds f16 values
    (rounded as collective.convert rounds; not in place).
    """
    if n_rows <= 0:
        return
    spec = _spec(kc, n_cols)
    push = struct.pack("<IIf", n_rows, n_cols, float(eps))
    to = "_to_f16" if out_f16 else ""
    if weight is None:
        kernel = kc.get(f"rms_norm_f32{to}", "rw", push_size=12, spec=spec)
        buffers = [_range(x), _range(out)]
    else:
        kernel = kc.get(f"rms_norm_mul_f32{to}", "rrw", push_size=12, spec=spec)
        buffers = [_range(x), _range(weight), _range(out)]
    seq.dispatch(kernel, buffers, groups_2d(n_rows), push)


def add_rms_norm(seq, kc, a, b, h, out, n_rows: int, n_cols: int, eps: float, weight, out_f16: bool = False) -> None:
    """h = a + b (h may be a or b), then out = rms_norm(h) * weight as rms_norm: a residual add and
    the norm after it in one dispatch, the same bits as `elementwise.add` then `rms_norm`. out_f16:
    out holds f16 values."""
    if n_rows <= 0:
        return
    kernel = kc.get("add_rms_norm_mul_f32_to_f16" if out_f16 else "add_rms_norm_mul_f32", "rrrww", push_size=12,
                    spec=_spec(kc, n_cols))
    seq.dispatch(kernel, [_range(a), _range(b), _range(weight), _range(out), _range(h)], groups_2d(n_rows),
                 struct.pack("<IIf", n_rows, n_cols, float(eps)))
