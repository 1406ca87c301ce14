"""SentencePiece-style BPE (GGUF `tokenizer.ggml.model = llama`), as llama.cpp's llm_tokenizer_spm.

The text (spaces already escaped to U+2581) starts as one symbol per character. Every adjacent pair
whose concatenation is a vocabulary token is queued with that token's score; the best score is merged
first, the leftmost pair on ties, and new pairs around the merged symbol are queued. Symbols that end
up outside the vocabulary (single characters the vocab lacks) fall back to `<0xXX>` byte tokens, or to
the unknown token when the vocab has no byte tokens.

Long texts (a whole evaluation file is one fragment) are cut into segments that no merge can cross,
and each segment's ids are cached: a merge joins two symbols into a vocabulary token, so it can only
happen across a position whose two neighbouring characters occur together in some token. Where no
token contains that character pair, the merges on either side never meet, and tokenizing the sides
separately gives the same ids (each side sees its own merges in the same order). Cuts are tried
before every U+2581 (the escaped space), so segments are words and natural text repeats them.
Short fragments (prompts) merge in one pass, as before.

Text with stray bytes (not UTF-8, stray_bytes.py) merges llama.cpp's byte symbols instead of
characters, in segments that contain them; a cut that such a symbol could straddle is not made.

Most segments are a few characters long (a word), and a text's first encode runs the merge once per
distinct word, so short segments take a cheaper path than the heap: the current symbols and the
score of each adjacent pair in two lists, `max` and `index` (C loops) to find the best pair, the
leftmost on ties -- the same order as the heap's, at a third of its cost for a word (the heap's
push calls and stale entries dominate there). Longer segments keep the heap (the lists' rescans
grow with the square of the length).
"""

from __future__ import annotations

import heapq
import math
import re

from .stray_bytes import has_stray_bytes, spm_cut_is_safe, spm_symbols

SPACE = "\u2581"
CACHE_LIMIT = 200_000        # cached segments at most: bounds memory on adversarial input
LONG_TEXT = 256              # fragments shorter than this merge in one pass (a prompt), uncached
SHORT_SEGMENT = 24           # segments up to this many characters merge with the list scan (see above)
NO_PAIR = float("-inf")      # the list scan's score of a pair that is no token (all scores are finite there)


