#!/usr/bin/env python3
"""Perplexity of several models over one text, as llama-perplexity computes it, in one table.

    python3 examples/perplexity_models.py -f botchan.txt -c 128 --chunks 8 a.gguf b.gguf
    python3 examples/perplexity_models.py -f botchan.txt synthetic:tiny-q4_0 synthetic:tiny-q8_0

Models are loaded one after the other; each scores chunks of -c tokens (second half of each chunk).
Models with different tokenizers see different token counts: compare PPL only between models that
share a vocabulary (quantizations of one model, for instance).
"""

import argparse
import time
from pathlib import Path

import llamavk
from llamavk.synthetic import synthetic_model_path


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("models", nargs="+", help="GGUF files or synthetic:PRESET-TYPE")
    ap.add_argument("-f", "--file", required=True, help="text file")
    ap.add_argument("-c", type=int, default=512, help="tokens per chunk")
    ap.add_argument("--chunks", type=int, default=-1, help="at most this many chunks (-1: all)")
    ap.add_argument("-dev", default=None)
    a = ap.parse_args()
    text = Path(a.file).read_text(encoding="utf-8-sig").replace("\r\n", "\n")

    print(f"| {'model':40s} | {'PPL':>21s} | tokens scored | seconds |")
    print(f"| {'-' * 40} | {'-' * 20}: | ------------: | ------: |")
    for name in a.models:
        path = synthetic_model_path(name) if name.startswith("synthetic:") else Path(name)
        t0 = time.perf_counter()
        with llamavk.load(path, devices=a.dev, n_ctx=a.c) as m:
            r = m.perplexity(text, n_ctx=a.c, chunks=a.chunks)
        print(f"| {path.name[:40]:40s} | {r.ppl:10.4f} ± {r.uncertainty:8.4f} | {r.count:13d} | "
              f"{time.perf_counter() - t0:7.1f} |", flush=True)


if __name__ == "__main__":
    main()
