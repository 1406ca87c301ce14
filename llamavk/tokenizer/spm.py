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
"""

from __future__ import annotations

import heapq

SPACE = "\u2581"
CACHE_LIMIT = 200_000        # cached segments at most: bounds memory on adversarial input
LONG_TEXT = 256              # fragments shorter than this merge in one pass (a prompt), uncached


class SPM:
    def __init__(self, token_to_id: dict[str, int], scores: list[float], unk_id: int | None):
        self.token_to_id = token_to_id
        self.scores = scores
        self.unk_id = unk_id
        self._byte_ids: list[int | None] = [self._byte_token(b) for b in range(256)]
        self._glue: set[str] | None = None     # see _before_space
        self._cache: dict[str, list[int]] = {}

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
            return self._encode_segment(text)
        out: list[int] = []
        cache = self._cache
        for seg in self._segments(text):
            ids = cache.get(seg)
            if ids is None:
                ids = self._encode_segment(seg)
                if len(cache) < CACHE_LIMIT:
                    cache[seg] = ids
            out.extend(ids)
        return out

    def _segments(self, text: str) -> list[str]:
        """`text` cut before each U+2581 whose preceding character no token has before a U+2581
        (see the module's note: no merge crosses such a cut)."""
        parts = text.split(SPACE)
        if len(parts) == 1:
            return parts
        glue = self._before_space
        segs: list[list[str]] = [[parts[0]]]
        last = parts[0][-1:]                  # the character before the next U+2581
        for part in parts[1:]:
            if last and last not in glue:
                segs.append(["", part])        # joined: U+2581 + part
            else:                             # the text's start, or a character some token has before it
                segs[-1].append(part)
            last = part[-1:] or SPACE         # an empty part: the next U+2581 follows a U+2581
        return [SPACE.join(seg) for seg in segs]

    def _encode_segment(self, text: str) -> list[int]:
        n = len(text)
        if n == 0:
            return []
        vocab, scores = self.token_to_id, self.scores
        syms = list(text)
        nxt = list(range(1, n)) + [-1]
        prv = list(range(-1, n - 1))
        heap: list[tuple[float, int, int, int]] = []

        def push(left: int, right: int) -> None:
            joined = syms[left] + syms[right]
            tid = vocab.get(joined)
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
            syms[right] = ""
            nr = nxt[right]
            nxt[left] = nr
            if nr >= 0:
                prv[nr] = left
            if prv[left] >= 0:
                push(prv[left], left)
            if nr >= 0:
                push(left, nr)

        out: list[int] = []
        for s in syms:
            if not s:
                continue
            tid = vocab.get(s)
            if tid is not None:
                out.append(tid)
            else:
                # Only single characters can be missing (every merge produced a vocab token), so
                # llama.cpp's "resegment" recursion reduces to byte fallback.
                for b in s.encode("utf-8"):
                    bid = self._byte_ids[b]
                    if bid is not None:
                        out.append(bid)
        return out
