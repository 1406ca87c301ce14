#!/bin/sh
# Q5_K, Q3_K and Q2_K one-token products (issue 27): the stream kernel (matvec_stream.comp, DOT8 form,
# Q4_K's MATVEC_CONFIGS rows, Q4_0's for the Q4_0-like types: the default on GPUs with fast integer
# dot products) against the base
# kernel they ran on before (matvec.comp, forced back through LLAMAVK_MATVEC with the GPU rows' old
# split), tg128 of the 7.2B (the 8b preset) per type on one GPU, each model twice per run (take the
# second pass). Each model is written to $DIR (4.6 / 2.9 / 2.2 GiB of tensors; a few minutes each) and
# deleted before the next (disk is small). Keep the stream rows only where they win.
# The types whose default is the half-super-block form (HALF_TYPES: selection.HALF_RULE_TYPES, kernel
# stream_dp_half) also run the whole-block stream form (stream_dp) with the rows it had, spelled per
# shape of the 8b preset: LLAMAVK_MATVEC cannot spell a row's `wave`, so those shapes (gate/up, the
# output) take the steps their rows' wave gives there (2).
# Usage: sh benchmarks/bench_kquant_stream_ab.sh [TYPES]  (default "q5_k q3_k q2_k"; IQ4_NL, MXFP4
# and IQ4_XS, on the stream kernel the same way: "iq4_nl mxfp4 iq4_xs"; Q4_1, Q5_0 and Q5_1 (planar,
# Q4_0's rows): "q4_1 q5_0 q5_1", 4.3 / 4.6 / 5.0 GiB)
set -u
TYPES=${1:-q5_k q3_k q2_k}
HALF_TYPES="q2_k q3_k"
PY=${PYTHON:-python3}
DIR=${DIR:-${TMPDIR:-/tmp}/llamavk-kquant-ab}
mkdir -p "$DIR"
# the whole-block stream form with the GPU rows it had, for the 8b preset's shapes (Q and O, K and V,
# gate/up, down, output)
whole_form() {
    echo "$1=stream_dp:512,2,1,1 $1@4096x4096=stream_dp:512,2,1,1,2,0,1 $1@14336x4096=stream_dp:512,2,1,1,2" \
         "$1@32000x4096=stream_dp:512,2,1,1,2 $1@4096x14336=stream_dp:256,2,16,1,1,1"
}
for t in $TYPES; do
    M="$DIR/8b-$t.gguf"
    echo "== write $M"
    timeout 1200 $PY examples/make_synthetic_model.py --preset 8b --type "$t" -o "$M" || { rm -f "$M"; continue; }
    echo "== $t: stream kernel (default)"
    timeout 600 $PY -m llamavk bench -m "$M,$M" -p 0 -n 128 -r 3
    case " $HALF_TYPES " in *" $t "*)
        W=$(whole_form "$t")
        echo "== $t: whole-block stream form, LLAMAVK_MATVEC=\"$W\""
        LLAMAVK_MATVEC="$W" timeout 600 $PY -m llamavk bench -m "$M,$M" -p 0 -n 128 -r 3 ;;
    esac
    echo "== $t: base kernel, LLAMAVK_MATVEC=$t=base:256,4,2,2"
    LLAMAVK_MATVEC="$t=base:256,4,2,2" timeout 600 $PY -m llamavk bench -m "$M,$M" -p 0 -n 128 -r 3
    rm -f "$M"
done
