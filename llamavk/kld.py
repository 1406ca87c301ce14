"""KL divergence between a base run's token distributions and this run's (llama-perplexity's
--kl-divergence-base / --kl-divergence).

Base file format (little endian), written by `KLDBaseWriter`, read by `KLDComparer`:

    8 bytes   magic b"LVKLD\\x00\\x01\\x00"
    4 x u32   n_ctx, n_vocab, n_chunks, scored = n_ctx - 1 - n_ctx/2 positions per chunk
    i32[n_chunks * n_ctx]             the evaluated tokens (BOS substitution included)
    per scored position, in order:    f32 lo, f32 step, u16[n_vocab] q  with  log p ~= lo + step * q

Log-probabilities are stored to 1/65535 of their range (~4e-4 nats for SmolLM2): 2 bytes per
vocabulary entry, like llama.cpp's own base files. A run compared with its own base file gives a
KL divergence of ~1e-8 (the rounding), not exactly 0.
"""

from __future__ import annotations

import math
import struct

import numpy as np

from .errors import LlamavkError

MAGIC = b"LVKLD\x00\x01\x00"


def log_softmax(logits: np.ndarray) -> np.ndarray:
    x = logits.astype(np.float64)
    m = x.max(axis=1, keepdims=True)
    return x - m - np.log(np.exp(x - m).sum(axis=1, keepdims=True))


class KLDBaseWriter:
    def __init__(self, path, n_ctx: int, n_vocab: int, n_chunks: int, tokens: list[int]):
        self.f = open(path, "wb")
        self.n_vocab = n_vocab
        scored = n_ctx - 1 - n_ctx // 2
        self.f.write(MAGIC + struct.pack("<4I", n_ctx, n_vocab, n_chunks, scored))
        self.f.write(np.asarray(tokens[:n_chunks * n_ctx], dtype="<i4").tobytes())

    def add(self, logits: np.ndarray, targets: np.ndarray | None = None) -> None:
        """Store the log-probabilities of these scored rows (targets: unused, same hook as compare)."""
        lp = log_softmax(logits)
        lo = lp.min(axis=1, keepdims=True)
        step = np.maximum(-lo / 65535.0, 1e-30)
        q = np.rint((lp - lo) / step).clip(0, 65535).astype("<u2")
        for row in range(len(lp)):
            self.f.write(struct.pack("<2f", float(lo[row, 0]), float(step[row, 0])))
            self.f.write(q[row].tobytes())

    def close(self) -> None:
        self.f.close()


