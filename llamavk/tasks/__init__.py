"""llama-perplexity's task scores: HellaSwag, Winogrande and multiple choice (SPEC §6).

Each module reads llama.cpp's task file format, picks tasks the way llama-perplexity does
(llamavk/cpp_random.py), scores them the same way and produces the lines it prints; evaluate.py runs the
sequences of many tasks through the engine in batches of parallel sequences.
"""

from .common import TaskScore, read_task_file

__all__ = ["TaskScore", "read_task_file"]
