#!/bin/sh
# Prompt products of few rows (routers, DeltaNet alpha/beta) on one GPU: the kernel forms per shape
# (8-token slices, tiles, the small-tile kernel with its tile sweep), then pp512 of the MoE models on
# the small-tile kernel (the default) and on the 8-token slices in one dispatch (LLAMAVK_SMALL_GEMM=0).
# Each model twice per call: take the second pass.
# Usage: sh benchmarks/bench_small_rows_ab.sh [MODELS]  (default: both synthetic MoE)
set -e
MODELS=${1:-"synthetic:30b-a3b-q4_0 synthetic:35b-a3b-q4_0"}
PY=${PYTHON:-python3}
$PY benchmarks/bench_small_rows.py --variants "base:256,1,8,1 base:256,8,8,1 wide:256,4,2,1,1,1"
for m in $MODELS; do
    echo "== $m: small-tile kernel (default)"
    $PY -m llamavk bench -m $m,$m -p 512 -n 0 -r 3
    echo "== $m: 8-token slices in one dispatch (LLAMAVK_SMALL_GEMM=0)"
    LLAMAVK_SMALL_GEMM=0 $PY -m llamavk bench -m $m,$m -p 512 -n 0 -r 3
done
