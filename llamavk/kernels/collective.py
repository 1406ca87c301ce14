"""Recorders for the split modes' cross-device work (shaders/exchange_sync.comp, reduce_sum.comp,
convert.comp). The buffers they touch live in host memory imported into every device
(vk.SharedHostMemory): that is the only thing devices of different vendors can share.
"""

from __future__ import annotations

import os
import struct

from ..errors import LlamavkError
from . import View, groups_2d

WG = 256
FLAG_LINES = 256          # cache lines each counter is written to (shaders/exchange_sync.comp): ~5 ms
FLAG_LINES_LONG = 8192    # for waits of a whole block of layers (layer mode): ~25 ms of polls ~6 us
                          # apart (MAX_GAP_LONG), then ~200 ms of polls ~50 us apart
FLAG_LINE_BYTES = 128     # one GPU L2 line
PART_BYTES = {"f32": 4, "f16": 2, "bf16": 2}
MAX_GAP = 20000           # the waits' back-off cap, iterations of exchange_sync.comp's loop (~45 us)
# Layer mode's waits: the cap over the first half of their lines. 4x H200, tg128 -sm layer on 4 GPUs
# against -sm none (one call): 7.2B 443.1 (2000, 8192 lines) / 441.0 (200, 16384) / 442.0 (0, 16384)
# against 435.1 (20000, 2048 lines; none 466.6); 31.5B 96.4 ± 3.6 / 100.7 ± 6.3 / 99.8 ± 5.7
# against 92.3-97.6 ± 2-5 (none 105.4-106.4): a woken device loses less of its peer's lead.
MAX_GAP_LONG = 2000


def _env_int(name: str, default: int) -> int:
    try:
        return int(os.environ.get(name) or default)
    except ValueError:
        raise LlamavkError(f"{name}={os.environ[name]!r}: a whole number") from None


# Experiments (a multi-GPU A/B of layer mode's waits): the back-off cap and layer mode's line count.
def max_gap(lines: int) -> int:
    return _env_int("LLAMAVK_EXCHANGE_GAP", MAX_GAP_LONG if lines > FLAG_LINES else MAX_GAP)


def long_lines() -> int:
    return _env_int("LLAMAVK_EXCHANGE_LINES_LONG", FLAG_LINES_LONG)


HOLD_GROUPS = 256          # an exchange point's holders: at least one workgroup on every SM of a big GPU


def hold_enabled() -> bool:
    """LLAMAVK_LAYER_HOLD=0 (A/B): layer mode's finished devices wait at the last hand-over with one
    busy invocation, not every SM (exchange_sync hold)."""
    return os.environ.get("LLAMAVK_LAYER_HOLD", "1") != "0"


def signal_spread() -> bool:
    """LLAMAVK_EXCHANGE_SIGNAL=spread (A/B): exchange_sync.comp's signal writes one line per
    invocation over as many workgroups as that takes, not in rounds of one workgroup from line 0."""
    value = os.environ.get("LLAMAVK_EXCHANGE_SIGNAL", "ordered")
    if value not in ("ordered", "spread"):
        raise LlamavkError(f"LLAMAVK_EXCHANGE_SIGNAL={value!r}: ordered or spread")
    return value == "spread"


def flag_bytes(n_exchanges: int, n_devices: int, lines: int = FLAG_LINES) -> int:
    """Size of the counter area for n_exchanges exchange points of one step."""
    return n_exchanges * n_devices * lines * FLAG_LINE_BYTES


