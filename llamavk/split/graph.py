"""-sm graph: the tensor-parallel structure of -sm tensor, with the choices of llama.cpp's graph mode.

- Uneven -ts may leave a device empty, and --max-gpu N keeps the N devices with the largest shares:
  idle devices are dropped before the split (split/__init__.py).
- The sums after attention and after the FFN (after the experts only, in a mixture of experts): for
  batches up to 32 tokens (decode) every device reads every f32 partial after one exchange (latency
  bound); above that a ring-style reduce-scatter + all-gather, two exchanges where each device sums
  one column chunk, with the partials sent in --reduce-type (f16 by default): half the bytes over
  the bus, bandwidth bound.
- Communication overlapped with independent work (one-token steps, spin sync, devices that chain
  products: kernels/chain.py): the product after each all-reduce is recorded without a barrier and
  issues its weight loads while the exchange point waits for the peers (split/matvec_steps.py).
"""

from __future__ import annotations

from .tensor import build


def plan(graph, shares: list[float], opts, blocks=None, large: bool = False):
    if large:
        return build(graph, shares, blocks or {}, ring=True, dtype=opts.reduce_type)
    dg = build(graph, shares, blocks or {}, ring=False, dtype="f32")
    dg.overlap = True
    return dg
