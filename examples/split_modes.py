#!/usr/bin/env python3
"""One model in every split mode: how its logits compare with -sm none, and how fast each mode runs.

    python3 examples/split_modes.py -m model.gguf -dev Vulkan0,Vulkan1
    python3 examples/split_modes.py -m synthetic:tiny-q4_0 -dev Vulkan0,Vulkan0   # two virtual devices on one

Every mode must give -sm none's answer up to float rounding (SPEC §5): the table shows the largest
logit difference relative to the largest logit, whether the greedy continuation is the same, and
prompt / generation speed measured through the public API (a first pass of each warms the GPU).
For llama-bench-style numbers use `llamavk bench -sm none,layer,row,tensor,graph` instead.
"""

import argparse
import time

import numpy as np

import llamavk
from llamavk.synthetic import synthetic_model_path


def measure(m, prompt: list[int], n_gen: int):
    """(logits of every prompt token, greedy continuation, prompt t/s, generation t/s)."""
    m.logits(prompt, all=True)                         # warm-up: records the step shapes
    t0 = time.perf_counter()
    logits = m.logits(prompt, all=True)
    pp = len(prompt) / (time.perf_counter() - t0)
    list(m.generate(prompt, n=2, temp=0))
    tokens = list(m.generate(prompt, n=n_gen, temp=0))
    tg = m.timings.eval_runs / max(m.timings.eval_ms, 1e-9) * 1e3
    return logits, tokens, pp, tg


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("-m", "--model", default=None, help="GGUF file or synthetic:PRESET-TYPE (default: SmolLM2)")
    ap.add_argument("-dev", required=True, help="at least two devices, e.g. Vulkan0,Vulkan1")
    ap.add_argument("--modes", default="layer,row,tensor,graph")
    ap.add_argument("-p", type=int, default=64, help="prompt tokens")
    ap.add_argument("-n", type=int, default=16, help="generated tokens")
    a = ap.parse_args()
    path = synthetic_model_path(a.model) if a.model and a.model.startswith("synthetic:") else a.model
    devices = a.dev.split(",")

    results = {}
    for mode in ["none"] + a.modes.split(","):
        with llamavk.load(path, devices=devices, split_mode=mode, n_ctx=a.p + a.n + 8) as m:
            prompt = [int(t) for t in np.random.default_rng(0).integers(0, m.config.n_vocab, a.p)]
            results[mode] = measure(m, prompt, a.n), len(m.devices)

    (ref_logits, ref_tokens, _, _), _ = results["none"]
    print(f"| {'mode':6s} | devices | max |dlogit| / max |logit| | greedy {a.n} | prompt t/s | gen t/s |")
    print("| ------ | ------: | ------------------------: | -------: | ---------: | ------: |")
    for mode, ((logits, tokens, pp, tg), n_dev) in results.items():
        err = np.abs(logits - ref_logits).max() / np.abs(ref_logits).max()
        same = "same" if tokens == ref_tokens else "DIFFERS"
        print(f"| {mode:6s} | {n_dev:7d} | {err:25.1e} | {same:>8s} | {pp:10.1f} | {tg:7.1f} |")


if __name__ == "__main__":
    main()
