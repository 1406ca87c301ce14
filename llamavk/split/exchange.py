"""Exchange ops: how activations cross devices, as ops in the device graphs.

Devices share nothing but one host allocation (split/comm.py): every exchange point has, per device,
a slot in it. The ops, recorded by split/comm.py:

  put(x)          [producer] write x (n_tokens rows; at column offset `at` of the slot's row layout)
                  into my slot, as f32 or the reduce type
  sync            [every device] exchange point `exchange`: publish my slot (signal) and/or wait for
                  the producers in wait_mask. Added to every device's graph, so all devices pass
                  the same exchange points in the same order (the host relay runs them as rounds)
  get -> y        [consumer] copy a producer's slot into y (all columns, or columns cols of y)
  copy_cols(x)->y local copy of x into columns cols of y (a device's own part of a gather)
  reduce(x) -> y  y = x + sum of the partial results in the producers' slots (an all-reduce), or
                  one column chunk of it written into my slot of a later exchange (ring)

Each builder below appends the ops of one communication pattern to the device graphs.
"""

from __future__ import annotations

from .base import DeviceGraphs, Exchange, partition

PART_BYTES = {"f32": 4, "f16": 2, "bf16": 2}


def _mask(devices) -> int:
    m = 0
    for d in devices:
        m |= 1 << d
    return m


def _sync_all(dg: DeviceGraphs, e: Exchange, layer, hold=frozenset()) -> None:
    """hold: devices that wait with nothing else to do (their GPUs kept busy while they wait)."""
    for d in range(dg.n):
        wait = (e.producers - {d}) if d in e.consumers else set()
        dg.emit(d, "sync", (), None, layer, exchange=e.index, signal=d in e.producers, wait_mask=_mask(wait),
                hold=d in hold)


def transfer(dg: DeviceGraphs, src: int, x, dsts, layer=None, idle=()) -> dict:
    """Copy activation x (on src) to every device in dsts; returns {dst: tensor}. idle: devices
    that read nothing but wait at this exchange point too (spin steps: their GPUs stay busy)."""
    dsts = [d for d in dsts if d != src]
    if not dsts:
        return {}
    e = dg.new_exchange()
    e.producers, e.consumers = {src}, set(dsts) | (set(idle) - {src})
    dg.emit(src, "put", (x,), None, layer, exchange=e.index, dtype="f32", at=0)
    dg.note_put(x.width)
    _sync_all(dg, e, layer, hold=set(idle) - {src})
    return {d: dg.emit(d, "get", (), x.width, layer, exchange=e.index, src=src, at=0, cols=None) for d in dsts}


def gather_columns(dg: DeviceGraphs, groups: list[tuple[int, dict]], dst: int, layer=None) -> list:
    """Several outputs split by columns, assembled on dst in one exchange.

    groups: [(width, {device: (part tensor, c0, c1)})]; returns the full tensors on dst, in order."""
    e = dg.new_exchange()
    e.consumers = {dst}
    at = {}                                                       # device -> columns put so far
    for _, parts in groups:
        for d, (t, c0, c1) in parts.items():
            if d != dst and c1 > c0:
                e.producers.add(d)
                dg.emit(d, "put", (t,), None, layer, exchange=e.index, dtype="f32", at=at.get(d, 0))
                at[d] = at.get(d, 0) + (c1 - c0)
    for cols in at.values():
        dg.note_put(cols)
    _sync_all(dg, e, layer)
    outs, offset = [], {}
    for width, parts in groups:
        full = None
        for d, (t, c0, c1) in sorted(parts.items()):
            if c1 <= c0:
                continue
            if d == dst:
                full = dg.emit(dst, "copy_cols", (t,), width, layer, out=full, cols=(c0, c1))
            else:
                full = dg.emit(dst, "get", (), width, layer, out=full, exchange=e.index, src=d,
                               at=offset.get(d, 0), cols=(c0, c1))
                offset[d] = offset.get(d, 0) + (c1 - c0)
        outs.append(full)
    return outs


def all_reduce(dg: DeviceGraphs, partials: dict, bases: dict, width: int, layer=None, ring: bool = False,
               dtype: str = "f32") -> dict:
    """y_d = base_d + sum of every device's partial, on every device of `bases`; partials[d] may be
    None (the device holds no part of this product), and so may bases[d] (y_d = the sum alone).
    Returns {device: y}.

    Direct: one exchange; every device reads every partial (fewest synchronisations: decode).
    Ring: reduce-scatter then all-gather, two exchanges; each device sums one column chunk, so each
    reads ~2/n of the data instead of n-1 partials (large batches; partials in `dtype`)."""
    devices = sorted(bases)
    contributors = {d for d, p in partials.items() if p is not None}
    e = dg.new_exchange()
    e.producers, e.consumers = set(contributors), set(devices)
    put_dtype = dtype if ring else "f32"
    for d in sorted(contributors):
        dg.emit(d, "put", (partials[d],), None, layer, exchange=e.index, dtype=put_dtype, at=0)
    dg.note_put(width, PART_BYTES[put_dtype])
    _sync_all(dg, e, layer)
    mask = _mask(contributors)
    base = {d: (bases[d],) if bases[d] is not None else () for d in devices}
    if not ring:
        return {d: dg.emit(d, "reduce", base[d], width, layer, exchange=e.index, mask=mask, dtype="f32",
                           cols=None, to_exchange=None, n_cols=width) for d in devices}
    chunks = dict(zip(devices, partition(width, [1.0] * len(devices), 32 if width % 32 == 0 else 1)))
    e2 = dg.new_exchange()
    e2.producers = {d for d in devices if chunks[d][1] > chunks[d][0]}
    e2.consumers = set(devices)
    for d in devices:
        if chunks[d][1] > chunks[d][0]:
            dg.emit(d, "reduce", base[d], None, layer, exchange=e.index, mask=mask, dtype=dtype,
                    cols=chunks[d], to_exchange=e2.index, n_cols=width)
    dg.note_put(max(c1 - c0 for c0, c1 in chunks.values()))
    _sync_all(dg, e2, layer)
    out = {}
    for d in devices:
        full = None
        for p in sorted(e2.producers):
            full = dg.emit(d, "get", (), width, layer, out=full, exchange=e2.index, src=p, at=0, cols=chunks[p])
        out[d] = full
    return out
