"""-sm tensor: Megatron-style tensor parallelism.

Q/K/V and gate/up are split by output rows, attention output and down by input columns, so each
device computes its heads' attention and its slice of the FFN with no communication, and sums its
partial products with the others twice per layer (after attention, after the FFN). Heads go in
whole KV-head groups (GQA: a group's query heads stay with their K/V head), and the KV cache is
split with them. Norms and the embedding are mirrored; the output matrix is split by vocabulary
and the host assembles the logits. A device may get no heads (more devices than KV heads) or no
FFN columns: it then contributes no partial to that sum.

A mixture of experts is split like the dense FFN, expert by expert: every device holds the same
rows of every expert's gate/up and the same columns of its down matrix (and a slice of the shared
expert, where there is one). The router is mirrored, so each device picks the same experts; the
weighted sum of the slots is linear, so each device sums its partials and the one all-reduce per
layer comes after it, not once per expert.

Gated DeltaNet layers (qwen35) are split by key heads like attention by KV heads: a device holds key
heads [a, b) and the value heads that read them (value head h reads key head h % Hk, so those are the
ranges j Hk + [a, b), j < Hv / Hk: gathered parts, Tensor.gathered), with their rows of the q|k|v,
gate, beta and alpha products, their convolution channels, dt and A, and their recurrent state; the
output product is split by those columns and summed like attention's. The gated attention's Q
product has [q | gate] per head: its rows go by whole heads of 2 x head_dim.

A mixture of experts can mirror its attention instead (LLAMAVK_MOE_MIRROR=1; the default is SPEC §5's
split by heads as above): every device holds all of Q/K/V/O, the whole KV cache, and runs the attention and
the output product in full, and likewise the whole Gated DeltaNet block (q|k|v, gate, beta, alpha,
convolution, delta rule, gated norm, ssm_out) with its recurrent state. Only the experts (and the
shared expert) stay split, so a layer has one all-reduce (after the weighted expert sum) instead of
two. Why: an MoE decode step is latency-bound (a layer's dependent stages take ~70 us on an H200
against ~11 us of weight reads), so halving each device's attention reads saves little, while an
all-reduce through host memory costs ~10-15 us; the attention is a small part of the weights (the
30B-A3B's ~510 MB of 17 GB), so holding it everywhere costs little memory. With the output product
whole, a device's router reads a product's output rather than a sum, and is folded into that product
as on one device (fusion.py). Dense models keep the split by heads: their attention is a large share
of their weight reads. Not the default: on 2 H200s it measured within -1% / +3.5% of the split by
heads (docs/PERFORMANCE.md), while it doubles each device's KV cache and DeltaNet state.

build() is shared with -sm graph (split/graph.py), which changes how the sums are made.
"""

from __future__ import annotations

import os

from .base import DeviceGraphs, partition
from .exchange import all_reduce

# q, k, v, gate, up (and the experts' and shared expert's) are split by output rows; these by input
# columns, giving partial sums; the router is mirrored; the output matrix is split by vocabulary:
ROW_PARALLEL = {"o", "down", "down_exps", "down_shexp", "ssm_out"}
MIRRORED = {"router"}
DELTANET_OPS = ("ssm_conv", "delta_net", "gated_norm")
OUTPUT_ROLES = {"output", "token_embd"}     # token_embd: a tied output matrix (the lookup is "embed")
# The attention and DeltaNet blocks: their products and the ops between them (mirrored_attention)
ATTENTION_ROLES = {"q", "k", "v", "o", "ssm_qkv", "ssm_z", "ssm_beta", "ssm_alpha", "ssm_out"}
ATTENTION_OPS = {"rope", "head_norm", "attention", "attn_gate", *DELTANET_OPS}
ENV_MOE_MIRROR = "LLAMAVK_MOE_MIRROR"


def mirrored_attention(cfg) -> bool:
    """Every device runs the whole attention (and DeltaNet) block: mixtures of experts where
    LLAMAVK_MOE_MIRROR=1 asks for it (module doc)."""
    return bool(cfg.n_expert) and os.environ.get(ENV_MOE_MIRROR, "0") == "1"


