"""What every subcommand shares: error handling (one line, right exit code) and common options."""

from __future__ import annotations

import sys
import traceback
from contextlib import contextmanager

import typer

from ..errors import LlamavkError, UsageError

EXIT_OK, EXIT_RUNTIME, EXIT_USAGE = 0, 1, 2

VERBOSE = typer.Option(False, "--verbose", "-v", help="Verbose output (and tracebacks on errors).")


def eprint(*args) -> None:
    print(*args, file=sys.stderr, flush=True)


@contextmanager
def user_errors(verbose: bool = False):
    """Turn failures into `error: ...` on stderr and an exit code; tracebacks only with -v."""
    try:
        yield
    except UsageError as exc:
        if verbose:
            traceback.print_exc()
        eprint(f"error: {exc}")
        raise typer.Exit(EXIT_USAGE)
    except LlamavkError as exc:
        if verbose:
            traceback.print_exc()
        eprint(f"error: {exc}")
        raise typer.Exit(EXIT_RUNTIME)
    except MemoryError:
        eprint("error: out of host memory")
        raise typer.Exit(EXIT_RUNTIME)


# -- device and split options shared by run / perplexity (bench takes lists of them) --------------
DEVICE = typer.Option(None, "--device", "-dev", help="Devices, comma-separated, e.g. Vulkan0,Vulkan1 (see list-devices).")
SPLIT_MODE = typer.Option("layer", "--split-mode", "-sm",
                          help="How to split the model across devices: none, layer, row, tensor, graph.")
TENSOR_SPLIT = typer.Option(None, "--tensor-split", "-ts",
                            help="Share of each device, e.g. 3,1 (default: by free memory).")
MAIN_GPU = typer.Option(0, "--main-gpu", "-mg",
                        help="Index (within the selected devices) of the device for -sm none, and for row mode's norms/attention.")
MAX_GPU = typer.Option(None, "--max-gpu", help="graph mode: use at most this many devices.")
REDUCE_TYPE = typer.Option("f16", "--reduce-type",
                           help="graph mode: type of partial sums sent between devices for batches > 32 tokens: f16, bf16, f32.")


def parse_tensor_split(text: str | None, sep: str = ",") -> list[float] | None:
    """'3,1' -> [3.0, 1.0] (llama.cpp's -ts); None -> None."""
    if text is None or not text.strip():
        return None
    try:
        values = [float(v) for v in text.replace("/", sep).split(sep)]
    except ValueError:
        raise UsageError(f"-ts: expected numbers separated by '{sep}', got {text!r}") from None
    return values


def split_kwargs(split_mode: str, tensor_split: str | None, main_gpu: int, max_gpu: int | None,
                 reduce_type: str) -> dict:
    return dict(split_mode=split_mode, tensor_split=parse_tensor_split(tensor_split), main_gpu=main_gpu,
                max_gpu=max_gpu, reduce_type=reduce_type)


def describe_model(m) -> list[str]:
    """-v: the model, where it runs, and for a split which device holds what."""
    from ..bench import ftype_name

    rt = m.runtime
    c = m.config
    ftype = ftype_name(m.file.metadata, [m.file.tensor_type(n).name for n in m.file.weights])
    experts = (f" ({rt.weight_bytes(experts_only=True) / 2**20:.1f} MiB of {c.n_expert} experts, "
               f"{c.n_expert_used} used per token)" if c.n_expert else "")
    state = (f", recurrent state {rt.state_bytes() / 2**20:.1f} MiB ({sum(c.recurrent_layers)} DeltaNet layers)"
             if c.recurrent_layers else "")
    kv = f", KV cache {rt.kv_bytes() / 2**20:.1f} MiB (K {m.kv_types.k}, V {m.kv_types.v})"
    head = (f"{m.path.name}: {c.arch}, {c.n_layer} layers, file type {ftype}, context {m.n_ctx}; weights "
            f"{rt.weight_bytes() / 2**20:.1f} MiB{experts}{kv}{state}, upload {rt.upload_seconds:.2f} s")
    if m.split_mode == "none":
        return [f"{head}; on {rt.device.name} ({rt.device.info.name})"]
    return [f"{head}; split mode {m.split_mode} over {len(m.devices)} devices:"] + rt.describe()
