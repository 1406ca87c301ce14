#!/usr/bin/env bash
# Short prompts (what `llamavk run` waits for before its first token): prompt t/s at 16-256 tokens,
# whole token tiles (multiples of 32) and partial ones, llamavk beside llama.cpp's -cm2 build
# (../shared/ref-llamacpp) in the same call.
#
#   bash benchmarks/bench_short_prompts.sh [MODEL ...]
#
# MODEL: a GGUF or synthetic:8b-q4_0 (default, with synthetic:1b-q4_0; llamavk writes it to
# ~/.cache/llamavk/synthetic/ first, and llama-bench reads that same file). Each model is listed
# twice: take the second pass (SPEC §10). SIZES overrides the prompt lengths.
set -euo pipefail
[ $# -gt 0 ] || set -- synthetic:8b-q4_0 synthetic:1b-q4_0
SIZES=${SIZES:-16,17,32,48,64,100,128,200,256}
LLAMAVK=${LLAMAVK:-llamavk}
REF=${REF:-/tmp/llamacpp-0c1e570-vk-cm2}
if [ ! -x "$REF/llama-bench" ] && [ -f ../shared/ref-llamacpp/llamacpp-0c1e570-vk-cm2.tar.xz ]; then
    tar xJf ../shared/ref-llamacpp/llamacpp-0c1e570-vk-cm2.tar.xz -C /tmp
fi
for MODEL in "$@"; do
    $LLAMAVK bench -m "$MODEL,$MODEL" -p "$SIZES" -n 0 -r 3
    if [[ "$MODEL" == synthetic:* ]]; then
        GGUF=$(ls -t ~/.cache/llamavk/synthetic/"${MODEL#synthetic:}"*.gguf | head -1)
    else
        GGUF=$MODEL
    fi
    if [ -x "$REF/llama-bench" ]; then
        "$REF/llama-bench" -m "$GGUF,$GGUF" -p "$SIZES" -n 0 -r 3 -fa 1 -ngl 99
    fi
done
