#!/bin/sh
# What staging x costs the one-token step (issue 27). TIMING ONLY: the variants compute wrong logits.
# matvec_stream.comp's DOT8 kernel of each type is rebuilt with its x staging (read x, apply the norm,
# quantize to int8 in shared memory) left out for one class of product, or with x read but neither
# normed nor quantized, and swapped into a copy of the package; tg128 of the 7.2B (the 8b preset) then
# runs on each copy in alternation with the default.
#   same    the unchanged source, rebuilt here (must read as the default)
#   nox     no product stages x
#   gu      the FFN's gate/up pair (NORM and PAIR)      qkvout  Q/K/V and the output (NORM, no PAIR)
#   down    the down product's column parts (KSPLIT)    o       the attention's output projection
#   raw     every product reads its x and stores its bits, no norm weights, no quantization
#   half    the NORM products (Q/K/V, the output, the gate/up pair) read x' = x * nw as f16 (half the
#           bytes of x, no norm weights) and 256 partial sums of squares, as if their producer wrote them
#   halfgu  only the gate/up pair does     halfo  and O reads its x as f16 too
# Usage: sh benchmarks/bench_x_staging.sh build DIR [TYPES]   (needs glslc; writes DIR/VARIANT/*.spv)
#        sh benchmarks/bench_x_staging.sh run DIR [TYPES]     (GPU machine; DIR from build, carried over)
# TYPES default "q4_0 q4_k". Each model ($PRESET, default 8b) is written to $MODELS (default /tmp/m)
# and deleted after.
set -eu
cmd=$1 dir=$2 types=${3:-q4_0 q4_k}
root=$(cd "$(dirname "$0")/.." && pwd)
variants=${VARIANTS:-same nox gu qkvout down o raw half halfgu halfo}
if [ "$cmd" = build ]; then
    src=$(mktemp -d)
    cp "$root"/shaders/*.comp "$root"/shaders/*.glsl "$src"/
    python3 - "$src/matvec_stream.comp" <<'EOF'
import sys
path = sys.argv[1]
s = open(path).read()
old = "#if !defined(NO_X) && !defined(READ_ONLY)\n        if (XFIRST && i == 0) {"
new = """#if defined(XRAW)
        for (uint k = tid; k < n4; k += WG) {
            vec4 v = x_at(kx + k);
            xqh[(k % V4) * TPR + k / V4] = floatBitsToUint(v.x + v.y + v.z + v.w);
        }
#elif !defined(NO_X) && !defined(READ_ONLY)
        if (NOX_COND) {} else
        if (XHALF_COND) {
            for (uint k = tid; k < n4 / 2; k += WG) {
                uvec4 u = floatBitsToUint(x_at(kx / 2 + k));
                stage(2 * k, vec4(unpackHalf2x16(u.x), unpackHalf2x16(u.y)));
                stage(2 * k + 1, vec4(unpackHalf2x16(u.z), unpackHalf2x16(u.w)));
            }
            if (NORM && tid < 64) ss += x_at(tid).x;
        } else
        if (XFIRST && i == 0) {"""
assert s.count(old) == 1, "matvec_stream.comp's staging changed: update this patch"
s = s.replace(old, new).replace('#include "common.glsl"\n', '#include "common.glsl"\n#ifndef NOX_COND\n#define NOX_COND false\n#endif\n#ifndef XHALF_COND\n#define XHALF_COND false\n#endif\n', 1)
open(path, "w").write(s)
EOF
    for v in $variants; do
        case $v in
            same) d="NOX_COND=false" ;; nox) d="NOX_COND=true" ;; gu) d="NOX_COND=(NORM&&PAIR)" ;;
            qkvout) d="NOX_COND=(NORM&&!PAIR)" ;; down) d="NOX_COND=(KSPLIT>1)" ;;
            o) d="NOX_COND=(!NORM&&KSPLIT==1)" ;; raw) d="XRAW=1" ;;
            half) d="XHALF_COND=NORM" ;; halfgu) d="XHALF_COND=(NORM&&PAIR)" ;;
            halfo) d="XHALF_COND=(KSPLIT==1)" ;;
        esac
        mkdir -p "$dir/$v"
        for t in $types; do
            glslc --target-env=vulkan1.2 -O -fshader-stage=compute "-DQTYPE_$(echo "$t" | tr a-z A-Z)=1" \
                -DDOT8=1 "-D$d" "$src/matvec_stream.comp" -o "$dir/$v/mul_mv_stream_dp_$t.spv"
        done
    done
    rm -rf "$src"
    echo "built $variants for $types in $dir"
    exit 0
fi
[ "$cmd" = run ] || { echo "usage: $0 build|run DIR [TYPES]" >&2; exit 2; }
dir=$(cd "$dir" && pwd)
models=${MODELS:-/tmp/m} preset=${PRESET:-8b}
work=$(mktemp -d)
mkdir -p "$models"
for v in $variants; do
    mkdir -p "$work/$v"
    cp -r "$root/llamavk" "$work/$v/"
    for t in $types; do cp "$dir/$v/mul_mv_stream_dp_$t.spv" "$work/$v/llamavk/spv/"; done
done
tg() {  # model variant: the package copy runs from its own directory (python -m puts the cwd first)
    if [ "$2" = default ]; then d=$root; else d=$work/$2; fi
    r=$(cd "$d" && PYTHONPATH="$d${PYTHONPATH:+:$PYTHONPATH}" LLAMAVK_CACHE="$work/cache-$2" \
        timeout 180 python3 -m llamavk bench -m "$1" -p 0 -n 128 -r 3 2>&1 | grep -oE 'tg128 .*|rror.*' || true)
    echo "$(basename "$1") [$2] $r"
}
for t in $types; do
    m=$models/$preset-$t.gguf
    python3 "$root/examples/make_synthetic_model.py" --preset "$preset" --type "$t" -o "$m" | tail -1
    for pass in 1 2; do for v in default $variants; do tg "$m" "$v"; done; done
    rm -f "$m"
done
rm -rf "$work"