class KLDComparer:
    def __init__(self, path):
        try:
            self.f = open(path, "rb")
        except OSError as exc:
            raise LlamavkError(f"cannot read KL-divergence base file {path}: {exc.strerror}") from None
        head = self.f.read(len(MAGIC) + 16)
        if len(head) < len(MAGIC) + 16 or head[:len(MAGIC)] != MAGIC:
            raise LlamavkError(f"{path} is not a llamavk KL-divergence base file")
        self.n_ctx, self.n_vocab, self.n_chunks, self.scored = struct.unpack("<4I", head[len(MAGIC):])
        raw = self.f.read(4 * self.n_chunks * self.n_ctx)
        if len(raw) != 4 * self.n_chunks * self.n_ctx:
            raise LlamavkError(f"{path} is truncated")
        self.tokens = np.frombuffer(raw, dtype="<i4").tolist()
        self.kld, self.dp, self.same_top = [], [], []
        self.nll_q, self.nll_base = [], []

    def check_model(self, n_vocab: int) -> None:
        if n_vocab != self.n_vocab:
            raise LlamavkError(f"the base file has {self.n_vocab} vocabulary entries, this model {n_vocab}")

    def _read_base(self, rows: int) -> np.ndarray:
        out = np.empty((rows, self.n_vocab))
        size = 8 + 2 * self.n_vocab
        for r in range(rows):
            b = self.f.read(size)
            if len(b) != size:
                raise LlamavkError("the KL-divergence base file is truncated")
            lo, step = struct.unpack("<2f", b[:8])
            out[r] = lo + step * np.frombuffer(b[8:], dtype="<u2")
        return out

    def add(self, logits: np.ndarray, targets: np.ndarray) -> None:
        lq = log_softmax(logits)
        lb = self._read_base(len(lq))
        pb = np.exp(lb)
        pb /= pb.sum(axis=1, keepdims=True)
        idx = np.arange(len(targets))
        self.kld.extend((pb * (np.log(pb) - lq)).sum(axis=1).tolist())
        self.dp.extend((np.exp(lq[idx, targets]) - pb[idx, targets]).tolist())
        self.same_top.extend((lq.argmax(axis=1) == lb.argmax(axis=1)).tolist())
        self.nll_q.extend((-lq[idx, targets]).tolist())
        self.nll_base.extend((-lb[idx, targets]).tolist())

    def report(self) -> list[str]:
        """llama-perplexity's three statistics blocks."""
        kld, dp = np.array(self.kld), np.array(self.dp)
        same = np.array(self.same_top, dtype=np.float64)
        nq, nb = np.array(self.nll_q), np.array(self.nll_base)
        n = len(kld)

        def mean_unc(v):
            return v.mean(), (v.std(ddof=1) / math.sqrt(n) if n > 1 else 0.0)

        ln_ratio = nq - nb
        m_ratio, u_ratio = mean_unc(ln_ratio)
        ppl_q, ppl_b = math.exp(nq.mean()), math.exp(nb.mean())
        cor = float(np.corrcoef(nq, nb)[0, 1]) if n > 1 and nq.std() > 0 and nb.std() > 0 else 1.0
        lines = ["====== Perplexity statistics ======",
                 f"Mean PPL(Q)                   : {ppl_q:10.6f}",
                 f"Mean PPL(base)                : {ppl_b:10.6f}",
                 f"Cor(ln(PPL(Q)), ln(PPL(base))): {100 * cor:6.2f}%",
                 f"Mean ln(PPL(Q)/PPL(base))     : {m_ratio:10.6f} ± {u_ratio:10.6f}",
                 f"Mean PPL(Q)/PPL(base)         : {math.exp(m_ratio):10.6f} ± {math.exp(m_ratio) * u_ratio:10.6f}",
                 f"Mean PPL(Q)-PPL(base)         : {ppl_q - ppl_b:10.6f}",
                 "", "====== KL divergence statistics ======"]
        m, u = mean_unc(kld)
        lines.append(f"Mean    KLD: {m:10.6f} ± {u:10.6f}")
        for label, q in (("Maximum", 100), ("99.9%  ", 99.9), ("99.0%  ", 99), ("Median ", 50), ("10.0%  ", 10),
                         (" 5.0%  ", 5), (" 1.0%  ", 1), (" 0.1%  ", 0.1), ("Minimum", 0)):
            lines.append(f"{label} KLD: {np.percentile(kld, q):10.6f}")
        lines += ["", "====== Token probability statistics ======"]
        m, u = mean_unc(dp)
        lines.append(f"Mean    Δp: {100 * m:6.3f} ± {100 * u:5.3f} %")
        for label, q in (("Maximum", 100), ("99.9%  ", 99.9), ("99.0%  ", 99), ("95.0%  ", 95), ("90.0%  ", 90),
                         ("75.0%  ", 75), ("Median ", 50), ("25.0%  ", 25), ("10.0%  ", 10), (" 5.0%  ", 5),
                         (" 1.0%  ", 1), (" 0.1%  ", 0.1), ("Minimum", 0)):
            lines.append(f"{label} Δp: {100 * np.percentile(dp, q):6.3f}%")
        rms = math.sqrt(float((dp ** 2).mean()))
        rms_unc = float((dp ** 2).std(ddof=1)) / math.sqrt(n) / (2 * rms) if n > 1 and rms > 0 else 0.0
        lines.append(f"RMS Δp    : {100 * rms:6.3f} ± {100 * rms_unc:5.3f} %")
        m, u = mean_unc(same)
        lines.append(f"Same top p: {100 * m:6.3f} ± {100 * u:5.3f} %")
        return lines

    def close(self) -> None:
        self.f.close()
