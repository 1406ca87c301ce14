"""The `llamavk` command: one thin module per subcommand on top of the Python API.

A subcommand's module is imported only when that subcommand runs (or for the top-level help):
`llamavk run` does not pay for importing what only bench or perplexity use.
"""

from __future__ import annotations

import importlib
import os
import sys

# subcommand -> (module in llamavk.cli, function)
COMMANDS = {
    "list-devices": ("list_devices", "list_devices"),
    "run": ("run", "run"),
    "perplexity": ("perplexity", "perplexity"),
    "bench": ("bench", "bench"),
}


def build_app(names=None):
    """The typer app with the named subcommands (None: all of them)."""
    import typer

    app = typer.Typer(add_completion=False, no_args_is_help=True, pretty_exceptions_enable=False,
                      context_settings={"help_option_names": ["-h", "--help"]},
                      help="Run GGUF language models with Vulkan on any GPU, or split across several.")
    for name, (module, func) in COMMANDS.items():
        if names is None or name in names:
            app.command(name)(getattr(importlib.import_module(f".{module}", __name__), func))

    @app.callback()
    def _root() -> None:
        """Run GGUF language models with Vulkan on any GPU, or split across several."""

    return app


def __getattr__(name: str):
    if name == "app":            # the whole app, for tests and scripts (`from llamavk.cli import app`)
        app = build_app()
        globals()["app"] = app
        return app
    raise AttributeError(name)


# Commands that load a model: the Vulkan instance is created on a thread while the command imports
# and parses (H100 machine: vkCreateInstance and the device queries 66-83 ms of a 1.1B run's 0.74 s),
# and the default device opened after it (vkCreateDevice: 80-89 ms more) unless the command line
# chooses devices.
EARLY_INSTANCE = ("run", "perplexity")

_ENDS_PROCESS = False      # set by main(): the command's process ends with leave()


def main() -> None:
    global _ENDS_PROCESS
    _ENDS_PROCESS = True
    command = sys.argv[1] if len(sys.argv) > 1 else None
    if command in EARLY_INSTANCE and not {"-h", "--help"} & set(sys.argv[2:]):
        from .early import chooses_devices, start_vulkan
        start_vulkan(open_device=not chooses_devices(sys.argv[2:]))
    try:
        code = run_app(build_app([command] if command in COMMANDS else None))
    except SystemExit as exc:
        code = exc.code
    leave(code)


def run_app(app) -> int:
    """Run the app on sys.argv; a usage error click finds (an unknown option, a missing or malformed
    value) is one `error:` line and exit 2, as the commands' own usage errors (typer would print the
    usage lines and the message in a box)."""
    import typer

    # click's UsageError, from the click typer runs on (typer 0.2x carries its own copy)
    usage_error = next(c for c in typer.BadParameter.__mro__ if c.__name__ == "UsageError")
    try:
        code = app(args=llamacpp_spelling(app, sys.argv[1:]), standalone_mode=False)
    except usage_error as exc:
        if type(exc).__name__ == "NoArgsIsHelpError":     # `llamavk` alone: its help, as typer shows it
            return app()
        hint = f" (see {exc.ctx.command_path} -h)" if exc.ctx is not None else ""
        print(f"error: {exc.format_message()}{hint}", file=sys.stderr)
        return exc.exit_code
    except typer.Abort:
        print("error: aborted", file=sys.stderr)
        return 1
    return code if isinstance(code, int) else 0


def llamacpp_spelling(app, argv: list[str]) -> list[str]:
    """The arguments with option names spelled as llama.cpp also takes them: `--repeat_penalty` is
    `--repeat-penalty` (its parser replaces every "_" of a "--" argument by "-"). Only a name the
    subcommand has once so replaced is touched, never an option's value."""
    if not argv or not any(a.startswith("--") and "_" in a for a in argv):
        return argv
    import typer.main

    command = getattr(typer.main.get_command(app), "commands", {}).get(argv[0])
    if command is None:
        return argv
    names, takes_value = set(), set()
    for param in command.params:
        for opt in list(getattr(param, "opts", ())) + list(getattr(param, "secondary_opts", ())):
            names.add(opt)
            if not getattr(param, "is_flag", True):
                takes_value.add(opt)
    out = argv[:1]
    value_next = False
    for i, arg in enumerate(argv[1:], 1):
        if arg == "--" and not value_next:          # the end of the options: the rest as it is
            return out + argv[i:]
        if value_next:
            out.append(arg)
            value_next = False
            continue
        name, eq, value = arg.partition("=")
        if name.startswith("--") and "_" in name and name not in names and name.replace("_", "-") in names:
            name = name.replace("_", "-")
            arg = name + eq + value
        out.append(arg)
        value_next = name in takes_value and not eq
    return out


def leave(code) -> None:
    """End the process once a command is done: output flushed, then os._exit, as a C program's exit
    would (LLAMAVK_FAST_EXIT=0: the interpreter's own shutdown instead). Everything a command opens
    it has closed by now (devices, pipeline cache files, output files); what is left is the
    interpreter tearing down modules and the Vulkan loader unloading drivers, 0.15-0.25 s measured
    on llvmpipe -- a tenth of a small model's whole `run`."""
    if code is None:
        code = 0
    elif not isinstance(code, int):        # sys.exit("message")
        print(code, file=sys.stderr)
        code = 1
    try:
        sys.stdout.flush()
        sys.stderr.flush()
    except OSError:                        # a closed pipe: the output is gone either way
        code = code or 1
    if os.environ.get("LLAMAVK_FAST_EXIT", "1").strip().lower() in ("0", "off", "false", "no"):
        sys.exit(code)
    os._exit(code)


def fast_exit() -> bool:
    """Whether the command ends with os._exit (LLAMAVK_FAST_EXIT, default on, and the `llamavk`
    command itself, not an app invoked in-process by a test or script): then a command's model need
    not free its device objects one by one (Model.close(release=False))."""
    return _ENDS_PROCESS and os.environ.get("LLAMAVK_FAST_EXIT", "1").strip().lower() not in ("0", "off", "false", "no")
