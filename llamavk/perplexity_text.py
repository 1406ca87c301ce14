"""The ids of a perplexity run's text: the head that its chunks need on the critical path, the
whole text's count on a thread while the main thread waits.

`llamavk perplexity --chunks N -c C` scores the first N * C ids of the text (llama-perplexity's
chunks; at least two chunks' worth must exist), yet it reports how many ids the whole text has. A
book tokenizes in ~0.1 s of Python (botchan, 279 kB) where 16 chunks of 512 need a sixteenth of
it: the load tokenizes only the head (Tokenizer.encode_prefix: cut where the ids cannot differ
from the whole text's), and the whole text is tokenized again on a thread once the main thread
mostly waits: for the weights' upload (the load's last step, api.Model(while_uploading=...)) if
they are still on their way, else for the device, from the first chunk on (cli/perplexity.py).
Its count is what the run prints; its first ids must be the head's (a mismatch would be a
tokenizer bug, reported, never scored silently). All chunks (--chunks -1) need the whole text anyway: it is tokenized during the load,
as before. LLAMAVK_PPL_PREFIX=0 does that for every run (for comparisons).
"""

from __future__ import annotations

import os
import sys
import threading

from .errors import LlamavkError

ENV = "LLAMAVK_PPL_PREFIX"
# While the thread tokenizes, the main thread wakes from device waits and must get the interpreter
# lock back at once to queue the next micro-batch: Python's default switch interval (5 ms) would
# leave the device idle that long at each wake-up.
SWITCH_INTERVAL_S = 1e-4


def prefix_enabled() -> bool:
    return os.environ.get(ENV, "").strip().lower() not in ("0", "off", "false", "no")


class EvaluationText:
    """A text to evaluate in chunks of n_ctx ids: `tokenize(model)` (a load's prepare_prompt) gives
    the ids the run needs, `n_tokens()` the whole text's count."""

    def __init__(self, text: str, n_ctx: int, chunks: int):
        self.text = text
        # llama-perplexity's rule: the text must hold two chunks, whatever --chunks says
        self.min_tokens = max(chunks, 2) * n_ctx if chunks >= 0 and prefix_enabled() else None
        self.ids: list[int] = []
        self.complete = False
        self._tokenizer = None
        self._thread: threading.Thread | None = None
        self._whole: list[int] | None = None
        self._error: BaseException | None = None

    def tokenize(self, model) -> list[int]:
        """The ids the run evaluates: the whole text's, or (with --chunks) a head of them."""
        tok = self._tokenizer = model.tokenizer
        if self.min_tokens is None:
            self.ids, self.complete = tok.encode(self.text, parse_special=False), True
        else:
            self.ids, self.complete = tok.encode_prefix(self.text, self.min_tokens, parse_special=False)
        return self.ids

    def count_in_background(self) -> None:
        """Start tokenizing the whole text on a thread (nothing to do when the ids are all of it)."""
        if self.complete or self._thread is not None:
            return
        self._interval = sys.getswitchinterval()
        sys.setswitchinterval(min(self._interval, SWITCH_INTERVAL_S))

        def work() -> None:
            try:
                self._whole = self._tokenizer.encode(self.text, parse_special=False)
            except BaseException as exc:      # noqa: BLE001 -- raised by n_tokens() on the main thread
                self._error = exc
            finally:
                sys.setswitchinterval(self._interval)

        self._thread = threading.Thread(target=work, name="llamavk-text-count", daemon=True)
        self._thread.start()

    def counted(self) -> bool:
        """Whether n_tokens() is known without waiting."""
        return self.complete or (self._thread is not None and not self._thread.is_alive())

    def n_tokens(self) -> int:
        """The whole text's number of ids (waits for the thread)."""
        if self.complete:
            return len(self.ids)
        self.count_in_background()
        self._thread.join()
        if self._error is not None:
            raise self._error
        whole = self._whole
        if whole[:len(self.ids)] != self.ids:
            first = next((i for i, (a, b) in enumerate(zip(whole, self.ids)) if a != b), len(whole))
            raise LlamavkError(f"tokenizer bug: the text's first {len(self.ids)} ids, tokenized alone, differ from "
                               f"the whole text's at id {first} (set {ENV}=0 to tokenize the whole text first)")
        return len(whole)
