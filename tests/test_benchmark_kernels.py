"""Benchmark kernels that compute something check it against numpy: benchmarks/bench_persistent.py
--check runs its chain of Q4_0 products (every register form: PIPE 0 and 1, MAXB 7 and 4; every x form: staged,
fixed int8 x read from memory, copied, in registers, per 8 values; both lane shapes, with and without touches
ahead) on the test device and exits non-zero where the result is off numpy's by more than int8 x allows;
benchmarks/bench_dataflow.py --check its products without grid barriers, each one's x quantized by its producer."""

import subprocess
import sys
from pathlib import Path

import pytest

BENCHMARKS = Path(__file__).resolve().parents[1] / "benchmarks"


def check_lines(script: str, *args: str) -> list:
    """Runs `script --check ARGS`, asserts it passed and returns its result lines."""
    r = subprocess.run([sys.executable, str(BENCHMARKS / script), "--check", *args],
                       capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stdout + r.stderr[-3000:]
    return [l for l in r.stdout.splitlines() if l.startswith("mode ")]


@pytest.mark.parametrize("maxb", ["7", "4"])
def test_bench_persistent_products_match_numpy(maxb):
    lines = check_lines("bench_persistent.py", "--pipe", "0,1", "--xmode", "0,1,2,3", "--maxb", maxb)
    assert len(lines) == 8 and all("largest error" in l for l in lines), lines


def test_bench_persistent_row_form_matches_numpy():
    lines = check_lines("bench_persistent.py", "--form", "1", "--rj", "1,2,4,8", "--xmode", "1,4", "--pref", "0,2")
    assert len(lines) == 16 and all("largest error" in l for l in lines), lines


def test_bench_dataflow_chain_matches_numpy():
    # both task orders and both ways of reading x, one dispatch per product and one persistent dispatch (grid 1:
    # llvmpipe cannot spin-wait for other workgroups); llvmpipe's subgroups are narrower than 32 lanes, so this
    # covers the kernel's shared-memory merge, the GPU's --check its subgroup one
    lines = check_lines("bench_dataflow.py", "--lag", "0,3", "--xshare", "0,1")
    assert len(lines) == 8 and all("waits given up 0" in l for l in lines), lines
