"""What `llamavk run` imports: start-up time on a slow Python is mostly imports, so the run path
leaves out the `gguf` package (its metadata module pulls in yaml and gguf's writer) and the modules
only other paths need. Each check runs in a fresh interpreter: this test process has imported them."""

from __future__ import annotations

import json
import subprocess
import sys

# modules (and their submodules) `run` without --chat must not import
NOT_ON_RUN_PATH = ("gguf", "yaml", "jinja2")
# nor, on one device, the split modes and their communication; nor, greedy, numpy's random module;
# nor, for a SentencePiece vocabulary (the synthetic llama model's), the regex package
NOT_FOR_GREEDY_ONE_DEVICE_SPM = NOT_ON_RUN_PATH + (
    "llamavk.split.layer", "llamavk.split.row", "llamavk.split.tensor", "llamavk.split.graph",
    "llamavk.split.comm", "numpy.random", "regex")


def _imported(code: str, names=NOT_ON_RUN_PATH) -> list[str]:
    """Which of `names` a fresh interpreter has imported after running `code`."""
    report = ("\nimport json as _json, sys as _sys\n"
              f"_names = {tuple(names)!r}\n"
              "print(_json.dumps(sorted(n for n in _names if any(m == n or m.startswith(n + '.') "
              "for m in _sys.modules))))\n")
    r = subprocess.run([sys.executable, "-c", code + report], capture_output=True, text=True, errors="replace",
                       timeout=300)    # a run's bytes need not be UTF-8
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout.strip().splitlines()[-1])


def test_importing_the_run_command_and_the_api():
    assert _imported("import llamavk.api, llamavk.cli.run") == []


def test_loading_a_model_and_generating(synthetic_model):
    path = synthetic_model("llama", "q4_0")
    code = (f"import llamavk\nm = llamavk.load({str(path)!r}, n_ctx=64)\n"
            "assert m.tokenizer.vocab.model == 'llama'\n"
            "ids = list(m.generate('hi', n=3, temp=0.0))\nassert len(ids) == 3, ids\n"
            "m.close()\n")
    assert _imported(code, NOT_FOR_GREEDY_ONE_DEVICE_SPM) == []


def test_the_run_command_end_to_end(synthetic_model):
    """`python -m llamavk run` itself (typer, the progress display, the output path), sampling."""
    path = synthetic_model("llama", "q4_0")
    code = ("import sys, llamavk.cli as cli\n"
            f"sys.argv = ['llamavk', 'run', '-m', {str(path)!r}, '-p', 'hi', '-n', '3']\n"
            "try:\n    cli.build_app(['run'])()\nexcept SystemExit as e:\n    assert not e.code, e.code\n")
    assert _imported(code) == []