def plan(graph, shares: list[float], opts, blocks=None) -> DeviceGraphs:
    return build(graph, shares, blocks or {}, ring=False, dtype="f32")


def build(graph, shares: list[float], blocks: dict, ring: bool, dtype: str) -> DeviceGraphs:
    """blocks: role -> block size of that weight's type (column cuts of o/down prefer block edges)."""
    cfg = graph.config
    n = len(shares)
    D, group = cfg.head_dim, cfg.n_head // cfg.n_head_kv
    dg = DeviceGraphs(graph, n)
    devices = list(range(n))
    mirror = mirrored_attention(cfg)
    kv = partition(cfg.n_head_kv, shares)                         # KV-head groups per device
    ff_block = blocks.get("down", 32)
    ff = partition(cfg.n_ff, shares, ff_block if cfg.n_ff // ff_block >= n else 32)
    vocab = partition(cfg.n_vocab, shares)

    def ffn_parts(width, block_role):
        block = blocks.get(block_role, 32)
        return partition(width, shares, block if width // block >= n else 32)

    exp = ffn_parts(cfg.n_ff_exp, "down_exps") if cfg.n_expert else []
    shexp = ffn_parts(cfg.n_ff_shexp, "down_shexp") if cfg.n_ff_shexp else []
    qd = 2 * D if cfg.attn_output_gate else D                     # Q rows per head ([q | gate])
    rows_of = {                                                   # role -> device -> output rows
        "q": [(a * group * qd, b * group * qd) for a, b in kv],
        "k": [(a * D, b * D) for a, b in kv], "v": [(a * D, b * D) for a, b in kv],
        "gate": ff, "up": ff, "gate_exps": exp, "up_exps": exp, "gate_shexp": shexp, "up_shexp": shexp,
        "o": [(a * group * D, b * group * D) for a, b in kv], "down": ff,   # input columns
        "down_exps": exp, "down_shexp": shexp,
    }
    kh = partition(cfg.ssm_n_group, shares) if cfg.recurrent_layers else [(0, 0)] * n
    if cfg.recurrent_layers:
        rows_of.update(deltanet_parts(cfg, kh))
    role = {}                        # model activation -> role of the product that made it
    partial = {}                     # model activation -> {device: partial sum or None}
    for op in graph.ops:
        k = op.kind
        if any(t in partial for t in op.inputs) and not (k in ("moe_sum", "scale_sigmoid", "add", "add_id")):
            # a partial sum read by an op that is not linear in it (gemma3's norm after attention /
            # the FFN, before the residual add): summed first, in the same one exchange per block
            for t in [t for t in op.inputs if t in partial]:
                out = all_reduce(dg, partial.pop(t), {d: None for d in devices}, t.width, op.layer,
                                 ring=ring, dtype=dtype)
                for d, full in out.items():
                    dg.bind(d, t, full)
        if k == "matmul" and op.inputs[0].role in OUTPUT_ROLES:
            w = op.inputs[0]
            for d, (r0, r1) in enumerate(vocab):
                if r1 > r0:
                    dg.bind(d, op.out, dg.emit(d, "matmul", [w.sliced(0, r0, r1), dg.tensor(d, op.inputs[1])],
                                               r1 - r0, op.layer))
            dg.logits_parts = [(d, r0, r1) for d, (r0, r1) in enumerate(vocab) if r1 > r0]
        elif k == "softcap":                         # in place on each device's part of the logits
            for d, (r0, r1) in enumerate(vocab):
                if r1 > r0:
                    dg.emit(d, k, [dg.tensor(d, op.inputs[0])], None, op.layer, **op.attrs)
        elif k == "matmul" and op.inputs[0].role in MIRRORED:
            for d in devices:
                dg.place(d, op)
        elif mirror and (k in ATTENTION_OPS or (k == "matmul" and op.inputs[0].role in ATTENTION_ROLES)):
            for d in devices:                        # as on one device: whole weights, all heads
                dg.place(d, op)
        elif k in ("matmul", "matmul_id"):
            w, x = op.inputs[0], op.inputs[1]
            extra = list(op.inputs[2:])                   # matmul: a bias; matmul_id: the route
            parts = [ranges_of(p) for p in rows_of[w.role]]
            role[op.out] = w.role
            if w.role in ROW_PARALLEL:
                partial[op.out] = {}
            slots = op.inputs[2].width // 2 if k == "matmul_id" else 1
            for d, rs in enumerate(parts):
                if not rs or not dg.has(d, x):
                    if w.role in ROW_PARALLEL:
                        partial[op.out][d] = None
                    continue
                if k == "matmul_id":
                    extra_d = [dg.tensor(d, extra[0])]
                elif w.role in ROW_PARALLEL:      # a bias of the sum (gpt-oss's O): on one device's partial
                    extra_d = extra if extra and d == first_part(parts) else []
                else:
                    extra_d = [extra[0].gathered(0, rs)] if extra else []
                if w.role in ROW_PARALLEL:
                    partial[op.out][d] = dg.emit(d, k, [w.gathered(1, rs), dg.tensor(d, x)] + extra_d,
                                                 op.out.width, op.layer)
                else:
                    dg.bind(d, op.out, dg.emit(d, k, [w.gathered(0, rs), dg.tensor(d, x)] + extra_d,
                                               slots * sum(b - a for a, b in rs), op.layer))
        elif k == "add_id" and op.inputs[0] in partial:
            # a bias of each slot's sum (gpt-oss's down_exps): on one device's partial
            ps = partial[op.inputs[0]]
            one = min(d for d, p in ps.items() if p is not None)
            partial[op.out] = {d: dg.emit(d, k, [p] + [dg.tensor(d, t) for t in op.inputs[1:]], op.out.width, op.layer)
                               if d == one else p for d, p in ps.items()}
        elif k == "add_id":                          # per-expert biases of the device's expert rows
            y, bias, route = op.inputs
            n_used = route.width // 2
            F = y.width // n_used
            for d in devices:
                if dg.has(d, y):
                    rs = ranges_of(rows_of[role[y]][d])
                    b = bias.gathered(0, [(e * F + a, e * F + c) for e in range(bias.width // F) for a, c in rs])
                    dg.place(d, op, inputs=[dg.tensor(d, y), b, dg.tensor(d, route)])
            role[op.out] = role[y]
        elif k in ("moe_sum", "scale_sigmoid") and op.inputs[0] in partial:
            # linear in the partial expert outputs: each device's partial of the sum (or gated sum)
            partial[op.out] = {d: dg.emit(d, k, [p] + [dg.tensor(d, t) for t in op.inputs[1:]], op.out.width,
                                          op.layer, **op.attrs)
                               if p is not None else None for d, p in partial[op.inputs[0]].items()}
        elif k == "add" and op.inputs[0] in partial and op.inputs[1] in partial:
            # two partials (the experts' and the shared expert's): their sum is still one
            pa, pb = partial[op.inputs[0]], partial[op.inputs[1]]
            partial[op.out] = {d: dg.emit(d, "add", [pa[d], pb[d]], op.out.width, op.layer)
                               if pa[d] is not None and pb[d] is not None else pa[d] or pb[d] for d in devices}
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
                    sinks = {"sinks": op.attrs["sinks"].gathered(0, [(a * group, b * group)])} \
                        if "sinks" in op.attrs else {}
                    dg.place(d, op, n_head=(b - a) * group, n_head_kv=b - a, **sinks)
        elif k == "attn_gate":                       # the device's query heads
            for d, (a, b) in enumerate(kv):
                if b > a and dg.has(d, op.inputs[0]):
                    dg.place(d, op, n_heads=(b - a) * group)
        elif k in DELTANET_OPS:                      # the device's key heads and their value heads
            place_deltanet(dg, cfg, op, kh)
        elif k in ("swiglu", "geglu", "swiglu_oai"):  # where the device holds a part of the FFN
            for d in devices:
                if dg.has(d, op.inputs[0]):
                    dg.place(d, op)
        else:                                        # embed, norms, last_row: mirrored
            for d in devices:
                dg.place(d, op)
    for d in devices:
        (h0, h1), (f0, f1), (v0, v1) = kv[d], ff[d], vocab[d]
        ffn = f"FFN columns {f0}-{f1 - 1}" if f1 > f0 else "no FFN columns"
        if cfg.n_expert:
            e0, e1 = exp[d]
            ffn = f"columns {e0}-{e1 - 1} of every expert" if e1 > e0 else "no expert columns"
        heads = [f"KV heads {h0}-{h1 - 1}" if h1 > h0 else "no heads"]
        if mirror:
            heads = ["attention mirrored (all heads, the whole KV cache)"]
            if cfg.recurrent_layers:
                heads.append("DeltaNet mirrored (all heads and their state)")
        elif cfg.recurrent_layers:
            k0, k1 = kh[d]
            heads.append(f"DeltaNet key heads {k0}-{k1 - 1} (and their state)" if k1 > k0 else "no DeltaNet heads")
        dg.holds[d] = heads + [ffn, f"vocab {v0}-{v1 - 1}" if v1 > v0 else "no vocab rows"]
        if vocab[d][1] > vocab[d][0]:
            dg.set_logits(d, dg.tensor(d, graph.logits))
    return dg


def first_part(parts) -> int:
    """The first device with a part of a split weight (the one that adds a bias of the sum)."""
    return next(d for d, rs in enumerate(parts) if rs)


def ranges_of(part) -> list[tuple[int, int]]:
    """A device's part of a weight axis: (start, stop), or a list of such ranges; empty ones dropped."""
    rs = [part] if isinstance(part, tuple) else list(part)
    return [(a, b) for a, b in rs if b > a]


def value_heads(cfg, a: int, b: int) -> list[tuple[int, int]]:
    """The value heads that read key heads [a, b): j Hk + [a, b) for every j (llama.cpp's tiled order),
    or r [a, b) where a key head's r value heads lie side by side (qwen3next: cfg.ssm_grouped)."""
    Hk = cfg.ssm_n_group
    if b <= a:
        return []
    if cfg.ssm_grouped:
        r = cfg.ssm_dt_rank // Hk
        return [(r * a, r * b)]
    return [(j * Hk + a, j * Hk + b) for j in range(cfg.ssm_dt_rank // Hk)]


def deltanet_parts(cfg, kh) -> dict:
    """role -> device -> its ranges of a DeltaNet weight's rows (ssm_out: columns), for key heads kh."""
    D, Hk = cfg.ssm_d_state, cfg.ssm_n_group
    qkv, z, heads = [], [], []
    for a, b in kh:
        vh = value_heads(cfg, a, b)
        heads.append(vh)
        z.append([(h0 * D, h1 * D) for h0, h1 in vh])
        qkv.append(([(a * D, b * D), ((Hk + a) * D, (Hk + b) * D)] if b > a else [])
                   + [((2 * Hk + h0) * D, (2 * Hk + h1) * D) for h0, h1 in vh])
    return {"ssm_qkv": qkv, "ssm_z": z, "ssm_beta": heads, "ssm_alpha": heads, "ssm_out": z}


def place_deltanet(dg, cfg, op, kh) -> None:
    """ssm_conv, delta_net, gated_norm on each device holding key heads, on its channels and heads."""
    K = cfg.ssm_d_conv
    parts = deltanet_parts(cfg, kh)
    for d, (a, b) in enumerate(kh):
        if b <= a or not dg.has(d, op.inputs[0]):
            continue
        n_v = cfg.ssm_dt_rank // cfg.ssm_n_group * (b - a)
        if op.kind == "ssm_conv":
            channels = parts["ssm_qkv"][d]
            taps = op.inputs[1].gathered(0, [(c0 * K, c1 * K) for c0, c1 in channels])
            dg.place(d, op, inputs=[dg.tensor(d, op.inputs[0]), taps],
                     channels=sum(c1 - c0 for c0, c1 in channels))
        elif op.kind == "delta_net":
            x, alpha, beta, dt, a_ = op.inputs
            heads = parts["ssm_beta"][d]
            dg.place(d, op, inputs=[dg.tensor(d, x), dg.tensor(d, alpha), dg.tensor(d, beta), dt.gathered(0, heads),
                                    a_.gathered(0, heads)], n_k_heads=b - a, n_v_heads=n_v)
        else:
            dg.place(d, op, n_heads=n_v)
