#!/usr/bin/env bash
# The KV cache types' cost (issue 25 item 3): tg128 @ d4096 and perplexity with -ctk/-ctv q8_0
# against f16, llamavk and llama.cpp (the -cm2 build, ../shared/ref-llamacpp) in the same call.
#
#   bash benchmarks/bench_kv_types.sh [MODEL] [SMOLLM2_GGUF BOTCHAN_TXT]
#
# MODEL: a GGUF or synthetic:8b-q4_0 (default; llamavk writes it to ~/.cache/llamavk/synthetic/ first,
# and llama-bench reads that same file). Each model is listed twice: take the second pass (SPEC §10).
# The perplexity part runs when SmolLM2's GGUF and botchan.txt are given (-c 512, whole text).
set -euo pipefail
MODEL=${1:-synthetic:8b-q4_0}
LLAMAVK=${LLAMAVK:-llamavk}
REF=${REF:-/tmp/llamacpp-0c1e570-vk-cm2}
if [ ! -x "$REF/llama-bench" ] && [ -f ../shared/ref-llamacpp/llamacpp-0c1e570-vk-cm2.tar.xz ]; then
    tar xJf ../shared/ref-llamacpp/llamacpp-0c1e570-vk-cm2.tar.xz -C /tmp
fi
TYPES=(-ctk f16,q8_0 -ctv f16,q8_0)
$LLAMAVK bench -m "$MODEL,$MODEL" -p 0 -n 128 -d 4096 -r 3 "${TYPES[@]}"
if [[ "$MODEL" == synthetic:* ]]; then
    GGUF=$(ls -t ~/.cache/llamavk/synthetic/"${MODEL#synthetic:}"*.gguf | head -1)
else
    GGUF=$MODEL
fi
if [ -x "$REF/llama-bench" ]; then
    "$REF/llama-bench" -m "$GGUF,$GGUF" -p 0 -n 128 -d 4096 -r 3 -fa 1 -ngl 99 "${TYPES[@]}"
fi
if [ $# -ge 3 ]; then
    for t in f16 q8_0; do
        echo "== perplexity -ctk $t -ctv $t"
        $LLAMAVK perplexity -m "$2" -f "$3" -c 512 -ctk $t -ctv $t 2>&1 | grep -E "Final estimate"
        if [ -x "$REF/llama-perplexity" ]; then
            "$REF/llama-perplexity" -m "$2" -f "$3" -c 512 -ngl 99 -fa 1 -ctk $t -ctv $t 2>&1 | grep -E "Final estimate"
        fi
    done
fi
