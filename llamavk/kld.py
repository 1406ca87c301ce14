"""KL-divergence base files in llama.cpp's format (llama-perplexity --kl-divergence-base).

A base run saves, for every scored position, its whole token distribution; a later run of another
model (a quantization, a split mode, another engine) is compared with it (kld_stats.py). The file
is llama-perplexity's own, so a base written by llama.cpp is read here and the other way round.

Layout, little endian:

    8 bytes      b"_logits_"
    i32 n_ctx    i32 n_vocab    i32 n_chunks
    i32[n_chunks * n_ctx]  the text's tokens, as tokenized (a model that adds BOS puts it into
                           each chunk's first slot when evaluating; the file keeps the original)
    per chunk, per scored position (n_ctx - 1 - n_ctx/2 of them, positions n_ctx/2 ... n_ctx - 2):
        u16[nv], nv = 2 * ceil(n_vocab / 2) + 4:
        f32 scale, f32 min_log_prob (the first 4 words), then one u16 q per vocabulary entry
        (and a zero word where n_vocab is odd): log p ~= min_log_prob + scale * q

Log-probabilities are stored over the 16 nats below the top one (anything less likely becomes
q = 0), so one step of q is 16/65535 nats at most. `encode_rows` computes them in single
precision the way llama-perplexity does, so the same logits give the same bytes.
"""

from __future__ import annotations

import os
import struct

import numpy as np

from .errors import LlamavkError

MAGIC = b"_logits_"
HEADER = struct.Struct("<8s3i")
LOG_PROB_RANGE = 16.0          # nats below the most likely token that the quantization covers


def row_words(n_vocab: int) -> int:
    """u16 words per stored position: scale and minimum (2 floats) + n_vocab, rounded up to even."""
    return 2 * ((n_vocab + 1) // 2) + 4


def scored_positions(n_ctx: int) -> int:
    return n_ctx - 1 - n_ctx // 2


def _exp_sum(x: np.ndarray, top: np.ndarray) -> np.ndarray:
    """sum(exp(x - top)) per row: each term in single precision, the sum in double (as llama.cpp)."""
    return np.exp(x - top[:, None]).sum(axis=1, dtype=np.float64)


def encode_rows(logits: np.ndarray, targets: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Quantized log-probabilities of these rows (u16 [rows, row_words]) and each row's NLL of its
    target token (float64), computed in llama-perplexity's single-precision steps."""
    x = np.asarray(logits, dtype=np.float32)
    rows, n_vocab = x.shape
    top = x.max(axis=1)
    low = np.maximum(x.min(axis=1), top - np.float32(LOG_PROB_RANGE))
    log_sum = np.log(_exp_sum(x, top)).astype(np.float32)
    out = np.zeros((rows, row_words(n_vocab)), dtype="<u2")
    scale = (top - low) / np.float32(65535)
    head = np.empty((rows, 2), dtype="<f4")
    head[:, 0] = scale
    head[:, 1] = (low - top) - log_sum          # log p of the lowest stored value
    out[:, :4] = head.view("<u2")
    live = scale != 0                           # a flat row stores q = 0 everywhere
    if live.any():
        inv = np.float32(1) / scale[live]
        lo = low[live][:, None]
        q = np.rint(inv[:, None] * (x[live] - lo))
        out[live, 4:4 + n_vocab] = np.where(x[live] > lo, np.minimum(q, 65535), 0).astype("<u2")
    nll = (top + log_sum) - x[np.arange(rows), np.asarray(targets)]
    return out, nll.astype(np.float64)


def decode_rows(words: np.ndarray, n_vocab: int) -> np.ndarray:
    """Stored rows (u16 [rows, row_words]) -> log-probabilities (float32 [rows, n_vocab])."""
    head = np.ascontiguousarray(words[:, :4]).view("<f4")
    return head[:, 0:1] * words[:, 4:4 + n_vocab].astype(np.float32) + head[:, 1:2]


class KLDBaseWriter:
    """Writes a base file while a perplexity run scores its chunks (`add` is its on_scored hook)."""

    def __init__(self, path, n_ctx: int, n_vocab: int, n_chunks: int, tokens: list[int]):
        try:
            self.f = open(path, "wb")
        except OSError as exc:
            raise LlamavkError(f"cannot write KL-divergence base file {path}: {exc.strerror}") from None
        self.f.write(HEADER.pack(MAGIC, n_ctx, n_vocab, n_chunks))
        self.f.write(np.asarray(tokens[:n_chunks * n_ctx], dtype="<i4").tobytes())

    def add(self, logits: np.ndarray, targets: np.ndarray) -> None:
        words, _ = encode_rows(logits, targets)
        self.f.write(words.tobytes())

    def close(self) -> None:
        self.f.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


class KLDBase:
    """A base file opened for comparison: header and tokens read and checked, then the stored rows
    are read in order, chunk by chunk, with `read_rows`. The file is untrusted input: counts are
    checked against its size before anything is allocated."""

    def __init__(self, path):
        self.path = path
        try:
            self.f = open(path, "rb")
            size = os.fstat(self.f.fileno()).st_size
        except OSError as exc:
            raise LlamavkError(f"cannot read KL-divergence base file {path}: {exc.strerror}") from None
        head = self.f.read(HEADER.size)
        if len(head) < HEADER.size or head[:8] != MAGIC:
            self.f.close()
            raise LlamavkError(f"{path} is not a KL-divergence base file (llama-perplexity --kl-divergence-base)")
        _, self.n_ctx, self.n_vocab, self.n_chunks = HEADER.unpack(head)
        if self.n_ctx < 4 or self.n_vocab < 1 or self.n_chunks < 1:
            self.f.close()
            raise LlamavkError(f"{path}: bad header (n_ctx {self.n_ctx}, n_vocab {self.n_vocab}, "
                               f"{self.n_chunks} chunks)")
        self.scored = scored_positions(self.n_ctx)
        self.row_bytes = 2 * row_words(self.n_vocab)
        need = HEADER.size + 4 * self.n_ctx * self.n_chunks + self.n_chunks * self.scored * self.row_bytes
        if size < need:
            self.f.close()
            raise LlamavkError(f"{path} is truncated: {self.n_chunks} chunks of {self.n_ctx} tokens over "
                               f"{self.n_vocab} entries need {need} bytes, the file has {size}")
        raw = self.f.read(4 * self.n_ctx * self.n_chunks)
        tokens = np.frombuffer(raw, dtype="<i4")
        bad = (tokens < 0) | (tokens >= self.n_vocab)
        if bad.any():
            self.f.close()
            raise LlamavkError(f"{path}: token id {int(tokens[bad][0])} is outside its vocabulary of {self.n_vocab}")
        self.tokens = tokens.tolist()

    def check_model(self, n_vocab: int) -> None:
        if n_vocab != self.n_vocab:
            raise LlamavkError(f"the base file has {self.n_vocab} vocabulary entries, this model {n_vocab}")

    def read_rows(self, rows: int) -> np.ndarray:
        """The next `rows` stored positions, u16 [rows, row_words]."""
        raw = self.f.read(rows * self.row_bytes)
        if len(raw) != rows * self.row_bytes:
            raise LlamavkError(f"{self.path} is truncated")
        return np.frombuffer(raw, dtype="<u2").reshape(rows, -1)

    def close(self) -> None:
        self.f.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
