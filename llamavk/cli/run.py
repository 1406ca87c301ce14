"""`llamavk run`: one-shot completion, like `llama-completion -no-cnv`.

Prints the prompt, streams the completion to stdout, and the timing summary to stderr in
llama.cpp's shape. Ctrl-C stops generation cleanly and still prints the timings (exit 130).
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

import typer

from ..errors import UsageError
from .common import (DEVICE, MAIN_GPU, MAX_GPU, REDUCE_TYPE, SPLIT_MODE, TENSOR_SPLIT, VERBOSE, describe_model,
                     eprint, split_kwargs, user_errors)

PERF = "llamavk_perf"


def perf_report(t, total_ms: float) -> list[str]:
    def rate(ms, n):
        return (ms / n if n else 0.0), (1e3 * n / ms if ms > 0 else 0.0)
    p_per, p_tps = rate(t.prompt_ms, t.prompt_tokens)
    e_per, e_tps = rate(t.eval_ms, t.eval_runs)
    return [
        f"{PERF}:        load time = {t.load_ms:10.2f} ms",
        f"{PERF}: prompt eval time = {t.prompt_ms:10.2f} ms / {t.prompt_tokens:5d} tokens "
        f"({p_per:8.2f} ms per token, {p_tps:8.2f} tokens per second)",
        f"{PERF}:        eval time = {t.eval_ms:10.2f} ms / {t.eval_runs:5d} runs   "
        f"({e_per:8.2f} ms per token, {e_tps:8.2f} tokens per second)",
        f"{PERF}:    sampling time = {t.sample_ms:10.2f} ms",
        f"{PERF}:       total time = {total_ms:10.2f} ms / {t.prompt_tokens + t.eval_runs:5d} tokens",
    ]


def run(
    model: Path = typer.Option(None, "--model", "-m", help="GGUF model file (default: the bundled SmolLM2-135M)."),
    prompt: str = typer.Option(None, "--prompt", "-p", help="Prompt text."),
    file: Path = typer.Option(None, "--file", "-f", help="Read the prompt from a file."),
    n_predict: int = typer.Option(-1, "--n-predict", "-n", help="Tokens to generate (-1: until end of text or full context)."),
    ctx_size: int = typer.Option(None, "--ctx-size", "-c", help="Context size (default min(training context, 4096); 0: the model's)."),
    batch_size: int = typer.Option(2048, "--batch-size", "-b", help="Logical batch size."),
    ubatch_size: int = typer.Option(512, "--ubatch-size", "-ub", help="Micro-batch size for prompt processing."),
    seed: int = typer.Option(-1, "--seed", "-s", help="Sampling seed (-1: random)."),
    temp: float = typer.Option(0.8, "--temp", help="Temperature (0: greedy)."),
    top_k: int = typer.Option(40, "--top-k", help="Top-k sampling (0: off)."),
    top_p: float = typer.Option(0.95, "--top-p", help="Top-p sampling (1.0: off)."),
    min_p: float = typer.Option(0.05, "--min-p", help="Min-p sampling (0.0: off)."),
    repeat_penalty: float = typer.Option(1.0, "--repeat-penalty", help="Penalty for repeated tokens (1.0: off)."),
    repeat_last_n: int = typer.Option(64, "--repeat-last-n", help="Tokens considered for the repeat penalty."),
    device: str = DEVICE,
    split_mode: str = SPLIT_MODE,
    tensor_split: str = TENSOR_SPLIT,
    main_gpu: int = MAIN_GPU,
    max_gpu: int = MAX_GPU,
    reduce_type: str = REDUCE_TYPE,
    verbose: bool = VERBOSE,
) -> None:
    """Generate a completion of a prompt."""
    from ..api import load

    with user_errors(verbose):
        if prompt is not None and file is not None:
            raise UsageError("give either -p or -f, not both")
        if file is not None:
            try:
                prompt = file.read_text(encoding="utf-8")
            except (OSError, UnicodeDecodeError) as exc:
                raise UsageError(f"cannot read prompt file {file}: {exc.strerror if isinstance(exc, OSError) else exc}")
        prompt = prompt or ""
        t_start = time.perf_counter()
        m = load(model, devices=device, n_ctx=ctx_size, n_batch=batch_size,
                 n_ubatch=ubatch_size, verbose=verbose, warn=eprint,
                 **split_kwargs(split_mode, tensor_split, main_gpu, max_gpu, reduce_type))
        with m:
            if verbose:
                for line in describe_model(m):
                    eprint(line)
            tokens = m.tokenize(prompt)
            if not tokens:
                raise UsageError("the prompt is empty and the model adds no BOS token: nothing to continue")
            out = sys.stdout
            out.write(prompt)
            out.flush()
            stream = m.tokenizer.stream()
            interrupted = False
            try:
                for token in m.generate(tokens, n=n_predict, temp=temp, top_k=top_k, top_p=top_p, min_p=min_p,
                                        repeat_penalty=repeat_penalty, repeat_last_n=repeat_last_n, seed=seed):
                    out.write(stream.feed(token))
                    out.flush()
            except KeyboardInterrupt:
                interrupted = True
            out.write(stream.flush() + "\n")
            out.flush()
            for line in perf_report(m.timings, (time.perf_counter() - t_start) * 1e3):
                eprint(line)
            if interrupted:
                raise typer.Exit(130)
