"""Benchmark kernels that compute something check it against numpy: benchmarks/bench_persistent.py
--check runs its chain of Q4_0 products (every register form: PIPE 0 and 1, MAXB 7 and 4) on the test device and
exits non-zero where the result is off numpy's by more than int8 x allows."""

import subprocess
import sys
from pathlib import Path

import pytest

BENCHMARKS = Path(__file__).resolve().parents[1] / "benchmarks"


@pytest.mark.parametrize("maxb", ["7", "4"])
def test_bench_persistent_products_match_numpy(maxb):
    r = subprocess.run([sys.executable, str(BENCHMARKS / "bench_persistent.py"), "--check", "--pipe", "0,1",
                        "--maxb", maxb],
                       capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stdout + r.stderr[-3000:]
    lines = [l for l in r.stdout.splitlines() if l.startswith("mode 0, pipe")]
    assert len(lines) == 2 and all("largest error" in l for l in lines), r.stdout
