"""Token sampling on the host: llama.cpp's default sampler chain (common_sampler over
llama-sampler.cpp), step for step, its draw included:

    suppressed tokens -> penalties -> top-n-sigma -> top-k -> typical -> top-p -> min-p -> XTC -> temperature
    -> draw

- Penalties over the last repeat_last_n tokens (the prompt's included; -1: the context): a token's
  logit divided by the repeat penalty (multiplied where it is <= 0), then less count x frequency
  penalty and the presence penalty once. Suppressed tokens (GGUF tokenizer.ggml.suppress_tokens)
  are never drawn.
- Each filter sees the candidates in llama.cpp's order: token order until a filter sorts them (top-k,
  top-p, typical's softmax), by logit after, by typicality after typical; min-p on unsorted
  candidates keeps their order. Probabilities are float32 softmaxes summed in that order.
- The draw: a std::mt19937 seeded with -s (-1: a random seed), one double per token from two of its
  words (cpp_random.canonical), the first candidate in order whose running sum of exp(logit - max)
  reaches that fraction of the total. So with the same seed and flags the tokens are llama-completion's
  wherever the two engines' logits put no draw on the other side of a candidate's edge.
- XTC (exclude top choices, off unless --xtc-probability > 0 and --xtc-threshold <= 0.5): with that
  probability (a float from a std::mt19937 of its own, seeded as the draw's), every candidate at or
  above the threshold but the least likely of them is dropped.
- Mirostat (--mirostat 1 or 2; then, as in llama.cpp, neither penalties nor the filters above): the
  temperature, then the candidates cut to those whose surprise stays within mu (2: by surprise;
  1: top-k with k from the estimated Zipf exponent), a draw as std::discrete_distribution makes it
  (cpp_random.discrete), and mu moved by the learning rate towards the target surprise.
- temp <= 0 is greedy: the highest logit after the penalties (and typical and XTC, the filters that
  can drop it).
- Not here: DRY (its default multiplier 0 leaves it out of llama.cpp's chain too), a grammar, a
  custom order (--samplers).
- Choice: typical after top-n-sigma with masked candidates left (top-k 0) takes 0 log 0 = 0 in the
  entropy; llama.cpp's sum turns NaN there and its candidates' order is its sort's accident.

A step costs well under a millisecond (numpy over the vocabulary, then over the survivors of top-k);
Mirostat sorts every logit (~1 ms on 150k).
"""

from __future__ import annotations

import math
import secrets
from collections import Counter, deque
from dataclasses import dataclass

import numpy as np

from .cpp_random import MT19937, canonical, canonical_float, discrete
from .errors import UsageError

F32 = np.float32


@dataclass
class SamplingParams:
    temp: float = 0.8
    top_k: int = 40
    top_p: float = 0.95
    min_p: float = 0.05
    repeat_penalty: float = 1.0
    repeat_last_n: int = 64      # -1: the whole context
    seed: int = -1               # -1: a random seed
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    typical_p: float = 1.0       # 1: off
    top_n_sigma: float = -1.0    # <= 0: off
    xtc_probability: float = 0.0  # 0: off
    xtc_threshold: float = 0.1    # > 0.5: off
    mirostat: int = 0            # 1, 2: Mirostat, Mirostat 2.0 instead of the chain
    mirostat_tau: float = 5.0    # its target surprise (bits)
    mirostat_eta: float = 0.1    # its learning rate

    def __post_init__(self):
        # what would turn the draw's probabilities into NaN: a usage error, not a traceback mid-generation
        for name in ("temp", "top_p", "min_p", "repeat_penalty", "presence_penalty", "frequency_penalty",
                     "typical_p", "top_n_sigma", "xtc_probability", "xtc_threshold", "mirostat_tau", "mirostat_eta"):
            if not math.isfinite(getattr(self, name)):
                raise UsageError(f"--{name.replace('_', '-')} must be a finite number")
        if self.repeat_penalty <= 0:
            raise UsageError("--repeat-penalty must be above 0 (1.0: off)")
        if self.mirostat not in (0, 1, 2):
            raise UsageError("--mirostat must be 0 (off), 1 (Mirostat) or 2 (Mirostat 2.0)")
        if self.repeat_last_n < -1:
            raise UsageError("--repeat-last-n must be -1 (the context), 0 (off) or more")

    @property
    def xtc(self) -> bool:
        return self.xtc_probability > 0.0 and self.xtc_threshold <= 0.5

    @property
    def penalizes(self) -> bool:
        return self.repeat_penalty != 1.0 or self.frequency_penalty != 0.0 or self.presence_penalty != 0.0


