"""Benchmark kernels that compute something check it against numpy: benchmarks/bench_persistent.py
--check runs its chain of Q4_0 products (every register form: PIPE 0 and 1, MAXB 7 and 4; every x form: staged,
fixed int8 x read from memory, copied, in registers, per 8 values; both lane shapes, with and without touches
ahead) on the test device and exits non-zero where the result is off numpy's by more than int8 x allows."""

import subprocess
import sys
from pathlib import Path

import pytest

BENCHMARKS = Path(__file__).resolve().parents[1] / "benchmarks"


@pytest.mark.parametrize("maxb", ["7", "4"])
def test_bench_persistent_products_match_numpy(maxb):
    r = subprocess.run([sys.executable, str(BENCHMARKS / "bench_persistent.py"), "--check", "--pipe", "0,1",
                        "--xmode", "0,1,2,3", "--maxb", maxb],
                       capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stdout + r.stderr[-3000:]
    lines = [l for l in r.stdout.splitlines() if l.startswith("mode 0, pipe")]
    assert len(lines) == 8 and all("largest error" in l for l in lines), r.stdout


def test_bench_persistent_row_form_matches_numpy():
    r = subprocess.run([sys.executable, str(BENCHMARKS / "bench_persistent.py"), "--check", "--form", "1",
                        "--rj", "1,2,4,8", "--xmode", "1,4", "--pref", "0,2"],
                       capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stdout + r.stderr[-3000:]
    lines = [l for l in r.stdout.splitlines() if l.startswith("mode 0, pipe")]
    assert len(lines) == 16 and all("largest error" in l for l in lines), r.stdout
