#!/usr/bin/env bash
# llamavk perplexity beside llama-perplexity, whole commands timed, each run twice in one call (the
# first llama-perplexity run compiles its shaders; the second runs are the ones to compare), then
# llamavk once more with the host's log-softmax (LLAMAVK_PPL_HOST=1: the path before the device
# reduction) and once with the whole text tokenized during the load (LLAMAVK_PPL_PREFIX=0: before
# --chunks tokenized only the head it needs), a third llamavk run's phases (LLAMAVK_PHASES=1) and benchmarks/bench_perplexity.py's
# breakdown (load, tokenize, evaluation).
#
#   bash benchmarks/perplexity_vs_llamacpp.sh LLAMACPP_DIR BOTCHAN MODEL [MODEL...]
#
# LLAMACPP_DIR: an unpacked ../shared/ref-llamacpp build (llamacpp-0c1e570-vk-cm2 on an H100).
# MODEL: a GGUF path or synthetic:PRESET-TYPE (synthetic:8b-q4_0 is the 7.2B, synthetic:1b-q4_0 the
# 1.1B; written into ~/.cache/llamavk/synthetic on first use). CHUNKS (16) and CTX (512) override.
set -euo pipefail
cpp=$1 text=$2
shift 2
py=${PYTHON:-python3}
chunks=${CHUNKS:-16} ctx=${CTX:-512}

timed() {   # label, command...: the command's wall seconds and its result lines
  local label=$1 t0 t1
  shift
  t0=$EPOCHREALTIME
  "$@" >/tmp/ppl_out.txt 2>/tmp/ppl_err.txt || { echo "$label: failed"; tail -3 /tmp/ppl_err.txt; return 0; }
  t1=$EPOCHREALTIME
  printf '%-36s %6.2f s  %s\n' "$label" "$(awk "BEGIN { print $t1 - $t0 }")" \
    "$(grep -ho 'Final estimate: PPL = [0-9.]* +/- [0-9.]*' /tmp/ppl_out.txt /tmp/ppl_err.txt | head -1)"
}

for m in "$@"; do
  if [[ $m == synthetic:* ]]; then
    m=$($py -c "import sys; from llamavk.synthetic import synthetic_model_path; print(synthetic_model_path(sys.argv[1]))" "$m")
  fi
  echo "== $(basename "$m"), -c $ctx --chunks $chunks"
  for run in 1 2; do
    timed "llamavk perplexity (run $run)" $py -m llamavk perplexity -m "$m" -f "$text" -c "$ctx" --chunks "$chunks"
    timed "llama-perplexity -ngl 99 (run $run)" "$cpp/llama-perplexity" -m "$m" -f "$text" -c "$ctx" \
      --chunks "$chunks" -ngl 99
  done
  # where the second llamavk run's wall time went (LLAMAVK_PHASES=1: phases from process start, the
  # upload threads' file read / copy into staging / wait for a slot / submit beside them)
  LLAMAVK_PHASES=1 $py -m llamavk perplexity -m "$m" -f "$text" -c "$ctx" --chunks "$chunks" 2>&1 >/dev/null \
    | grep -E "^phase|in all"
  timed "llamavk, host log-softmax" env LLAMAVK_PPL_HOST=1 $py -m llamavk perplexity -m "$m" -f "$text" -c "$ctx" \
    --chunks "$chunks"
  timed "llamavk, whole text tokenized first" env LLAMAVK_PPL_PREFIX=0 $py -m llamavk perplexity -m "$m" -f "$text" \
    -c "$ctx" --chunks "$chunks"
  $py benchmarks/bench_perplexity.py -m "$m" -f "$text" -c "$ctx" --chunks "$chunks" -r 2
done
