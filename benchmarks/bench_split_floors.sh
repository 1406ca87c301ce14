#!/bin/bash
# Issue 28's split-mode table in one call on a machine of 4 GPUs (docs/PERFORMANCE.md, "4x NVIDIA
# H200"): tg128 of the 31.5B and 7.2B dense models in every mode on 4 GPUs (listed twice: take the
# second pass) and on 2 of them, pp512 / tg128 of the 30B-A3B and 35B-A3B MoEs on 4 and 2, llama.cpp
# -sm none / layer beside (LC: an unpacked llama.cpp build), split_check on 4 devices.
# Usage (repository root): bash benchmarks/bench_split_floors.sh LC [MODELS_DIR] [PART]
# PART: llamavk (the llamavk rows), others (llama.cpp and split_check) or all (default): the whole runs
# longer than one 600 s call of the device tool, so lent machines take it in two.
# No background jobs: the lent machines' scripts tee their output, and bash's `wait` would wait for tee.
LC=${1:?usage: bench_split_floors.sh LC [MODELS_DIR] [PART]}; M=${2:-/tmp/m}; PART=${3:-all}; PY=${PYTHON:-python3}
mkdir -p $M
for p in 8b 32b 30b-a3b 35b-a3b; do
    [ -f $M/$p.gguf ] || $PY examples/make_synthetic_model.py --preset $p --type q4_0 -o $M/$p.gguf | tail -1
done
D4=Vulkan0/Vulkan1/Vulkan2/Vulkan3; D2=Vulkan0/Vulkan1
B() { timeout $1 $PY -m llamavk bench "${@:2}" 2>&1 | grep -E "^\| [a-z0-9]|rror" | grep -v "| model"; }
L() { timeout $1 $LC/llama-bench "${@:2}" -fa 1 -ngl 99 2>&1 | grep -E "^\| [a-z]|rror" | grep -v "| model"; }
if [ $PART != others ]; then
echo "== dense, 4 GPUs"; B 240 -m $M/32b.gguf,$M/32b.gguf,$M/8b.gguf,$M/8b.gguf -p 0 -n 128 -r 3 -sm none,layer,tensor,graph -dev $D4
echo "== dense, 2 GPUs"; B 120 -m $M/32b.gguf,$M/8b.gguf -p 0 -n 128 -r 3 -sm layer,tensor,graph -dev $D2
for p in 30b-a3b 35b-a3b; do
    echo "== $p, 4 GPUs"; B 120 -m $M/$p.gguf -p 512 -n 128 -r 2 -sm none,layer,tensor,graph -dev $D4
    echo "== $p, 2 GPUs"; B 90 -m $M/$p.gguf -p 512 -n 128 -r 2 -sm layer,tensor,graph -dev $D2
done
fi
[ $PART = llamavk ] && exit 0
echo "== llama.cpp -sm none"; L 150 -m $M/8b.gguf,$M/32b.gguf,$M/30b-a3b.gguf,$M/35b-a3b.gguf -p 512 -n 128 -r 2 -sm none
echo "== llama.cpp -sm layer, 2 / 4 GPUs"; L 240 -m $M/8b.gguf,$M/32b.gguf,$M/30b-a3b.gguf,$M/35b-a3b.gguf -p 512 -n 128 -r 2 -sm layer -dev $D2,$D4
echo "== split_check, 4 devices"; timeout 150 $PY examples/split_check.py -dev Vulkan0,Vulkan1,Vulkan2,Vulkan3 --modes layer,row,tensor,graph 2>&1 | tail -28
