"""Batched evaluation of task sequences (the endings of HellaSwag, Winogrande and multiple-choice
tasks) as parallel sequences, and the log-probabilities the scores are made of.

llama-perplexity puts a task's common prefix into the KV cache once, shared by the sequences of
its endings. llamavk's engine runs whole sequences of one length back to back (`seq_len`: row p of
the KV cache is position p % L of sequence p // L), so here every ending is a whole sequence, the
prefix repeated, padded at its end to the batch's longest; padding only follows a sequence's own
tokens, so it changes none of the logits that are read. The logits are those of the shared-prefix
layout up to float rounding; the work is larger by the repeated prefixes (about 2x for HellaSwag).

Sequences are packed in task order into batches of at most `budget` tokens (the loaded context),
evaluated `n_batch` tokens at a time so that only that many rows of logits are ever held, and
each task's log-probabilities are handed back, in order, as soon as its last sequence is done.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Iterator

import numpy as np

from ..errors import LlamavkError

PAD_GRANULE = 16     # batches are padded to a multiple of this: few step shapes to record


@dataclass
class TaskSequences:
    """One task's sequences and the log-probabilities its score needs: `queries[k] = (s, j, t)`
    asks for log p(token t | sequence s up to and including position j)."""
    sequences: list[list[int]]
    queries: list[tuple[int, int, int]]


def log_prob_rows(logits: np.ndarray, targets: np.ndarray) -> np.ndarray:
    """log softmax(logits[i])[targets[i]] per row, in double precision."""
    x = logits.astype(np.float64)
    top = x.max(axis=1, keepdims=True)
    log_z = top[:, 0] + np.log(np.exp(x - top).sum(axis=1))
    return x[np.arange(len(targets)), targets] - log_z


def plan_batches(lengths: list[int], budget: int) -> list[tuple[int, int, int]]:
    """Split sequences (in order) into batches: (first, count, L) with count * L <= budget, L the
    longest of the batch."""
    out = []
    i = 0
    while i < len(lengths):
        longest, n = lengths[i], 1
        if longest > budget:
            raise LlamavkError(f"a sequence of {longest} tokens does not fit the context of {budget} (use a larger -c)")
        while i + n < len(lengths) and (n + 1) * max(longest, lengths[i + n]) <= budget:
            longest = max(longest, lengths[i + n])
            n += 1
        out.append((i, n, longest))
        i += n
    return out


def evaluate_tasks(eval_rows: Callable[[list[int], int, int], np.ndarray], tasks: list[TaskSequences],
                   budget: int, n_batch: int) -> Iterator[tuple[int, np.ndarray]]:
    """Yield (task index, log-probs of its queries) in task order.

    `eval_rows(tokens, n_past, seq_len)` evaluates tokens at KV rows n_past... of sequences of
    seq_len tokens back to back (0: one sequence) and returns one row of logits per token."""
    seqs = [seq for task in tasks for seq in task.sequences]
    first_seq = np.cumsum([0] + [len(task.sequences) for task in tasks])
    wanted: dict[int, list[tuple[int, int, int, int]]] = {}    # global sequence -> (task, query, pos, target)
    for t, task in enumerate(tasks):
        for k, (s, j, target) in enumerate(task.queries):
            if not (0 <= s < len(task.sequences) and 0 <= j < len(task.sequences[s])):
                raise ValueError(f"task {t}: query {k} outside its sequences")
            wanted.setdefault(int(first_seq[t]) + s, []).append((t, k, j, target))
    results = [np.full(len(task.queries), np.nan) for task in tasks]
    done = 0
    for first, count, length in plan_batches([len(s) for s in seqs], budget):
        tokens = []
        for seq in seqs[first:first + count]:
            tokens += seq + [seq[-1]] * (length - len(seq))
        total = min(budget, -(-len(tokens) // PAD_GRANULE) * PAD_GRANULE)
        tokens += [tokens[-1]] * (total - len(tokens))       # a partial sequence of padding
        seq_len = length if count > 1 or total > length else 0
        rows = {}                                            # batch row -> [(task, query, target)]
        for g in range(first, first + count):
            for t, k, j, target in wanted.get(g, []):
                rows.setdefault((g - first) * length + j, []).append((t, k, target))
        for start in range(0, total, n_batch):
            logits = eval_rows(tokens[start:start + n_batch], start, seq_len)
            picks = [(r, item) for r in range(start, start + len(logits)) for item in rows.get(r, [])]
            if picks:
                lp = log_prob_rows(logits[[r - start for r, _ in picks]], np.array([it[2] for _, it in picks]))
                for value, (_, (t, k, _)) in zip(lp, picks):
                    results[t][k] = value
        while done < len(tasks) and (first_seq[done + 1] <= first + count):
            yield done, results[done]
            results[done] = None
            done += 1
    while done < len(tasks):             # tasks without sequences
        yield done, results[done]
        done += 1
