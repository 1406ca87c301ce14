"""Perplexity the way llama-perplexity computes it (SPEC §6).

The token stream is cut into chunks of n_ctx tokens (the tail that does not fill a chunk is dropped).
Each chunk is evaluated from an empty KV cache, with BOS in its first slot when the model adds BOS;
only the second half is scored: the logits at positions first = n_ctx/2 ... n_ctx - 2 predict the
tokens after them, so the model always has at least n_ctx/2 tokens of context. The running value
after chunk i is exp(mean NLL over all scored tokens so far); the final uncertainty is
PPL * sqrt(var(NLL) / (count - 1)).

Like llama-perplexity, several chunks may be evaluated in one batch as parallel sequences (n_seq of
them, n_batch / n_ctx there): each is still its own sequence from position 0, so the scores are
those of one chunk at a time up to float rounding.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Callable

import numpy as np

from .errors import UsageError
from .tokenizer.stray_bytes import from_bytes


@dataclass
class PerplexityResult:
    ppl: float
    uncertainty: float          # +/- of the final estimate
    n_ctx: int
    n_chunks: int
    count: int                  # scored tokens
    running: list[float] = field(default_factory=list)   # PPL after each chunk


def token_nll(logits: np.ndarray, targets: np.ndarray) -> np.ndarray:
    """-log softmax(logits[i])[targets[i]] per row, in float64."""
    x = logits.astype(np.float64)
    m = x.max(axis=1, keepdims=True)
    log_z = m[:, 0] + np.log(np.exp(x - m).sum(axis=1))
    return log_z - x[np.arange(len(targets)), targets]


def chunk_plan(n_tokens: int, n_ctx: int, chunks: int, min_chunks: int = 2) -> int:
    """Chunks to evaluate. A text needs at least 2 chunks' worth of tokens (llama-perplexity's rule);
    re-evaluating a KL-divergence base file needs its own chunks only (min_chunks=1)."""
    if n_ctx < 4:
        raise UsageError(f"context {n_ctx} is too small for perplexity")
    if n_tokens < min_chunks * n_ctx:
        raise UsageError(f"you need at least {2 * n_ctx} tokens to evaluate perplexity with a context of "
                         f"{n_ctx} (the text has {n_tokens})")
    if chunks == 0:
        raise UsageError("--chunks 0 leaves nothing to evaluate")
    n_max = n_tokens // n_ctx
    return n_max if chunks is None or chunks < 0 else min(chunks, n_max)


def perplexity(tokens: list[int], n_ctx: int, eval_all_logits: Callable[[list[int]], np.ndarray] | None,
               bos_id: int | None, chunks: int = -1, on_chunk: Callable[[int, float], None] | None = None,
               on_scored: Callable[[np.ndarray, np.ndarray], None] | None = None,
               min_chunks: int = 2, n_seq: int = 1, score_batches=None) -> PerplexityResult:
    """`eval_all_logits(batch_tokens)` returns one row of logits per token of `batch_tokens`: up to
    `n_seq` whole chunks back to back, each a fresh sequence of n_ctx tokens (one chunk with n_seq 1).
    `on_scored(logits, targets)` sees each chunk's scored rows (KL-divergence files and statistics).
    `score_batches` (token_scorer.TokenScorer.score), when given, evaluates the batches instead and
    returns each token's log-probability computed on the device (and the scored rows of logits
    where on_scored needs them)."""
    n_chunks = chunk_plan(len(tokens), n_ctx, chunks, min_chunks)
    first = n_ctx // 2
    step = max(1, n_seq)
    starts = range(0, n_chunks, step)
    sizes = [min(step, n_chunks - start) for start in starts]
    if score_batches is not None:
        per_batch = score_batches(((evaluated_tokens(tokens[start * n_ctx:(start + n) * n_ctx], n_ctx, n, bos_id),
                                    scored_targets(tokens, n_ctx, start, n), n_ctx if n > 1 else 0)
                                   for start, n in zip(starts, sizes)), keep_rows=on_scored is not None)
    else:
        per_batch = (_host_scores(eval_all_logits(evaluated_tokens(tokens[start * n_ctx:(start + n) * n_ctx],
                                                                   n_ctx, n, bos_id)),
                                  scored_targets(tokens, n_ctx, start, n))
                     for start, n in zip(starts, sizes))
    nll_sum = nll2_sum = 0.0
    count = 0
    running = []
    scored_rows = n_ctx - 1 - first
    for start, n, (log_p, rows) in zip(starts, sizes, per_batch):
        for j in range(n):
            i = start + j
            nll = -log_p[j * n_ctx + first:(j + 1) * n_ctx - 1]
            if on_scored:
                # targets are the original tokens (only a chunk's first was replaced, and it is never a target)
                targets = np.asarray(tokens[i * n_ctx + first + 1:(i + 1) * n_ctx], dtype=np.int64)
                on_scored(rows[j * scored_rows:(j + 1) * scored_rows], targets)
            nll_sum += float(nll.sum())
            nll2_sum += float((nll ** 2).sum())
            count += len(nll)
            running.append(math.exp(nll_sum / count))
            if on_chunk:
                on_chunk(i, running[-1])
    mean = nll_sum / count
    var = nll2_sum / count - mean * mean
    ppl = math.exp(mean)
    unc = ppl * math.sqrt(var / (count - 1)) if var > 0 and count > 1 else 0.0
    return PerplexityResult(ppl, unc, n_ctx, n_chunks, count, running)


def scored_targets(tokens: list[int], n_ctx: int, start: int, n: int) -> np.ndarray:
    """Per row of a batch of n chunks from chunk `start`: the token its logits are scored against
    (rows n_ctx/2 ... n_ctx - 2 of each chunk), -1 elsewhere."""
    first = n_ctx // 2
    out = np.full(n * n_ctx, -1, dtype=np.int64)
    for j in range(n):
        i = start + j
        out[j * n_ctx + first:(j + 1) * n_ctx - 1] = tokens[i * n_ctx + first + 1:(i + 1) * n_ctx]
    return out


def _host_scores(logits: np.ndarray, targets: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """A batch's log-probabilities from its logits on the host (per row, NaN where unscored) and
    its scored rows. Used where the device reduction is not (split modes, callers' own logits)."""
    rows = np.flatnonzero(targets >= 0)
    scored = logits[rows]
    log_p = np.full(len(targets), np.nan)
    log_p[rows] = -token_nll(scored, targets[rows])
    return log_p, scored


def evaluated_tokens(tokens: list[int], n_ctx: int, n_chunks: int, bos_id: int | None) -> list[int]:
    """The tokens the chunks actually evaluate: each chunk's first replaced by BOS where used."""
    out = list(tokens[:n_chunks * n_ctx])
    if bos_id is not None:
        for i in range(n_chunks):
            out[i * n_ctx] = bos_id
    return out


def read_text(path) -> str:
    """A text file for evaluation, read as llama-perplexity's -f reads it: the bytes as they are
    (a UTF-8 byte-order mark and CR LF line ends stay in the text and are tokenized, so the ids equal
    llama.cpp's on any file), one final LF dropped. Bytes that are not UTF-8 stay in the text as
    surrogate escapes and are tokenized as llama.cpp tokenizes them (tokenizer/stray_bytes.py)."""
    with open(path, "rb") as f:
        data = f.read()
    if data.endswith(b"\n"):
        data = data[:-1]
    return from_bytes(data)
