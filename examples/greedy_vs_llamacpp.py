#!/usr/bin/env python3
"""Greedy completions of llamavk against llama.cpp's (llama-completion on the CPU, ../shared/ref-llamacpp).

    python3 examples/greedy_vs_llamacpp.py -m ~/.cache/llamavk/gemma-3-270m-q4_k_m.gguf -n 32
    python3 examples/greedy_vs_llamacpp.py -m model.gguf -p "Once upon a time" -p "Water boils at"

For each prompt: both texts, how many generated tokens agree, and where they part, llamavk's margin
between its top two logits there (a near-tie: llama.cpp rounds activations to 8 bits in its quantized
products, which moves logits by a few hundredths). Exit status 1 when a completion differs before a
near-tie (margin >= --tie).
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
from pathlib import Path

import numpy as np

import llamavk

ROOT = Path(__file__).resolve().parents[1]
PROMPTS = ["The capital of France is", "Once upon a time", "The three primary colors are",
           "def fibonacci(n):", "Water boils at"]


def llama_completion(tool: Path, model: str, prompt: str, n: int) -> str:
    env = dict(os.environ, GGML_VK_VISIBLE_DEVICES="")    # the CPU backend only
    r = subprocess.run([str(tool), "-m", model, "-p", prompt, "-n", str(n), "--temp", "0", "-ngl", "0",
                        "-t", "2", "-no-cnv"], capture_output=True, text=True, env=env, timeout=600)
    if r.returncode != 0:
        sys.exit(f"llama-completion failed:\n{r.stderr[-2000:]}")
    return r.stdout


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("-m", "--model", required=True)
    ap.add_argument("-p", "--prompt", action="append", help="prompt (repeatable; default: five built in)")
    ap.add_argument("-n", type=int, default=32, help="tokens to generate")
    ap.add_argument("--llamacpp", help="folder with llama-completion (default: the unpacked reference build)")
    ap.add_argument("--tie", type=float, default=0.05, help="top-2 logit margin below which a step is a near-tie")
    args = ap.parse_args()
    if args.llamacpp:
        tool = Path(args.llamacpp) / "llama-completion"
    else:
        sys.path.insert(0, str(ROOT))
        from tests.llamacpp_ref import llamacpp_dir
        d = llamacpp_dir()
        if d is None:
            sys.exit("llama.cpp reference build not found: pass --llamacpp DIR")
        tool = d / "llama-completion"
    bad = 0
    with llamavk.load(args.model, warn=lambda m: None) as m:
        for prompt in args.prompt or PROMPTS:
            theirs = llama_completion(tool, args.model, prompt, args.n)
            ids = m.tokenize(prompt)
            out = list(m.generate(ids, n=args.n, temp=0))
            logits = m.logits(ids + out, all=True)[len(ids) - 1:]
            text = prompt
            agree = len(out)
            for i, t in enumerate(out):
                nxt = text + m.detokenize([t])
                if not theirs.startswith(nxt) and not (i == len(out) - 1 and theirs.rstrip("\n") == nxt.rstrip("\n")):
                    agree = i
                    break
                text = nxt
            print(f"== {prompt!r}\n  llama.cpp: {theirs.rstrip()!r}\n  llamavk:   {prompt + m.detokenize(out)!r}")
            if agree == len(out):
                print(f"  all {len(out)} tokens agree")
                continue
            top2 = np.sort(logits[agree])[-2:]
            margin = float(top2[1] - top2[0])
            tie = margin < args.tie
            bad += not tie
            print(f"  {agree} tokens agree; then llamavk's top-2 margin {margin:.3f}"
                  f" ({'a near-tie' if tie else 'NOT a near-tie'})")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
