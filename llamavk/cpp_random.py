"""The random numbers llama.cpp draws, reproduced exactly: C++'s `std::mt19937` and libstdc++'s
reductions of its 32-bit words.

llama-perplexity samples HellaSwag, Winogrande and multiple-choice tasks with a `std::mt19937` seeded
with 1, so the same task file and count always give the same tasks. To score the same tasks we need
the same 32-bit stream and the same reduction of each draw to an index:

- HellaSwag draws with `std::uniform_int_distribution<size_t>`; libstdc++ (GCC >= 11, the library
  llama.cpp's builds use) reduces a 32-bit engine's draw by Lemire's multiply-and-reject method
  (`uniform_index`).
- Winogrande and multiple choice scale the draw in single precision: int(2^-32 * float(draw) * float(n))
  (`scaled_index`).

llama.cpp's token sampler (llama-sampler.cpp's dist) draws `std::uniform_real_distribution<double>(0, 1)`
from a `std::mt19937` seeded with `-s`: libstdc++'s generate_canonical of two words (`canonical`); its
XTC sampler a float from one word of a generator of its own (`canonical_float`); Mirostat draws through
`std::discrete_distribution` (`discrete`).
"""

from __future__ import annotations

import numpy as np

_N, _M = 624, 397
_MATRIX_A, _UPPER, _LOWER = 0x9908B0DF, 0x80000000, 0x7FFFFFFF


class MT19937:
    """The 32-bit Mersenne Twister with C++'s `std::mt19937(seed)` seeding (init_genrand)."""

    def __init__(self, seed: int = 5489):
        mt = [seed & 0xFFFFFFFF]
        for i in range(1, _N):
            mt.append((1812433253 * (mt[-1] ^ (mt[-1] >> 30)) + i) & 0xFFFFFFFF)
        self._mt = mt
        self._i = _N

    def _twist(self) -> None:
        mt = self._mt
        for i in range(_N):
            y = (mt[i] & _UPPER) | (mt[(i + 1) % _N] & _LOWER)
            mt[i] = mt[(i + _M) % _N] ^ (y >> 1) ^ (_MATRIX_A if y & 1 else 0)
        self._i = 0

    def __call__(self) -> int:
        if self._i >= _N:
            self._twist()
        y = self._mt[self._i]
        self._i += 1
        y ^= y >> 11
        y ^= (y << 7) & 0x9D2C5680
        y ^= (y << 15) & 0xEFC60000
        return y ^ (y >> 18)


def uniform_index(rng: MT19937, n: int) -> int:
    """libstdc++'s `uniform_int_distribution<size_t>(0, n - 1)(rng)` for a 32-bit engine: the high
    word of draw * n, redrawing while the low word falls in the biased zone below 2^32 mod n."""
    if not 1 <= n <= 1 << 32:
        raise ValueError("uniform_index needs 1 <= n <= 2^32")
    if n == 1 << 32:                  # the whole range: the draw itself
        return rng()
    product = rng() * n
    low = product & 0xFFFFFFFF
    if low < n:
        threshold = (1 << 32) % n     # = (-n) mod n in 32-bit arithmetic
        while low < threshold:
            product = rng() * n
            low = product & 0xFFFFFFFF
    return product >> 32


_TWO_TO_MINUS_32 = np.float32(1.0) / (np.float32(1.0) + np.float32(0xFFFFFFFF))   # the float 2^-32


def scaled_index(rng: MT19937, n: int) -> int:
    """int(scale * draw * n) evaluated in float (llama-perplexity's Winogrande and multiple-choice
    sampling). The draw's rounding to 24 bits can reach n itself for draws within 2^7 of 2^32 (a
    chance of 3e-8); C++ would then read past its array, here the last index is taken."""
    x = np.float32(_TWO_TO_MINUS_32 * np.float32(rng())) * np.float32(n)
    return min(int(x), n - 1)


_TWO_32, _TWO_64 = 2.0 ** 32, 2.0 ** 64


def canonical(rng: MT19937) -> float:
    """libstdc++'s `std::generate_canonical<double, 53>(rng)` for a 32-bit engine (and so
    `uniform_real_distribution<double>(0, 1)`): ceil(53 / 32) = 2 words, (w0 + w1 2^32) / 2^64 in
    double arithmetic, a result rounded up to 1.0 moved to the double just below it."""
    w0 = rng()
    w1 = rng()
    r = (float(w0) + float(w1) * _TWO_32) / _TWO_64
    return r if r < 1.0 else 1.0 - 2.0 ** -53


def canonical_float(rng: MT19937) -> float:
    """libstdc++'s `std::generate_canonical<float, 24>(rng)` (`uniform_real_distribution<float>(0, 1)`):
    one word, float(w) / 2^32 in single precision (the word rounded to 24 bits first), a result
    rounded up to 1.0 moved to the float just below it."""
    r = np.float32(rng()) / np.float32(_TWO_32)
    return float(r) if r < 1.0 else float(np.nextafter(np.float32(1.0), np.float32(0.0)))


def discrete(probs: np.ndarray, rng: MT19937) -> int:
    """libstdc++'s `std::discrete_distribution<int>(probs)(rng)`: the weights normalised in double,
    their running sums with the last set to 1, the first sum at or above one canonical double. With
    fewer than two weights it keeps no table and returns 0 without drawing."""
    if probs.size < 2:
        return 0
    w = probs.astype(np.float64)
    run = np.cumsum(w / np.cumsum(w)[-1])
    run[-1] = 1.0
    return int(np.searchsorted(run, canonical(rng), side="left"))
