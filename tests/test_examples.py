"""The Python API examples in examples/ run (tiny settings, so they stay runnable as the API changes)."""

import subprocess
import sys
from pathlib import Path

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"


def run_example(name, *args):
    r = subprocess.run([sys.executable, str(EXAMPLES / name), *map(str, args)], capture_output=True, text=True,
                       timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    return r.stdout


def test_completion(synthetic_model):
    out = run_example("completion.py", "-m", synthetic_model("llama", "q4_0"), "-p", "hello", "-n", "4")
    assert out.startswith("hello") and "4 tokens in" in out


def test_perplexity_of_several_models(synthetic_model, tmp_path, botchan_text):
    text = tmp_path / "t.txt"
    text.write_text(botchan_text[:20000])
    out = run_example("perplexity_models.py", "-f", text, "-c", "64", "--chunks", "2",
                      synthetic_model("llama", "q4_0"), synthetic_model("llama", "q8_0"))
    rows = [l for l in out.splitlines() if l.startswith("| llama-")]
    assert len(rows) == 2 and all(" ± " in r and "|            62 |" in r for r in rows), out


def test_split_modes_on_virtual_devices(synthetic_model):
    out = run_example("split_modes.py", "-m", synthetic_model("llama", "q4_0"), "-dev", "Vulkan0,Vulkan0",
                      "--modes", "layer,tensor", "-p", "24", "-n", "4")
    rows = [l for l in out.splitlines() if l.startswith("| none") or l.startswith("| layer") or l.startswith("| tensor")]
    assert len(rows) == 3 and all("same" in r for r in rows), out


def test_split_check_on_virtual_devices():
    """examples/split_check.py, the GPU machines' check of every split mode: on two virtual devices its
    nine tiny models under -sm graph match -sm none (prompt logits, each decode step's, greedy tokens)."""
    out = run_example("split_check.py", "-dev", "Vulkan0,Vulkan0", "--modes", "graph")
    rows = [l for l in out.splitlines() if "graph  on 2 devices" in l]
    assert len(rows) == 9 and all("decode steps" in r and "greedy same" in r and "FAIL" not in r for r in rows), out
