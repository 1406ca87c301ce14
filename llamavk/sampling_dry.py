"""DRY ("don't repeat yourself"), llama.cpp's dry sampler step for step (llama-sampler.cpp, after
Koboldcpp's): a token that would extend a sequence already seen in the last `last_n` tokens loses

    multiplier * base ** (length of that sequence - allowed_length)

from its logit, where the sequence is at least `allowed_length` tokens long. Sequence breakers end
the repeats looked for: the most recent one in the window caps the length a repeat can have, and a
token that is a whole breaker by itself is never penalized.

- Breakers are strings. llama.cpp turns each into token sequences over the vocabulary: every token
  whose text holds the breaker is a breaker by itself (an empty tail); every token whose text ends in
  a beginning of it becomes a head, its tail the ids of the breaker's rest tokenized alone (at most
  20 of them; the breaker cut to 40 bytes first). `breaker_sequences` does the same: the same heads
  and tails, quirks included (SPM's space prefix on the tail).
- The repeats: the Z-algorithm over the window read backwards, each length capped at the breaker's
  limit (llama.cpp reuses the capped lengths inside a Z-box: so do we).
- Arithmetic as llama.cpp's: the exponent capped at int(88.7228391f / logf(base)) (float max), the
  penalty a double power of the float base cast to float, subtracted in float.

The window's scan is a few Python loops over its tokens: ~0.1 ms a token at the default 64.
"""

from __future__ import annotations

from collections import deque

import numpy as np

from .tokenizer.stray_bytes import from_bytes, to_bytes

F32 = np.float32
DEFAULT_BREAKERS = ("\n", ":", '"', "*")
MAX_BREAKER_BYTES = 40     # llama_sampler_init_dry's MAX_CHAR_LEN
MAX_TAIL_TOKENS = 20       # ... MAX_SEQ_LEN
FLOAT_MAX_LOG = F32(88.7228391)


def breaker_sequences(tokenizer, breakers) -> dict[int, set[tuple[int, ...]]]:
    """Head token -> the tails that complete a breaker after it (an empty tail: the token holds a
    whole breaker), as llama.cpp's get_overlapping_token_sequences builds them."""
    seqs: dict[int, set[tuple[int, ...]]] = {}
    strings = [to_bytes(b)[:MAX_BREAKER_BYTES] for b in breakers]
    strings = [s for s in strings if s]          # llama.cpp skips empty ones (with a warning)
    if not strings:
        return seqs
    tails: dict[bytes, tuple[int, ...]] = {}

    def tail_ids(rest: bytes) -> tuple[int, ...]:
        if rest not in tails:
            ids = tokenizer.encode(from_bytes(rest), add_special=False, parse_special=False)
            tails[rest] = tuple(ids[:MAX_TAIL_TOKENS])
        return tails[rest]

    for tid in range(tokenizer.n_vocab):
        word = tokenizer.decode_bytes([tid])     # llama.cpp's detokenize({token}, special=true)
        for s in strings:
            if s in word:
                seqs.setdefault(tid, set()).add(())
                continue
            # the word's end is a beginning of s: every place its first byte occurs where the rest of
            # the word matches s (the word ends before s does, or s would be in it)
            pos = word.find(s[:1])
            while pos >= 0:
                n = len(word) - pos
                if n < len(s) and word[pos:] == s[:n]:
                    seqs.setdefault(tid, set()).add(tail_ids(s[n:]))
                pos = word.find(s[:1], pos + 1)
    return seqs


class Dry:
    """The dry sampler's state: the window of recent tokens (prompt included) and the breakers."""

    def __init__(self, multiplier: float, base: float, allowed_length: int, last_n: int,
                 breakers: dict[int, set[tuple[int, ...]]]):
        self.multiplier = F32(multiplier)
        self.base = F32(base)
        self.allowed = int(allowed_length)
        last_n = max(int(last_n), 0)
        # llama.cpp's dry_enabled: otherwise the step is an empty sampler
        self.enabled = bool(self.multiplier != 0 and self.base >= 1 and last_n != 0)
        self.recent: deque[int] = deque(maxlen=last_n if self.enabled else 0)
        self.breakers = breakers

    def accept(self, token: int) -> None:
        if self.enabled:
            self.recent.append(token)

    def repeats(self) -> dict[int, int] | None:
        """Token -> the longest repeat that emitting it next would extend (of allowed_length or more);
        None where llama.cpp returns before it penalizes (the candidates' order then stays as it is)."""
        toks = list(reversed(self.recent))       # toks[i]: i tokens back from the last (ring_buffer.rat)
        n = len(toks)
        if not self.enabled or n <= self.allowed:
            return None
        # 1: the most recent breaker caps a repeat's length
        limit = n
        for i, t in enumerate(toks):
            tails = self.breakers.get(t)
            if not tails:
                continue
            longest = -1
            for tail in tails:
                k = len(tail)
                if longest < k <= i and all(tail[o] == toks[i - o - 1] for o in range(k)):
                    longest = k
            if longest >= 0:
                limit = i - longest
                break
        if limit < self.allowed:
            return None
        # 2: count[n - 1 - k] = how far the window's end repeats k tokens back (the Z-algorithm
        # backwards, lengths capped at limit)
        count = [0] * n
        last, lt, rt = n - 1, 0, 0
        for k in range(1, n):
            if k > rt:
                m = 0
                while m + k < n and toks[m] == toks[m + k]:
                    m += 1
                count[last - k] = min(m, limit)
                if m > 0:
                    lt, rt = k, k + m - 1
            else:
                p = k - lt
                if count[last - p] < rt - k + 1:
                    count[last - k] = min(count[last - p], limit)
                else:
                    i = rt + 1
                    while i < n and toks[i] == toks[i - k]:
                        i += 1
                    count[last - k] = min(i - k, limit)
                    lt, rt = k, i - 1
        # 3: the token after each repeat would extend it
        longest_by_token: dict[int, int] = {}
        for i in range(n - 1):
            length = count[i]
            if length >= self.allowed:
                t = toks[n - 2 - i]
                if longest_by_token.get(t, -1) < length:
                    longest_by_token[t] = length
        return longest_by_token

    def penalty(self, length: int) -> np.float32:
        """What a token extending a repeat of `length` tokens loses."""
        exponent = length - self.allowed
        if self.base > F32(1.000001):
            cap = int(FLOAT_MAX_LOG / np.log(self.base))
            if cap > 0:
                exponent = min(exponent, cap)
        return F32(float(self.multiplier) * float(self.base) ** exponent)

    def single_token_breaker(self, token: int) -> bool:
        return () in self.breakers.get(token, ())
