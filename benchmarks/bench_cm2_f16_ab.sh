#!/bin/sh
# The f16 coopmat2 form (matmul_cm2.comp F16: the prompt products of weights dequantized to f16 first,
# mul_mm_cm2d) as a whole model, on one GPU with VK_NV_cooperative_matrix2 (H100), from the repository
# root: its default (128-thread workgroups, selection.CM2_F16_WG) against 256 threads, for the types
# that take it (Q4_K, Q6_K), and the types that keep their decode functions (Q4_0, Q8_0) with and
# without it (its results at e70419a: docs/PERFORMANCE.md, Kernel-level measurements). Each `-m M,M`
# runs a model twice in one process: take the second pass.
# Usage: sh benchmarks/bench_cm2_f16_ab.sh [TYPES]   (default "q4_k q6_k q4_0 q8_0")
set -e
PY=${PYTHON:-python3}
mkdir -p /tmp/m
for t in ${1:-q4_k q6_k q4_0 q8_0}; do
    M=/tmp/m/8b-$t.gguf
    $PY examples/make_synthetic_model.py --preset 8b --type $t -o $M | tail -1
    bench() { echo "== 8b $t $*"; env "$@" $PY -m llamavk bench -m $M,$M -p 512 -n 0 -r 3 | grep -E "^\| [a-z]" || true; }
    case $t in
        q4_k|q6_k) bench LLAMAVK_CM2_WG=128; bench LLAMAVK_CM2_WG=256 ;;
        *) bench LLAMAVK_CM2_DEQUANT=0; bench LLAMAVK_CM2_DEQUANT=$t; bench LLAMAVK_CM2_DEQUANT=$t LLAMAVK_CM2_WG=256 ;;
    esac
    rm -f $M
done
