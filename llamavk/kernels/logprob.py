"""Token log-probability statistics of logits rows (shaders/token_logprob.comp), for perplexity.

Per row the kernel writes (max, sum of exp(x - max), x[target], 0) as float32: 16 bytes instead of
the row's n_vocab floats. `log_probs` turns them into log p(target) in double precision on the host.
"""

from __future__ import annotations

import struct

import numpy as np

from . import groups_2d
from .norm import _pow2_ceil, _range

OUT_WORDS = 4          # floats per row in the output
MAX_WG = 512


def token_logprob(seq, kc, logits, targets, out, n_rows: int, n_cols: int, row_stride: int | None = None) -> None:
    """Record the statistics of rows [0, n_rows) of `logits` (float32, row r at r * row_stride) for
    the uint32 column `targets[r]` into `out` (float32 [n_rows][4]).
    A row whose target is >= n_cols is skipped (its output is left as it was): perplexity
    scores half of each chunk. One workgroup per row, as wide as the row allows (at most 512 threads)."""
    if n_rows <= 0:
        return
    sg = max(1, kc.info.subgroup_size or 32)
    wg = min(MAX_WG, max(sg, _pow2_ceil((n_cols + 7) // 8)))
    kernel = kc.get("token_logprob_f32", "rrw", push_size=12, spec=(wg,))
    push = struct.pack("<III", n_rows, n_cols, n_cols if row_stride is None else row_stride)
    seq.dispatch(kernel, [_range(logits), _range(targets), _range(out)], groups_2d(n_rows), push)


def log_probs(stats: np.ndarray) -> np.ndarray:
    """log p(target) per row from the kernel's rows (float32 [rows][4]), in float64."""
    s = np.asarray(stats, dtype=np.float64)
    return (s[:, 2] - s[:, 0]) - np.log(s[:, 1])
