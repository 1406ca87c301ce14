"""Reverse prompts (llama-completion's -r): generation stops once the text of the sequence ends with
one of them, as llama-completion decides it without interaction:

- after the prompt and after each token (which is still written), the last 32 tokens' pieces
  (prompt tokens included, special tokens as their text) are joined; a reverse prompt found in the
  last len + 2 bytes of that text stops it -- "+ 2" because the text after it may have come in the
  same token as its end;
- a reverse prompt that is one token (tokenized alone, special tokens parsed) also stops it where
  that token is the last one.

So a prompt that already ends with one generates nothing, as in llama-completion.
"""

from __future__ import annotations

from collections import deque

from .tokenizer.stray_bytes import to_bytes

WINDOW = 32          # tokens whose text is searched (llama-completion's n_prev)
SLACK = 2            # bytes after the reverse prompt that still count (its extra_padding)


class ReversePrompts:
    def __init__(self, tokenizer, prompts):
        self.tokenizer = tokenizer
        self.texts = [to_bytes(p) for p in prompts]
        self.tokens = set()
        for p in prompts:
            ids = tokenizer.encode(p, add_special=False, parse_special=True)
            if len(ids) == 1:
                self.tokens.add(ids[0])
        self.recent: deque[int] = deque(maxlen=WINDOW)

    def seen(self, tokens) -> bool:
        """Take the sequence's next tokens; whether its text now ends with a reverse prompt."""
        self.recent.extend(tokens)
        if not self.texts:
            return False
        text = b"".join(self.tokenizer.token_to_piece(t) for t in self.recent)
        for p in self.texts:
            if text.find(p, max(len(text) - (len(p) + SLACK), 0)) >= 0:
                return True
        return bool(text) and self.recent[-1] in self.tokens
