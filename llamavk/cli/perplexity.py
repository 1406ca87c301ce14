"""`llamavk perplexity`: llama-perplexity's algorithms and output.

Perplexity: running values `[i]PPL,` go to stdout as chunks finish, then `Final estimate: PPL = X
+/- Y`. Progress goes to stderr: a bar with ETA on a terminal, llama.cpp's "seconds per pass - ETA"
line otherwise. As llama-perplexity, n_seq = min(n_batch / n_ctx, chunks) chunks are evaluated per
batch as parallel sequences, so the model is loaded with a context of n_seq * n_ctx tokens.

`--kl-divergence-base FILE` saves the run's token distributions in llama.cpp's base-file format
(llamavk/kld.py); with `--kl-divergence` the base file's chunks are evaluated again (its context;
-f is not needed) and compared: llama-perplexity's per-chunk table, then its statistics blocks.

`--hellaswag`, `--winogrande`, `--multiple-choice` score llama.cpp's task files (-f; -bf reads the
binary multiple-choice file as is) with llama-perplexity's task selection, scoring and lines
(llamavk/tasks/). As llama-perplexity, the model is loaded with a context of 4 * -c tokens, the
budget of one batch of parallel sequences.

What goes where: result lines on stdout (llama-perplexity's own stdout lines, and the final
estimates and scores that it logs on stderr), progress and notes on stderr.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

import typer

from ..errors import UsageError
from ..llamacpp_compat import check_common, no_effect_notes
from . import fast_exit
from .common import (DEVICE, MAIN_GPU, MAX_GPU, REDUCE_TYPE, SPLIT_MODE, TENSOR_SPLIT, VERBOSE, describe_model,
                     eprint, split_kwargs, user_errors)
from .llamacpp_flags import (CACHE_TYPE_K, CACHE_TYPE_V, FLASH_ATTN, GPU_LAYERS, MLOCK, NO_MMAP, NO_WARMUP, OVERRIDE_KV,
                             ROPE_FREQ_BASE, ROPE_FREQ_SCALE, ROPE_SCALE, ROPE_SCALING, THREADS, YARN_ATTN_FACTOR,
                             YARN_BETA_FAST, YARN_BETA_SLOW, YARN_EXT_FACTOR, YARN_ORIG_CTX, kv_overrides, rope)
from .load_progress import LoadProgress

TASK_PARALLEL = 4        # llama-perplexity's n_parallel for task scores: the context is 4 * -c


def perplexity(
    model: Path = typer.Option(None, "--model", "-m", help="GGUF model file (default: the bundled SmolLM2-135M)."),
    file: Path = typer.Option(None, "--file", "-f", help="Text (or task file) to evaluate (not needed with --kl-divergence)."),
    binary_file: Path = typer.Option(None, "--binary-file", "-bf", help="Binary task file (--multiple-choice), read as is."),
    ctx_size: int = typer.Option(512, "--ctx-size", "-c", help="Chunk size = context of each evaluation."),
    batch_size: int = typer.Option(2048, "--batch-size", "-b", help="Logical batch size."),
    ubatch_size: int = typer.Option(512, "--ubatch-size", "-ub", help="Micro-batch size."),
    chunks: int = typer.Option(-1, "--chunks", help="Evaluate at most this many chunks (-1: all)."),
    device: str = DEVICE,
    split_mode: str = SPLIT_MODE,
    tensor_split: str = TENSOR_SPLIT,
    main_gpu: int = MAIN_GPU,
    max_gpu: int = MAX_GPU,
    reduce_type: str = REDUCE_TYPE,
    kld_base: Path = typer.Option(None, "--kl-divergence-base", "--save-all-logits",
                                  help="Save log-probs here (or, with --kl-divergence, compare with them)."),
    kld: bool = typer.Option(False, "--kl-divergence", help="Compare with the --kl-divergence-base file."),
    hellaswag: bool = typer.Option(False, "--hellaswag", help="HellaSwag score of the task file given with -f."),
    hellaswag_tasks: int = typer.Option(400, "--hellaswag-tasks", help="Number of HellaSwag tasks (random ones)."),
    winogrande: bool = typer.Option(False, "--winogrande", help="Winogrande score of the CSV given with -f."),
    winogrande_tasks: int = typer.Option(0, "--winogrande-tasks", help="Number of Winogrande tasks (0: all)."),
    multiple_choice: bool = typer.Option(False, "--multiple-choice", help="Multiple-choice score of the -f/-bf file."),
    multiple_choice_tasks: int = typer.Option(0, "--multiple-choice-tasks", help="Number of multiple-choice tasks (0: all)."),
    gpu_layers: str = GPU_LAYERS,
    flash_attn: str = FLASH_ATTN,
    cache_type_k: str = CACHE_TYPE_K,
    cache_type_v: str = CACHE_TYPE_V,
    threads: int = THREADS,
    no_warmup: bool = NO_WARMUP,
    mlock: bool = MLOCK,
    no_mmap: bool = NO_MMAP,
    override_kv: list[str] = OVERRIDE_KV,
    rope_freq_base: float = ROPE_FREQ_BASE,
    rope_freq_scale: float = ROPE_FREQ_SCALE,
    rope_scale: float = ROPE_SCALE,
    rope_scaling: str = ROPE_SCALING,
    yarn_orig_ctx: int = YARN_ORIG_CTX,
    yarn_ext_factor: float = YARN_EXT_FACTOR,
    yarn_beta_fast: float = YARN_BETA_FAST,
    yarn_beta_slow: float = YARN_BETA_SLOW,
    yarn_attn_factor: float = YARN_ATTN_FACTOR,
    verbose: bool = VERBOSE,
) -> None:
    """Perplexity of a model over a text file, KL divergence against a base run, or task scores, as
    llama-perplexity computes them."""
    from .. import phases
    from ..api import load

    phases.mark("imports, arguments")
    with user_errors(verbose):
        n_gpu_layers = check_common(gpu_layers, flash_attn, cache_type_k, cache_type_v)
        overrides = kv_overrides(override_kv)
        rope_opts = rope(rope_freq_base, rope_freq_scale, rope_scale, rope_scaling, yarn_orig_ctx, yarn_ext_factor,
                         yarn_beta_fast, yarn_beta_slow, yarn_attn_factor)
        if verbose:
            for note in no_effect_notes(threads, no_warmup, mlock=mlock, no_mmap=no_mmap):
                eprint(note)
        if ctx_size < 4:
            raise UsageError("-c must be at least 4")
        if chunks == 0:
            raise UsageError("--chunks 0 leaves nothing to evaluate")
        task = [name for name, on in (("hellaswag", hellaswag), ("winogrande", winogrande),
                                      ("multiple-choice", multiple_choice)) if on]
        if len(task) + kld > 1:
            raise UsageError("give one of --hellaswag, --winogrande, --multiple-choice, --kl-divergence")
        if min(hellaswag_tasks, winogrande_tasks, multiple_choice_tasks) < 0:
            raise UsageError("task counts cannot be negative")
        if kld and kld_base is None:
            raise UsageError("--kl-divergence needs --kl-divergence-base FILE (written by a base run)")

        def load_model(n_ctx: int, n_batch: int, **kwargs):
            with LoadProgress(model.name if model else "default model") as progress:
                return load(model, devices=device, n_ctx=n_ctx, n_batch=n_batch, n_ubatch=ubatch_size,
                            n_gpu_layers=n_gpu_layers, verbose=verbose, warn=eprint, progress=progress,
                            type_k=cache_type_k, type_v=cache_type_v, kv_overrides=overrides, rope=rope_opts, **kwargs,
                            **split_kwargs(split_mode, tensor_split, main_gpu, max_gpu, reduce_type))

        if task:
            data = binary_file or file
            if data is None:
                raise UsageError(f"give the {task[0]} task file with -f FILE")
            n_ctx = TASK_PARALLEL * ctx_size
            with load_model(n_ctx, min(batch_size, n_ctx)) as m:
                if verbose:
                    for line in describe_model(m):
                        eprint(line)
                run_tasks(m, task[0], data, hellaswag_tasks, winogrande_tasks, multiple_choice_tasks)
            return
        if kld:
            from ..kld import KLDBase

            with KLDBase(kld_base) as base:      # the base run's chunks are evaluated again
                ctx_size, base_chunks = base.n_ctx, base.n_chunks
            n_chunks = base_chunks if chunks < 0 else min(chunks, base_chunks)
            n_seq = min(max(1, batch_size // ctx_size), max(1, n_chunks))
            with load_model(ctx_size * n_seq, batch_size) as m:
                if verbose:
                    for line in describe_model(m):
                        eprint(line)
                compare_with_base(m, kld_base, n_chunks, n_seq, batch_size)
            return
        if file is None:
            raise UsageError("give the text to evaluate with -f FILE")
        from ..perplexity import read_text
        from ..perplexity_text import EvaluationText
        try:
            text = EvaluationText(read_text(file), ctx_size, chunks)
        except (OSError, UnicodeDecodeError) as exc:
            raise UsageError(f"cannot read {file}: {exc.strerror if isinstance(exc, OSError) else exc}")
        n_seq = max(1, batch_size // ctx_size)          # llama-perplexity's n_batch / n_ctx
        if chunks >= 0:
            n_seq = min(n_seq, max(1, chunks))
        t_start = time.perf_counter()
        # The text is tokenized (as far as the chunks need it), and the evaluation's steps recorded,
        # while the weights upload; the whole text is counted while the load waits for the rest of them.
        m = load_model(ctx_size * n_seq, batch_size, prerecord="score", prepare_prompt=text.tokenize,
                       while_uploading=lambda m: text.count_in_background())
        try:
            if verbose:
                for line in describe_model(m):
                    eprint(line)
            run_perplexity(m, text, ctx_size, chunks, n_seq, batch_size, kld_base)
            phases.mark("evaluation")
        finally:
            m.close(release=not fast_exit())
        phases.mark("teardown")
        eprint(f"perplexity: {time.perf_counter() - t_start:.2f} s in all")
        if verbose or phases.requested():
            for line in phases.report():
                eprint(line)


class _Progress:
    """Chunks done: a tqdm bar on a terminal, else llama.cpp's one "seconds per pass" line."""

    def __init__(self, name: str, n_chunks: int, n_seq: int, t0: float | None = None):
        """t0: when the evaluation started (default: now)."""
        self.name, self.n_chunks, self.n_seq = name, n_chunks, n_seq
        self.bar = None
        if sys.stderr.isatty():
            from tqdm import tqdm
            self.bar = tqdm(total=n_chunks, unit="chunk", file=sys.stderr, leave=False)
        self.t0 = time.perf_counter() if t0 is None else t0

    def chunk(self, i: int, t_done: float | None = None) -> None:
        """Chunk i is done (at t_done, default now)."""
        if self.bar is not None:
            self.bar.update(1)
        elif i == 0:
            per = (time.perf_counter() if t_done is None else t_done) - self.t0
            passes = -(-self.n_chunks // self.n_seq)
            eprint(f"{self.name}: {per:.2f} seconds per pass - ETA {per * passes / 60:.2f} minutes")

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()


def run_perplexity(m, text, ctx_size: int, chunks: int, n_seq: int, batch_size: int, kld_base) -> None:
    """text: a perplexity_text.EvaluationText, tokenized by the load (its ids: as many as the chunks
    need). The lines before the first chunk's name the whole text's number of ids; where the load
    tokenized only a head of the text, a thread counts them (from the load's wait for the weights,
    or else from the first chunk on, while the device evaluates), and the chunks that finish before
    it are shown once it has (the lines and their order stay those of a run that tokenized the whole
    text first; the device never waits for the count)."""
    from ..perplexity import chunk_plan

    tokens = text.ids
    n_chunks = chunk_plan(len(tokens), ctx_size, chunks)
    n_seq = max(1, min(n_seq, n_chunks))
    progress = None
    pending: list[tuple[int, float, float]] = []     # (chunk, running PPL, when it was done)

    def header() -> None:
        nonlocal progress
        eprint(f"perplexity: tokenized the input into {text.n_tokens()} tokens")
        if kld_base is not None:
            eprint(f"perplexity: saving all logits to {kld_base}")
        eprint(f"perplexity: calculating perplexity over {n_chunks} chunks, n_ctx={ctx_size}, "
               f"batch_size={min(batch_size, ctx_size * n_seq)}, n_seq={n_seq}")
        progress = _Progress("perplexity", n_chunks, n_seq, t0)

    def show_pending() -> None:
        if progress is None:
            header()
        for i, ppl, t_done in pending:
            progress.chunk(i, t_done)
            sys.stdout.write(f"[{i + 1}]{ppl:.4f},")
        sys.stdout.flush()
        pending.clear()

    def on_chunk(i: int, ppl: float) -> None:
        pending.append((i, ppl, time.perf_counter()))
        if progress is not None or text.counted():
            show_pending()
        else:
            # Not started during the load: now, when every step is recorded and the main thread only
            # waits for the device (earlier, the thread would slow the recording of the second slot).
            text.count_in_background()

    t0 = time.perf_counter()
    if text.counted():
        header()
    bos = m.tokenizer.bos_id if m.tokenizer.add_bos else None
    result = m.perplexity_tokens(tokens, ctx_size, n_chunks, bos, on_chunk, n_seq=n_seq, kl_divergence_base=kld_base)
    show_pending()
    progress.close()
    print()
    print(f"Final estimate: PPL = {result.ppl:.4f} +/- {result.uncertainty:.5f}")
    eprint(f"perplexity: {result.count} tokens scored")


def compare_with_base(m, kld_base, n_chunks: int, n_seq: int, batch_size: int) -> None:
    from ..kld_stats import CHUNK_HEADER, report

    ctx_size = m.n_ctx // n_seq
    eprint(f"kl_divergence: computing over {n_chunks} chunks, n_ctx={ctx_size}, batch_size={batch_size}, "
           f"n_seq={n_seq}")
    progress = _Progress("kl_divergence", n_chunks, n_seq)

    def on_chunk(i: int, stats) -> None:
        progress.chunk(i)
        if i == 0:
            print()
            print(CHUNK_HEADER)
        print(stats.chunk_line(i + 1), flush=True)

    result = m.kl_divergence(kld_base, n_chunks, on_chunk, n_seq=n_seq)
    progress.close()
    print()
    if result.count < 100:
        eprint(f"kl_divergence: {result.count} tokens compared: too few for the statistics (llama-perplexity "
               f"prints them from 100 on)")
    for line in report(result):
        print(line)
    print()                                  # llama-perplexity ends its output with an empty line


def run_tasks(m, task: str, path, hellaswag_tasks: int, winogrande_tasks: int, multiple_choice_tasks: int) -> None:
    def emit(line: str) -> None:
        print(line, flush=True)

    if task == "hellaswag":
        m.hellaswag(path, hellaswag_tasks, emit, eprint)
    elif task == "winogrande":
        m.winogrande(path, winogrande_tasks, emit, eprint)
    else:
        m.multiple_choice(path, multiple_choice_tasks, emit, eprint)
    print()                                  # llama-perplexity ends its output with an empty line
