#!/bin/sh
# Q6_K one-token products: the base kernel (the table's choice for Q6_K) against the stream kernel
# (matvec_stream.comp, DOT8 form) forced through LLAMAVK_MATVEC, on one GPU (issue 27: 7.2B Q6_K
# tg128 at 0.76x llama.cpp -cm2 on the base kernel). First the kernel alone per shape of the 7.2B
# (GB/s of weights; v0 = the base kernel's default split), then tg128 of the 7.2B Q6_K per variant,
# each model twice per run (take the second pass). The first run writes synthetic:8b-q6_k to
# ~/.cache/llamavk/synthetic (about 5.5 GiB, a few minutes): run the script once to warm it if the
# call's time is short. Pick the best variant into selection.MATVEC_CONFIGS only where it wins.
# Usage: sh benchmarks/bench_q6k_stream_ab.sh [MODEL]  (default synthetic:8b-q6_k)
set -e
M=${1:-synthetic:8b-q6_k}
PY=${PYTHON:-python3}
# whole rows, 2 rows per lane; + 2 row blocks per workgroup; column parts of 16 units with x first
# (the FFN down product's form for Q4_K; applied to every shape here, it also cuts the 4096-wide rows
# in two parts, which keeps RoPE out of the Q/K/V products)
V1="q6_k=stream_dp:512,2,1,1"
V2="q6_k=stream_dp:512,2,1,1,2"
V3="q6_k=stream_dp:256,2,16,1,1,1"
$PY benchmarks/bench_matvec.py --types q6_k --shapes "4096x4096 1024x4096 14336x4096 4096x14336 32000x4096" \
    --variants "base:256,4,2,2 stream_dp:512,2,1,1 stream_dp:512,2,1,1,2 stream_dp:512,2,1,1,4 stream_dp:256,2,16,1,1,1 stream:512,2,1,1" --fused
echo "== $M: base kernel (default)"
$PY -m llamavk bench -m $M,$M -p 0 -n 128 -r 3
for v in "$V1" "$V2" "$V3"; do
    echo "== $M: LLAMAVK_MATVEC=$v"
    LLAMAVK_MATVEC="$v" $PY -m llamavk bench -m $M,$M -p 0 -n 128 -r 3
done
