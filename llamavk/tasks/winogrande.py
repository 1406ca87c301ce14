"""Winogrande as llama-perplexity --winogrande scores it.

Task file: CSV lines `index,sentence,choice1,choice2,answer` (answer 1 or 2; the sentence may be
in double quotes and holds one `_` where a choice goes), e.g.
`0,Sarah was a much better surgeon than Maria so _ always got the easier cases.,Sarah,Maria,2`.
Lines that do not parse are reported and skipped. As llama-perplexity reads the file (its last
line is read only when a line break follows it after -f has dropped the file's final one), the
file's last line is not scored unless the file ends with an empty line: the same tasks as it.

With `n_tasks` > 0 and fewer than the file's tasks, that many are drawn with std::mt19937(1)
(each draw scales the 32-bit number to an index in single precision), else all in file order.

Each choice is put into the blank; its score is the mean log-probability of the tokens after the
choice (after the prefix both sentences share where either sentence has at most 3 tokens after
it), the sentence's last token left out where more than one is scored. llama-perplexity reads
these from its shared-prefix batch; where the choice word itself is scored, its index arithmetic
takes the second sentence's first log-probability from the logits after the first sentence's last
token. That is reproduced (`_batch_row`), so the scores are its scores.
"""

from __future__ import annotations

import numpy as np

from ..errors import LlamavkError
from .common import Emit, TaskScore, c_int, common_prefix, f32, run_tasks
from ..cpp_random import MT19937, scaled_index
from .evaluate import TaskSequences

MIN_TRAILING_TOKENS = 3


def parse(text: str, log: Emit) -> list[tuple[str, str, list[str], int]]:
    """(text before the blank, text after it, [choice1, choice2], answer 1|2) per usable line."""
    pieces = text.split("\n")
    out = []
    for line in pieces[:-1]:          # the last piece has no line break after it: not read (see above)
        commas, quoted = [], False
        for i, ch in enumerate(line):
            if quoted:
                quoted = ch != '"'
            elif ch == ",":
                commas.append(i)
                if len(commas) == 4:
                    break
            elif ch == '"':
                quoted = True
        if len(commas) != 4:
            log(f"load_winogrande_from_csv: failed to find comma separators in <{line}>")
            continue
        c0, c1, c2, c3 = commas
        sentence = line[c0 + 2:c1 - 1] if line[c0 + 1] == '"' else line[c0 + 1:c1]
        where = sentence.find("_")
        if where < 0:
            log(f"load_winogrande_from_csv: no _ in <{sentence}>")
            continue
        answer = c_int(line[c3 + 1:])
        if answer not in (1, 2):
            log(f"load_winogrande_from_csv: failed to parse answer <{line[c3 + 1:]}>")
            continue
        out.append((sentence[:where], sentence[where + 1:], [line[c1 + 1:c2], line[c2 + 1:c3]], answer))
    return out


def select(tasks: list, n_tasks: int) -> list:
    if not 0 < n_tasks < len(tasks):
        return tasks
    rng = MT19937(1)
    left = list(range(len(tasks)))
    chosen = []
    for _ in range(n_tasks):
        j = scaled_index(rng, len(left))
        chosen.append(tasks[left[j]])
        left[j] = left[-1]
        left.pop()
    return chosen


def _batch_row(li: int, prefix: int, lengths: list[int], s: int, j: int) -> tuple[int, int]:
    """The (sequence, position) of logits row `li` in llama-perplexity's layout of one task: the
    shared prefix's last token, then every token of sequence 0 after the prefix, then sequence 1's.
    Rows outside the task (index arithmetic that C would take from a neighbouring task) fall back
    to the logits meant, (s, j)."""
    after0 = lengths[0] - prefix
    if li < 0 or li > after0 + lengths[1] - prefix:
        return s, j
    if li == 0:
        return 0, prefix - 1
    if li <= after0:
        return 0, prefix + li - 1
    return 1, prefix + li - 1 - after0


def prepare(task, tokenize) -> tuple[TaskSequences, list[int], int]:
    """Sequences, queries (with llama-perplexity's row choice: choice 1's, then choice 2's), the
    number of tokens each choice's score averages, and how many queries are choice 1's."""
    first, second, choices, _ = task
    seqs = [tokenize(first + c + second) for c in choices]
    prefix = common_prefix(seqs)
    lengths = [len(s) for s in seqs]
    skip_choice = all(n - prefix > MIN_TRAILING_TOKENS for n in lengths)
    queries, counts = [], []
    for s, choice in enumerate(choices):
        base = len(tokenize(first + choice)) if skip_choice else prefix
        n = lengths[s]
        last = 1 if n - base > 1 or n < base else 0          # C's unsigned n - base > 1
        li = base - prefix if s == 0 else (lengths[0] - prefix) + (base - prefix)
        if base > 0:                                        # base - 1 < 0: C's unsigned loop runs no step
            for j in range(base - 1, n - 1 - last):
                queries.append((*_batch_row(li, prefix, lengths, s, j), seqs[s][j + 1]))
                li += 1
        counts.append(n - base - last)
        if s == 0:
            n_first = len(queries)
    return TaskSequences(seqs, queries), counts, n_first


def score(model, text: str, n_tasks: int = 0, emit: Emit | None = None, log: Emit | None = None) -> TaskScore:
    """Score the tasks of a Winogrande CSV's text; `emit` gets llama-perplexity's output lines."""
    emit = emit or (lambda line: None)
    log = log or (lambda line: None)
    tasks = parse(text, log)
    if not tasks:
        raise LlamavkError("no Winogrande tasks in the file")
    log(f"winogrande_score : loaded {len(tasks)} tasks from prompt.")
    if 0 < n_tasks < len(tasks):
        log(f"winogrande_score : selecting {n_tasks} random tasks")
    tasks = select(tasks, n_tasks)

    def tokenize(s):
        return model.tokenize(s, add_special=True, parse_special=False)

    log("winogrande_score : tokenizing selected tasks")
    prepared = [prepare(task, tokenize) for task in tasks]
    log("winogrande_score : calculating winogrande score over selected tasks.")
    result = TaskScore("winogrande")

    def score_one(i: int, log_probs) -> None:
        counts, n_first = prepared[i][1], prepared[i][2]
        sums = [float(np.sum(log_probs[:n_first])), float(np.sum(log_probs[n_first:]))]
        scores = [s / c if c > 0 else float("nan") for s, c in zip(sums, counts)]
        answer = 1 if scores[0] > scores[1] else 2
        result.add(scores, answer - 1, answer == tasks[i][3])
        emit("%d\t%.4f\t%10.6f  %10.6f  %d  %d" % (i + 1, 100.0 * result.n_correct / result.n_tasks,
                                                 f32(scores[0]), f32(scores[1]), answer, tasks[i][3]))

    run_tasks(model, [p[0] for p in prepared], score_one)
    emit("")
    if result.n_tasks >= 100:
        p = np.float32(result.n_correct) / np.float32(result.n_tasks)
        sigma = np.float32(100) * np.sqrt(p * (np.float32(1) - p) / np.float32(result.n_tasks - 1))
        result.uncertainty = float(sigma)
        emit("Final Winogrande score(%d tasks): %.4f +/- %.4f" % (result.n_tasks, np.float32(100) * p, sigma))
    return result
