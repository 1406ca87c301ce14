"""Perplexity's forward passes on one device, each token's log-probability reduced there.

A perplexity run needs, per scored position, only log p(next token): the logits' maximum, their
sum of exponentials and the target's logit. The kernel (kernels/logprob.py) computes those on the
device right after the forward pass, so the host reads 16 bytes per row, not n_vocab floats
(32,000 x 4 bytes for a Llama 2 vocabulary), and no log-softmax runs in numpy. Where the whole
distribution is needed (KL-divergence files and statistics), only the scored rows are copied.

Micro-batches are pipelined in two slots: the next one is submitted before the host reads this
one's results, so the device does not wait for the host's work (or the host's wake-up) between them.
Each reduction's command buffer starts with a barrier (the forward pass before it wrote the logits)
and ends with one (the next forward pass, already queued, reuses the other slot and the activations),
so queued work stays ordered without the host waiting in between.
"""

from __future__ import annotations

import os
from collections import deque
from typing import Iterable, Iterator

import numpy as np

from .kernels import VIEW_ALIGN, View
from .kernels.logprob import OUT_WORDS, log_probs, token_logprob
from .runtime import SLOTS
from .vk import Buffer, CommandSequence
from .vk.sequence import COMPUTE, TRANSFER


def _align(n: int) -> int:
    return (n + VIEW_ALIGN - 1) // VIEW_ALIGN * VIEW_ALIGN


def device_scoring_enabled() -> bool:
    """LLAMAVK_PPL_HOST=1 turns the device reduction off (the host's log-softmax over copied
    logits, as before: for comparisons)."""
    return os.environ.get("LLAMAVK_PPL_HOST", "") in ("", "0")


class TokenScorer:
    """Scores batches of whole sequences on a single-device runtime (runtime.DeviceRuntime)."""

    def __init__(self, rt):
        self.rt = rt
        dev = rt.device
        self.rows = rt.n_ubatch_all
        self.targets_stride = _align(self.rows * 4)
        self.out_stride = _align(self.rows * OUT_WORDS * 4)
        self.targets = Buffer(dev, SLOTS * self.targets_stride, host_visible=True)
        self.out = Buffer(dev, SLOTS * self.out_stride, host_visible=True)
        self.target_words = [self.targets.array(np.uint32, self.rows, s * self.targets_stride) for s in range(SLOTS)]
        self.out_rows = [self.out.array(np.float32, self.rows * OUT_WORDS, s * self.out_stride).reshape(-1, OUT_WORDS)
                         for s in range(SLOTS)]
        self._reductions: dict[tuple[int, int], CommandSequence] = {}

    def _reduction(self, n: int, slot: int) -> CommandSequence:
        seq = self._reductions.get((n, slot))
        if seq is None:
            rt = self.rt
            seq = CommandSequence(rt.device, f"token_logprob[{n}]#{slot}").begin()
            seq._src_stages = COMPUTE | TRANSFER     # whatever the forward pass wrote the logits with
            seq.barrier()
            token_logprob(seq, rt.kc, View(rt.logits_buf, slot * rt.logits_stride, rt.logits_stride),
                          View(self.targets, slot * self.targets_stride, self.targets_stride),
                          View(self.out, slot * self.out_stride, self.out_stride), n, rt.n_logits)
            seq.barrier()
            self._reductions[(n, slot)] = seq = seq.end()
        return seq

    def score(self, batches: Iterable[tuple[list[int], np.ndarray, int]], keep_rows: bool = False
              ) -> Iterator[tuple[np.ndarray, np.ndarray | None]]:
        """batches: (tokens, targets, seq_len), each evaluated from an empty KV cache (whole
        sequences of seq_len tokens back to back; 0: one sequence). targets[i] is the token whose
        log-probability row i gives, negative where none is wanted. Yields per batch, in order:
        log p(target) per row (float64, NaN where no target) and, with keep_rows, the logits rows
        that have a target (float32 [rows with a target][n_vocab], a copy)."""
        rt = self.rt
        ub = self.rows
        inflight: deque = deque()      # (slot, n, value, targets, last of its batch)
        done: list = []                # this batch's collected micro-batches
        step = 0

        def collect():
            slot, n, value, tg, last = inflight.popleft()
            rt.device.timeline.wait(value)
            scored = np.flatnonzero(tg >= 0)        # the kernel skips (leaves stale) the other rows
            lp = np.full(n, np.nan)
            lp[scored] = log_probs(self.out_rows[slot][scored])
            rows = rt.logits(n, slot)[scored] if keep_rows else None
            done.append((lp, rows))
            return last

        def batch_result():
            lp = np.concatenate([d[0] for d in done])
            rows = np.concatenate([d[1] for d in done]) if keep_rows else None
            done.clear()
            return lp, rows

        for tokens, targets, seq_len in batches:
            targets = np.asarray(targets, dtype=np.int64)
            for pos in range(0, len(tokens), ub):
                chunk = tokens[pos:pos + ub]
                n = len(chunk)
                rt.check_batch("all", n, pos)
                while len(inflight) >= SLOTS:        # this slot's last use is read and done
                    if collect():
                        yield batch_result()
                slot = step % SLOTS
                step += 1
                (forward,) = rt.prepare("all", chunk, pos, slot, seq_len=seq_len)
                tg = targets[pos:pos + n]
                self.target_words[slot][:n] = np.where(tg >= 0, tg, 0xFFFFFFFF).astype(np.uint32)
                forward.submit()
                value = self._reduction(n, slot).submit()
                inflight.append((slot, n, value, tg, pos + n >= len(tokens)))
        while inflight:
            if collect():
                yield batch_result()
