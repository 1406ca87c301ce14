"""The Tokenizer facade: encode/decode with the vocabulary and algorithm the GGUF metadata names."""

from __future__ import annotations

from typing import Any

from ..errors import LlamavkError
from .bpe import BPE, bpe_text_to_bytes, parse_merges
from .pretokenizers import PreTokenizer
from .special import partition
from .spm import SPM
from .stray_bytes import has_stray_bytes, llamacpp_text
from .stream import StreamDecoder
from .vocab import BYTE, CONTROL, NORMAL, UNKNOWN, USER_DEFINED, Vocab, load_vocab


class Tokenizer:
    """Text <-> token ids, equal to llama.cpp's llama_tokenize / llama_detokenize."""

    def __init__(self, vocab: Vocab):
        self.vocab = vocab
        ids = vocab.ids
        self.n_vocab = len(vocab.tokens)
        self.bos_id: int | None = ids["bos"]
        self.eos_id: int | None = ids["eos"]
        self.eot_id: int | None = ids["eot"]
        self.unk_id: int | None = ids["unk"]
        self.add_bos: bool = vocab.add_bos
        self.add_eos: bool = vocab.add_eos
        if vocab.model == "llama":
            self._spm = SPM(vocab.token_to_id, vocab.scores, ids["unk"])
        else:
            self._pre = PreTokenizer(vocab.pre_family)
            self._bpe = BPE(vocab.token_to_id, parse_merges(vocab.merges), vocab.ignore_merges)
        # Every token's bytes, computed once when first asked for (llama.cpp's cache_token_to_piece,
        # special=true): a completion needs a few hundred of a 150k vocabulary's pieces, not all.
        self._pieces: list[bytes | None] = [None] * self.n_vocab

    @classmethod
    def from_metadata(cls, meta: dict[str, Any]) -> "Tokenizer":
        return cls(load_vocab(meta))

    # -- encoding ---------------------------------------------------------------------------------

    def encode(self, text: str, add_special: bool = True, parse_special: bool = True) -> list[int]:
        out = self._start_ids(add_special)
        after_special = True  # SPM adds the space prefix at the start and after special tokens
        for frag in partition(self.vocab, text, parse_special):
            if isinstance(frag, int):
                out.append(frag)
                after_special = True
                continue
            out.extend(self._encode_piece(self._fragment_text(frag, after_special)))
            after_special = False
        if add_special and self.add_eos:
            if self.eos_id is None:
                raise LlamavkError("the model asks for an EOS token but its vocabulary has none")
            out.append(self.eos_id)
        return out

    def encode_prefix(self, text: str, min_tokens: int, add_special: bool = True,
                      parse_special: bool = True) -> tuple[list[int], bool]:
        """The first ids of encode(text, ...), at least `min_tokens` of them where the text has that
        many, from a prefix of the text cut where its ids cannot differ from the whole text's
        (prefix.py); and whether they are all of encode's ids."""
        from .prefix import encode_prefix
        return encode_prefix(self, text, min_tokens, add_special, parse_special)

    def _start_ids(self, add_special: bool) -> list[int]:
        if add_special and self.add_bos:
            if self.bos_id is None:
                raise LlamavkError("the model asks for a BOS token but its vocabulary has none")
            return [self.bos_id]
        return []

    def _fragment_text(self, frag: str, after_special: bool) -> str:
        """A text fragment as the algorithm reads it: SPM's escaped text (spaces as U+2581, the space
        prefix where the vocabulary adds one), byte-level BPE's as is, but for stray bytes (not UTF-8:
        stray_bytes.py) read as llama.cpp reads them."""
        if self.vocab.model != "llama":
            return llamacpp_text(frag) if has_stray_bytes(frag) else frag
        if self.vocab.add_space_prefix and after_special:
            frag = " " + frag
        return frag.replace(" ", "\u2581")

    def _encode_piece(self, piece: str) -> list[int]:
        """Ids of a fragment's text as _fragment_text gives it (or of a part of it between two of
        _next_cut's positions)."""
        if self.vocab.model == "llama":
            return self._spm.encode(piece)
        out: list[int] = []
        for word in self._pre.split(piece):
            out.extend(self._bpe.encode_word(word))
        return out

    def _next_cut(self, piece: str, start: int) -> int:
        """The first position >= start (and > 0) where a fragment's text can be cut into two parts
        whose ids, each encoded alone, are the whole's (-1: none)."""
        if self.vocab.model == "llama":
            return self._spm.next_cut(piece, start)
        return self._pre.next_cut(piece, start)

    # -- decoding ---------------------------------------------------------------------------------

    def _make_piece(self, tid: int) -> bytes:
        v = self.vocab
        text, kind = v.tokens[tid], v.types[tid]
        if kind in (CONTROL, USER_DEFINED, UNKNOWN):  # special tokens render as their text
            return text.encode("utf-8")
        if v.model == "llama":
            if kind == NORMAL:
                return text.replace("\u2581", " ").encode("utf-8")
            if kind == BYTE:
                return bytes([int(text[3:5], 16)])
            return b""  # unused/undefined tokens render as nothing (llama.cpp)
        if kind == NORMAL:
            raw = bpe_text_to_bytes(text)
            if raw is None:  # not byte-level text: llama.cpp prints a marker; keep the UTF-8 text
                return text.encode("utf-8")
            return raw
        return b""

    def token_to_piece(self, tid: int, special: bool = True) -> bytes:
        """A token's bytes; special=False: control and unknown tokens are empty (llama.cpp's
        token_to_piece with special=false, what llama-completion prints without --special)."""
        if not 0 <= tid < self.n_vocab:
            raise LlamavkError(f"token id {tid} out of range (vocabulary has {self.n_vocab} tokens)")
        if not special and self.vocab.types[tid] in (CONTROL, UNKNOWN):
            return b""
        piece = self._pieces[tid]
        if piece is None:
            piece = self._pieces[tid] = self._make_piece(tid)
        return piece

    def decode(self, ids: list[int]) -> str:
        """Whole-sequence detokenisation (llama_detokenize with special tokens rendered)."""
        return self.decode_bytes(ids).decode("utf-8", errors="replace")

    def decode_bytes(self, ids: list[int]) -> bytes:
        """decode's bytes, before any UTF-8 decoding (llama_detokenize's text)."""
        parts = [self.token_to_piece(t) for t in ids]
        # SPM models add a space prefix when encoding; drop one leading space of the first piece.
        if parts and self.vocab.add_space_prefix and parts[0].startswith(b" "):
            parts[0] = parts[0][1:]
        data = b"".join(parts)
        return _clean_spaces(data) if self.vocab.clean_spaces else data

    def stream(self, special: bool = True) -> StreamDecoder:
        return StreamDecoder(lambda t: self.token_to_piece(t, special))

    def is_eog(self, tid: int | None) -> bool:
        return tid is not None and tid in self.vocab.eog_ids

    def __repr__(self) -> str:
        return (f"Tokenizer({self.vocab.model}, pre={self.vocab.pre_family}, n_vocab={self.n_vocab}, "
                f"bos={self.bos_id}, eos={self.eos_id}, add_bos={self.add_bos})")