class Sampler:
    def __init__(self, params: SamplingParams, history=(), n_ctx: int | None = None, suppress=()):
        self.p = params
        n = params.repeat_last_n if params.repeat_last_n >= 0 else (n_ctx or 0)
        self.window = n
        self.recent: deque[int] = deque()
        self.counts: Counter[int] = Counter()
        for t in list(history)[-n:] if n else ():
            self.accept(t)
        self._suppress = np.unique(np.asarray(list(suppress), dtype=np.int64))
        self._rng: MT19937 | None = None
        self._xtc_rng: MT19937 | None = None
        self._mu = F32(2.0 * params.mirostat_tau)    # Mirostat's running bound on the surprise

    def _seeded(self) -> MT19937:
        seed = self.p.seed if self.p.seed is not None and self.p.seed >= 0 else secrets.randbits(32)
        return MT19937(seed & 0xFFFFFFFF)

    @property
    def rng(self) -> MT19937:
        """The draws' generator, seeded at the first draw (a greedy run never needs it)."""
        if self._rng is None:
            self._rng = self._seeded()
        return self._rng

    @property
    def xtc_rng(self) -> MT19937:
        """XTC's own generator (llama.cpp seeds it with the same seed)."""
        if self._xtc_rng is None:
            self._xtc_rng = self._seeded()
        return self._xtc_rng

    def accept(self, token: int) -> None:
        """A token of the sequence (prompt or generated): the penalties' window moves on."""
        if not self.window:
            return
        self.counts[token] += 1
        if len(self.recent) >= self.window:
            old = self.recent.popleft()
            self.counts[old] -= 1
            if not self.counts[old]:
                del self.counts[old]
        self.recent.append(token)

    def sample(self, logits: np.ndarray) -> int:
        p = self.p
        penalize = bool(self.counts) and p.penalizes
        # a copy where logits are written (the runtime's array may be a view of its buffer)
        x = np.array(logits, dtype=F32) if self._suppress.size or penalize else np.asarray(logits, dtype=F32)
        if self._suppress.size:
            x[self._suppress] = -np.inf
        if p.mirostat:
            return int(np.argmax(x)) if p.temp <= 0 else self._mirostat(x / F32(p.temp))
        if penalize:
            ids = np.fromiter(self.counts.keys(), np.int64, len(self.counts))
            n = np.fromiter(self.counts.values(), F32, len(self.counts))
            v = x[ids]
            v = np.where(v <= 0, v * F32(p.repeat_penalty), v / F32(p.repeat_penalty))
            x[ids] = v - (n * F32(p.frequency_penalty) + F32(p.presence_penalty))
        if p.temp <= 0 and p.typical_p >= 1.0 and not p.xtc:   # greedy: no filter left drops the highest logit
            return int(np.argmax(x))
        if p.top_n_sigma > 0 and x.size > 1:
            x = _top_n_sigma(x, p.top_n_sigma)
        # the candidates: ids and logits in llama.cpp's order (`ordered`: by logit, highest first)
        if p.top_k > 0:
            cand = _top_k(x, min(p.top_k, x.size))
            vals, ordered = x[cand], True
        else:
            cand, vals, ordered = np.arange(x.size), x, False
        if p.typical_p < 1.0:
            if not ordered:
                cand, vals, ordered = _by_logit(cand, vals)
            probs = _softmax(vals)
            with np.errstate(divide="ignore", invalid="ignore"):
                surprise = -np.log(probs)
                # 0 log 0 = 0: tokens top-n-sigma masked (llama.cpp's sum turns NaN there, and its
                # order of the candidates is then its sort's accident)
                entropy = np.cumsum(np.where(probs > 0, probs * surprise, F32(0)), dtype=F32)[-1]
                order = np.argsort(np.abs(surprise - entropy), kind="stable")
            keep = _count_to(np.cumsum(probs[order], dtype=F32), p.typical_p, strict=True)
            cand, vals, ordered = cand[order[:keep]], vals[order[:keep]], False
        if p.top_p < 1.0:
            probs = _softmax(vals)
            if not ordered:
                order = np.argsort(-vals, kind="stable")
                cand, vals, probs, ordered = cand[order], vals[order], probs[order], True
            keep = _count_to(np.cumsum(probs, dtype=F32), p.top_p, strict=False)
            cand, vals = cand[:keep], vals[:keep]
        if p.min_p > 0.0:
            floor = (vals[0] if ordered else vals.max()) + np.log(F32(p.min_p))
            if not ordered and not (vals >= floor).any():   # min-p > 1: llama.cpp sorts, keeps the best
                cand, vals, ordered = _by_logit(cand, vals)
            if ordered:
                below = np.nonzero(vals[1:] < floor)[0]
                keep = 1 + below[0] if below.size else vals.size
                cand, vals = cand[:keep], vals[:keep]
            else:
                cand, vals = cand[vals >= floor], vals[vals >= floor]
        if p.xtc and vals.size > 1 and canonical_float(self.xtc_rng) <= p.xtc_probability:
            if not ordered:
                cand, vals, ordered = _by_logit(cand, vals)
            above = np.nonzero(_softmax(vals) < F32(p.xtc_threshold))[0]   # sorted: the first one below
            last = (above[0] if above.size else vals.size) - 1                # the last at or above it
            if last > 0:
                cand, vals = cand[last:], vals[last:]
        if p.temp <= 0:                          # greedy after typical or XTC: the first highest in order
            return int(cand[np.argmax(vals)])
        vals = vals / F32(p.temp)
        return int(cand[self._draw(vals, ordered)])

    def _mirostat(self, vals: np.ndarray) -> int:
        """llama.cpp's Mirostat (1) or Mirostat 2.0 (2) on the tempered logits of every token."""
        p = self.p
        s = np.sort(vals)[::-1]                       # the softmax over every token, summed in its sorted order
        probs = _softmax(s)
        if p.mirostat == 2:
            over = np.nonzero(-np.log2(probs) > self._mu)[0]
            keep = max(1, int(over[0]) if over.size else s.size)
        else:
            m = min(100 - 1, s.size - 1)              # the Zipf exponent from the 100 likeliest
            i = np.arange(m, dtype=F32)
            t = np.log((i + F32(2)) / (i + F32(1)))
            with np.errstate(divide="ignore", invalid="ignore"):
                b = np.log(probs[:m] / probs[1:m + 1])
                s_hat = np.cumsum(t * b, dtype=F32)[-1] / np.cumsum(t * t, dtype=F32)[-1]
                eps = s_hat - F32(1)
                k = np.power(eps * np.power(F32(2), self._mu) / (F32(1) - np.power(F32(s.size), -eps)), F32(1) / s_hat)
            keep = min(max(int(k), 1), s.size) if np.isfinite(k) else s.size
        cand = _top_k(vals, keep)
        probs = _softmax(vals[cand])
        i = discrete(probs, self.rng)
        self._mu = F32(self._mu - F32(p.mirostat_eta) * (-np.log2(probs[i]) - F32(p.mirostat_tau)))
        return int(cand[i])

    def _draw(self, vals: np.ndarray, ordered: bool) -> int:
        """llama.cpp's dist sampler: index of the candidate the seeded draw lands on."""
        r = canonical(self.rng)                  # one draw per token, even for a single candidate
        if vals.size == 1:
            return 0
        with np.errstate(invalid="ignore"):
            w = np.exp(vals - (vals[0] if ordered else vals.max())).astype(np.float64)
        run = np.cumsum(w)
        return min(int(np.searchsorted(run, run[-1] * r, side="left")), vals.size - 1)


