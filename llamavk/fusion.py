"""Graph rewrites that save dispatches, barriers and passes over memory.

`fuse_rope_kv` (every step shape): `rope(q)`, `rope(k)` feeding `attention(q, k, v)` become one
attention op with attr rope=True; the runtime records it as one rope_kv dispatch (rotate q, rotate +
store k, store v) before attention, instead of four dispatches over two dependent stages. Per-head
Q/K norms before the rotation (qwen3) go into it too (attrs q_norm, k_norm, eps).

`fuse_for_matvec` (matrix-vector steps, decode):

A decode step is a chain of small kernels separated by barriers; on a GPU each barrier costs a few
microseconds, as much as reading megabytes. This pass folds into the matrix-vector product:

- `rms_norm(x, w)` feeding only matmuls  -> each matmul normalises its input itself (attrs norm, eps);
- `swiglu(g, u)` feeding one matmul      -> the matmul reads silu(g)·u as its input (attr glu);
- `moe_sum(matmul_id(...))`              -> the expert product sums its weighted slots (attr sum);
- `moe_route(matmul(Wrouter, ...))`      -> the router product picks the experts itself (attr route);
- `add(r, matmul(...))`                  -> the matmul writes r + W·x (attr residual).
("matmul" here is either product: `matmul`, or `matmul_id` over a token's chosen experts.)

The result is a new Graph with the same weights and logits; the original is untouched (prompt
batches use the tiled matrix-matrix kernel, which takes the unfused graph).

`fuse_rope_into_products` (one-token steps, where the device's kernel can): the Q, K and V products
feeding a rope=True attention apply RoPE and store K and V into the cache themselves (attrs
rope="q" / "k" / "v"; the attention op gets kv_stored=True): the rope_kv dispatch and its stage go.

`fuse_delta_net_step` (one-token steps, where the device can): a Gated DeltaNet layer's
`gated_norm(delta_net(ssm_conv(qkv)), z)` becomes one op, delta_net_step, recorded as one dispatch
(deltanet.delta_net_step): three dependent stages per DeltaNet layer become one.

`fuse_qk_norm_into_attention` (one-token steps, where the device's decode attention can): an attention
whose q and k are per-head RMS-normed and rotated (qwen3, qwen3moe, gemma3; qwen35's gated attention,
whose Q norm reads the q halves of [q | gate] heads) takes the raw Q and K products and does the norms,
RoPE and the KV store itself (attrs qk_fused, q_norm, k_norm, eps, q_stride; kv_stored): the rope_kv
dispatch (or the head norms and rope_kv) and its stage go.

`fuse_glu_pairs` (one-token steps, before `fuse_for_matvec`, where the device's one-token kernel can):
`swiglu(matmul(Wg, h), matmul(Wu, h))` becomes one matmul of Wg with attr pair=Wu that writes
silu(Wg h) * (Wu h) itself: one dispatch for gate and up, and the down product then reads one plain
vector instead of computing silu(gate) * up from two. The same for a mixture of experts' gate and up
(`matmul_id` over one route).
"""

from __future__ import annotations

from collections import defaultdict

from .graph import Graph, Op

PRODUCTS = ("matmul", "matmul_id")   # weight products: plain, or with each token's chosen experts


def _copy_ops(graph: Graph) -> list[Op]:
    # built directly: copy.copy of a dataclass costs ~10x more (7.2B, 8 passes: 30 ms of a load)
    return [Op(op.kind, op.inputs, op.out, op.layer, dict(op.attrs)) for op in graph.ops]


def _graph_like(graph: Graph, ops: list[Op]) -> Graph:
    out = Graph(graph.config)
    out.weights = graph.weights
    out.logits = graph.logits
    out.ops = ops
    return out


def fuse_rope_kv(graph: Graph) -> Graph:
    ops = _copy_ops(graph)
    consumers = _consumers(ops)
    producer = {op.out: op for op in ops if op.out is not None}
    dropped: set[int] = set()
    for op in ops:
        if op.kind != "attention":
            continue
        q, k, v = op.inputs
        ropes = [r for r in ops if r.kind == "rope" and r.inputs[0] in (q, k) and id(r) not in dropped]
        if len(ropes) == 2 and {r.inputs[0] for r in ropes} == {q, k}:
            dropped.update(id(r) for r in ropes)
            op.attrs["rope"] = True
            # qwen3's per-head Q/K norms feeding only the rotation: into the same dispatch
            norms = [producer.get(t) for t in (q, k)]
            cfg = graph.config
            if all(n is not None and n.kind == "head_norm" and consumers[n.out] == [r, op] and "stride" not in n.attrs
                   for n, r in zip(norms, sorted(ropes, key=lambda r: r.inputs[0] is k))) \
                    and cfg.rope_dim == cfg.head_dim:
                dropped.update(id(n) for n in norms)
                op.inputs = (norms[0].inputs[0], norms[1].inputs[0], v)
                op.attrs.update(q_norm=norms[0].inputs[1], k_norm=norms[1].inputs[1], eps=norms[0].attrs["eps"])
    return _graph_like(graph, [op for op in ops if id(op) not in dropped])


