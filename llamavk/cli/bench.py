"""`llamavk bench`: llama-bench's flags and output; llamavk/bench.py does the work.

Results go to stdout as each test finishes. Progress goes to stderr: a live display when stderr is a
terminal, llama-bench's `benchmark i/N: ...` lines with --progress otherwise.
"""

from __future__ import annotations

import sys

import typer

from ..bench import Progress, BenchTest, parse_params, run_bench
from .common import VERBOSE, eprint, user_errors

EPILOG = ("Each test flag takes a comma list and may be repeated; every combination runs. -p, -n, -d, -b "
          "and -ub also take ranges FIRST-LAST, FIRST-LAST+STEP, FIRST-LAST*MULT. Inside one -ts or "
          "-dev value, '/' separates devices: -ts 3/1 -dev Vulkan0/Vulkan1.")


class TextProgress(Progress):
    """llama-bench's --progress lines."""

    def event(self, index: int, n_tests: int, test: BenchTest, message: str) -> None:
        eprint(f"llamavk bench: benchmark {index}/{n_tests}: {message}")


class LiveProgress(Progress):
    """A rich bar over all repetitions, naming the test and what it is doing."""

    def __init__(self):
        from rich.console import Console
        from rich.progress import (BarColumn, MofNCompleteColumn, SpinnerColumn, TextColumn,
                                   TimeElapsedColumn)
        from rich.progress import Progress as Bar

        self.bar = Bar(SpinnerColumn(), TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                       TimeElapsedColumn(), console=Console(stderr=True), transient=True,
                       redirect_stdout=False, redirect_stderr=True)
        self.task = None

    def print(self, text: str) -> None:
        """Text for the terminal, shown above the bar and never re-wrapped (table rows are wide)."""
        self.bar.console.print(text, end="", soft_wrap=True, markup=False, highlight=False, emoji=False)

    def begin(self, n_tests: int, n_reps: int) -> None:
        self.task = self.bar.add_task("starting", total=n_tests * n_reps)
        self.bar.start()

    def event(self, index: int, n_tests: int, test: BenchTest, message: str) -> None:
        self.bar.update(self.task, description=f"{index}/{n_tests} {test.name} (sm {test.split_mode}): {message}")

    def rep_done(self) -> None:
        self.bar.advance(self.task)

    def end(self) -> None:
        self.bar.stop()


def _write(text: str) -> None:
    sys.stdout.write(text)
    sys.stdout.flush()


def _list_devices() -> None:
    """llama-bench --list-devices: one line per device; filtered ones marked."""
    from ..devices import catalogue
    from ..vk.instance import get_instance
    from .list_devices import headline

    print("Available devices:")
    for e in catalogue(get_instance().devices):
        print(f"  {headline(e)}" + (f"  [filtered: {e.filtered}]" if e.filtered else ""))