class SPM:
    def __init__(self, token_to_id: dict[str, int], scores: list[float], unk_id: int | None):
        self.token_to_id = token_to_id
        self.scores = scores
        self.unk_id = unk_id
        self._byte_ids: list[int | None] = [self._byte_token(b) for b in range(256)]
        self._glue: set[str] | None = None     # see _before_space
        self._cut_pattern: re.Pattern | None = None    # see _segments
        self._cache: dict[str, list[int]] = {}
        # The list scan marks "no token" with -inf, so it needs every score finite (a GGUF may hold
        # anything: other vocabularies take the heap). The sum is finite exactly when every score
        # is (or, harmlessly, not when finite scores overflow it): one C loop, ~1 ms for 262k.
        self._scan_ok = math.isfinite(sum(scores))

    def _byte_token(self, b: int) -> int | None:
        tid = self.token_to_id.get(f"<0x{b:02X}>")
        if tid is None:  # llama.cpp also accepts the raw one-byte string as the byte's token
            tid = self.token_to_id.get(chr(b)) if b < 0x80 else None
        return tid if tid is not None else self.unk_id

    @property
    def _before_space(self) -> set[str]:
        """Every character that some token has right before a U+2581: a cut there could split a
        merge. Found on the first long text (a scan of the vocabulary: ~20 ms for 262k tokens)."""
        if self._glue is None:
            self._glue = {t[i - 1] for t in self.token_to_id if t.find(SPACE, 1) > 0
                          for i in range(1, len(t)) if t[i] == SPACE}
        return self._glue

    def encode(self, text: str) -> list[int]:
        """Ids for an already escaped text fragment."""
        if len(text) < LONG_TEXT:
            return self._encode_any(text)
        out: list[int] = []
        cache = self._cache
        for seg in self._segments(text):
            ids = cache.get(seg)
            if ids is None:
                ids = self._encode_any(seg)
                if len(cache) < CACHE_LIMIT:
                    cache[seg] = ids
            out.extend(ids)
        return out

    def _segments(self, text: str) -> list[str]:
        """`text` cut before each U+2581 whose preceding character no token has before a U+2581
        (see the module's note: no merge crosses such a cut). One regex split (a zero-width match:
        a U+2581 ahead, any character but those behind), not a Python loop over the words. With
        stray bytes, a segment whose last symbol could run past its end takes the next one too."""
        segs = self._cuts.split(text)
        if not has_stray_bytes(text):
            return segs
        out: list[str] = []
        for seg in segs:
            if out and not spm_cut_is_safe(out[-1], len(out[-1])):
                out[-1] += seg
            else:
                out.append(seg)
        return out

    def next_cut(self, text: str, start: int) -> int:
        """The first of _segments' cut positions in `text` at or after `start` (-1: none): the ids of
        text[:cut] and text[cut:], each encoded alone, are those of the whole text."""
        pos = max(start, 1)
        while (m := self._cuts.search(text, pos)) is not None and not spm_cut_is_safe(text, m.start()):
            pos = m.start() + 1
        return m.start() if m else -1

    @property
    def _cuts(self) -> re.Pattern:
        if self._cut_pattern is None:
            glue = "".join(re.escape(c) for c in sorted(self._before_space))
            behind = f"[^{glue}]" if glue else "."
            self._cut_pattern = re.compile(f"(?<={behind})(?={SPACE})", re.DOTALL)
        return self._cut_pattern

    def _encode_any(self, text: str) -> list[int]:
        return self._encode_bytes(text) if has_stray_bytes(text) else self._encode_segment(text)

    def _encode_segment(self, text: str) -> list[int]:
        n = len(text)
        if n == 0:
            return []
        if n <= SHORT_SEGMENT and self._scan_ok:
            return self._ids(self._merge_scan(text), self.token_to_id.get)
        return self.one_pass(text)

    def one_pass(self, text: str) -> list[int]:
        """Ids of the whole text merged by the heap in one pass, no segments (encode's reference)."""
        if has_stray_bytes(text):
            return self._encode_bytes(text)
        return self._ids(self._merge_heap(list(text), self.token_to_id.get), self.token_to_id.get)

    def _encode_bytes(self, text: str) -> list[int]:
        """Ids of a text with stray bytes: llama.cpp's byte symbols merged as characters are (a
        symbol that is not UTF-8 is no token and never merges)."""
        return self._ids(self._merge_heap(spm_symbols(text), self._bytes_token), self._bytes_token)

    def _bytes_token(self, sym: bytes) -> int | None:
        try:
            return self.token_to_id.get(sym.decode("utf-8"))
        except UnicodeDecodeError:
            return None

    def _merge_scan(self, text: str) -> list[str]:
        """The merged symbols of a short text: each step merges the adjacent pair with the best
        score, the leftmost on ties (as the heap orders them)."""
        get, scores = self.token_to_id.get, self.scores
        syms = list(text)
        pair = []
        for a, b in zip(text, text[1:]):
            tid = get(a + b)
            pair.append(NO_PAIR if tid is None else scores[tid])
        while pair:
            best = max(pair)
            if best == NO_PAIR:
                break
            i = pair.index(best)                     # the leftmost pair with that score
            syms[i:i + 2] = [syms[i] + syms[i + 1]]
            del pair[i]
            if i < len(pair):                        # the merged symbol and its right neighbour
                tid = get(syms[i] + syms[i + 1])
                pair[i] = NO_PAIR if tid is None else scores[tid]
            if i > 0:                                # its left neighbour and the merged symbol
                tid = get(syms[i - 1] + syms[i])
                pair[i - 1] = NO_PAIR if tid is None else scores[tid]
        return syms

    def _merge_heap(self, syms: list, token) -> list:
        """The merged symbols (characters, or stray_bytes.spm_symbols; emptied where a symbol was
        merged into its left neighbour): candidate pairs in a heap, best score first, leftmost on
        ties; stale entries skipped. `token(symbol)` is its id or None."""
        n = len(syms)
        scores = self.scores
        nxt = list(range(1, n)) + [-1]
        prv = list(range(-1, n - 1))
        heap: list[tuple[float, int, int, int]] = []

        def push(left: int, right: int) -> None:
            joined = syms[left] + syms[right]
            tid = token(joined)
            if tid is not None:
                # max score first, then leftmost: heapq is a min-heap, so negate the score
                heapq.heappush(heap, (-scores[tid], left, right, len(joined)))

        for i in range(n - 1):
            push(i, i + 1)
        while heap:
            _, left, right, size = heapq.heappop(heap)
            a, b = syms[left], syms[right]
            # stale: a side was consumed, or grew (symbols only grow, so equal size = unchanged)
            if not a or not b or len(a) + len(b) != size:
                continue
            syms[left] = a + b
            syms[right] = a[:0]
            nr = nxt[right]
            nxt[left] = nr
            if nr >= 0:
                prv[nr] = left
            if prv[left] >= 0:
                push(prv[left], left)
            if nr >= 0:
                push(left, nr)
        return syms

    def _ids(self, syms: list, token) -> list[int]:
        out: list[int] = []
        for s in syms:
            if not s:
                continue
            tid = token(s)
            if tid is not None:
                out.append(tid)
            else:
                # Only single symbols can be missing (every merge produced a vocab token), so
                # llama.cpp's "resegment" recursion reduces to byte fallback.
                for b in s if isinstance(s, bytes) else s.encode("utf-8"):
                    bid = self._byte_ids[b]
                    if bid is not None:
                        out.append(bid)
        return out
