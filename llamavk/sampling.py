"""Token sampling on the host, llama.cpp's default chain:
repeat penalty -> top-k -> top-p -> min-p -> temperature -> draw.  temp <= 0 is greedy.

Works on the logits of one token (numpy, vocabulary-sized); only the candidates that survive top-k
are sorted, so a step costs well under a millisecond.
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass

import numpy as np

from .errors import UsageError


@dataclass
class SamplingParams:
    temp: float = 0.8
    top_k: int = 40
    top_p: float = 0.95
    min_p: float = 0.05
    repeat_penalty: float = 1.0
    repeat_last_n: int = 64
    seed: int = -1          # -1: a random seed

    def __post_init__(self):
        # what would turn the draw's probabilities into NaN: a usage error, not a traceback mid-generation
        for name in ("temp", "top_p", "min_p", "repeat_penalty"):
            if not math.isfinite(getattr(self, name)):
                raise UsageError(f"--{name.replace('_', '-')} must be a finite number")
        if self.repeat_penalty <= 0:
            raise UsageError("--repeat-penalty must be above 0 (1.0: off)")


class Sampler:
    def __init__(self, params: SamplingParams, history=()):
        self.p = params
        self._seed = None if params.seed is None or params.seed < 0 else params.seed
        self._rng = None
        n = max(0, params.repeat_last_n)
        self.recent: deque[int] = deque(list(history)[-n:] if n else [], maxlen=n or None)

    @property
    def rng(self) -> np.random.Generator:
        """The generator of the draws, made at the first draw: a greedy run (temp <= 0) never
        imports numpy.random (start-up time). Only draws use it, so a seed gives the same tokens."""
        if self._rng is None:
            self._rng = np.random.default_rng(self._seed)
        return self._rng

    def accept(self, token: int) -> None:
        if self.p.repeat_last_n != 0:
            self.recent.append(token)

    def sample(self, logits: np.ndarray) -> int:
        p = self.p
        logits = np.asarray(logits, dtype=np.float32)
        if p.repeat_penalty != 1.0 and self.recent:
            logits = logits.copy()
            ids = np.fromiter(set(self.recent), dtype=np.int64)
            vals = logits[ids]
            logits[ids] = np.where(vals > 0, vals / p.repeat_penalty, vals * p.repeat_penalty)
        if p.temp <= 0:
            return int(np.argmax(logits))
        # top-k (k <= 0: keep all), candidates sorted by logit, descending
        k = len(logits) if p.top_k <= 0 else min(p.top_k, len(logits))
        cand = np.argpartition(-logits, k - 1)[:k] if k < len(logits) else np.arange(len(logits))
        cand = cand[np.argsort(-logits[cand], kind="stable")]
        vals = logits[cand].astype(np.float64)
        # top-p on the softmax of the survivors
        if p.top_p < 1.0:
            probs = _softmax(vals)
            keep = int(np.searchsorted(np.cumsum(probs), p.top_p) + 1)
            cand, vals = cand[:keep], vals[:keep]
        # min-p: drop tokens less likely than min_p x the most likely one
        if p.min_p > 0.0:
            probs = _softmax(vals)
            keep = max(1, int(np.sum(probs >= p.min_p * probs[0])))
            cand, vals = cand[:keep], vals[:keep]
        probs = _softmax(vals / p.temp)
        return int(cand[self.rng.choice(len(cand), p=probs)])


def _softmax(x: np.ndarray) -> np.ndarray:
    e = np.exp(x - x.max())
    return e / e.sum()
