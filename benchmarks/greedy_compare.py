#!/usr/bin/env python3
"""Greedy tokens of one model under several settings, compared with the first: for A/Bs that must not
change what a model says (a split mode, a kernel or chaining switch).

    python3 benchmarks/greedy_compare.py MODEL DEVICES SETTING [SETTING ...] [-n 96]

A setting is a split mode with optional environment variables, colon-separated, e.g.
`none graph graph:LLAMAVK_CHAIN=aoge tensor` (DEVICES: comma-separated, `-sm none` takes the first); a
value may hold colons itself (`none:LLAMAVK_MATVEC=q4_0=stream_dp:256,2,1,1`): a new variable starts
only where a colon is followed by an upper-case NAME=.
Prints per setting a hash of its tokens and the first step where they differ from the first setting's.
"""

import argparse
import hashlib
import os
import re
import time

import numpy as np

import llamavk


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("model")
    ap.add_argument("devices")
    ap.add_argument("settings", nargs="+")
    ap.add_argument("-n", type=int, default=96, help="greedy tokens per setting")
    a = ap.parse_args()
    devices = a.devices.split(",")
    prompt = None
    results = []
    for spec in a.settings:
        mode, *envs = re.split(r":(?=[A-Z_][A-Z0-9_]*=)", spec)
        saved = {}
        for e in envs:
            key, _, value = e.partition("=")
            saved[key] = os.environ.get(key)
            os.environ[key] = value
        t0 = time.perf_counter()
        try:
            with llamavk.load(a.model, devices=devices if mode != "none" else devices[0], split_mode=mode,
                              n_ctx=40 + a.n + 8) as m:
                if prompt is None:
                    prompt = [int(t) for t in np.random.default_rng(1).integers(0, min(1000, m.config.n_vocab), 40)]
                tokens = list(m.generate(prompt, n=a.n, temp=0, ignore_eos=True))
        finally:
            for key, value in saved.items():
                os.environ.pop(key, None) if value is None else os.environ.__setitem__(key, value)
        digest = hashlib.sha1(np.array(tokens, np.int64).tobytes()).hexdigest()[:12]
        print(f"{spec:40s} tokens {digest} ({time.perf_counter() - t0:.1f} s)", flush=True)
        results.append((spec, tokens))
    base = results[0][1]
    same = True
    for spec, tokens in results[1:]:
        diff = next((i for i, (x, y) in enumerate(zip(base, tokens)) if x != y), None)
        same &= diff is None and len(tokens) == len(base)
        print(f"{spec:40s} " + ("same as the first" if diff is None else f"differs from step {diff}"))
    return 0 if same else 1


if __name__ == "__main__":
    raise SystemExit(main())
