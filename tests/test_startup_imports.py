"""What `llamavk run` imports: start-up time on a slow Python is mostly imports, so the run path
leaves out the `gguf` package (its metadata module pulls in yaml and gguf's writer) and the modules
only other paths need. Each check runs in a fresh interpreter: this test process has imported them."""

from __future__ import annotations

import json
import subprocess
import sys

# modules `run` (without --chat) must not import, by top-level package name
NOT_ON_RUN_PATH = ("gguf", "yaml", "jinja2")

_REPORT = f"""
import json, sys
print(json.dumps(sorted({{m.split('.')[0] for m in sys.modules}} & {set(NOT_ON_RUN_PATH)!r})))
"""


def _imported(code: str) -> list[str]:
    r = subprocess.run([sys.executable, "-c", code + _REPORT], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout.strip().splitlines()[-1])


def test_importing_the_run_command_and_the_api():
    assert _imported("import llamavk.api, llamavk.cli.run") == []


def test_loading_a_model_and_generating(synthetic_model):
    path = synthetic_model("llama", "q4_0")
    code = (f"import llamavk\nm = llamavk.load({str(path)!r}, n_ctx=64)\n"
            "ids = list(m.generate('hi', n=3, temp=0.0))\nassert len(ids) == 3, ids\n"
            "m.close()\n")
    assert _imported(code) == []


def test_the_run_command_end_to_end(synthetic_model):
    """`python -m llamavk run` itself (typer, the progress display, the output path)."""
    path = synthetic_model("llama", "q4_0")
    code = ("import sys, llamavk.cli as cli\n"
            f"sys.argv = ['llamavk', 'run', '-m', {str(path)!r}, '-p', 'hi', '-n', '3']\n"
            "try:\n    cli.build_app(['run'])()\nexcept SystemExit as e:\n    assert not e.code, e.code\n")
    assert _imported(code) == []
