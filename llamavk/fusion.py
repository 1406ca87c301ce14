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
- `add_id(matmul_id(...), b)`            -> the expert product adds each slot's expert bias (attr bias);
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

`fuse_glu_pairs` (one-token steps, before `fuse_for_matvec`, where the device's one-token kernel can):
`swiglu(matmul(Wg, h), matmul(Wu, h))` becomes one matmul of Wg with attr pair=Wu that writes
silu(Wg h) * (Wu h) itself: one dispatch for gate and up, and the down product then reads one plain
vector instead of computing silu(gate) * up from two. The same for a mixture of experts' gate and up
(`matmul_id` over one route).

gpt-oss's pair: `swiglu_oai(add_id(matmul_id(Wg, h), bg), add_id(matmul_id(Wu, h), bu))` likewise
becomes one matmul_id with attrs pair, bias, pair_bias and oai (swiglu_oai's alpha and limit).

`fuse_shared_expert` (one-token steps, after `fuse_glu_pairs`, where the device's expert kernels can):
a mixture of experts with a shared expert, gated (qwen35moe) or not (glm4moe), computes
    out = sum_k w_k * expert_k(h) + sigmoid(w_gate . h) * shared(h)     (or + shared(h))
as router, gate/up pair, down + sum, and beside them the shared gate/up, its down, scale_sigmoid
and an add: the norm h feeds five ops, so it cannot fold into the products, and the shared branch
adds dependent stages. The shared expert becomes one more slot of the routed products instead: the
router writes sigmoid(w_gate . h) as the weight of slot n_used (attr shexp_gate; ungated: 1, attr
shexp_one; route rows one slot wider), the gate/up pair computes the shared slot too (attrs shexp,
shexp_pair: its matrices; output per token: the routed slots' rows, then the shared slot's), and the
down product sums all slots (attrs sum, shexp). `fuse_for_matvec` then folds the norm into router
and pair and the residual add into the down product: 3 dependent stages for the FFN instead of 6-7.

`fuse_router_into_products` (one-token steps, after `fuse_for_matvec`, where the device's kernel can):
a router picking the experts itself (attr route) whose input x is written by a product (the output
projection + residual; qwen35moe's DeltaNet output product likewise) goes into that product: the
router's logits are linear in x, so the product's workgroups add the router's terms of the rows of x
they write, and the last of them picks the experts (matvec_stream.comp ROUTER). The product gets attr
router (the router's weight, route attrs, norm, eps, shared-expert gate) and attr route_out, the
route tensor it now writes besides x (graph.WRITTEN_ATTRS); the router op goes: one dependent stage
fewer per MoE layer.
"""

from __future__ import annotations

from collections import defaultdict

from .graph import Graph, Op, Tensor

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
    ops, consumers, producer = _rewrite_state(graph)
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


def _rewrite_state(graph: Graph):
    """A pass's working state: a copy of the graph's ops, each tensor's readers and its producer."""
    ops = _copy_ops(graph)
    return ops, _consumers(ops), {op.out: op for op in ops if op.out is not None}


def _consumers(ops):
    consumers = defaultdict(list)
    for op in ops:
        for t in op.reads():
            consumers[t].append(op)
    return consumers


def fuse_rope_into_products(graph: Graph, can_fuse) -> Graph:
    """can_fuse(weight) -> bool: whether the device's one-token product of that weight can do it."""
    ops, consumers, producer = _rewrite_state(graph)
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


def fuse_glu_pairs(graph: Graph, can_pair) -> Graph:
    """can_pair(gate_weight, up_weight) -> bool: whether the device runs this pair as one product."""
    ops, consumers, producer = _rewrite_state(graph)
    dropped: set[int] = set()
    for op in ops:
        if op.kind == "swiglu_oai":
            _fuse_oai_pair(op, consumers, producer, can_pair, dropped)
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


def _fuse_oai_pair(op, consumers, producer, can_pair, dropped) -> None:
    """gpt-oss: swiglu_oai(add_id(matmul_id(Wg, h), bg), add_id(matmul_id(Wu, h), bu)) -> one matmul_id
    of Wg with attrs pair=Wu, bias=bg, pair_bias=bu, oai=(alpha, limit) writing the unit itself."""
    adds = [producer.get(t) for t in op.inputs]
    if not all(a is not None and a.kind == "add_id" and consumers[a.out] == [op] for a in adds):
        return
    g, u = (producer.get(a.inputs[0]) for a in adds)
    if g is None or u is None or g is u or not all(
            m.kind == "matmul_id" and len(m.inputs) == 3 and not m.attrs and consumers[m.out] == [a]
            for m, a in zip((g, u), adds)):
        return
    route = g.inputs[2]
    if g.inputs[1:] != u.inputs[1:] or any(a.inputs[2] is not route for a in adds) \
            or not can_pair(g.inputs[0], u.inputs[0]):
        return
    g.attrs.update(pair=u.inputs[0], bias=adds[0].inputs[1], pair_bias=adds[1].inputs[1],
                   oai=(op.attrs["alpha"], op.attrs["limit"]))
    g.out = op.out
    dropped.update((id(u), id(op), *(id(a) for a in adds)))


def fuse_delta_net_step(graph: Graph, can_fuse) -> Graph:
    """can_fuse(head_dim, d_conv) -> bool: whether the device runs a DeltaNet layer's one-token
    conv, delta rule and gated norm as one dispatch."""
    ops, consumers, producer = _rewrite_state(graph)
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


def fuse_shared_expert(graph: Graph, can_fuse) -> Graph:
    """can_fuse(router, gate_exps, up_exps, down_exps, gate_shexp, up_shexp, down_shexp) -> bool:
    whether the device's router and expert products can take the shared expert as a slot. Only the
    exact shape moe_ffn builds (each intermediate read by the next op alone) is rewritten; anything
    else (e.g. a split mode's exchange ops in between) keeps its ops."""
    ops, consumers, producer = _rewrite_state(graph)
    dropped: set[int] = set()

    def only(t, kind, user, n_inputs=2, attrs=()):
        """The op of `kind` producing t, read by `user` alone, with n_inputs and exactly `attrs`."""
        p = producer.get(t)
        ok = p is not None and p.kind == kind and consumers[t] == [user] and len(p.inputs) == n_inputs \
            and set(p.attrs) == set(attrs)
        return p if ok else None

    for add in ops:
        if add.kind != "add" or id(add) in dropped or add.inputs[0] is add.inputs[1]:
            continue
        # the shared expert's output: gated (scale_sigmoid of its down product) or not (glm4moe)
        side = [p for p in map(producer.get, add.inputs) if p is not None and p.kind in ("scale_sigmoid", "matmul")]
        ss = next((p for p in side if p.kind == "scale_sigmoid"), None)
        if ss is not None:
            y_sh, h, w_gate = ss.inputs
            down_sh = only(y_sh, "matmul", ss)
            shared_out = ss.out
        else:
            down_sh = next((p for p in side if len(p.inputs) == 2 and not p.attrs), None)
            y_sh, w_gate = (down_sh.out, None) if down_sh is not None else (None, None)
            shared_out = y_sh
        if down_sh is None or consumers[shared_out] != [add]:
            continue
        m = add.inputs[1] if add.inputs[0] is shared_out else add.inputs[0]
        msum = only(m, "moe_sum", add)
        if msum is None:
            continue
        # the shared gate/up: one paired product, or two products and their swiglu
        gu = only(down_sh.inputs[1], "matmul", down_sh, attrs=("pair",))
        if gu is not None:
            gate_sh, up_sh = gu.inputs[0], gu.attrs["pair"]
            shared_ops = [down_sh, gu]
            shared_inputs = [gu.inputs[1]]
        else:
            act = only(down_sh.inputs[1], "swiglu", down_sh, attrs=())
            g = act and only(act.inputs[0], "matmul", act)
            u = act and only(act.inputs[1], "matmul", act)
            if not (g and u) or g is u:
                continue
            gate_sh, up_sh = g.inputs[0], u.inputs[0]
            shared_ops = [down_sh, act, g, u]
            shared_inputs = [g.inputs[1], u.inputs[1]]
        d, route = msum.inputs
        down = only(d, "matmul_id", msum, 3)
        pair = down and only(down.inputs[1], "matmul_id", down, 3, ("pair",))
        mr = producer.get(route)
        if not (down and pair) or mr is None or mr.kind != "moe_route" or down.inputs[2] is not route \
                or pair.inputs[2] is not route or sorted(map(id, consumers[route])) != sorted(map(id, (pair, down, msum))):
            continue
        router = only(mr.inputs[0], "matmul", mr, attrs=())
        h = pair.inputs[1]
        if router is None or any(t is not h for t in [router.inputs[1], pair.inputs[1]] + shared_inputs) \
                or (ss is not None and ss.inputs[1] is not h):
            continue
        if not can_fuse(router.inputs[0], pair.inputs[0], pair.attrs["pair"], down.inputs[0], gate_sh, up_sh,
                        down_sh.inputs[0]):
            continue
        wide_route = Tensor(f"{route.name}+shexp", route.width + 2, layer=route.layer)
        router.attrs["route"] = dict(mr.attrs)
        if w_gate is not None:
            router.attrs["shexp_gate"] = w_gate
        else:
            router.attrs["shexp_one"] = True          # the shared slot's weight is 1
        router.out = wide_route
        wide_act = Tensor(f"{pair.out.name}+shexp", pair.out.width + gate_sh.rows, layer=pair.out.layer)
        pair.inputs = pair.inputs[:2] + (wide_route,)
        pair.attrs.update(shexp=gate_sh, shexp_pair=up_sh)
        pair.out = wide_act
        down.inputs = (down.inputs[0], wide_act, wide_route)
        down.attrs.update(sum=True, shexp=down_sh.inputs[0])
        down.out = add.out
        dropped.update(id(o) for o in shared_ops + [mr, msum, add] + ([ss] if ss is not None else []))
    return _graph_like(graph, [op for op in ops if id(op) not in dropped])


def fuse_one_token(graph: Graph, can_pair, can_rope, can_sum=lambda weight: True,
                   can_route=lambda weight: True, can_fuse_gdn=lambda head_dim, d_conv: False,
                   can_shexp=lambda *weights: False,
                   can_fold_router=lambda product, router, n_used, shexp, **kw: False) -> Graph | None:
    """The one-token step's graph: pairs, RoPE and a shared expert in the products and DeltaNet's
    middle in one op, where the device can, then the decode fusions and routers in the products
    writing their inputs; None where none applies (the step then takes fuse_for_matvec's graph)."""
    one = fuse_rope_into_products(fuse_glu_pairs(graph, can_pair), can_rope)
    one = fuse_shared_expert(fuse_delta_net_step(one, can_fuse_gdn), can_shexp)
    changed = len(one.ops) != len(graph.ops) or any(op.attrs.get("kv_stored") for op in one.ops)
    decode = fuse_for_matvec(one, can_sum, can_route)
    folded = fuse_router_into_products(decode, can_fold_router)
    return folded if changed or len(folded.ops) != len(decode.ops) else None


def fuse_router_into_products(graph: Graph, can_fold) -> Graph:
    """can_fold(product weight, router weight, n_used, shexp[, sel_bias]) -> bool: whether the device's
    one-token product of that weight can compute that router (n_used experts per token; shexp: with a
    shared expert's gate; sel_bias: with a bias per expert in the pick, glm4moe) from the rows it writes."""
    ops, consumers, producer = _rewrite_state(graph)
    dropped: set[int] = set()
    for op in ops:
        if op.kind != "matmul" or "route" not in op.attrs:   # a router (with its bias: gpt-oss)
            continue
        x = op.inputs[1]
        prod = producer.get(x)
        if prod is None or prod.kind != "matmul" or prod.out is graph.logits \
                or any(k in prod.attrs for k in ("pair", "rope", "route", "router")):
            continue
        a = op.attrs
        sel = {"sel_bias": True} if "sel_bias" in a["route"] else {}
        if not can_fold(prod.inputs[0], op.inputs[0], a["route"]["n_used"], "shexp_gate" in a, **sel):
            continue
        prod.attrs["router"] = dict(weight=op.inputs[0], route=a["route"], norm=a.get("norm"),
                                    eps=a.get("eps", 0.0), shexp_gate=a.get("shexp_gate"),
                                    shexp_one=a.get("shexp_one", False),
                                    bias=op.inputs[2] if len(op.inputs) > 2 else None)
        prod.attrs["route_out"] = op.out
        dropped.add(id(op))
    return _graph_like(graph, [op for op in ops if id(op) not in dropped])


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
            if producer is not None and consumers[logits] == [op] and len(producer.inputs) in (2, 3) \
                    and can_route(producer.inputs[0]):
                producer.attrs["route"] = dict(op.attrs)     # a bias (gpt-oss): the router adds it
                producer.out = op.out
                dropped.add(id(op))
        elif op.kind == "add_id":
            y, bias, route = op.inputs
            producer = next((p for p in ops if p.out is y and p.kind == "matmul_id"), None)
            if producer is not None and consumers[y] == [op] and producer.inputs[2] is route \
                    and not {"bias", "sum", "shexp"} & set(producer.attrs):
                producer.attrs["bias"] = bias       # gpt-oss: each slot's expert bias, in the product
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
            # (a product adding one residual already, e.g. glm4moe's ungated shared expert adding the
            # routed experts' sum, keeps it: the outer add stays)
            if producer is not None and len(consumers[b]) == 1 and producer.out is not graph.logits \
                    and "residual" not in producer.attrs:
                producer.attrs["residual"] = a
                producer.out = op.out
                dropped.add(id(op))

    return _graph_like(graph, [op for op in ops if id(op) not in dropped])
