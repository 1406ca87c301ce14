#!/bin/sh
# Prompt products of few rows (routers, DeltaNet alpha/beta) on one GPU: the kernel forms per shape,
# then pp512 of the MoE models with every full 8-token slice in one dispatch (the default), with one
# dispatch per slice (LLAMAVK_SMALL_ROWS_SLICES=1: the old recording), and with a float router of 8 rows
# per workgroup (x read by 16x fewer workgroups than one row each; LLAMAVK_MATVEC=f32=...: in these
# models' prompts only the router is an f32 matrix-vector product). Each model twice per call: take
# the second pass. Usage: sh benchmarks/bench_small_rows_ab.sh [MODELS]  (default: both synthetic MoE)
set -e
MODELS=${1:-"synthetic:30b-a3b-q4_0 synthetic:35b-a3b-q4_0"}
PY=${PYTHON:-python3}
$PY benchmarks/bench_small_rows.py --variants "base:256,1,8,1 base:256,2,8,1 base:256,4,8,1 base:256,8,8,1 base:256,8,4,1 base:128,4,4,1 base:256,4,2,2 base:128,4,2,1 base:64,2,1,2 wide:256,4,2,1,1,1 wide:128,2,1,1,1,1"
for m in $MODELS; do
    echo "== $m: one dispatch for all slices (default)"
    llamavk bench -m $m,$m -p 512 -n 0 -r 3
    echo "== $m: one dispatch per 8-token slice (LLAMAVK_SMALL_ROWS_SLICES=1)"
    LLAMAVK_SMALL_ROWS_SLICES=1 llamavk bench -m $m,$m -p 512 -n 0 -r 3
    echo "== $m: one dispatch, f32 router 8 rows per workgroup (LLAMAVK_MATVEC=f32=base:256,8,8,1)"
    LLAMAVK_MATVEC="f32=base:256,8,8,1" llamavk bench -m $m,$m -p 512 -n 0 -r 3
done
