"""The `llamavk` command: one thin module per subcommand on top of the Python API."""

from __future__ import annotations

import typer

from . import bench, list_devices, perplexity, run

app = typer.Typer(add_completion=False, no_args_is_help=True, pretty_exceptions_enable=False,
                  context_settings={"help_option_names": ["-h", "--help"]},
                  help="Run GGUF language models with Vulkan on any GPU, or split across several.")
app.command("list-devices")(list_devices.list_devices)
app.command("run")(run.run)
app.command("perplexity")(perplexity.perplexity)
app.command("bench")(bench.bench)


@app.callback()
def _root() -> None:
    """Run GGUF language models with Vulkan on any GPU, or split across several."""


def main() -> None:
    app()
