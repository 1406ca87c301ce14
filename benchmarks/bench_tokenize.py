"""A text's first and warm encode (CPU only): what perplexity's "prompt tokenized" phase waits for.

    python3 benchmarks/bench_tokenize.py [-m MODEL.gguf] [-f TEXT] [-r REPEATS]

Without -m: the synthetic presets' SentencePiece vocabulary (32000 pieces, as 1b/8b); -f defaults to
~/.cache/llamavk/botchan.txt (scripts/fetch-test-data.sh). Each repeat builds a fresh tokenizer, so
"first" includes the word cache filling (one merge per distinct word) and "warm" is the same text again;
"head" is the first encode of only the ids perplexity --chunks 16 -c 512 evaluates (--head N).
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

from llamavk.perplexity import read_text
from llamavk.tokenizer import Tokenizer


def vocab_metadata(model: str | None) -> dict:
    if model:
        from llamavk.gguf_file import GGUFFile
        return GGUFFile(model).metadata
    from llamavk.synthetic import synthetic_vocab
    tokens, scores, types = synthetic_vocab(32000)
    return {"tokenizer.ggml.model": "llama", "tokenizer.ggml.tokens": tokens, "tokenizer.ggml.scores": scores,
            "tokenizer.ggml.token_type": types, "tokenizer.ggml.unknown_token_id": 0,
            "tokenizer.ggml.bos_token_id": 1, "tokenizer.ggml.eos_token_id": 2}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("-m", "--model", help="GGUF file whose vocabulary to use (default: the synthetic 32k SPM one)")
    ap.add_argument("-f", "--file", default=str(Path.home() / ".cache" / "llamavk" / "botchan.txt"))
    ap.add_argument("-r", "--repeats", type=int, default=3)
    ap.add_argument("--head", type=int, default=16 * 512,
                    help="also time the first encode of a head of this many ids (encode_prefix: what "
                         "perplexity --chunks N -c C tokenizes during the load, N*C ids; 0: not)")
    args = ap.parse_args()
    meta = vocab_metadata(args.model)
    text = read_text(args.file)
    for _ in range(args.repeats):
        t0 = time.perf_counter()
        tok = Tokenizer.from_metadata(meta)
        t1 = time.perf_counter()
        ids = tok.encode(text, parse_special=False)
        t2 = time.perf_counter()
        tok.encode(text, parse_special=False)
        t3 = time.perf_counter()
        head = ""
        if args.head > 0:
            tok = Tokenizer.from_metadata(meta)
            t4 = time.perf_counter()
            first, _ = tok.encode_prefix(text, args.head, parse_special=False)
            head = f"   head of {len(first)} ids {1e3 * (time.perf_counter() - t4):6.1f} ms"
            assert first == ids[:len(first)]
        print(f"vocabulary {1e3 * (t1 - t0):6.1f} ms   first encode {1e3 * (t2 - t1):6.1f} ms   "
              f"warm {1e3 * (t3 - t2):6.1f} ms   {len(ids)} tokens{head}")


if __name__ == "__main__":
    main()
