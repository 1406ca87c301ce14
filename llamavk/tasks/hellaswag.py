"""HellaSwag as llama-perplexity --hellaswag scores it.

Task file: 6 lines per task (llama.cpp's hellaswag_val_full.txt layout): the context
("activity_label: ctx"), the index 0-3 of the gold ending, then the four endings.

Tasks are drawn at random with std::mt19937(1) (each draw picks one of the tasks not yet drawn,
by uniform_int_distribution), `n_tasks` of them (default 400), or all of them in random order when
the file has fewer. Each ending is scored as context + " " + ending, tokenized with the model's
special tokens added: its score is the mean log-probability of its tokens after the prefix all
four endings share (acc_norm). The highest score wins; the running accuracy is printed after every
task with its 95% Wilson score interval.
"""

from __future__ import annotations

from ..errors import LlamavkError
from .common import Emit, TaskScore, c_int, common_prefix, first_max, run_tasks, wilson_interval
from ..cpp_random import MT19937, uniform_index
from .evaluate import TaskSequences

HEADER = "task\tacc_norm\t95% confidence interval"


def parse(text: str) -> list[tuple[str, int | None, list[str]]]:
    """(context, gold index, endings) per task; lines as C++ getline splits them."""
    lines = text.split("\n")
    if lines and lines[-1] == "":
        lines.pop()
    if len(lines) % 6:
        raise LlamavkError(f"a HellaSwag task file has 6 lines per task; this one has {len(lines)} lines")
    tasks = []
    for i in range(0, len(lines), 6):
        gold = c_int(lines[i + 1])
        if gold is None:
            raise LlamavkError(f"HellaSwag task {i // 6 + 1}: line {i + 2} ({lines[i + 1][:40]!r}) is not an ending index")
        tasks.append((lines[i], gold, lines[i + 2:i + 6]))
    return tasks


def select(tasks: list, n_tasks: int) -> list:
    """llama-perplexity's random order: min(n_tasks, len(tasks)) draws without replacement."""
    rng = MT19937(1)
    left = list(tasks)
    return [left.pop(uniform_index(rng, len(left))) for _ in range(min(n_tasks, len(tasks)))]


def prepare(task, tokenize, number: int) -> tuple[TaskSequences, int]:
    context, _, endings = task
    seqs = [tokenize(context + " " + ending) for ending in endings]
    prefix = common_prefix(seqs)
    if prefix == 0 or any(len(s) == prefix for s in seqs):
        raise LlamavkError(f"HellaSwag task {number}: its endings must share a first token and each add a token "
                           f"after the common prefix")
    queries = [(s, j, seq[j + 1]) for s, seq in enumerate(seqs) for j in range(prefix - 1, len(seq) - 1)]
    return TaskSequences(seqs, queries), prefix


def score(model, text: str, n_tasks: int = 400, emit: Emit | None = None, log: Emit | None = None) -> TaskScore:
    """Score the tasks of a HellaSwag file's text; `emit` gets llama-perplexity's output lines."""
    emit = emit or (lambda line: None)
    log = log or (lambda line: None)
    tasks = parse(text)
    log(f"hellaswag_score : loaded {len(tasks)} tasks from prompt.")
    tasks = select(tasks, n_tasks)
    log(f"hellaswag_score : selecting {len(tasks)} randomized tasks.")

    def tokenize(s):
        return model.tokenize(s, add_special=True, parse_special=False)

    prepared = [prepare(task, tokenize, i + 1) for i, task in enumerate(tasks)]
    log("hellaswag_score : calculating hellaswag score over selected tasks.")
    emit("")
    emit(HEADER)
    result = TaskScore("hellaswag")

    def score_one(i: int, log_probs) -> None:
        seqs, queries = prepared[i][0].sequences, prepared[i][0].queries
        sums, counts = [0.0] * 4, [0] * 4
        for (s, _, _), lp in zip(queries, log_probs):
            sums[s] += lp
            counts[s] += 1
        means = [sums[s] / counts[s] for s in range(len(seqs))]
        chosen = first_max(means)
        result.add(means, chosen, chosen == tasks[i][1])
        lo, hi = wilson_interval(result.n_correct, result.n_tasks)
        result.interval = (lo * 100.0, hi * 100.0)
        freq = result.n_correct / result.n_tasks
        emit("%d\t%3.8f%%\t[%3.4f%%, %3.4f%%]" % (i + 1, freq * 100.0, lo * 100.0, hi * 100.0))

    run_tasks(model, [p[0] for p in prepared], score_one)
    emit("")
    return result
