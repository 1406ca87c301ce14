"""Mixture-of-experts recorders: the router's choice, the products with the chosen experts, their
weighted sum, and the shared expert's gate (shaders/moe_*.comp, matvec_id.comp, matmul.comp
MUL_MAT_ID, scale_sigmoid.comp).

A route tensor holds per token the n_used chosen expert ids (uint32 bits) and then their n_used
weights. Expert ids never leave the GPU: the products read them there.

- the router (decode): its product and the top-k in one dispatch, `moe_router.comp`; else the
  product (kernels/matmul.py) and `moe_route.comp`.
- a shared expert as one more slot (one-token steps of qwen35moe, fusion.fuse_shared_expert): the
  router writes its gate sigmoid(w_shexp . x') as the weight of slot n_used (route rows of n_used + 1
  slots), the gate/up pair and the summing down product take its matrices, bound apart, as their
  last slot (matvec_id.comp SHEXP). `shexp_slot_ok` says where the kernels can.
- one to MATVEC_MAX_TOKENS tokens (decode): `matvec_id.comp`, a grid of (row blocks, token x slot);
  each workgroup reads its slot's expert id and only that expert's rows. With `sum`, the down
  product adds the weighted slots (and the residual) itself: (row blocks, token) workgroups, each
  taking its rows of every slot.
- more tokens (prompts): `moe_group.comp` lists, per expert, the (token, slot) pairs that chose it
  (in a scratch buffer of the device); `matmul.comp` MUL_MAT_ID then multiplies each expert's tile
  of rows with its listed tokens only (workgroups past an expert's count return at once).
"""

from __future__ import annotations

import os
import struct
from dataclasses import dataclass

import numpy as np

from ..errors import LlamavkError
from ..vk import Buffer
from . import KernelCache, QWeight, View, filled_buffer, groups_2d
from .matmul import (MATMUL_TILES, MATVEC_MAX_TOKENS, MATVEC_STREAM_TABLE_BYTES, _check_view, f16_copy,
                     matvec_router_ok, tile_kernel, type_suffix)
from .selection import moe_product_kernel

# prompt kernels (selection.moe_product_kernel): name prefix -> (rows, tokens) per workgroup tile
MOE_TILES = {"mul_mm_id": MATMUL_TILES["mul_mm"], "mul_mm_coop_id": (128, 64)}
# The types whose cooperative-matrix expert tiles read x as f16 (shaders/variants_matmul.py _X_F16):
# Q4_K's kernel then holds 168 registers a thread instead of 176, 3 workgroups an SM on NVIDIA instead
# of 2 (H200 30B-A3B pp512 9,457 -> 10,727 with the conversion); Q4_0 (3 either way) loses the
# conversion's 1.5%, as IQ4_XS (165 -> 162: 10,916 -> 10,749). MXFP4's 32-row subgroup parts gain
# 1.4% with it (gpt-oss-20b pp512 9,623 -> 9,755, two calls); the other 32-row types lose 0.5-1%.
COOP_ID_X_F16 = {"q4_k", "mxfp4"}
ROUTER_WG = 256       # moe_router.comp: one workgroup per (expert, token), the row over all its threads
MATVEC_ID_WG = 128
# weight loads (16 bytes) a lane of matvec_id.comp issues before its arithmetic. H100, 30B-A3B's
# experts alone (benchmarks/bench_matvec_id.py, µs per dispatch): gate/up pair 25.1 at 8 loads (32
# lanes x 2 units x 2 rows) -> 16.7 at 16 (4 rows); down 19.1 at 6 (8 x 3 x 2) -> 13.4 at 12 (8 x 3 x
# 4). Yet in the model's decode step 16 loses: tg128 261.8 at 8 against 244.8-253.9 at 16 (same
# call). So 8. LLAMAVK_MVID=loads,wg overrides (A/B).
MATVEC_ID_LOADS = 8
MATVEC_ID_LOADS_3UNITS = 12  # whole subgroups on rows of 3 units a lane: this many (matvec_id_split)
MATVEC_ID_RED = 2048    # matvec_id.comp RED at most: slots x rows of a SUM workgroup
MATVEC_ID_STAGE_MAX = 49152   # bytes of x' a matvec_id.comp workgroup stages at most (XS)
# threads of a SUM workgroup at least (matvec_id_sum_sps): gpt-oss's down experts (4 slots of 2880, 46
# KiB of x rows) as 2 subgroups a slot, x staged: H200, gpt-oss-20b MXFP4 tg128, one call, 303.3 /
# 301.2 -> 350.9 (4 a slot 347.4 / 347.0; 4 a slot unstaged 299.2, staged with one a slot 305.6)
MATVEC_ID_SUM_THREADS = 256
GROUP_PAD = 256     # words after the group lists: a tile's tail may read (not use) past the last list


def route(seq, kc: KernelCache, logits: View, out: View, n_tokens: int, n_expert: int, n_used: int,
          gating: str, norm: bool, scale: float, sel_bias: View | None = None) -> None:
    """out[t] = the n_used most probable experts' ids and weights from the router's logits[t]
    (sel_bias, f32 per expert: the pick ranks probability + sel_bias, glm4moe)."""
    if n_tokens <= 0:
        return
    _check_view(logits, 4 * n_tokens * n_expert, "moe_route logits")
    _check_view(out, 8 * n_tokens * n_used, "moe_route out")
    if sel_bias is not None:
        _check_view(sel_bias, 4 * n_expert, "moe_route selection bias")
    sg = kc.info.subgroup_size or 32
    kernel = kc.get("moe_route_f32", "rwr", push_size=24, spec=(sg, sel_bias is not None))
    push = struct.pack("<5If", n_tokens, n_expert, n_used, gating == "sigmoid", bool(norm), scale)
    seq.dispatch(kernel, [logits.range, out.range, (sel_bias or logits).range], groups_2d(n_tokens), push)


