"""-sm tensor: Megatron-style tensor parallelism.

Q/K/V and gate/up are split by output rows, attention output and down by input columns, so each
device computes its heads' attention and its slice of the FFN with no communication, and sums its
partial products with the others twice per layer (after attention, after the FFN). Heads go in
whole KV-head groups (GQA: a group's query heads stay with their K/V head), and the KV cache is
split with them. Norms and the embedding are mirrored; the output matrix is split by vocabulary
and the host assembles the logits. A device may get no heads (more devices than KV heads) or no
FFN columns: it then contributes no partial to that sum.

build() is shared with -sm graph (split/graph.py), which changes how the sums are made.
"""

from __future__ import annotations

from .base import DeviceGraphs, partition
from .exchange import all_reduce

# q, k, v, gate, up are split by output rows; these by input columns, giving partial sums:
ROW_PARALLEL = {"o", "down"}


def plan(graph, shares: list[float], opts, blocks=None) -> DeviceGraphs:
    return build(graph, shares, blocks or {}, ring=False, dtype="f32")


def build(graph, shares: list[float], blocks: dict, ring: bool, dtype: str) -> DeviceGraphs:
    """blocks: role -> block size of that weight's type (column cuts of o/down prefer block edges)."""
    cfg = graph.config
    n = len(shares)
    D, group = cfg.head_dim, cfg.n_head // cfg.n_head_kv
    dg = DeviceGraphs(graph, n)
    devices = list(range(n))
    kv = partition(cfg.n_head_kv, shares)                         # KV-head groups per device
    ff_block = blocks.get("down", 32)
    ff = partition(cfg.n_ff, shares, ff_block if cfg.n_ff // ff_block >= n else 32)
    vocab = partition(cfg.n_vocab, shares)
    rows_of = {                                                   # role -> device -> output rows
        "q": [(a * group * D, b * group * D) for a, b in kv],
        "k": [(a * D, b * D) for a, b in kv], "v": [(a * D, b * D) for a, b in kv],
        "gate": ff, "up": ff,
        "o": [(a * group * D, b * group * D) for a, b in kv], "down": ff,   # input columns
    }
    role = {}                        # model activation -> role of the product that made it
    partial = {}                     # model activation -> {device: partial sum or None}
    for op in graph.ops:
        k = op.kind
        if k == "matmul" and op.out is graph.logits:
            w = op.inputs[0]
            for d, (r0, r1) in enumerate(vocab):
                if r1 > r0:
                    dg.set_logits(d, dg.emit(d, "matmul", [w.sliced(0, r0, r1), dg.tensor(d, op.inputs[1])],
                                             r1 - r0, op.layer))
            dg.logits_parts = [(d, r0, r1) for d, (r0, r1) in enumerate(vocab) if r1 > r0]
        elif k == "matmul":
            w, x = op.inputs[0], op.inputs[1]
            bias = op.inputs[2] if len(op.inputs) > 2 else None
            parts = rows_of[w.role]
            role[op.out] = w.role
            if w.role in ROW_PARALLEL:
                partial[op.out] = {}
            for d, (a, b) in enumerate(parts):
                if b <= a or not dg.has(d, x):
                    if w.role in ROW_PARALLEL:
                        partial[op.out][d] = None
                    continue
                if w.role in ROW_PARALLEL:
                    partial[op.out][d] = dg.emit(d, "matmul", [w.sliced(1, a, b), dg.tensor(d, x)], w.rows, op.layer)
                else:
                    inputs = [w.sliced(0, a, b), dg.tensor(d, x)] + ([bias.sliced(0, a, b)] if bias is not None else [])
                    dg.bind(d, op.out, dg.emit(d, "matmul", inputs, b - a, op.layer))
        elif k == "add" and op.inputs[1] in partial:
            x = op.inputs[0]
            out = all_reduce(dg, partial[op.inputs[1]], {d: dg.tensor(d, x) for d in devices}, x.width,
                             op.layer, ring=ring, dtype=dtype)
            for d, t in out.items():
                dg.bind(d, op.out, t)
        elif k in ("rope", "head_norm"):
            heads = kv if role.get(op.inputs[0]) == "k" else [(a * group, b * group) for a, b in kv]
            for d, (a, b) in enumerate(heads):
                if b > a and dg.has(d, op.inputs[0]):
                    dg.place(d, op, n_heads=b - a)
            if k == "head_norm":
                role[op.out] = role.get(op.inputs[0])
        elif k == "attention":
            for d, (a, b) in enumerate(kv):
                if b > a:
                    dg.place(d, op, n_head=(b - a) * group, n_head_kv=b - a)
        elif k == "swiglu":
            for d, (a, b) in enumerate(ff):
                if b > a:
                    dg.place(d, op)
        else:                                        # embed, norms, last_row: mirrored
            for d in devices:
                dg.place(d, op)
    for d in devices:
        (h0, h1), (f0, f1), (v0, v1) = kv[d], ff[d], vocab[d]
        dg.holds[d] = [f"KV heads {h0}-{h1 - 1}" if h1 > h0 else "no heads",
                       f"FFN columns {f0}-{f1 - 1}" if f1 > f0 else "no FFN columns",
                       f"vocab {v0}-{v1 - 1}" if v1 > v0 else "no vocab rows"]
    return dg