def exchange_sync(seq, kc, flags: View, status: View, step: View, me: int, exchange: int, signal: bool,
                  wait_mask: int, n_devices: int, base_word: int, lines: int = FLAG_LINES,
                  hold: View | None = None) -> None:
    """Record one exchange point: publish my counter (signal) and/or wait until every device in
    wait_mask has published it (bounded; status[0] = 2 on time-out, status[1] = exchange).
    hold (a device-local word pair): the wait keeps every SM busy until it is over (HOLD_GROUPS
    workgroups polling hold; shaders/exchange_sync.comp), for a device with nothing else to do.

    Barriers on both sides: everything this device wrote before is complete before the counter moves,
    and nothing after it starts before the peers' counters arrived."""
    kernel = kc.get("exchange_sync", "wwrw", push_size=28, spec=(lines, FLAG_LINE_BYTES // 4, max_gap(lines)))
    seq.barrier()
    groups = HOLD_GROUPS if hold is not None else (lines + 255) // 256 if signal and signal_spread() else 1
    seq.dispatch(kernel, [flags.range, status.range, step.range, (hold or status).range], (groups, 1, 1),
                 struct.pack("<7I", me, exchange, int(signal), wait_mask, n_devices, base_word, int(hold is not None)))
    seq.barrier()


def exchange_reduce(seq, kc, flags: View, status: View, step: View, me: int, exchange: int, signal: bool,
                    wait_mask: int, n_devices: int, base_word: int, parts: View, part_mask: int, part_stride: int,
                    out: View, n_tokens: int, n_cols: int, base: View | None = None, lines: int = FLAG_LINES,
                    chain=None, wait=None, clock=None) -> int:
    """Record one all-reduce of a matrix-vector step as one dispatch (shaders/exchange_reduce.comp):
    publish my counter (signal), wait for the devices in wait_mask, then
    out[t, c] = base[t, c] + sum_{p in part_mask} part_p[t, c] (rows n_cols apart; part p starts at
    element p * part_stride of `parts`). signal False and wait_mask 0: the sum alone.
    chain (a kernels.chain.Signal): count the workgroup done there for a consumer recorded without a
    barrier (kernels/chain.py). wait (a kernels.chain.Wait): recorded without a barrier after the
    product that writes my partial, the shader waits for its workgroups' count instead (-sm graph).
    clock (a split.clock.Stamp): the CLOCK variant, which writes its device-clock stamps there (the
    split timeline). Returns the workgroup count (1)."""
    spec = (lines, FLAG_LINE_BYTES // 4, max_gap(lines))
    if clock is None:
        kernel = kc.get("exchange_reduce", "wwrrrww", push_size=60, spec=spec)
    else:
        kernel = kc.get("exchange_reduce_clock", "wwrrrwww", push_size=64, spec=spec)
    if signal and wait is None:
        seq.barrier()          # every earlier write of this device (its partial) before the counter
    b = base if base is not None else out
    if chain is not None and wait is not None and chain.counters != wait.counters:
        raise ValueError("exchange_reduce: a chain signal and wait in different counter buffers")
    counters = chain.counters if chain is not None else wait.counters if wait is not None else out.range
    push = struct.pack("<15I", me, exchange, int(signal), wait_mask, n_devices, base_word, n_tokens, n_cols,
                       part_mask, part_stride, int(base is not None), int(chain is not None),
                       chain.slot if chain is not None else 0,
                       wait.slot if wait is not None else 0, wait.n if wait is not None else 0)
    bufs = [flags.range, status.range, step.range, parts.range, b.range, out.range, counters]
    if clock is not None:
        push += struct.pack("<I", clock.slot)
        bufs.append(clock.stamps)
    seq.dispatch(kernel, bufs, (1, 1, 1), push, chained=wait is not None)
    return 1


def reduce_sum(seq, kc, parts: View, part_dtype: str, part_mask: int, part_stride: int, out: View,
               n_tokens: int, n_cols: int, in_stride: int, in_c0: int = 0, base: View | None = None,
               base_stride: int = 0, base_c0: int = 0, out_stride: int | None = None, out_c0: int = 0) -> None:
    """out[t, out_c0 + c] = base[t, base_c0 + c] + sum_{p in part_mask} part_p[t, in_c0 + c]
    for t < n_tokens, c < n_cols (strides in elements; part p starts at element p * part_stride)."""
    if n_tokens <= 0 or n_cols <= 0:
        return
    kernel = kc.get(f"reduce_sum_{part_dtype}", "rrw", push_size=44)
    out_stride = n_cols if out_stride is None else out_stride
    b = base if base is not None else out
    push = struct.pack("<11I", n_tokens, n_cols, part_mask, part_stride, in_stride, in_c0, base_stride, base_c0,
                       out_stride, out_c0, int(base is not None))
    gy = groups_2d(n_tokens)
    seq.dispatch(kernel, [parts.range, b.range, out.range], ((n_cols + WG - 1) // WG, gy[0], gy[1]), push)


def convert(seq, kc, src: View, dst: View, dtype: str, n: int) -> None:
    """dst[i] = dtype(src[i]) for i < n (f32 -> f16 / bf16)."""
    if n <= 0:
        return
    kernel = kc.get(f"convert_{dtype}", "rw", push_size=4)
    seq.dispatch(kernel, [src.range, dst.range], groups_2d((n + WG - 1) // WG), struct.pack("<I", n))