def bench(
    model: list[str] = typer.Option(None, "--model", "-m", help="GGUF file or synthetic:PRESET-TYPE[-ARCH], e.g. synthetic:8b-q4_0 (default: the bundled SmolLM2-135M)."),
    n_prompt: list[str] = typer.Option(None, "--n-prompt", "-p", help="Prompt tokens of pp tests (default 512)."),
    n_gen: list[str] = typer.Option(None, "--n-gen", "-n", help="Generated tokens of tg tests (default 128)."),
    pg: list[str] = typer.Option(None, "-pg", help="A prompt then generation test, PP,TG (repeat -pg for several)."),
    n_depth: list[str] = typer.Option(None, "--n-depth", "-d", help="Tokens already in the KV cache, filled untimed (default 0)."),
    repetitions: int = typer.Option(5, "--repetitions", "-r", help="Timed repetitions of each test."),
    batch_size: list[str] = typer.Option(None, "--batch-size", "-b", help="Logical batch size (default 2048)."),
    ubatch_size: list[str] = typer.Option(None, "--ubatch-size", "-ub", help="Micro-batch size (default 512)."),
    split_mode: list[str] = typer.Option(None, "--split-mode", "-sm", help="none, layer, row, tensor or graph (default layer)."),
    tensor_split: list[str] = typer.Option(None, "--tensor-split", "-ts", help="Share of each device, '/'-separated, e.g. 3/1 (default automatic)."),
    main_gpu: list[str] = typer.Option(None, "--main-gpu", "-mg", help="Index of the main device within the selected ones (default 0)."),
    device: list[str] = typer.Option(None, "--device", "-dev", help="Devices, '/'-separated, e.g. Vulkan0/Vulkan1 (default auto)."),
    max_gpu: list[str] = typer.Option(None, "--max-gpu", help="graph mode: use at most this many devices (default 0: all)."),
    reduce_type: list[str] = typer.Option(None, "--reduce-type", help="graph mode: type of partial sums sent between devices for batches > 32 tokens: f16, bf16, f32 (default f16)."),
    flash_attn: list[str] = typer.Option(None, "--flash-attn", "-fa", help="1: llamavk's attention is always a flash-attention kernel."),
    gpu_layers: list[str] = typer.Option(None, "--n-gpu-layers", "-ngl", help="llama-bench's layers on the GPU: llamavk keeps every layer there (the ngl column is 99), so -1, all or at least the layer count."),
    cache_type_k: list[str] = typer.Option(None, "--cache-type-k", "-ctk", help="KV cache type for K: f16, q8_0, q4_0, q4_1, q5_0, q5_1 (comma list)."),
    cache_type_v: list[str] = typer.Option(None, "--cache-type-v", "-ctv", help="KV cache type for V: f16, q8_0, q4_0, q4_1, q5_0, q5_1 (comma list)."),
    threads: list[str] = typer.Option(None, "--threads", "-t", help="Accepted for llama-bench command lines; no effect (the GPUs compute)."),
    output: str = typer.Option("md", "--output", "-o", help="md, csv, json or jsonl."),
    progress: bool = typer.Option(False, "--progress", help="Progress on stderr (always shown live on a terminal)."),
    no_warmup: bool = typer.Option(False, "--no-warmup", help="Skip each test's untimed warm-up run."),
    list_devices: bool = typer.Option(False, "--list-devices", help="List the devices and exit."),
    verbose: bool = VERBOSE,
) -> None:
    """Measure prompt processing and generation speed, like llama-bench."""
    with user_errors(verbose):
        if list_devices:
            _list_devices()
            return
        params = parse_params(model=model, n_prompt=n_prompt, n_gen=n_gen, pg=pg, n_depth=n_depth,
                              batch=batch_size, ubatch=ubatch_size, split_mode=split_mode,
                              tensor_split=tensor_split, main_gpu=main_gpu, device=device, max_gpu=max_gpu,
                              reduce_type=reduce_type, flash_attn=flash_attn, gpu_layers=gpu_layers,
                              cache_type_k=cache_type_k, cache_type_v=cache_type_v,
                              repetitions=repetitions, output=output, no_warmup=no_warmup)
        if verbose and threads:
            eprint(f"-t {','.join(threads)}: no effect (the GPUs compute; the CPU only orchestrates)")
        shown = LiveProgress() if sys.stderr.isatty() else TextProgress() if progress else None
        write, warn = _write, eprint
        if isinstance(shown, LiveProgress):
            # Lines for the terminal go through the live display so they land above the bar; results
            # for a file or pipe go there untouched.
            warn = lambda msg: shown.print(msg + "\n")   # noqa: E731
            if sys.stdout.isatty():
                write = shown.print
        try:
            run_bench(params, write, shown, verbose=verbose, warn=warn)
        except KeyboardInterrupt:
            eprint("llamavk bench: interrupted")
            raise typer.Exit(130)


bench.__doc__ += "\n\n" + EPILOG
