"""The first ids of a long text without tokenizing all of it (perplexity over a few chunks of a book).

encode(text) is BOS, then each fragment's ids (special-token partition, special.py), then EOS. A
fragment's ids are cut, here, only where the algorithm's own rules make its two sides independent:
SentencePiece before a U+2581 that no merge can cross (spm.py's segment cuts), byte-level BPE before a
space between two letters, where every pre-tokenizer's regexes split both sides as they split the
whole (pretokenizers.CUT). The ids of the head are then exactly the first ids of the whole text --
no margin of uncertain tokens to drop, no difference at the cut. The special-token partition is made
over the whole text (a token's text may straddle any cut), as encode() does.

The head grows in steps, each ending at the first such cut past a length estimated from the ids so
far (after a short first step that measures the text's characters per token), until it holds
`min_tokens` ids; a fragment with no cut left is taken whole. An EOS that the
vocabulary appends closes the text: with one, the whole text is tokenized.
"""

from __future__ import annotations

from .special import partition

PROBE_TOKENS = 256            # the first step's ids: enough to measure the text's characters per token
FIRST_CHARS_PER_TOKEN = 3.0   # the first step's guess; later steps use the ratio seen so far
OVERSHOOT = 1.05              # steps aim this much past the estimate: one step is the usual case
MIN_STEP = 64                 # characters at least per step


def encode_prefix(tok, text: str, min_tokens: int, add_special: bool = True,
                  parse_special: bool = True) -> tuple[list[int], bool]:
    """(ids, complete): the first ids of tok.encode(text, add_special, parse_special), at least
    min_tokens of them where the text has that many; complete when they are all of them."""
    if add_special and tok.add_eos:
        return tok.encode(text, add_special, parse_special), True
    out = tok._start_ids(add_special)
    frags = partition(tok.vocab, text, parse_special)
    chars = 0                      # characters encoded so far, for the next step's estimate
    after_special = True
    for k, frag in enumerate(frags):
        if len(out) >= min_tokens:
            return out, False
        if isinstance(frag, int):
            out.append(frag)
            after_special = True
            continue
        piece = tok._fragment_text(frag, after_special)
        after_special = False
        pos = 0
        while pos < len(piece) and len(out) < min_tokens:
            if len(out) < PROBE_TOKENS:    # a short first step measures the text's characters per token
                step = min(min_tokens, PROBE_TOKENS) * FIRST_CHARS_PER_TOKEN
            else:
                step = (min_tokens - len(out)) * (chars / len(out)) * OVERSHOOT
            target = pos + max(MIN_STEP, int(step))
            cut = tok._next_cut(piece, target) if target < len(piece) else -1
            end = cut if cut > 0 else len(piece)
            out.extend(tok._encode_piece(piece[pos:end]))
            chars += end - pos
            pos = end
        if pos < len(piece):
            return out, False
    return out, True
