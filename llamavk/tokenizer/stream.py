"""Incremental detokenisation: text appears as soon as it is complete UTF-8, never half a character.

Byte-fallback (SPM `<0xF0>`...) and byte-level BPE tokens can split one character over several
tokens. An incremental UTF-8 decoder holds back an incomplete trailing sequence until the next token
completes it; bytes that can never form a character become U+FFFD instead of stalling the stream.
"""

from __future__ import annotations

import codecs
from typing import Callable


class StreamDecoder:
    def __init__(self, token_to_piece: Callable[[int], bytes]):
        self._piece = token_to_piece
        self._dec = codecs.getincrementaldecoder("utf-8")(errors="replace")

    def feed(self, token_id: int) -> str:
        """Text completed by this token ("" while a multi-byte character is still incomplete)."""
        return self._dec.decode(self._piece(token_id))

    def flush(self) -> str:
        """Whatever is still held back (an unfinished character comes out as U+FFFD)."""
        out = self._dec.decode(b"", final=True)
        self._dec.reset()
        return out