TOP_K_BANDS = (2.0, 6.0, 16.0)    # see _top_k


def _top_k(vals: np.ndarray, k: int) -> np.ndarray:
    """Indices of the k highest values, highest first (equal values in index order). The selection
    runs on the values within the narrowest of TOP_K_BANDS of the highest that holds k of them (an
    LLM's top 40 lie within a few units of its best logit), not on the whole vocabulary: a partition
    of 150k values takes ~0.5 ms, a fifth of a 7B decode step."""
    if k >= vals.size:
        return np.argsort(-vals, kind="stable")
    best = vals.max()
    for band in TOP_K_BANDS:
        near = np.flatnonzero(vals >= best - F32(band))
        if near.size >= k:
            break
    else:
        near = np.arange(vals.size)
    if near.size > k:
        near = np.sort(near[np.argpartition(-vals[near], k - 1)[:k]])
    return near[np.argsort(-vals[near], kind="stable")]


def _softmax(vals: np.ndarray) -> np.ndarray:
    """llama.cpp's float32 softmax of the candidates in their order (the sum accumulated in that order)."""
    e = np.exp(vals - vals.max())
    return e / np.cumsum(e, dtype=F32)[-1]


def _by_logit(cand: np.ndarray, vals: np.ndarray):
    order = np.argsort(-vals, kind="stable")
    return cand[order], vals[order], True


def _count_to(cum: np.ndarray, p: float, strict: bool) -> int:
    """How many candidates until the running probability reaches p (exceeds it, strict): all where it never does."""
    hit = np.nonzero(cum > F32(p) if strict else cum >= F32(p))[0]
    return int(hit[0]) + 1 if hit.size else cum.size


def _top_n_sigma(x: np.ndarray, n: float) -> np.ndarray:
    """Logits more than n standard deviations (of the finite ones) below the highest set to -inf."""
    finite = x[np.isfinite(x)]
    if not finite.size:
        return x
    std = F32(np.sqrt(np.mean((finite.astype(np.float64) - finite.mean(dtype=np.float64)) ** 2)))
    return np.where(x < finite.max() - F32(n) * std, F32(-np.inf), x)
