#!/usr/bin/env bash
# One-shot completion wall time: `llamavk run` beside llama.cpp's llama-completion, same files, same
# command line (issue 23's "done when"), with llamavk's phase breakdown (LLAMAVK_PHASES=1).
#
#   bash benchmarks/run_wall.sh [LLAMACPP] [PRESETS]
#
# LLAMACPP: a llama.cpp build folder holding llama-completion, or a reference tarball
#   (../shared/ref-llamacpp/llamacpp-0c1e570-vk-cm2.tar.xz, unpacked to /tmp/lc); default: that
#   tarball under .carry/ or ../shared/ref-llamacpp/, else llamavk alone.
# PRESETS: synthetic models to write (Q4_0), default "8b 1b" (7.2B and 1.1B parameters, vocabulary
#   32000); files go to ${MODELS:-/tmp/m} and are reused when present. RUN_ARGS: the sampling flags
#   both commands take (default "--temp 0", greedy; "-s 1": llama.cpp's default chain, seeded).
#
# Each command runs twice (the second run counts: page cache and driver caches warm); the
# wall time is measured around the whole process. The llamavk lines to read: "phase ..." (where
# the wall goes, from process start; "(of which upload threads' ...)": where the weight upload's
# threads spent their time, summed over them -- file read, copy into staging, wait for a slot,
# submit) and llamavk_perf's load / prompt / eval lines. The last
# section is `llamavk bench -n 128` (tg128) of the same files, for run's eval t/s against it.
set -u
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
[ -x .venv/bin/python ] && PY=${PYTHON:-.venv/bin/python}
MODELS=${MODELS:-/tmp/m}
PRESETS=${2:-"8b 1b"}
PROMPT="Once upon a time"
N=${N:-128}
RUN_ARGS=${RUN_ARGS:---temp 0}
mkdir -p "$MODELS"

LC=${1:-}
if [ -z "$LC" ]; then
    for t in .carry/llamacpp-0c1e570-vk-cm2.tar.xz ../shared/ref-llamacpp/llamacpp-0c1e570-vk-cm2.tar.xz; do
        [ -f "$t" ] && LC=$t && break
    done
fi
if [ -n "$LC" ] && [ -f "$LC" ]; then
    mkdir -p /tmp/lc && tar xJf "$LC" -C /tmp/lc
    LC=/tmp/lc/$(basename "$LC" .tar.xz)
fi
[ -n "$LC" ] && [ ! -x "$LC/llama-completion" ] && { echo "no llama-completion in $LC"; LC=""; }

wall() { "$PY" -c "import sys; print(f'{float(sys.argv[2]) - float(sys.argv[1]):.2f}')" "$1" "$2"; }

for p in $PRESETS; do
    f=$MODELS/$p-q4_0.gguf
    [ -f "$f" ] || "$PY" examples/make_synthetic_model.py --preset "$p" --type q4_0 -o "$f" 2>&1 | tail -1
done

# Byte-code as a user's pip install has it (pip compiles at install time): with an editable install
# under PYTHONDONTWRITEBYTECODE=1, or dependencies installed with --no-compile, every run compiled
# those sources again (llamavk's alone: ~0.1 s of "imports" on the 2-core llvmpipe machine).
"$PY" -m compileall -q llamavk >/dev/null 2>&1
"$PY" - <<'EOF' 2>/dev/null
import compileall, importlib.util, os
for name in ("vulkan", "gguf", "typer", "click", "pydantic", "pydantic_core", "rich", "tqdm", "numpy", "regex"):
    spec = importlib.util.find_spec(name)
    for d in (spec.submodule_search_locations or []) if spec else []:
        if os.access(d, os.W_OK):
            compileall.compile_dir(d, quiet=2)
EOF

for p in $PRESETS; do
    f=$MODELS/$p-q4_0.gguf
    for i in 1 2; do
        s=$EPOCHREALTIME
        LLAMAVK_PHASES=1 "$PY" -m llamavk run -m "$f" -p "$PROMPT" -n "$N" $RUN_ARGS >/dev/null 2>/tmp/run_wall.err
        e=$EPOCHREALTIME
        echo "== llamavk run $p run$i: wall $(wall "$s" "$e") s"
        grep -E "load time|prompt eval|eval time|sampling time|^phase" /tmp/run_wall.err | sed 's/^llamavk_perf: *//'
    done
    if [ -n "$LC" ]; then
        for i in 1 2; do
            s=$EPOCHREALTIME
            "$LC/llama-completion" -m "$f" -p "$PROMPT" -n "$N" $RUN_ARGS -ngl 99 -no-cnv >/dev/null 2>/tmp/run_wall.err
            e=$EPOCHREALTIME
            echo "== llama-completion $p run$i: wall $(wall "$s" "$e") s"
            grep -E "load time|prompt eval time|eval time|sampling time" /tmp/run_wall.err | head -4 | sed 's/.*common_perf_print: *//'
        done
    fi
done

models=$(for p in $PRESETS; do printf '%s,%s,' "$MODELS/$p-q4_0.gguf" "$MODELS/$p-q4_0.gguf"; done)
echo "== llamavk bench tg$N (each model twice; the second row counts)"
"$PY" -m llamavk bench -m "${models%,}" -p 0 -n "$N" -r 3 2>&1 | grep -E "^\| (model|llama)"
