#!/usr/bin/env python3
"""A completion with the Python API: load a model, stream the tokens, report the speed.

    python3 examples/completion.py                                  # the default model (SmolLM2-135M)
    python3 examples/completion.py -m model.gguf -p "Once upon a time" -n 64 --temp 0.8
    python3 examples/completion.py --chat -p "What is the capital of France?"
"""

import argparse
import time

import llamavk
from llamavk.chat_template import chat_messages


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("-m", "--model", default=None, help="GGUF file (default: the bundled SmolLM2-135M)")
    ap.add_argument("-p", "--prompt", default="The capital of France is")
    ap.add_argument("-n", type=int, default=32, help="tokens to generate")
    ap.add_argument("--temp", type=float, default=0.0, help="0: greedy")
    ap.add_argument("--chat", action="store_true", help="apply the model's chat template")
    ap.add_argument("-dev", default=None, help="devices, e.g. Vulkan0 or Vulkan0,Vulkan1")
    a = ap.parse_args()

    with llamavk.load(a.model, devices=a.dev, n_ctx=512) as m:
        prompt = m.apply_chat_template(chat_messages(a.prompt)) if a.chat else a.prompt
        print(prompt, end="", flush=True)
        stream = m.tokenizer.stream()            # whole UTF-8 characters, as tokens arrive
        t0 = time.perf_counter()
        n = 0
        for token in m.generate(prompt, n=a.n, temp=a.temp, seed=1):
            print(stream.feed(token), end="", flush=True)
            n += 1
        print(stream.flush())
        seconds = time.perf_counter() - t0
        t = m.timings
        print(f"\n{n} tokens in {seconds:.2f} s; prompt {t.prompt_tokens} tokens in {t.prompt_ms:.0f} ms, "
              f"{t.eval_runs / max(t.eval_ms, 1e-9) * 1e3:.1f} tokens/s after it")


if __name__ == "__main__":
    main()
