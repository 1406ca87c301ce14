#!/bin/sh
# Q6_K one-token products (issue 27): the stream kernel's quarter-super-block form on the planar Q6_K
# layout (matvec_stream.comp Q6_K; Q4_K's MATVEC_CONFIGS rows: the default on GPUs with fast integer
# dot products) against its half-super-block form (stream_dp_h, with the rule it had: column parts of
# 16 units, x first, every shape) and the base kernel (matvec.comp), both forced through
# LLAMAVK_MATVEC, on one GPU. First the kernels alone per shape of the 7.2B (GB/s of weights), then
# tg128 of the 7.2B (the 8b preset) per form, each model twice per run (take the second pass). The
# model is written to $DIR (about 5.5 GiB of tensors, a few minutes) and deleted at the end (disk is
# small). Keep the quarter form's rows only where they win; the half form's earlier numbers were
# taken on the GGUF layout (git log), so compare within one run.
# Usage: sh benchmarks/bench_q6k_stream_ab.sh
set -u
PY=${PYTHON:-python3}
DIR=${DIR:-${TMPDIR:-/tmp}/llamavk-q6k-ab}
OLD="q6_k=stream_dp_h:256,2,16,1,1,1"
BASE="q6_k=base:256,4,2,2"
mkdir -p "$DIR"
timeout 600 $PY benchmarks/bench_matvec.py --types q6_k --shapes "4096x4096 1024x4096 14336x4096 4096x14336 32000x4096" \
    --variants "base:256,4,2,2 stream_dp:512,2,1,1 stream_dp:256,2,16,1,1,1 stream_dp_h:256,2,16,1,1,1" --fused
M="$DIR/8b-q6_k.gguf"
echo "== write $M"
timeout 1200 $PY examples/make_synthetic_model.py --preset 8b --type q6_k -o "$M" || { rm -f "$M"; exit 1; }
echo "== q6_k: stream kernel, quarter super-blocks (default)"
timeout 600 $PY -m llamavk bench -m "$M,$M" -p 0 -n 128 -r 3
echo "== q6_k: stream kernel, half super-blocks, LLAMAVK_MATVEC=$OLD"
LLAMAVK_MATVEC="$OLD" timeout 600 $PY -m llamavk bench -m "$M,$M" -p 0 -n 128 -r 3
echo "== q6_k: base kernel, LLAMAVK_MATVEC=$BASE"
LLAMAVK_MATVEC="$BASE" timeout 600 $PY -m llamavk bench -m "$M,$M" -p 0 -n 128 -r 3
rm -f "$M"