ROUTER_TYPES = ("f32", "f16", "bf16")


def router_ok(w: QWeight) -> bool:
    """Whether the router product and its top-k can be one dispatch (moe_router.comp): a float
    matrix in one buffer."""
    return type_suffix(w.qtype) in ROUTER_TYPES and len(w.chunks) == 1 and not w.experts


def router(seq, kc: KernelCache, w: QWeight, x: View, out: View, n_tokens: int, n_used: int, gating: str,
           norm: bool, scale: float, norm_w: View | None = None, eps: float = 0.0, wait=None,
           shexp: View | None = None, bias: View | None = None, sel_bias: View | None = None,
           shexp_one: bool = False) -> None:
    """out[t] = the route of token t from its router logits W x'[t] (+ bias: f32 per expert; x' =
    rms_norm(x[t]) * norm_w where given), product and top-k in one dispatch: n_tokens <=
    MATVEC_MAX_TOKENS (decode). wait (a chain.Wait, one token): recorded without a barrier after the
    product writing x. shexp (the shared expert's gate vector, f32): the route gets slot n_used with
    weight sigmoid(shexp . x'[t]); shexp_one (an ungated shared expert, glm4moe): slot n_used with weight
    1. sel_bias (f32 per expert): the pick ranks probability + sel_bias."""
    if n_tokens <= 0:
        return
    if not router_ok(w) or n_tokens > MATVEC_MAX_TOKENS:
        raise LlamavkError("moe router: a float matrix in one buffer and at most "
                           f"{MATVEC_MAX_TOKENS} tokens (else the product, then moe_route)")
    n_expert = w.rows
    _check_view(x, 4 * n_tokens * w.cols, "moe router x")
    if shexp is not None and shexp_one:
        raise LlamavkError("moe router: a shared expert is gated or not, not both")
    _check_view(out, 8 * n_tokens * (n_used + (shexp is not None or shexp_one)), "moe router out")
    if shexp is not None:
        _check_view(shexp, 4 * w.cols, "moe router shared expert gate")
    logits, counts = kc.shared("moe router", n_expert, lambda: (
        Buffer(kc.device, 4 * MATVEC_MAX_TOKENS * n_expert),
        filled_buffer(kc.device, np.zeros(MATVEC_MAX_TOKENS, np.uint32))))   # zero between runs (the kernel resets it)
    if wait is not None and n_tokens != 1:
        raise LlamavkError("moe router: chaining without a barrier takes one token")
    if bias is not None:
        _check_view(bias, 4 * n_expert, "moe router bias")
    if sel_bias is not None:
        _check_view(sel_bias, 4 * n_expert, "moe router selection bias")
    kernel = kc.get(f"moe_router_{type_suffix(w.qtype)}", "rrrwwwwrrr", push_size=36,
                    spec=(ROUTER_WG, norm_w is not None, wait is not None, shexp is not None, bias is not None,
                          sel_bias is not None, shexp_one))
    push = struct.pack("<5I2f2I", n_expert, w.cols, n_used, gating == "sigmoid", bool(norm), scale, eps,
                       wait.slot if wait else 0, wait.n if wait else 0)
    seq.dispatch(kernel, [w.chunks[0].buffer, x.range, (norm_w or x).range, out.range, logits, counts,
                          wait.counters if wait else counts, (shexp or x).range, (bias or x).range,
                          (sel_bias or x).range],
                 (n_expert + (shexp is not None), n_tokens, 1), push, chained=wait is not None)


def router_fold_mode() -> str:
    """LLAMAVK_ROUTER_FUSE (A/B): 0 keeps the router a dispatch of its own after the product writing
    its input; `late` folds it with each row block's router weights loaded after the block's
    arithmetic; `early` with its matrix loads (matvec_stream.comp REARLY); `ahead` (default) every
    block's of a workgroup with the first block's matrix loads, before a chained product's wait
    (RAHEAD; where a thread's router weights of all its blocks fit ROUTER_MAX_REGS, else `late`).
    H100, tg128, one call (two passes each): 30B-A3B off 311.4 / 321.9, early 325.9 / 335.2, late
    333.1 / 333.9; 35B-A3B off 334.6 / 328.2, early 336.7 / 336.0, late 345.3 / 344.9. Another
    call (serial tail): 30B-A3B ahead 344.8 / 345.0 against late 336.2 / 334.7; with the rank tail
    35B-A3B ahead 330.4 / 330.9 against late 326.5 / 326.4.
    -> "off", "early", "late" or "ahead"."""
    value = os.environ.get("LLAMAVK_ROUTER_FUSE", "ahead")
    if value not in ("0", "1", "early", "late", "ahead"):
        raise LlamavkError(f"LLAMAVK_ROUTER_FUSE={value!r}: 0, early, late or ahead (1: late)")
    return {"0": "off", "1": "late", "early": "early", "late": "late", "ahead": "ahead"}[value]


