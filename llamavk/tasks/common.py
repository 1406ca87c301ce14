"""What the three task scorers share: the result type, common prefixes, C-style parsing and
choosing, and the run loop over evaluate_tasks."""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from typing import Callable

import numpy as np

from ..errors import UsageError
from ..tokenizer.stray_bytes import from_bytes
from .evaluate import TaskSequences, evaluate_tasks

Emit = Callable[[str], None]


@dataclass
class TaskScore:
    """The outcome of a task set (HellaSwag, Winogrande, multiple choice) as llama-perplexity scores it.
    Per task, in the order scored: the score of each choice (mean log-probability of its scored
    tokens), the choice taken (the first highest score) and whether it was right."""
    name: str
    n_tasks: int = 0
    n_correct: int = 0
    scores: list[list[float]] = field(default_factory=list)
    chosen: list[int] = field(default_factory=list)
    correct: list[bool] = field(default_factory=list)
    uncertainty: float | None = None          # Winogrande, multiple choice: of the accuracy, percent
    interval: tuple[float, float] | None = None   # HellaSwag: 95% Wilson interval, percent
    random_chance: float | None = None        # multiple choice: percent right by picking at random

    @property
    def accuracy(self) -> float:
        """Percent of tasks answered right (HellaSwag's acc_norm)."""
        return 100.0 * self.n_correct / self.n_tasks if self.n_tasks else float("nan")

    def add(self, scores: list[float], chosen: int, right: bool) -> None:
        self.scores.append([float(s) for s in scores])
        self.chosen.append(chosen)
        self.correct.append(right)
        self.n_tasks += 1
        self.n_correct += int(right)


def common_prefix(seqs: list[list[int]]) -> int:
    """Number of leading tokens all sequences share."""
    n = 0
    for column in zip(*seqs):
        if any(t != column[0] for t in column):
            break
        n += 1
    return n


def first_max(values) -> int:
    """Index of the first largest value (a strict > scan, as in C: ties go to the earlier one)."""
    best = 0
    for i in range(1, len(values)):
        if values[i] > values[best]:
            best = i
    return best


_LEADING_INT = re.compile(r"[ \t\n\v\f\r]*([+-]?[0-9]+)")


def c_int(text: str) -> int | None:
    """The integer at the start of `text` as C++ stream/stoi parsing reads it (leading white space,
    a sign, digits; anything after is ignored), or None where there is none or it overflows int."""
    m = _LEADING_INT.match(text)
    if m is None:
        return None
    value = int(m.group(1))
    return value if -2 ** 31 <= value < 2 ** 31 else None


def f32(x) -> float:
    return float(np.float32(x))


def wilson_interval(correct: int, n: int) -> tuple[float, float]:
    """95% Wilson score interval of correct / n, as fractions."""
    za = 1.95996398454
    freq = correct / n
    z = za * za / n
    cnf = z * math.sqrt(n * (4.0 * freq * (1 - freq) + z)) / (za + za)
    return (freq + z * 0.5 - cnf) / (1.0 + z), (freq + z * 0.5 + cnf) / (1.0 + z)


def run_tasks(model, prepared: list[TaskSequences], score_one: Callable[[int, np.ndarray], None]) -> None:
    """Evaluate the prepared tasks on `model` (batched, see evaluate.py) and hand each task's
    log-probabilities to `score_one(index, log_probs)` in order. The batch budget is the loaded
    context; logits are read n_batch rows at a time."""
    def eval_rows(tokens, n_past, seq_len):
        return model.runtime.eval("all", tokens, n_past, seq_len=seq_len)

    for i, log_probs in evaluate_tasks(eval_rows, prepared, model.n_ctx, min(model.n_batch, model.n_ctx)):
        score_one(i, log_probs)


def read_task_file(path, binary: bool = False) -> bytes | str:
    """A task file's contents as llama-perplexity takes them: `-f` text with one final line break
    dropped (HellaSwag, Winogrande), or the bytes as they are (multiple choice, its `-bf`)."""
    try:
        with open(path, "rb") as f:
            data = f.read()
    except OSError as exc:
        raise UsageError(f"cannot read {path}: {exc.strerror}") from None
    if binary:
        return data
    if data.endswith(b"\n"):
        data = data[:-1]
    return from_bytes(data)   # bytes that are not UTF-8 are tokenized as llama.cpp does (stray_bytes.py)
