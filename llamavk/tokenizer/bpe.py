"""Byte-level BPE (GGUF `tokenizer.ggml.model = gpt2`), as llama.cpp's llm_tokenizer_bpe does it.

Each pre-token word is UTF-8 encoded and every byte is mapped to a printable character (GPT-2's
bytes<->unicode table), so the vocabulary and merges are plain strings. Merging repeatedly joins the
adjacent pair with the lowest merge rank, the leftmost one on ties. A heap with lazy invalidation keeps
long words (runs of spaces, minified code) O(n log n) instead of O(n^2), and results are cached per
word: natural text repeats words a lot, so most words are never merged twice.
"""

from __future__ import annotations

import heapq


def _bytes_to_unicode() -> list[str]:
    """GPT-2's reversible byte -> printable character table (index = byte value)."""
    keep = list(range(ord("!"), ord("~") + 1)) + list(range(0xA1, 0xAC + 1)) + list(range(0xAE, 0xFF + 1))
    table = [""] * 256
    extra = 0
    for b in range(256):
        if b in keep:
            table[b] = chr(b)
        else:  # bytes that are not printable go to code points 256, 257, ...
            table[b] = chr(256 + extra)
            extra += 1
    return table


BYTE_TO_UNICODE: list[str] = _bytes_to_unicode()
UNICODE_TO_BYTE: dict[str, int] = {c: b for b, c in enumerate(BYTE_TO_UNICODE)}
# str.translate table: latin-1 decoded bytes -> GPT-2 characters in one C-level pass.
_TRANSLATE = {b: c for b, c in enumerate(BYTE_TO_UNICODE)}


def bytes_to_bpe_text(data: bytes) -> str:
    return data.decode("latin-1").translate(_TRANSLATE)


def bpe_text_to_bytes(text: str) -> bytes | None:
    """Inverse mapping; None when a character is outside the table (not a byte-level token)."""
    try:
        return bytes(UNICODE_TO_BYTE[c] for c in text)
    except KeyError:
        return None


def parse_merges(merges: list[str]) -> dict[tuple[str, str], int]:
    """`"a b"` strings -> {(a, b): rank}. The separator is the first space after the first char."""
    ranks: dict[tuple[str, str], int] = {}
    for i, m in enumerate(merges):
        pos = m.find(" ", 1)
        if pos < 0:
            continue  # llama.cpp stores ("", "") here, which can never match; skipping is equivalent
        ranks.setdefault((m[:pos], m[pos + 1:]), i)
    return ranks


class BPE:
    def __init__(self, token_to_id: dict[str, int], ranks: dict[tuple[str, str], int],
                 ignore_merges: bool):
        self.token_to_id = token_to_id
        self.ranks = ranks
        self.ignore_merges = ignore_merges
        self._cache: dict[str, list[int]] = {}

    def encode_word(self, word: str) -> list[int]:
        """Ids for one pre-token word (a Python str of the original text; a surrogate in it is a code
        point llama.cpp's lenient decoder made of stray bytes, encoded back as it does: stray_bytes.py)."""
        ids = self._cache.get(word)
        if ids is None:
            ids = self._encode_uncached(bytes_to_bpe_text(word.encode("utf-8", "surrogatepass")))
            if len(self._cache) < 200_000:  # bound memory on adversarial input
                self._cache[word] = ids
        return ids

    def _encode_uncached(self, text: str) -> list[int]:
        vocab = self.token_to_id
        if self.ignore_merges and text in vocab:  # Llama 3: whole words in the vocab skip merging
            return [vocab[text]]
        out: list[int] = []
        for sym in self._merge(text):
            tid = vocab.get(sym)
            if tid is not None:
                out.append(tid)
            else:
                # llama.cpp falls back to looking up each UTF-8 *byte* of the symbol as a one-byte
                # string; only ASCII can match. It never happens with a complete byte-level vocab.
                for ch in sym.encode("utf-8"):
                    tid = vocab.get(chr(ch)) if ch < 0x80 else None
                    if tid is not None:
                        out.append(tid)
        return out

    def _merge(self, text: str) -> list[str]:
        n = len(text)
        if n <= 1:
            return [text] if n else []
        ranks = self.ranks
        syms = list(text)
        nxt = list(range(1, n)) + [-1]
        prv = list(range(-1, n - 1))
        heap: list[tuple[int, int, int, str]] = []
        for i in range(n - 1):
            r = ranks.get((syms[i], syms[i + 1]))
            if r is not None:
                heap.append((r, i, i + 1, syms[i] + syms[i + 1]))
        heapq.heapify(heap)
        while heap:
            r, left, right, joined = heapq.heappop(heap)
            a, b = syms[left], syms[right]
            # stale entry: one side was merged away or grew since this pair was queued
            if not a or not b or nxt[left] != right or a + b != joined:
                continue
            syms[left] = joined
            syms[right] = ""
            nr = nxt[right]
            nxt[left] = nr
            if nr >= 0:
                prv[nr] = left
            pl = prv[left]
            if pl >= 0:
                r2 = ranks.get((syms[pl], joined))
                if r2 is not None:
                    heapq.heappush(heap, (r2, pl, left, syms[pl] + joined))
            if nr >= 0:
                r2 = ranks.get((joined, syms[nr]))
                if r2 is not None:
                    heapq.heappush(heap, (r2, left, nr, joined + syms[nr]))
        return [s for s in syms if s]
