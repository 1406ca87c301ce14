"""Exchange points of matrix-vector steps (decode) rewritten to cost one dependent dispatch.

The general recording of an all-reduce (split/exchange.py, split/comm.py) is three dependent
dispatches after the product that made the partial: copy the partial into my slot of shared host
memory, the exchange point (exchange_sync.comp), the sum (reduce_sum.comp); each costs a few
microseconds of GPU idle time between dispatches, and a 31.5B model has 128 of them per token. In the
matrix-vector steps (decode) this pass makes it one:

- direct puts: a put whose tensor no other op reads gets attr direct=True; the op that makes the
  tensor writes it straight into my slot (DeviceComm.direct_views gives the runtime that view), and
  the put records nothing. Any f32 put: all-reduces, a layer hop, row mode's gathers.
- sync_reduce (one-token steps of spin-synchronised splits): a sync followed by the direct sum of
  the same exchange point becomes one op, recorded as shaders/exchange_reduce.comp: publish, wait,
  sum in one dispatch. So does a sync followed by the get of a whole activation from one device (a
  layer-mode hop: the "sum" of that device's slot alone), instead of a wait, a copy out of host
  memory and the barriers between them. With attr overlap (-sm graph), the product after it is chained without a
  barrier (kernels/chain.py, where the device chains products at all): its weight loads are in
  flight while the exchange point waits for the peers; the communication of the layer overlaps the
  next product's independent work.

Prompt batches keep the general path (their partials are megabytes: a copy is the right tool there,
and host relay cuts each step into rounds anyway).
"""

from __future__ import annotations

import os
from collections import defaultdict

from ..fusion import _copy_ops, _graph_like
from ..graph import Graph, Op


def hop_fuse() -> bool:
    """LLAMAVK_HOP_FUSE=0: a hop stays a wait, a copy and their barriers (A/B)."""
    return os.environ.get("LLAMAVK_HOP_FUSE", "1") != "0"


def rewrite(graph: Graph, one_token: bool, spin: bool, overlap: bool) -> Graph:
    """The matrix-vector step graph of one device with its exchange points cut down (module doc)."""
    ops = _copy_ops(graph)
    hops = hop_fuse()
    readers = defaultdict(list)
    for op in ops:
        for t in op.reads():
            readers[t].append(op)
    for op in ops:
        if op.kind == "put" and op.attrs["dtype"] == "f32" and readers[op.inputs[0]] == [op] \
                and op.inputs[0] is not graph.logits:
            op.attrs["direct"] = True
    if not (one_token and spin):
        return _graph_like(graph, ops)
    out: list[Op] = []
    for op in ops:
        prev = out[-1] if out else None
        if op.kind == "reduce" and op.attrs["to_exchange"] is None and op.attrs["dtype"] == "f32" \
                and prev is not None and prev.kind == "sync" and prev.attrs["exchange"] == op.attrs["exchange"]:
            attrs = dict(op.attrs)
            attrs.update(signal=prev.attrs["signal"], wait_mask=prev.attrs["wait_mask"], overlap=overlap)
            out[-1] = Op("sync_reduce", op.inputs, op.out, op.layer, attrs)
        elif hops and op.kind == "get" and op.attrs["cols"] is None and op.attrs["at"] == 0 \
                and prev is not None and prev.kind == "sync" and prev.attrs["exchange"] == op.attrs["exchange"] \
                and prev.attrs["wait_mask"]:
            # a hop (a whole activation from one device): the sum of that one device's slot
            attrs = dict(exchange=op.attrs["exchange"], signal=prev.attrs["signal"], wait_mask=prev.attrs["wait_mask"],
                         overlap=overlap, mask=1 << op.attrs["src"], dtype="f32", cols=None, to_exchange=None,
                         n_cols=op.out.width)
            out[-1] = Op("sync_reduce", (), op.out, op.layer, attrs)
        else:
            out.append(op)
    return _graph_like(graph, out)
