"""Text that is not valid UTF-8, tokenized as llama.cpp tokenizes it.

llama.cpp takes a prompt, a prompt file or an evaluation file as bytes, and tokenizes bytes that are
not UTF-8 rather than refusing them (a Latin-1 file, a truncated character, `\\xff` in a prompt's
escapes). llamavk's texts are Python strings, so such bytes travel as surrogate escapes: a stray byte
0xXY is the character U+DCXY (Python's "surrogateescape", which is also how Python hands over a
command line's bytes). `from_bytes` / `to_bytes` convert; valid text is unchanged either way.

What llama.cpp makes of them depends on the vocabulary:
- byte-level BPE (unicode_cpts_from_utf8): a lenient decoder. Where a lead byte (0xC0-0xF7) has its
  continuation bytes, the code point is taken whatever it is -- overlong forms (C0 AF is "/") and
  encoded surrogates (ED A0 80 is U+D800, encoded back to the same bytes for the merges) included;
  any other byte is one U+FFFD. `llamacpp_text` does the same. A sequence past U+10FFFF (F4 90 80 80)
  makes llama.cpp abort; here it is an error.
- SentencePiece (llm_tokenizer_spm): the text is cut into symbols of 1-4 bytes by each lead byte's
  high nibble alone (0xC-0xD two, 0xE three, 0xF four, others one), whatever follows, so a stray
  lead byte swallows the bytes after it, even part of the next character; a symbol that is no
  token falls back to byte tokens. `spm_symbols` cuts the same way (spm.py merges them).
"""

from __future__ import annotations

import codecs
import re

from ..errors import LlamavkError

_SURROGATE = re.compile("[\ud800-\udfff]")
_STRAY_LEAD = re.compile("[\udcc0-\udcff]")     # a stray byte 0xC0-0xFF: SPM's symbol may run past it
_SPM_LEN = (1,) * 12 + (2, 2, 3, 4)              # SPM symbol bytes by the lead byte's high nibble


def _encode_stray(exc: UnicodeEncodeError):
    """Encoding error handler: surrogate escapes back to their byte, any other surrogate as the three
    bytes UTF-8's pattern gives it (a code point llama.cpp's decoder can produce, see above)."""
    out = bytearray()
    for ch in exc.object[exc.start:exc.end]:
        c = ord(ch)
        out += bytes((c - 0xDC00,)) if 0xDC80 <= c <= 0xDCFF else ch.encode("utf-8", "surrogatepass")
    return bytes(out), exc.end


def _decode_like_llamacpp(exc: UnicodeDecodeError):
    """Decoding error handler at a byte Python's strict decoder refuses: llama.cpp's reading of it
    (unicode_cpt_from_utf8; see the module's note)."""
    data, i = exc.object, exc.start
    b0 = data[i]
    n = 2 if b0 & 0xE0 == 0xC0 else 3 if b0 & 0xF0 == 0xE0 else 4 if b0 & 0xF8 == 0xF0 else 0
    if n and i + n <= len(data) and all(data[i + k] & 0xC0 == 0x80 for k in range(1, n)):
        cpt = b0 & (0x7F >> n)
        for k in range(1, n):
            cpt = cpt << 6 | data[i + k] & 0x3F
        if cpt > 0x10FFFF:
            raise LlamavkError(f"the text's bytes {data[i:i + n].hex(' ')} encode U+{cpt:X}, past "
                               "Unicode's last code point: this vocabulary cannot tokenize them (llama.cpp aborts)")
        return chr(cpt), i + n
    return "\ufffd", i + 1


codecs.register_error("llamavk.stray", _encode_stray)
codecs.register_error("llamavk.llamacpp", _decode_like_llamacpp)


def from_bytes(data: bytes) -> str:
    """Bytes as text: UTF-8, each byte that is not part of valid UTF-8 as its surrogate escape."""
    return data.decode("utf-8", "surrogateescape")


def to_bytes(text: str) -> bytes:
    """The bytes of a text from from_bytes (or any text: other surrogates as their 3-byte pattern)."""
    return text.encode("utf-8", "llamavk.stray")


def has_stray_bytes(text: str) -> bool:
    """Whether the text holds surrogates (stray bytes): the only texts the functions below change."""
    return not text.isascii() and _SURROGATE.search(text) is not None


def llamacpp_text(text: str) -> str:
    """The code points byte-level BPE tokenizes in llama.cpp (the module's note)."""
    return to_bytes(text).decode("utf-8", "llamavk.llamacpp")


def spm_symbols(text: str) -> list[bytes]:
    """The text's bytes cut as llama.cpp's SentencePiece tokenizer cuts them (the module's note)."""
    data = to_bytes(text)
    out, i, n = [], 0, len(data)
    while i < n:
        k = min(_SPM_LEN[data[i] >> 4], n - i)
        out.append(data[i:i + k])
        i += k
    return out


def spm_cut_is_safe(text: str, pos: int) -> bool:
    """Whether SPM's symbols of text[:pos] and text[pos:] are those of the whole text: no stray lead
    byte in the 3 characters before the cut, whose symbol could run past it (a lead takes at most 3
    bytes after it, at least one a character)."""
    return _STRAY_LEAD.search(text, max(0, pos - 3), pos) is None