def _consumers(ops):
    consumers = defaultdict(list)
    for op in ops:
        for t in op.reads():
            consumers[t].append(op)
    return consumers


def fuse_rope_into_products(graph: Graph, can_fuse) -> Graph:
    """can_fuse(weight) -> bool: whether the device's one-token product of that weight can do it."""
    ops = _copy_ops(graph)
    consumers = _consumers(ops)
    producer = {op.out: op for op in ops if op.out is not None}
    for op in ops:
        if op.kind != "attention" or not op.attrs.get("rope") or "q_norm" in op.attrs:
            continue
        prods = [producer.get(t) for t in op.inputs]
        if all(p is not None and p.kind == "matmul" and consumers[p.out] == [op] and "residual" not in p.attrs
               and "pair" not in p.attrs and can_fuse(p.inputs[0]) for p in prods):
            for p, kind in zip(prods, "qkv"):
                p.attrs["rope"] = kind
            op.attrs["rope"] = False
            op.attrs["kv_stored"] = True
    return _graph_like(graph, ops)


def fuse_qk_norm_into_attention(graph: Graph, can_fuse) -> Graph:
    """can_fuse(attention op) -> bool: whether the device's one-token attention can do it for that op.
    Two forms: the norms already in the attention (fuse_rope_kv took them: attrs q_norm, k_norm), or
    head_norm ops read by nothing but the attention (qwen35's strided Q norm, which rope_kv cannot do)."""
    ops = _copy_ops(graph)
    consumers = _consumers(ops)
    producer = {op.out: op for op in ops if op.out is not None}
    dropped: set[int] = set()
    for op in ops:
        if op.kind != "attention" or not op.attrs.get("rope") or not can_fuse(op):
            continue
        q, k, v = op.inputs
        if "q_norm" not in op.attrs:
            nq, nk = producer.get(q), producer.get(k)
            if not all(n is not None and n.kind == "head_norm" and consumers[n.out] == [op] for n in (nq, nk)) \
                    or "stride" in nk.attrs or nq.attrs["eps"] != nk.attrs["eps"]:
                continue
            dropped.update((id(nq), id(nk)))
            op.inputs = (nq.inputs[0], nk.inputs[0], v)
            op.attrs.update(q_norm=nq.inputs[1], k_norm=nk.inputs[1], eps=nq.attrs["eps"])
            if "stride" in nq.attrs:
                op.attrs["q_stride"] = nq.attrs["stride"]
        op.attrs.update(rope=False, kv_stored=True, qk_fused=True)
    return _graph_like(graph, [op for op in ops if id(op) not in dropped])


def fuse_glu_pairs(graph: Graph, can_pair) -> Graph:
    """can_pair(gate_weight, up_weight) -> bool: whether the device runs this pair as one product."""
    ops = _copy_ops(graph)
    consumers = _consumers(ops)
    producer = {op.out: op for op in ops if op.out is not None}
    dropped: set[int] = set()
    for op in ops:
        if op.kind != "swiglu":
            continue
        g, u = (producer.get(t) for t in op.inputs)
        if g is None or u is None or g.kind not in PRODUCTS or u.kind != g.kind or g is u:
            continue
        # plain products of one input (matmul_id: and one route), each read by the swiglu alone
        n_inputs = 3 if g.kind == "matmul_id" else 2
        plain = all(len(m.inputs) == n_inputs and not m.attrs and consumers[m.out] == [op] for m in (g, u))
        if plain and g.inputs[1:] == u.inputs[1:] and can_pair(g.inputs[0], u.inputs[0]):
            g.attrs["pair"] = u.inputs[0]
            g.out = op.out
            dropped.update((id(u), id(op)))
    return _graph_like(graph, [op for op in ops if id(op) not in dropped])


