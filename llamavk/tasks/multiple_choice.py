"""Multiple-choice tasks (ARC, MMLU, TruthfulQA, HellaSwag in this form) as llama-perplexity
--multiple-choice scores them.

Task file (binary, little endian, llama.cpp's format):

    u32 n_tasks, u32 offset[n_tasks]    (byte offset of each task from the file's start)
    per task: string question, then two answer sets, mc1 (one right answer: the one scored) and
    mc2 (several right answers: read, not scored); an answer set is u32 n (at most 100), n strings,
    i32 label[n] (1: right); a string is u32 length + that many bytes (UTF-8; stray bytes are
    tokenized as llama.cpp tokenizes them, tokenizer/stray_bytes.py).

With `n_tasks` > 0 and fewer than the file's, that many are drawn with std::mt19937(1) (each draw
scales the 32-bit number to an index in single precision) and read at their offsets; else all are
read in order, from after the offset table. Each answer is scored as question + " " + answer:
the mean log-probability of its tokens after the prefix all answers share; the first highest
score is taken, right when its label is 1. The final result and the chance of picking a right
answer at random are printed with their uncertainties.
"""

from __future__ import annotations

import struct

import numpy as np

from ..errors import LlamavkError
from ..tokenizer.stray_bytes import from_bytes
from .common import Emit, TaskScore, common_prefix, first_max, run_tasks
from ..cpp_random import MT19937, scaled_index
from .evaluate import TaskSequences

MAX_ANSWERS = 100
HEADER = "task\tacc_norm"


class _Reader:
    """Bounds-checked reads from the task file's bytes (untrusted input)."""

    def __init__(self, data: bytes, pos: int = 0):
        self.data, self.pos = data, pos

    def take(self, n: int, what: str) -> bytes:
        if n < 0 or self.pos + n > len(self.data):
            raise LlamavkError(f"the multiple-choice task file ends inside {what}")
        out = self.data[self.pos:self.pos + n]
        self.pos += n
        return out

    def u32(self, what: str) -> int:
        return struct.unpack("<I", self.take(4, what))[0]

    def string(self, what: str) -> str:
        return from_bytes(self.take(self.u32(what), what))   # not UTF-8: tokenized as llama.cpp does

    def answers(self, what: str) -> tuple[list[str], list[int]]:
        n = self.u32(what)
        if n > MAX_ANSWERS:
            raise LlamavkError(f"the multiple-choice file's {what} has {n} answers (at most {MAX_ANSWERS})")
        texts = [self.string(f"{what}, answer {i + 1}") for i in range(n)]
        labels = list(struct.unpack(f"<{n}i", self.take(4 * n, f"{what}'s labels")))
        return texts, labels


def read_task(r: _Reader, number: int) -> tuple[str, list[str], list[int]]:
    """(question, answers, labels) of one task; the mc2 set is read past."""
    what = f"task {number}"
    question = r.string(f"{what}'s question")
    answers, labels = r.answers(f"{what}'s answers")
    r.answers(f"{what}'s second answer set")
    return question, answers, labels


def load(data: bytes, n_tasks: int, log: Emit) -> list[tuple[str, list[str], list[int]]]:
    r = _Reader(data)
    total = r.u32("the task count") if len(data) >= 4 else 0
    if total == 0:
        raise LlamavkError("no multiple-choice tasks in the file")
    log(f"multiple_choice_score: there are {total} tasks in prompt")
    offsets = struct.unpack(f"<{total}I", r.take(4 * total, "the task offsets"))
    if n_tasks == 0 or n_tasks >= total:
        return [read_task(r, i + 1) for i in range(total)]
    log(f"multiple_choice_score: selecting {n_tasks} random tasks from {total} tasks available")
    rng = MT19937(1)
    left = list(range(total))
    tasks = []
    for _ in range(n_tasks):
        j = scaled_index(rng, len(left))
        idx = left[j]
        left[j] = left[-1]
        left.pop()
        tasks.append(read_task(_Reader(data, offsets[idx]), idx + 1))
    return tasks


def prepare(task, tokenize, number: int) -> TaskSequences:
    question, answers, _ = task
    if not question or not answers:
        raise LlamavkError(f"multiple-choice task {number}: empty question or no answers")
    if any(not a for a in answers):
        raise LlamavkError(f"multiple-choice task {number}: an empty answer")
    seqs = [tokenize(question + " " + a) for a in answers]
    prefix = common_prefix(seqs)
    if prefix == 0 or any(len(s) == prefix for s in seqs):
        raise LlamavkError(f"multiple-choice task {number}: its answers must share a first token and each add a "
                           f"token after the common prefix")
    return TaskSequences(seqs, [(s, j, seq[j + 1]) for s, seq in enumerate(seqs)
                                for j in range(prefix - 1, len(seq) - 1)])


def score(model, data: bytes, n_tasks: int = 0, emit: Emit | None = None, log: Emit | None = None) -> TaskScore:
    """Score the tasks of a multiple-choice file's bytes; `emit` gets llama-perplexity's output lines."""
    emit = emit or (lambda line: None)
    log = log or (lambda line: None)
    tasks = load(data, n_tasks, log)

    def tokenize(s):
        return model.tokenize(s, add_special=True, parse_special=False)

    prepared = [prepare(task, tokenize, i + 1) for i, task in enumerate(tasks)]
    log(f"multiple_choice_score : calculating TruthfulQA score over {len(tasks)} tasks.")
    emit("")
    emit(HEADER)
    result = TaskScore("multiple-choice")
    n_answers = 0

    def score_one(i: int, log_probs) -> None:
        nonlocal n_answers
        queries = prepared[i].queries
        n = len(prepared[i].sequences)
        sums, counts = [0.0] * n, [0] * n
        for (s, _, _), lp in zip(queries, log_probs):
            sums[s] += lp
            counts[s] += 1
        means = [sums[s] / counts[s] for s in range(n)]
        chosen = first_max(means)
        n_answers += n
        result.add(means, chosen, tasks[i][2][chosen] == 1)
        emit("%d\t%.8f" % (result.n_tasks, 100.0 * result.n_correct / result.n_tasks))

    run_tasks(model, prepared, score_one)
    # llama-perplexity prints the result after any number of tasks (with one, its uncertainty is nan)
    with np.errstate(divide="ignore", invalid="ignore"):
        n = np.float32(result.n_tasks)
        p = np.float32(result.n_correct) / n
        sigma = np.sqrt(p * (np.float32(1) - p) / (n - np.float32(1)))
        chance = n / np.float32(n_answers)
        chance_sigma = np.sqrt(chance * (np.float32(1) - chance) / (n - np.float32(1)))
    result.uncertainty = float(np.float32(100) * sigma)
    result.random_chance = float(np.float32(100) * chance)
    emit("")
    emit("Final result: %.4f +/- %.4f" % (np.float32(100) * p, np.float32(100) * sigma))
    emit("Random chance: %.4f +/- %.4f" % (np.float32(100) * chance, np.float32(100) * chance_sigma))
    return result
