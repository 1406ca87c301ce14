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