def _clean_spaces(data: bytes) -> bytes:
    """llama.cpp's clean_up_tokenization_spaces (three byte passes, same order and rules)."""
    # 1: " ?", " !", " .", " ,"  -> drop the space
    b = bytearray()
    for i, x in enumerate(data):
        if i > 0 and data[i - 1] == 0x20 and x in b"?!.,":
            b.pop()
        b.append(x)
    # 2: " ' " -> "'"
    s = bytearray(b)
    b = bytearray()
    i = 0
    while i < len(s):
        x = s[i]
        if i > 0 and x == 0x27 and i + 1 < len(s) and s[i - 1] == 0x20 and s[i + 1] == 0x20:
            b.pop()
            b.append(x)
            s[i + 1] = 0  # llama.cpp overwrites the skipped space, so " ' ' " strips only once
            i += 2
            continue
        b.append(x)
        i += 1
    # 3: " 's", " 'm", " 're", " 've" -> drop the space (" 't", " 'd", " 'll" keep it)
    s = bytes(b)
    b = bytearray()
    for i, x in enumerate(s):
        if i > 0 and s[i - 1] == 0x20 and x == 0x27 and i + 1 < len(s):
            x1 = s[i + 1]
            if x1 in b"sm" or (i + 2 < len(s) and s[i + 1:i + 3] in (b"re", b"ve")):
                b.pop()
        b.append(x)
    return bytes(b)
