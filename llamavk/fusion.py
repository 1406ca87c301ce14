"""Fusion for matrix-vector steps (decode): fewer dispatches, fewer barriers, fewer passes over memory.

A decode step is a chain of small kernels separated by barriers; on a GPU each barrier costs a few
microseconds, as much as reading megabytes. This pass folds into the matrix-vector product:

- `rms_norm(x, w)` feeding only matmuls  -> each matmul normalises its input itself (attrs norm, eps);
- `add(r, matmul(...))`                  -> the matmul writes r + W·x (attr residual).

The result is a new Graph with the same weights and logits; the original is untouched (prompt
batches use the tiled matrix-matrix kernel, which takes the unfused graph).
"""

from __future__ import annotations

import copy
from collections import defaultdict

from .graph import Graph


def fuse_for_matvec(graph: Graph) -> Graph:
    ops = [copy.copy(op) for op in graph.ops]
    for op in ops:
        op.attrs = dict(op.attrs)
    consumers = defaultdict(list)
    for op in ops:
        for t in op.reads():
            consumers[t].append(op)
    dropped: set[int] = set()

    for op in ops:
        if op.kind == "rms_norm" and len(op.inputs) == 2:
            users = consumers[op.out]
            if users and all(u.kind == "matmul" and u.inputs[1] is op.out for u in users):
                x, weight = op.inputs
                for u in users:
                    u.inputs = (u.inputs[0], x) + u.inputs[2:]
                    u.attrs.update(norm=weight, eps=op.attrs["eps"])
                dropped.add(id(op))
        elif op.kind == "add":
            a, b = op.inputs
            producer = next((p for p in ops if p.out is b and p.kind == "matmul"), None)
            if producer is not None and len(consumers[b]) == 1 and producer.out is not graph.logits:
                producer.attrs["residual"] = a
                producer.out = op.out
                dropped.add(id(op))

    fused = Graph(graph.config)
    fused.weights = graph.weights
    fused.logits = graph.logits
    fused.ops = [op for op in ops if id(op) not in dropped]
    return fused
