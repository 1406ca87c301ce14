#!/usr/bin/env python3
"""Write a random-weight GGUF model (for benchmarks and tests where real weights are not at hand).

    python examples/make_synthetic_model.py --preset 8b --type q4_0 -o /tmp/llama-8b-q4_0.gguf
    python examples/make_synthetic_model.py --preset 70b --type q4_0 --dry-run

Presets tiny/1b/8b/32b/70b (1b..70b: the exact shapes of llama.cpp's reference runs in SPEC §10),
tiny-moe/30b-a3b (qwen3moe), tiny-qwen35/0.8b (qwen35), tiny-qwen35moe/35b-a3b (qwen35moe: Qwen3.6-35B-A3B's
shape; or qwen3next), tiny-qwen3next (qwen3next); types f32, f16, q8_0, q4_0, q4_1, q5_0, q5_1, q2_k, q3_k, q4_k, q5_k, q6_k, iq4_nl, iq4_xs, mxfp4
(every 2-D weight of that type, but a mixture of experts' router and a DeltaNet's convolution taps:
f32); architectures llama, mistral3, qwen2, qwen3, gemma3 for the llama presets, qwen2moe for the
qwen3moe ones.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

try:
    import llamavk  # noqa: F401
except ImportError:  # running from a checkout without `pip install -e .`
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from llamavk.errors import LlamavkError
from llamavk.models import ARCHITECTURES
from llamavk.synthetic import PRESETS, SYNTHETIC_NAMES, describe_plan, synthetic_plan, write_synthetic_model


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--preset", default="tiny", choices=list(PRESETS))
    ap.add_argument("--type", default="q4_0", choices=list(SYNTHETIC_NAMES),
                    help="mxfp4_moe: MXFP4 experts, Q8_0 the other matrices (the released gpt-oss files); "
                         "q4_k_m / q5_k_m: the K-quant with Q6_K for the output and, on about half "
                         "the layers, attn_v and the FFN's down matrices (llama-quantize's _M mixes)")
    ap.add_argument("--arch", default=None, choices=sorted(ARCHITECTURES),
                    help="default: the preset's (llama; qwen3moe for tiny-moe and 30b-a3b; qwen35 for "
                         "tiny-qwen35 and 0.8b; qwen35moe for tiny-qwen35moe and 35b-a3b)")
    ap.add_argument("-o", "--output", help="output .gguf path (default: synthetic-PRESET-TYPE-ARCH.gguf)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--layers", type=int, help="override the number of layers")
    ap.add_argument("--dry-run", action="store_true", help="print the shapes and size, write nothing")
    args = ap.parse_args(argv)

    overrides = {"n_layer": args.layers} if args.layers else {}
    try:
        plan = synthetic_plan(args.preset, args.type, args.arch, **overrides)
        print(describe_plan(plan), file=sys.stderr)
        if args.dry_run:
            for t in plan.tensors[:12]:
                print(f"  {t.spec.name:28s} {t.qtype.name:5s} {str(t.spec.shape):14s} {t.nbytes} bytes")
            if len(plan.tensors) > 12:
                print(f"  ... {len(plan.tensors) - 12} more tensors")
            return 0
        out = args.output or f"synthetic-{args.preset}-{args.type}-{plan.config.arch}.gguf"
        t0 = time.perf_counter()
        write_synthetic_model(out, args.preset, args.type, args.arch, seed=args.seed, **overrides)
        print(f"wrote {out} in {time.perf_counter() - t0:.1f} s", file=sys.stderr)
    except LlamavkError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
