#!/bin/sh
# `llamavk bench` of two package trees in alternation: the working tree and a committed revision's.
# Each runs from its own directory with its own pipeline cache: `python3 -m` puts the current
# directory first on Python's path, so a tree named only in PYTHONPATH from the repository root runs
# the working tree instead (two A/Bs of 12c2efa-5054dc4 did, docs/PERFORMANCE.md).
# Usage: sh benchmarks/bench_trees_ab.sh build DIR REV   (here: DIR/llamavk from `git archive REV`; put
#                                                         DIR in a git-ignored folder the GPU run carries)
#        sh benchmarks/bench_trees_ab.sh run DIR MODEL [BENCH ARGS]   (GPU machine; default -p 0 -n 128 -r 2)
# Each tree prints the file its package came from first, then two passes of both in alternation.
set -eu
cmd=$1 dir=$2
root=$(cd "$(dirname "$0")/.." && pwd)
if [ "$cmd" = build ]; then
    rm -rf "$dir" && mkdir -p "$dir"
    (cd "$root" && git archive "$3" llamavk) | tar x -C "$dir"
    echo "$dir/llamavk: $(cd "$root" && git rev-parse --short "$3")"
    exit 0
fi
dir=$(cd "$dir" && pwd) model=$3
shift 3
[ $# -gt 0 ] || set -- -p 0 -n 128 -r 2
work=$(mktemp -d)
bench() {  # tree label, then bench arguments
    d=$1 label=$2; shift 2
    (cd "$d" && PYTHONPATH="$d${PYTHONPATH:+:$PYTHONPATH}" LLAMAVK_CACHE="$work/cache-$label" \
        timeout 300 python3 -m llamavk bench -m "$model" "$@" 2>&1 | grep -E '^\| [a-z]|rror' | grep -v '| model' |
        sed "s/^/[$label] /" || true)
}
for d in "$root" "$dir"; do
    (cd "$d" && PYTHONPATH="$d${PYTHONPATH:+:$PYTHONPATH}" python3 -c "import llamavk; print(llamavk.__file__)")
done
for pass in 1 2; do
    bench "$root" new "$@"
    bench "$dir" old "$@"
done
rm -rf "$work"
