"""Split prompt text around special tokens written in it ("<|im_start|>" -> its id).

Like llama.cpp's tokenizer_st_partition: special tokens are tried longest first; each one splits
every remaining text fragment at all its occurrences. With parse_special=False only USER_DEFINED
tokens are matched (control and unknown tokens stay plain text), as in llama.cpp / HF tokenizers.
"""

from __future__ import annotations

from .vocab import CONTROL, UNKNOWN, Vocab


_C_ISSPACE = " \t\n\v\f\r"  # C isspace(): what llama.cpp strips around rstrip/lstrip tokens


def partition(vocab: Vocab, text: str, parse_special: bool) -> list[str | int]:
    frags: list[str | int] = [text] if text else []
    for sid in vocab.special_ids:
        if not parse_special and vocab.types[sid] in (CONTROL, UNKNOWN):
            continue
        needle = vocab.tokens[sid]
        rstrip = sid in vocab.rstrip
        out: list[str | int] = []
        for frag in frags:
            if isinstance(frag, int) or needle not in frag:
                out.append(frag)
                continue
            parts = frag.split(needle)
            for k, part in enumerate(parts):
                if k > 0:
                    out.append(sid)
                    if rstrip:
                        part = part.lstrip(_C_ISSPACE)
                if part:
                    out.append(part)
        frags = out
    return frags