def router_tail_mode() -> int:
    """LLAMAVK_ROUTER_TAIL (A/B): the folded router's pick in the last workgroup (matvec_stream.comp
    RTAIL): `serial` (default) the first subgroup's RNU rounds of subgroup reductions after a softmax
    over every expert, its partials read 8 loads at a time; `rank` every thread at once, ranking the
    experts' scores (4 barriers). H100 tg128, one call, second passes (fuse late): 30B-A3B serial
    339.3 against rank 314.1, 35B-A3B 346.4 against 326.4, so `rank` stays opt-in.
    -> the shader's RTAIL (1 or 0)."""
    value = os.environ.get("LLAMAVK_ROUTER_TAIL", "serial")
    if value not in ("rank", "serial"):
        raise LlamavkError(f"LLAMAVK_ROUTER_TAIL={value!r}: rank or serial")
    return 1 if value == "rank" else 0


# matvec_stream.comp RLOADS at most (RTAIL 1): the last workgroup's vec4 loads of the partials in
# flight per thread, so that 30B-A3B's 128 partial rows (15 slices of 33 vec4 columns: 9 each) come
# in one round trip, not two; qwen35moe's (7 slices of 65: 19 each) in two of 10
ROUTER_LOADS_MAX = 12


def router_tail_loads(wg: int, columns: int, writers: int, tail: int) -> int:
    """The partials' vec4 loads in flight per thread of the last workgroup (RLOADS): the serial
    tail's 8, else a thread's share of its slice over as few rounds of at most ROUTER_LOADS_MAX as
    can be, spread evenly."""
    if tail == 0:
        return 8
    per = -(-writers // max(1, wg // -(-columns // 4)))
    rounds = -(-per // ROUTER_LOADS_MAX)
    return max(1, -(-per // rounds))


def router_fold_enabled() -> bool:
    return router_fold_mode() != "off"


def router_fold_ok(kc: KernelCache, product_w: QWeight, router_w: QWeight, n_used: int, shexp: bool,
                   sel_bias: bool = False) -> bool:
    """Whether the one-token product of product_w (writing x) can also compute the router reading x
    (FoldedRouter; matvec_stream.comp ROUTER): an f32 router matrix in one buffer over x's rows, and
    the product's kernel able to (matmul.matvec_router_ok)."""
    return (router_fold_enabled() and type_suffix(router_w.qtype) == "f32" and len(router_w.chunks) == 1
            and not router_w.experts and router_w.cols == product_w.rows and n_used <= router_w.rows
            and matvec_router_ok(kc, product_w, router_w.rows + shexp + 1, n_used, sel_bias))


@dataclass(frozen=True)
class FoldedRouter:
    """A router folded into the one-token product that writes its input x (matmul(router=...),
    fusion.fuse_router_into_products): that product's workgroups add the router's terms of the rows
    they write, the last of them picks the experts and writes the route row as router() would, so the
    router's dispatch and its dependent stage go."""
    w: QWeight              # the router matrix: f32, n_expert x the product's rows
    out: View               # the route row: n_used (+1) ids, then their weights
    n_used: int
    gating: str             # "softmax" or "sigmoid"
    norm: bool              # the chosen weights renormalized to sum 1
    scale: float
    norm_w: View | None     # the FFN norm's weights: the router reads rms_norm(x) * norm_w
    eps: float
    shexp: View | None      # a shared expert's gate vector: slot n_used, weight sigmoid(shexp . x')
    bias: View | None = None  # the router's bias (gpt-oss): added to each logit
    sel_bias: View | None = None  # the pick's bias per expert (glm4moe): ranks probability + it
    shexp_one: bool = False   # an ungated shared expert (glm4moe): slot n_used of weight 1

    @property
    def columns(self) -> int:
        """Partial sums per workgroup: a logit per expert, the shared gate's, x's sum of squares."""
        return self.w.rows + (self.shexp is not None) + 1

    def spec(self, wg: int, writers: int, ahead_fits: bool) -> tuple:
        """matvec_stream.comp's RNE, RNU, RSIG, RRENORM, RSCALE, REPS, RNORM, RSH, REARLY, RTAIL, RLOADS,
        RAHEAD for a product of `wg`-thread workgroups, `writers` of which write x (ahead_fits: a
        thread's router weights of all its row blocks fit its registers)."""
        tail, mode = router_tail_mode(), router_fold_mode()
        tail = 0 if self.sel_bias is not None else tail      # RSELB: the serial pick only
        ahead = mode == "ahead" and ahead_fits
        return (self.w.rows, self.n_used, self.gating == "sigmoid", bool(self.norm), float(self.scale),
                float(self.eps), self.norm_w is not None, self.shexp is not None, mode == "early",
                tail, router_tail_loads(wg, self.columns, writers, tail), ahead, self.bias is not None,
                self.sel_bias is not None, self.shexp_one)

    def scratch(self, kc: KernelCache, writers: int) -> tuple:
        """(partials, count) ranges: [writers][columns rounded up to 4] floats, and the count of
        workgroups done (0 between runs: the last one puts it back). One of each per device, shared
        by every layer (the recorder orders two users: both write them)."""
        nbytes = 16 * writers * -(-self.columns // 4)
        part = kc.shared("router fold partials", nbytes, lambda: Buffer(kc.device, nbytes))
        count = kc.shared("router fold count", 0, lambda: filled_buffer(kc.device, np.zeros(4, np.uint32)))
        _check_view(self.out, 4 * 2 * (self.n_used + (self.shexp is not None or self.shexp_one)),
                    "folded router route")
        if self.shexp is not None:
            _check_view(self.shexp, 4 * self.w.cols, "folded router shared expert gate")
        if self.norm_w is not None:
            _check_view(self.norm_w, 4 * self.w.cols, "folded router norm")
        if self.bias is not None:
            _check_view(self.bias, 4 * self.w.rows, "folded router bias")
        if self.sel_bias is not None:
            _check_view(self.sel_bias, 4 * self.w.rows, "folded router selection bias")
        return (part, 0, nbytes), (count, 0, 16)


def group_scratch(kc: KernelCache, n_expert: int, n_tokens: int) -> View:
    """The device's buffer of per-expert token lists (moe_group.comp), shared by every layer: the
    recorder's barriers order one layer's grouping after the previous layer's products."""
    words = n_expert * (n_tokens + 1) + GROUP_PAD
    buf = kc.shared("moe groups", n_expert, lambda: Buffer(kc.device, 4 * words), fits=lambda b: b.size >= 4 * words)
    return View(buf, 0, 4 * words)


def group(seq, kc: KernelCache, route_view: View, groups: View, n_tokens: int, n_used: int, n_expert: int) -> None:
    """groups = per expert, the count and list of (token, slot) pairs that chose it."""
    kernel = kc.get("moe_group", "rw", push_size=12)
    seq.dispatch(kernel, [route_view.range, groups.range], (n_expert, 1, 1),
                 struct.pack("<3I", n_tokens, n_used, n_expert))


# matvec_id.comp's weights per unit (a Q4_K, Q5_K or Q6_K quarter super-block: KUNIT; else one 32-weight
# block or sub-block) and 16-byte quant loads per unit (Q4_K's head, a 16-byte load too, not counted:
# one per super-block, it comes from the cache for the quarters after the first; nor Q6_K's scale
# words and d)
# the lattice types (iq_unit.glsl's quarter super-blocks), loaded as matvec_stream.comp's
LATTICE_STREAM_TYPES = ("iq2_xxs", "iq2_xs", "iq2_s", "iq3_xxs", "iq3_s", "iq1_s", "iq1_m")
MATVEC_ID_UNIT = {"q4_k": (64, 2), "q5_k": (64, 4), "q6_k": (64, 3), "q8_0": (32, 2),
                  **{t: (64, 2) for t in LATTICE_STREAM_TYPES}}
# the lattice types' grid and sign masks in shared memory (iq_unit.glsl), as matvec_stream.comp's
MATVEC_ID_TABLE_BYTES = {t: MATVEC_STREAM_TABLE_BYTES[t] for t in LATTICE_STREAM_TYPES}
# the types whose every weight load matvec_id.comp issues before its arithmetic (QPRELOAD): the ones
# it can run as a gate/up pair and chain without a barrier. Q4_K (quarter super-blocks, KUNIT) since
# the experts of Q4_K_M files are Q4_K: H100, 30B-A3B with Q4_K experts, tg128 in alternation, one
# call: 408.59 / 409.47 against 360.25 / 366.49 loading unit by unit without the pair and the chained
# stages (llama.cpp -cm2 220.35); teacher-forced decode logits within 3e-4 of the old kernel's until
# an expert choice flips (LLAMAVK_MVID=16,128 369.15 / 361.04, =4,128 403.60 / 405.81; x first makes
# no difference: 408.05 / 411.30 without). Q6_K (the down experts of half the layers of a Q4_K_M file):
# 372.37 / 367.86 against 329.84 / 331.14 (llama.cpp 218.25). IQ4_XS (its table values from a shared
# table of byte pairs): 306.23 / 311.97 against 209.73 / 210.23 (llama.cpp 199.85; LLAMAVK_MVID=4,128
# 288.89 / 291.93, =16,128 287.39 / 291.46). Q5_K 353.17 / 349.22 against 329.83 / 332.50 (llama.cpp
# 214.09); IQ4_NL 333.40 / 336.88 against 195.41 / 193.63 (llama.cpp 227.07). The lattice types
# (iq_unit.glsl's units, the grid in shared memory): H200, IQ2_XXS 404.83 / 404.00 against 334.89 /
# 335.54, IQ3_XXS 381.05 / 377.06 against 321.15 / 321.82 (903dccff against dc39dcf, one call).
MATVEC_ID_PRELOAD = ("q4_0", "q8_0", "q4_k", "q5_k", "q6_k", "iq4_nl", "iq4_xs", "mxfp4") + LATTICE_STREAM_TYPES


def matvec_id_split(type_name: str, cols: int, subgroup: int, pair: bool) -> tuple[int, int, int]:
    """matvec_id.comp's (TPR lanes per row, C units per lane, RJ rows per lane) for rows of `cols`
    weights: whole rows in at most 4 units per lane, without idle lanes where a power of two up to
    the subgroup divides the row's units, else a whole subgroup (GLM-4.5-Air's 1408-wide down experts,
    44 units: 32 lanes of 2, 20 slots idle; 16 lanes of 3, 4 idle, lost: H200, tg128 of 8 of its
    layers, in alternation, 718.2 / 723.4 against 728.1 / 738.0); rows per lane as far as a lane's
    weight loads stay <= 8 (16-byte loads per unit: MATVEC_ID_UNIT, else one; a pair twice as many)."""
    loads_max = matvec_id_tuning(pair)[0]
    unit_w, unit_loads = MATVEC_ID_UNIT.get(type_name, (32, 1))
    units = cols // unit_w
    tprs = [1 << k for k in range(subgroup.bit_length()) if 1 << k <= min(subgroup, units)]
    exact = [t for t in tprs if units % t == 0 and units // t <= 4]
    tpr = max(exact) if exact else max(tprs)
    c = -(-units // tpr)
    loads = c * (2 if pair else 1) * unit_loads
    if unit_loads == 1 and c == 3 and tpr == subgroup and not pair and not os.environ.get("LLAMAVK_MVID"):
        # whole subgroups on rows of 3 single-load units a lane (gpt-oss's down experts, 2880 = 90
        # blocks): 4 rows a lane, not 2 (a workgroup stages all of x for its rows). H100, gpt-oss-20b
        # MXFP4 tg128, one call, in alternation: 213.6 / 214.4 -> 267.7 / 270.0 (LLAMAVK_MVID=12,128,
        # which gives its gate/up pair 2 rows too; 24 and 32 loads, 4 rows each, 254-255). Not for
        # 30B-A3B's down experts (768 = 24 blocks, 8 lanes a row): 453.7 / 445.2 -> 416.7 / 418.3.
        loads_max = MATVEC_ID_LOADS_3UNITS
    rj = max(1, min(4, loads_max // loads))
    return tpr, c, rj


def matvec_id_sum_sps(n_used: int, subgroup: int, max_wg: int) -> int:
    """matvec_id.comp's subgroups per slot of a SUM product (its workgroup n_used x that many
    subgroups): workgroups of at least MATVEC_ID_SUM_THREADS, so that the slots' staged x rows serve
    more weight rows. LLAMAVK_MVID_SPS overrides (A/B)."""
    env = os.environ.get("LLAMAVK_MVID_SPS")
    sps = int(env) if env else max(1, MATVEC_ID_SUM_THREADS // (n_used * subgroup))
    while sps > 1 and n_used * subgroup * sps > max_wg:
        sps //= 2
    return max(1, sps)


def matvec_id_pair_wg(cols: int, wg: int, max_wg: int = 1024) -> int:
    """The gate/up pair's workgroup: doubled until a lane loads at most XPRE (4) vec4s of x first
    (matvec_id.comp XFIRST, which needs that), at most 256 threads. H200 tg128, one call: gpt-oss-20b
    MXFP4 (2880 wide) at 256 threads 414.3 against 401.0 / 402.8 at 128 (384.6-391.6 with 2 rows a lane,
    320.3 with 4); 30B-A3B Q4_0 (2048 wide: XFIRST at 128 already) 472.6 / 472.3 at 256 against 474.1 /
    464.9."""
    while cols // 4 > 4 * wg and wg < 256 and 2 * wg <= max_wg:
        wg *= 2
    return wg


def matvec_id_tuning(pair: bool = False) -> tuple[int, int]:
    """(weight loads per lane, workgroup size) of matvec_id.comp's plain and PAIR products.
    LLAMAVK_MVID=loads,wg overrides both, LLAMAVK_MVID_PAIR the PAIR products' (A/B)."""
    name = "LLAMAVK_MVID_PAIR" if pair and os.environ.get("LLAMAVK_MVID_PAIR") else "LLAMAVK_MVID"
    env = os.environ.get(name, "")
    if not env:
        return MATVEC_ID_LOADS, MATVEC_ID_WG
    try:
        loads, wg = (int(v) for v in env.split(","))
    except ValueError:
        raise LlamavkError(f"{name}={env!r}: expected LOADS,WG (e.g. 16,128)") from None
    return loads, wg


def matvec_id_staged(kc: KernelCache, cols: int, rows: int, summing: bool = False, fused: bool = True,
                     red: int = MATVEC_ID_RED, table: int = 0) -> int:
    """matvec_id.comp's XS: the vec4s of x' a workgroup stages in shared memory (rows x cols), or 0
    where they would not fit beside its other shared arrays (x then comes from memory).
    fused: x' is computed from two inputs (NORM: x and the norm weights; GLU: gate and up). table: the
    bytes of a lattice type's grid and sign masks (iq_unit.glsl) beside them.
    Staged by default for every product: a lane otherwise reads its units' consecutive vec4s of x
    straight from memory, each load instruction of a subgroup touching 32 cache lines. H100, tg128,
    one call (e181a0d): staging the slot-summing down product as well as the fused gate/up pair,
    30B-A3B 297.8 / 294.9 -> 305.9 / 306.7 and, with the down chained to the pair (selection
    CHAIN_VENDORS "e", which only pays with it), 329.8 / 325.5; 35B-A3B 321.9 / 326.4 -> 325.8 /
    327.0, chained 338.3 / 338.7. (Before the shared-expert slot folded the norm into the 35B-A3B's
    pair, staging its plain products lost: 200.1 -> 194.0.)
    LLAMAVK_MVID_STAGE=0 turns staging off, =1 (default) on for every product, =s for the slot-summing
    products only, =t for the others only, =f for fused inputs only (A/B)."""
    mode = os.environ.get("LLAMAVK_MVID_STAGE", "1")
    if mode == "0" or (mode == "s" and not summing) or (mode == "t" and summing) or (mode == "f" and not fused):
        return 0
    # beside xs: red (RED floats), red_ss (128 floats), kv_pair (256 vec2s; counted for every type) and a
    # lattice type's table
    room = (kc.info.max_shared_memory or 16384) - 4 * (red if summing else 1) - 512 - 2048 - table
    stage_max = int(os.environ.get("LLAMAVK_MVID_STAGE_MAX", MATVEC_ID_STAGE_MAX))
    return rows * cols // 4 if 4 * rows * cols <= min(room, stage_max) else 0


def matvec_id_xfirst(name: str, staged: int, wait, slot_rows: bool, glu, cols: int, wg: int) -> bool:
    """matvec_id.comp XFIRST: a staging product not waiting in its shader (the experts' gate/up pair,
    behind the barrier after the output projection picking them), one x row, no GLU, at most 4 vec4s of
    x per lane. H100 tg128, in alternation, one call (6633267's tree): 30B-A3B 451.78 / 453.81 / 446.81
    against 440.96 / 445.82 / 438.35, d1024 396.67 against 391.78, 35B-A3B 396.87 / 396.74 against
    390.31 / 390.84; greedy tokens the same. Planar Q4_0 / Q8_0 (every weight load issued up front):
    Q4_K experts, when their loads went out unit by unit, 367.57 / 365.81 with it against 364.10 /
    364.68; preloaded since (MATVEC_ID_PRELOAD): the same, 408.59 / 409.47 against 408.05 / 411.30.
    LLAMAVK_MVID_XFIRST=0 turns it off, =all on for every type (A/B)."""
    mode = os.environ.get("LLAMAVK_MVID_XFIRST", "1")
    return (mode != "0" and (mode == "all" or name in MATVEC_ID_PRELOAD) and staged > 0 and wait is None
            and not slot_rows and glu is None and cols // 4 <= 4 * wg)


def matvec_id_pairs(w: QWeight, p: QWeight) -> bool:
    """Whether the one-token expert product can take w and p as a gate/up pair (matvec_id.comp PAIR):
    the types it preloads (16-byte loads of both), the same type, shape and expert chunks."""
    return (type_suffix(w.qtype) in MATVEC_ID_PRELOAD and (w.qtype, w.rows, w.cols, w.experts) ==
            (p.qtype, p.rows, p.cols, p.experts) and [c.n_rows for c in w.chunks] == [c.n_rows for c in p.chunks])


def matvec_id_chain_ok(w: QWeight) -> bool:
    """Whether w's one-token expert product can be chained without a barrier (kernels/chain.py):
    a type in MATVEC_ID_PRELOAD (its weight loads come first, so they are in flight while it waits), one
    chunk (one dispatch)."""
    return type_suffix(w.qtype) in MATVEC_ID_PRELOAD and len(w.chunks) == 1


def shexp_fuse_enabled() -> bool:
    """LLAMAVK_SHEXP_FUSE=0 keeps a shared expert out of the routed experts' dispatches (A/B)."""
    return os.environ.get("LLAMAVK_SHEXP_FUSE", "1") != "0"


# Which types: the preloaded ones since the K-quant and IQ experts took that path (before, planar Q4_0
# / Q8_0 only). H100, 35B-A3B with Q4_K matrices, tg128 in alternation, one call: 355.90 / 350.54
# against 238.24 / 237.62 before (LLAMAVK_SHEXP_FUSE=0 239.19 / 238.60; llama.cpp -cm2 156.06).
def shexp_slot_ok(gate: QWeight, up: QWeight, down: QWeight, gate_sh: QWeight, up_sh: QWeight,
                  down_sh: QWeight) -> bool:
    """Whether the one-token expert products can take a shared expert as one more slot (matvec_id.comp
    SHEXP): the routed gate/up a pair (matvec_id_pairs), the shared gate/up of their type and input
    width, the shared down of the routed down's type and output height, every matrix of a type whose
    loads matvec_id.comp issues up front (MATVEC_ID_PRELOAD: the shared slot's loads are that code's) in
    one chunk (one dispatch of each product takes it). Shapes may differ otherwise: the shared expert's
    width is its own."""
    mats = (gate, up, down, gate_sh, up_sh, down_sh)
    return (shexp_fuse_enabled() and matvec_id_pairs(gate, up)
            and all(type_suffix(m.qtype) in MATVEC_ID_PRELOAD and len(m.chunks) == 1 for m in mats)
            and not (gate_sh.experts or up_sh.experts or down_sh.experts)
            and gate_sh.qtype == up_sh.qtype == gate.qtype and down_sh.qtype == down.qtype
            and (gate_sh.rows, gate_sh.cols) == (up_sh.rows, up_sh.cols) and gate_sh.cols == gate.cols
            and down_sh.rows == down.expert_rows and down_sh.cols == gate_sh.rows
            and gate_sh.rows % 32 == 0 and gate.expert_rows % 32 == 0)


def matmul_id(seq, kc: KernelCache, w: QWeight, x: View, route_view: View, y: View, n_tokens: int,
              n_used: int, xslot: bool, groups: View | None = None, norm: View | None = None, eps: float = 0.0,
              glu: View | None = None, sum_slots: bool = False, residual: View | None = None,
              pair: QWeight | None = None, wait=None, signal=None,
              shexp: tuple[QWeight, QWeight | None] | None = None, route_wait: bool = False,
              bias: View | None = None, pair_bias: View | None = None, oai: tuple[float, float] | None = None) -> int:
    """y[t, s] = W[id(t, s)] x'[t(, s)] for t < n_tokens, s < n_used (y: [n_tokens][n_used][R]);
    with sum_slots, y[t] = residual[t] + sum_s weight(t, s) W[id(t, s)] x'[t, s] (y: [n_tokens][R]);
    with pair (a second stack of experts P, where matvec_id_pairs allows), y[t, s] =
    silu(W[id(t, s)] x') * (P[id(t, s)] x').

    w: stacked experts (w.experts of R = w.expert_rows rows). x: [n_tokens][(n_used if xslot)][cols].
    norm (x' = rms_norm(x) * norm), glu (x' = silu(x) * glu, glu shaped as x), sum_slots and residual
    and pair are the decode forms (n_tokens <= MATVEC_MAX_TOKENS); larger batches need `groups` (group()).
    wait / signal (chain.Wait / chain.Signal; one token, matvec_id_chain_ok): recorded without a barrier
    after the producer it waits for / counting its workgroups done. Returns the workgroups of a
    signalling product (0 otherwise). route_wait (with wait): the producer writes the route too (the
    output projection picking the experts), so the wait comes before the route is read (RWAIT).

    shexp = (S, SP) (decode, shexp_slot_ok): slot n_used - 1 is a shared expert, S (its gate with the
    pair SP = its up, or its down with sum_slots) in place of the chosen expert's matrices; its route
    weight is the router's gate (router(shexp=...)). Per token, y (non-summing) and x (xslot) hold the
    n_used - 1 routed slots' rows, then the shared slot's (S.rows values out / S.cols in).

    bias / pair_bias (decode; f32 [experts][R]): W's / P's product of each slot gets its expert's bias
    row (gpt-oss), before the unit and before the slot's route weight; oai = (alpha, limit) (with pair):
    the unit is swiglu_oai instead of silu(g) u."""
    if n_tokens <= 0:
        return 0
    if (wait is not None or signal is not None) and (n_tokens != 1 or not matvec_id_chain_ok(w)):
        raise LlamavkError("matmul_id: chaining without a barrier takes one token and one chunk of a type "
                           "matvec_id preloads (moe.MATVEC_ID_PRELOAD)")
    if not w.experts:
        raise LlamavkError("matmul_id: the weight is not a stack of experts")
    name = type_suffix(w.qtype)
    R, cols = w.expert_rows, w.cols
    sh, sh_pair = shexp if shexp is not None else (None, None)
    sh_rows, sh_cols = (sh.rows, sh.cols) if sh is not None else (R, cols)
    tok_in = (n_used - 1) * cols + sh_cols    # per token: the slots' x rows (xslot), the shared one last
    tok_out = (n_used - 1) * R + sh_rows
    _check_view(x, 4 * n_tokens * (tok_in if xslot else cols), "matmul_id x")
    _check_view(y, 4 * n_tokens * (R if sum_slots else tok_out), "matmul_id y")
    if sh is not None:
        if n_tokens > MATVEC_MAX_TOKENS or len(w.chunks) > 1 or sh_cols % 32 or (pair is None) != (sh_pair is None) \
                or sh.qtype != w.qtype or type_suffix(w.qtype) not in MATVEC_ID_PRELOAD or sh.experts \
                or (sum_slots and sh_rows != R) or (not xslot and sh_cols != cols) \
                or (sh_pair is not None and (sh_pair.qtype, sh_pair.rows, sh_pair.cols) != (sh.qtype, sh_rows, sh_cols)):
            raise LlamavkError("matmul_id: a shared expert slot needs matrices of the experts' type (one that "
                               "matvec_id preloads) in one buffer, in a small batch (kernels/moe.py shexp_slot_ok)")
    if bias is not None or pair_bias is not None or oai is not None:
        if n_tokens > MATVEC_MAX_TOKENS or sh is not None or (oai is not None and pair is None) \
                or (pair_bias is not None and (pair is None or bias is None)):
            raise LlamavkError("matmul_id: per-expert biases and swiglu_oai are folded into small batches' products "
                               "(no shared slot; the pair's bias with W's, swiglu_oai with a pair)")
        if bias is not None:
            _check_view(bias, 4 * w.experts * R, "matmul_id bias")
        if pair_bias is not None:
            _check_view(pair_bias, 4 * w.experts * R, "matmul_id pair bias")
    if n_tokens <= MATVEC_MAX_TOKENS:
        if cols % 32:
            raise LlamavkError(f"matmul_id: expert rows of {cols} weights (not a multiple of 32) are not supported")
        if sum_slots and len(w.chunks) > 1:
            raise LlamavkError("matmul_id: the weighted sum of slots needs the experts in one chunk")
        if pair is not None and not matvec_id_pairs(w, pair):
            raise LlamavkError("matmul_id: a gate/up pair needs two matrices of one shape and of a type matvec_id "
                               "preloads (moe.MATVEC_ID_PRELOAD)")
        sg = kc.info.subgroup_size or 32
        # the shared slot's units (its own cols) must fit the lanes too
        tpr, c, rj = matvec_id_split(name, max(cols, sh_cols), sg, pair is not None)
        g = sg // tpr
        if sum_slots:
            sps = matvec_id_sum_sps(n_used, sg, kc.info.max_workgroup_invocations or 1024)
            while sps > 1 and n_used * sps * g * rj > MATVEC_ID_RED:    # the slots' rows fit RED
                sps //= 2
            wg, rows_per_wg = n_used * sg * sps, sps * g * rj           # sps subgroups per slot
            if wg > (kc.info.max_workgroup_invocations or 1024) or n_used * rows_per_wg > MATVEC_ID_RED:
                raise LlamavkError(f"matmul_id: {n_used} experts per token do not fit one workgroup here")
        else:
            wg = max(matvec_id_tuning(pair is not None)[1], sg)
            if pair is not None and not os.environ.get("LLAMAVK_MVID_PAIR") and not os.environ.get("LLAMAVK_MVID"):
                wg = matvec_id_pair_wg(cols, wg, kc.info.max_workgroup_invocations or 128)
            rows_per_wg = wg // sg * g * rj
        staged = matvec_id_staged(kc, tok_in if sum_slots and xslot else cols, 1, sum_slots,
                                  norm is not None or glu is not None, n_used * rows_per_wg,
                                  MATVEC_ID_TABLE_BYTES.get(name, 0))
        spec = (wg, tpr, c, rj, norm is not None, glu is not None, sum_slots, xslot, residual is not None,
                pair is not None, wait is not None, signal is not None, staged,
                n_used * rows_per_wg if sum_slots else 1, sh is not None, wait is not None and route_wait,
                matvec_id_xfirst(name, staged, wait, sum_slots and xslot, glu, cols, wg),
                bias is not None, oai is not None)
        # the shared slot's code lives in a variant of its own (matvec_id.comp SHEXP_SLOT)
        kernel = kc.get(f"mul_mv_id_{name}" + ("_shexp" if sh is not None else ""), "rrrwrrrrwrrrr",
                        push_size=56, spec=spec)
        rows_max = R if sum_slots else max(R, sh_rows)
        grid = ((rows_max + rows_per_wg - 1) // rows_per_wg, n_tokens * (1 if sum_slots else n_used), 1)
        pair_chunks = pair.chunks if pair is not None else w.chunks
        chain = wait or signal   # both name the step's counters (else an unused binding)
        chain_push = struct.pack("<5I2f", wait.slot if wait else 0, wait.n if wait else 0, signal.slot if signal else 0,
                                 sh_rows, sh_cols, *(oai or (0.0, 0.0)))
        for ch, pch in zip(w.chunks, pair_chunks):
            push = struct.pack("<6If", R, cols, n_used, ch.row_start // R, ch.n_rows // R, rows_per_wg, eps)
            sh_buffers = [sh.chunks[0].buffer, (sh_pair or sh).chunks[0].buffer] if sh is not None else [ch.buffer] * 2
            seq.dispatch(kernel, [ch.buffer, x.range, route_view.range, y.range, (norm or x).range,
                                  (residual or x).range, (glu or x).range, pch.buffer,
                                  chain.counters if chain else y.range] + sh_buffers
                         + [(bias or x).range, (pair_bias or bias or x).range], grid, push + chain_push,
                         chained=wait is not None)
        return grid[0] * grid[1] * grid[2] if signal is not None else 0
    if norm is not None or glu is not None or sum_slots or residual is not None or pair is not None:
        raise LlamavkError("matmul_id: fused norm/glu/sum/residual inputs exist for small batches only")
    if groups is None:
        raise LlamavkError("matmul_id: a batch needs the tokens grouped by expert (moe.group)")
    family = moe_product_kernel(kc, cols, name)
    kernel, tile_rows, tile_tokens = tile_kernel(kc, family, name, "rrrwr", 40, MOE_TILES)
    if family == "mul_mm_coop_id" and name in COOP_ID_X_F16:   # x as f16: one conversion for gate and up
        x = f16_copy(seq, kc, x, n_tokens * (n_used if xslot else 1) * cols)
    for ch in w.chunks:
        grid = ((R + tile_rows - 1) // tile_rows, (n_tokens + tile_tokens - 1) // tile_tokens, ch.n_rows // R)
        push = struct.pack("<10I", R, cols, R, 0, 0, n_tokens, n_used, ch.row_start // R, w.experts, xslot)
        seq.dispatch(kernel, [ch.buffer, x.range, x.range, y.range, groups.range], grid, push)
    return 0


def moe_sum(seq, kc: KernelCache, y: View, route_view: View, out: View, n_tokens: int, n_used: int,
            width: int) -> None:
    """out[t] = sum_s weight(t, s) y[t, s] (y: [n_tokens][n_used][width])."""
    if n_tokens <= 0:
        return
    kernel = kc.get("moe_sum_f32", "rrw", push_size=12)
    n = n_tokens * width
    seq.dispatch(kernel, [y.range, route_view.range, out.range], groups_2d((n + 255) // 256),
                 struct.pack("<3I", n_tokens, width, n_used))


def add_id(seq, kc: KernelCache, y: View, bias: View, route_view: View, out: View, n_tokens: int, n_used: int,
           rows: int, n_expert: int) -> None:
    """out[t, s] = y[t, s] + bias[id(t, s)] (y, out: [n_tokens][n_used][rows], out may be y; bias:
    [n_expert][rows]): an expert product's per-expert bias (ggml_add_id)."""
    if n_tokens <= 0:
        return
    kernel = kc.get("add_id_f32", "rrrw", push_size=16)
    n = n_tokens * n_used * rows
    seq.dispatch(kernel, [y.range, bias.range, route_view.range, out.range], groups_2d((n + 255) // 256),
                 struct.pack("<4I", n_tokens, rows, n_used, n_expert))


def scale_sigmoid(seq, kc: KernelCache, y: View, x: View, w: View, out: View, n_tokens: int, width: int,
                  cols: int) -> None:
    """out[t] = y[t] * sigmoid(w . x[t]) (y, out: [n_tokens][width]; x: [n_tokens][cols])."""
    if n_tokens <= 0:
        return
    kernel = kc.get("scale_sigmoid_f32", "rrrw", push_size=12)
    seq.dispatch(kernel, [y.range, x.range, w.range, out.range], groups_2d(n_tokens),
                 struct.pack("<3I", n_tokens, width, cols))
