"""`llamavk perplexity`: llama-perplexity's algorithm and output.

Running values `[i]PPL,` go to stdout as chunks finish, then `Final estimate: PPL = X +/- Y`.
Progress goes to stderr: a bar with ETA on a terminal, llama.cpp's "seconds per pass - ETA" line
otherwise. `--kl-divergence-base FILE` saves this run's token distributions (llamavk/kld.py documents
the format); adding `--kl-divergence` evaluates the base file's tokens instead of a text and prints
llama-perplexity's KL-divergence, Δp and same-top-token statistics against it.

As llama-perplexity, n_seq = min(n_batch / n_ctx, chunks) chunks are evaluated per batch as parallel
sequences, so the model is loaded with a context of n_seq * n_ctx tokens (before the text is
tokenized, the chunk count is only bounded by --chunks or the KL-divergence base file).
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

import typer

from ..errors import UsageError
from ..llamacpp_compat import check_common, no_effect_notes
from .common import (DEVICE, MAIN_GPU, MAX_GPU, REDUCE_TYPE, SPLIT_MODE, TENSOR_SPLIT, VERBOSE, describe_model,
                     eprint, split_kwargs, user_errors)
from .llamacpp_flags import CACHE_TYPE_K, CACHE_TYPE_V, FLASH_ATTN, GPU_LAYERS, NO_WARMUP, THREADS
from .load_progress import LoadProgress


def perplexity(
    model: Path = typer.Option(None, "--model", "-m", help="GGUF model file (default: the bundled SmolLM2-135M)."),
    file: Path = typer.Option(None, "--file", "-f", help="Text file to evaluate (not needed with --kl-divergence)."),
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
    kld_base: Path = typer.Option(None, "--kl-divergence-base", help="Save log-probs here (or, with --kl-divergence, compare with them)."),
    kld: bool = typer.Option(False, "--kl-divergence", help="Compare with the --kl-divergence-base file."),
    gpu_layers: str = GPU_LAYERS,
    flash_attn: str = FLASH_ATTN,
    cache_type_k: str = CACHE_TYPE_K,
    cache_type_v: str = CACHE_TYPE_V,
    threads: int = THREADS,
    no_warmup: bool = NO_WARMUP,
    verbose: bool = VERBOSE,
) -> None:
    """Perplexity of a model over a text file, as llama-perplexity computes it."""
    from ..api import load
    from ..kld import KLDBaseWriter, KLDComparer
    from ..perplexity import chunk_plan, evaluated_tokens, read_text

    with user_errors(verbose):
        n_gpu_layers = check_common(gpu_layers, flash_attn, cache_type_k, cache_type_v)
        if verbose:
            for note in no_effect_notes(threads, no_warmup):
                eprint(note)
        if ctx_size < 4:
            raise UsageError("-c must be at least 4")
        if kld and kld_base is None:
            raise UsageError("--kl-divergence needs --kl-divergence-base FILE (written by a base run)")
        comparer = KLDComparer(kld_base) if kld else None
        text = None
        if comparer is not None:
            ctx_size = comparer.n_ctx                  # the base run's chunks, evaluated again
        elif file is None:
            raise UsageError("give the text to evaluate with -f FILE")
        else:
            try:
                text = read_text(file)
            except (OSError, UnicodeDecodeError) as exc:
                raise UsageError(f"cannot read {file}: {exc.strerror if isinstance(exc, OSError) else exc}")
        n_seq = max(1, batch_size // ctx_size)          # llama-perplexity's n_batch / n_ctx
        if comparer is not None:
            n_seq = min(n_seq, max(1, comparer.n_chunks if chunks < 0 else min(chunks, comparer.n_chunks)))
        elif chunks >= 0:
            n_seq = min(n_seq, max(1, chunks))
        t_start = time.perf_counter()
        with LoadProgress(model.name if model else "default model") as progress:
            m = load(model, devices=device, n_ctx=ctx_size * n_seq, n_batch=batch_size,
                     n_ubatch=ubatch_size, n_gpu_layers=n_gpu_layers, verbose=verbose, warn=eprint,
                     progress=progress, **split_kwargs(split_mode, tensor_split, main_gpu, max_gpu, reduce_type))
        with m:
            if verbose:
                for line in describe_model(m):
                    eprint(line)
            if comparer is not None:
                comparer.check_model(m.config.n_vocab)
                tokens, bos = comparer.tokens, None
                chunks = comparer.n_chunks if chunks < 0 else min(chunks, comparer.n_chunks)
            else:
                tokens = m.tokenize(text)
                bos = m.tokenizer.bos_id if m.tokenizer.add_bos else None
            n_tokens = len(tokens)
            min_chunks = 1 if comparer is not None else 2
            n_chunks = chunk_plan(n_tokens, ctx_size, chunks, min_chunks)
            n_seq = max(1, min(n_seq, n_chunks))
            writer = None
            if kld_base is not None and comparer is None:
                writer = KLDBaseWriter(kld_base, ctx_size, m.config.n_vocab, n_chunks,
                                       evaluated_tokens(tokens, ctx_size, n_chunks, bos))
            eprint(f"perplexity: tokenized the input into {n_tokens} tokens")
            eprint(f"perplexity: calculating perplexity over {n_chunks} chunks, n_ctx={ctx_size}, "
                   f"batch_size={min(batch_size, ctx_size * n_seq)}, n_seq={n_seq}")
            bar = None
            if sys.stderr.isatty():
                from tqdm import tqdm
                bar = tqdm(total=n_chunks, unit="chunk", file=sys.stderr, leave=False)
            t0 = time.perf_counter()

            def on_chunk(i: int, ppl: float) -> None:
                if bar is not None:
                    bar.update(1)
                elif i == 0:
                    per = time.perf_counter() - t0
                    passes = -(-n_chunks // n_seq)
                    eprint(f"perplexity: {per:.2f} seconds per pass - ETA {per * passes / 60:.2f} minutes")
                sys.stdout.write(f"[{i + 1}]{ppl:.4f},")
                sys.stdout.flush()

            sink = comparer or writer
            on_scored = (comparer.add if comparer else writer.add) if sink else None
            result = m.perplexity_tokens(tokens, ctx_size, n_chunks, bos, on_chunk, on_scored, min_chunks, n_seq)
            if bar is not None:
                bar.close()
            print()
            print(f"Final estimate: PPL = {result.ppl:.4f} +/- {result.uncertainty:.5f}")
            if comparer is not None:
                print()
                for line in comparer.report():
                    print(line)
                comparer.close()
            if writer is not None:
                writer.close()
                eprint(f"perplexity: saved the base log-probs of {result.count} tokens to {kld_base}")
            eprint(f"perplexity: {result.count} tokens scored, {time.perf_counter() - t_start:.2f} s in all")
