#!/usr/bin/env python3
"""The driver's statistics (NVIDIA: registers per thread, shared memory, ...) of every pipeline a model's
decode step and prompt step use: what bounds a kernel's occupancy, which Vulkan otherwise hides.

    python3 benchmarks/kernel_stats.py -m model.gguf|synthetic:PRESET [-p 512]

Needs a driver with VK_KHR_pipeline_executable_properties (NVIDIA, RADV, ANV; not llvmpipe).
"""

import argparse
import os
import sys

os.environ["LLAMAVK_PIPELINE_STATS"] = "1"   # before any device is opened

import numpy as np  # noqa: E402

import llamavk  # noqa: E402
from llamavk.benchmark import decode, prompt  # noqa: E402
from llamavk.synthetic import synthetic_model_path  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("-m", "--model", required=True)
    ap.add_argument("-p", type=int, default=512)
    a = ap.parse_args()
    path = str(synthetic_model_path(a.model)) if a.model.startswith("synthetic:") else a.model
    rng = np.random.default_rng(0)
    with llamavk.load(path, n_ctx=a.p + 16, n_ubatch=a.p) as m:
        rt = m.runtime
        if not rt.device.features.get("pipeline_stats"):
            print(f"{rt.device.info.name}: no VK_KHR_pipeline_executable_properties", file=sys.stderr)
            return 1
        prompt(m, a.p, rng, 0)
        decode(m, 2, rng, a.p)
        for (name, spec), kernel in sorted(rt.kc._kernels.items(), key=lambda kv: kv[0][0]):
            stats = kernel.statistics()
            shown = ", ".join(f"{k}={v}" for k, v in stats.items())
            print(f"{name} {list(spec)}: {shown}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
