"""-sm row: every weight matrix split by output rows across devices (per -ts); norms, attention and
the KV cache stay on the main device (-mg). So do a mixture of experts' stacked expert matrices (as
in llama.cpp, whose row split leaves them whole): splitting each of a token's few small expert
products would cost a broadcast and a gather per product for little work; the router is split.
Gated DeltaNet layers (qwen35) split their products like any other; the convolution, the delta rule
and the gated norm run on the main device, which holds their recurrent state.

Before each group of products that share an input (Q/K/V; gate/up; each other one alone) the main
device broadcasts the input; after it, every device's rows are gathered on the main device in one
exchange. The output matrix is split by vocabulary rows and stays split: the host assembles the
logits from each device's part.
"""

from __future__ import annotations

from .base import DeviceGraphs, partition
from .exchange import gather_columns, transfer


def _matmul_groups(ops):
    """Consecutive products with the same input become one group (one broadcast, one gather)."""
    group = []
    for op in ops:
        if op.kind == "matmul" and group and group[0].kind == "matmul" and op.inputs[1] is group[0].inputs[1]:
            group.append(op)
            continue
        if group:
            yield group
        group = [op]
    if group:
        yield group


def plan(graph, shares: list[float], opts, blocks=None) -> DeviceGraphs:
    cfg = graph.config
    n, mg = len(shares), opts.main_gpu
    dg = DeviceGraphs(graph, n)
    for group in _matmul_groups(graph.ops):
        if group[0].kind == "softcap" and group[0].inputs[0] is graph.logits:   # in place on each part
            for d, _, _ in dg.logits_parts:
                dg.emit(d, "softcap", [dg.tensor(d, graph.logits)], None, None, **group[0].attrs)
            continue
        if group[0].kind != "matmul":
            dg.place(mg, group[0])
            continue
        x = group[0].inputs[1]
        parts = [partition(op.inputs[0].rows, shares) for op in group]
        users = {d for p in parts for d, (r0, r1) in enumerate(p) if r1 > r0}
        local_x = {mg: dg.tensor(mg, x)}
        local_x.update(transfer(dg, mg, local_x[mg], sorted(users), x.layer))
        outs = []
        for op, p in zip(group, parts):
            w, bias = op.inputs[0], op.inputs[2] if len(op.inputs) > 2 else None
            pieces = {}
            for d, (r0, r1) in enumerate(p):
                if r1 > r0:
                    inputs = [w.sliced(0, r0, r1), local_x[d]] + ([bias.sliced(0, r0, r1)] if bias is not None else [])
                    pieces[d] = (dg.emit(d, "matmul", inputs, r1 - r0, op.layer), r0, r1)
            outs.append((op, pieces))
        if group[-1].out is graph.logits:           # logits stay split: the host assembles them
            op, pieces = outs[-1]
            for d, (t, r0, r1) in pieces.items():
                dg.set_logits(d, t)
                dg.bind(d, op.out, t)
            dg.logits_parts = [(d, r0, r1) for d, (t, r0, r1) in sorted(pieces.items())]
            continue
        fulls = gather_columns(dg, [(op.out.width, pieces) for op, pieces in outs], mg, group[0].layer)
        for (op, _), full in zip(outs, fulls):
            dg.bind(mg, op.out, full)
    what, width = ("router", cfg.n_expert) if cfg.n_expert else ("FFN", cfg.n_ff)
    for d in range(n):
        rows = partition(width, shares)[d]
        dg.holds[d] = [f"{100 * shares[d]:.0f}% of every matrix's rows (e.g. {what} rows {rows[0]}-{rows[1] - 1})"]
    dg.holds[mg].append("norms, attention, KV cache" + (", the experts" if cfg.n_expert else "")
                        + (", DeltaNet convolutions and delta rule with their state" if cfg.recurrent_layers else ""))
    return dg