def fuse_delta_net_step(graph: Graph, can_fuse) -> Graph:
    """can_fuse(head_dim, d_conv) -> bool: whether the device runs a DeltaNet layer's one-token
    conv, delta rule and gated norm as one dispatch."""
    ops = _copy_ops(graph)
    consumers = _consumers(ops)
    producer = {op.out: op for op in ops if op.out is not None}
    dropped: set[int] = set()
    for op in ops:
        if op.kind != "gated_norm":
            continue
        rule = producer.get(op.inputs[0])
        if rule is None or rule.kind != "delta_net" or consumers[rule.out] != [op]:
            continue
        conv = producer.get(rule.inputs[0])
        if conv is None or conv.kind != "ssm_conv" or consumers[conv.out] != [rule] \
                or not can_fuse(rule.attrs["head_dim"], conv.attrs["d_conv"]):
            continue
        qkv, taps = conv.inputs
        _, alpha, beta, dt, a = rule.inputs
        _, z, w = op.inputs
        # in gated_norm's place: every input (z's product too) is made by then
        op.kind = "delta_net_step"
        op.inputs = (qkv, taps, alpha, beta, dt, a, z, w)
        op.attrs = dict(rule.attrs, channels=conv.attrs["channels"], d_conv=conv.attrs["d_conv"],
                        norm_eps=op.attrs["eps"])
        dropped.update((id(conv), id(rule)))
    return _graph_like(graph, [op for op in ops if id(op) not in dropped])


def fuse_one_token(graph: Graph, can_pair, can_rope, can_sum=lambda weight: True,
                   can_route=lambda weight: True, can_qk=lambda op: False,
                   can_fuse_gdn=lambda head_dim, d_conv: False) -> Graph | None:
    """The one-token step's graph: pairs and RoPE in the products, or Q/K norms and RoPE in the
    attention, and DeltaNet's middle in one op, where the device can, then the decode fusions; None
    where none applies (the step then takes fuse_for_matvec's graph)."""
    one = fuse_qk_norm_into_attention(fuse_rope_into_products(fuse_glu_pairs(graph, can_pair), can_rope), can_qk)
    one = fuse_delta_net_step(one, can_fuse_gdn)
    if len(one.ops) == len(graph.ops) and not any(op.attrs.get("kv_stored") for op in one.ops):
        return None
    return fuse_for_matvec(one, can_sum, can_route)


def fuse_for_matvec(graph: Graph, can_sum=lambda weight: True, can_route=lambda weight: True) -> Graph:
    """can_sum(expert weight) -> bool: whether the device's expert product can sum the slots itself;
    can_route(router weight): whether its router product can pick the experts itself."""
    ops = _copy_ops(graph)
    consumers = _consumers(ops)
    dropped: set[int] = set()

    for op in ops:
        if op.kind == "rms_norm" and len(op.inputs) == 2:
            users = consumers[op.out]
            if users and all(u.kind in PRODUCTS and u.inputs[1] is op.out for u in users):
                x, weight = op.inputs
                for u in users:
                    u.inputs = (u.inputs[0], x) + u.inputs[2:]
                    u.attrs.update(norm=weight, eps=op.attrs["eps"])
                dropped.add(id(op))
        elif op.kind == "swiglu":
            users = consumers[op.out]
            if len(users) == 1 and users[0].kind in PRODUCTS and users[0].inputs[1] is op.out \
                    and "norm" not in users[0].attrs:
                gate, up = op.inputs
                u = users[0]
                u.inputs = (u.inputs[0], gate) + u.inputs[2:]
                u.attrs["glu"] = up
                dropped.add(id(op))
        elif op.kind == "moe_route":
            logits = op.inputs[0]
            producer = next((p for p in ops if p.out is logits and p.kind == "matmul"), None)
            if producer is not None and consumers[logits] == [op] and len(producer.inputs) == 2 \
                    and can_route(producer.inputs[0]):
                producer.attrs["route"] = dict(op.attrs)
                producer.out = op.out
                dropped.add(id(op))
        elif op.kind == "moe_sum":
            y, route = op.inputs
            producer = next((p for p in ops if p.out is y and p.kind == "matmul_id"), None)
            if producer is not None and consumers[y] == [op] and producer.inputs[2] is route \
                    and can_sum(producer.inputs[0]):
                producer.attrs["sum"] = True
                producer.out = op.out
                dropped.add(id(op))
        elif op.kind == "add":
            a, b = op.inputs
            producer = next((p for p in ops if p.out is b and (p.kind == "matmul" or p.attrs.get("sum"))), None)
            if producer is not None and len(consumers[b]) == 1 and producer.out is not graph.logits:
                producer.attrs["residual"] = a
                producer.out = op.out
                dropped.add(id(op))

    return _graph_like(graph, [op for op in ops if id(op) not in dropped])
