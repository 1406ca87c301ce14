#!/usr/bin/env python3
"""Where a perplexity run's time goes: load, tokenizing the text, and the evaluation with the token
log-probabilities reduced on the device (token_scorer.py) against the host's log-softmax over copied
logits (LLAMAVK_PPL_HOST=1's path), in one process on one loaded model.

    python3 benchmarks/bench_perplexity.py -m model.gguf|synthetic:PRESET -f botchan.txt [-c 512] [--chunks 16] [-b 2048] [-r 2]

Each evaluation runs -r times (the first also records the step shapes); the PPLs of the two paths
must agree to float rounding. Times are wall seconds and the process's CPU seconds (on llvmpipe the
device's work is CPU time of this process: a fair measure on a shared machine). BENCH_PATHS=host,device
orders or repeats the paths. For the whole-command comparison with llama-perplexity, time
`llamavk perplexity` and `llama-perplexity ... -ngl 99` as commands (docs/EVALUATION.md, Speed).
"""

import argparse
import os
import time

import llamavk
from llamavk.perplexity import read_text
from llamavk.synthetic import synthetic_model_path


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("-m", "--model", required=True)
    ap.add_argument("-f", "--file", required=True)
    ap.add_argument("-c", type=int, default=512)
    ap.add_argument("-b", type=int, default=2048)
    ap.add_argument("--chunks", type=int, default=16)
    ap.add_argument("-r", type=int, default=2)
    ap.add_argument("-dev", default=None)
    a = ap.parse_args()
    if a.model.startswith("synthetic:"):
        a.model = str(synthetic_model_path(a.model))
    n_seq = max(1, min(a.b // a.c, a.chunks))
    t0 = time.perf_counter()
    with llamavk.load(a.model, devices=a.dev, n_ctx=a.c * n_seq, n_batch=a.b, warn=lambda m: None) as m:
        t_load = time.perf_counter() - t0
        text = read_text(a.file)
        t0 = time.perf_counter()
        tokens = m.tokenize(text, parse_special=False)
        t_tok = time.perf_counter() - t0
        print(f"{os.path.basename(a.model)} on {m.devices[0].info.name}: load {t_load:.2f} s, tokenize "
              f"{len(text) / 1e3:.0f} kB -> {len(tokens)} tokens {t_tok:.2f} s", flush=True)
        bos = m.tokenizer.bos_id if m.tokenizer.add_bos else None
        for path in os.environ.get("BENCH_PATHS", "device,host").split(","):
            os.environ["LLAMAVK_PPL_HOST"] = "1" if path == "host" else "0"
            times = []
            for _ in range(a.r):
                t0, c0 = time.perf_counter(), time.process_time()
                r = m.perplexity_tokens(tokens, a.c, a.chunks, bos, n_seq=n_seq)
                times.append(f"{time.perf_counter() - t0:.2f} s ({time.process_time() - c0:.2f} s CPU)")
            print(f"  {path:6s} log-probabilities: PPL {r.ppl:.4f} +/- {r.uncertainty:.5f} over {r.n_chunks} chunks "
                  f"(n_seq {n_seq}): " + ", ".join(times), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
