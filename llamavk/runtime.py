"""Runs a model's graph on one device: weights, KV cache, activations, recordings, replay.

A forward pass is recorded once per (graph, batch size) and replayed: per step the host writes the
token ids and the step parameters (n_past, n_tokens, n_kv, seq_len) into small host-visible buffers, submits
the prebuilt command buffer and waits. Activations are planned once per graph by a linear scan that
reuses memory of tensors no later op reads.
"""

from __future__ import annotations

import os
import threading
import time
from dataclasses import dataclass

import numpy as np

from . import kv_cache, phases
from .errors import LlamavkError
from .fusion import fuse_for_matvec, fuse_one_token, fuse_rope_kv
from .graph import Graph, Tensor
from .kv_cache import KVTypes
from .kernels import (STEP_N_KV, STEP_N_PAST, STEP_N_TOKENS, STEP_SEQ_LEN, STEP_SYNC_BASE, STEP_WORDS, VIEW_ALIGN,
                      KernelCache, QWeight, View, allocate_qweight)
from .kernels import attention as attn_k
from .kernels import deltanet, elementwise, matmul, moe, norm, rope
from .kernels.chain import ChainCounters, timing_only_skipped
from .kernels.selection import chain_edges, chain_x_ok
from .quant import GGMLQuantizationType, quant_info
from .vk import Buffer, CommandSequence, MemoryBlocks


SPIN_SECONDS = 0.02   # longest a decode step's wait polls before it blocks
SLOTS = 2             # step-parameter / token-id / logits slots: a split pipelines two micro-batches
LARGE_BATCH = 32      # batches above this use a graph's "@large" variant where a split mode gives one


def _align(n: int) -> int:
    return (n + VIEW_ALIGN - 1) // VIEW_ALIGN * VIEW_ALIGN


@dataclass
class ActivationPlan:
    """Byte offsets of every activation tensor inside one arena, for batches up to n_tokens."""
    offsets: dict
    sizes: dict
    arena_bytes: int


def plan_activations(graph: Graph, n_tokens: int) -> ActivationPlan:
    """Linear-scan allocation: a tensor's memory is reused once the last op reading it has run."""
    last_use: dict[Tensor, int] = {}
    for i, op in enumerate(graph.ops):
        for t in op.reads():
            if t.kind == "act":
                last_use[t] = i
    free: list[tuple[int, int]] = []          # (offset, size)
    offsets, sizes, top = {}, {}, 0
    rows = n_tokens
    for i, op in enumerate(graph.ops):
        if op.kind == "last_row":
            rows = 1                              # everything after it is one token's row
        for out in op.writes():
            if out in offsets or out is graph.logits:   # logits: own buffer
                continue
            size = _align(rows * out.width * 4)
            for j, (off, sz) in enumerate(free):
                if sz >= size:
                    offsets[out] = off
                    free[j] = (off + size, sz - size)
                    break
            else:
                offsets[out] = top
                top += size
            sizes[out] = size
        for t in set(op.reads()):
            if t.kind == "act" and last_use.get(t) == i and t is not graph.logits:
                free.append((offsets[t], sizes[t]))
        free = _coalesce(free)
    return ActivationPlan(offsets, sizes, max(top, VIEW_ALIGN))


def _coalesce(free):
    free = sorted(f for f in free if f[1] > 0)
    merged: list[tuple[int, int]] = []
    for off, sz in free:
        if merged and merged[-1][0] + merged[-1][1] == off:
            merged[-1] = (merged[-1][0], merged[-1][1] + sz)
        else:
            merged.append((off, sz))
    return merged


def _one_pass_safe(inputs, outputs) -> bool:
    """Whether one dispatch that reads `inputs` and writes `outputs` (views of [rows][width] f32, a
    workgroup per row, each row read before it is written) may run where the ops it replaces ran one
    after another: the activation arena may put an output over an input (or another output) once that
    one is dead, and at another offset a workgroup would overwrite rows that others have yet to read.
    In place (the same offset) is safe."""
    views = list(inputs) + list(outputs)
    for u in outputs:
        for v in views:
            if v is u or u.buffer is not v.buffer or u.offset == v.offset:
                continue
            if u.offset < v.offset + v.nbytes and v.offset < u.offset + u.nbytes:
                return False
    return True


def _write_out(seq, kc, view, size: int, f16: bool, record, *, rows: int):
    """Record an op through record(out, f16): with f16, as the f16 x of the products after it (into
    their scratch: matmul.record_f16_x, with room for whole token tiles of its `rows` tokens; its f32
    output never exists), else into its own view. Returns what record returns."""
    if not f16:
        return record(view, False)
    result = []
    matmul.record_f16_x(seq, kc, view, size, lambda xh: result.append(record(xh, True)), f16_only=True,
                        room=matmul.f16_x_room(rows, size // rows))
    return result[0]


class DeviceRuntime:
    """One model on one device."""

    def __init__(self, model_file, device, n_ctx: int, n_ubatch: int, graphs: dict[str, Graph],
                 profile: bool = False, progress=None, step_pass=None, background_upload: bool = False,
                 kv_types: KVTypes = KVTypes(), prefetch=()):
        """graphs: key -> graph ("last", "all"; a split mode may add "<key>@large" for batches above
        LARGE_BATCH tokens). progress(nbytes), if given, is called as each weight reaches the device
        (the load's progress bar). step_pass(graph, one_token) -> graph: a split's last rewrite of
        the matrix-vector step graphs (split/matvec_steps.py). background_upload: the weights' buffers
        are allocated here and their contents copied by a worker thread, so that the caller records
        steps (prerecord) while the file streams to the device; wait_weights() joins it (the first
        step does). kv_types: the KV cache's K and V types (kv_cache.py). prefetch: kernels to
        start making on threads now (vk/kernel_list.py: those the last load of this model made)."""
        self.model = model_file
        self.profile = profile
        self.cfg = model_file.config
        self.device = device
        self.comm = None     # a split's SplitRuntime sets this device's DeviceComm (split/comm.py)
        self.clock = None    # ... and its clock stamps, when profiling the split timeline (split/clock.py)
        self.kc = KernelCache(device)
        if prefetch:
            self.kc.prefetch(prefetch)
        self.n_ctx = n_ctx
        self.n_ubatch = n_ubatch
        self.kv_types = kv_types
        kv_types.check_head_dim(self.cfg.head_dim)
        # Weights: every buffer first (recordings need only those), then their contents, copied in
        # file order through the staging ring (vk/transfer.py) here or by a worker thread.
        self._upload_start = time.perf_counter()
        self.weights: dict[str, object] = {}
        self._weight_blocks = MemoryBlocks(device)    # a few allocations, not one per weight (vk/buffer.py)
        fills = []
        for g in graphs.values():
            for name, t in g.weights.items():
                if name not in self.weights:
                    self.weights[name], fill = self._allocate(name, t)
                    fills.append((fill, _stored_bytes(self.weights[name])))
        self.freqs = None
        if "rope_freqs.weight" in model_file.weights:
            self.freqs, fill = self._allocate_vector("rope_freqs.weight")
            fills.append((fill, 0))
        self._weight_blocks.bind()
        device.transfer               # created on this thread, before a worker uses it
        phases.mark("weight buffers")
        self.upload_seconds = 0.0
        self._uploader: threading.Thread | None = None
        self._upload_error: BaseException | None = None
        if background_upload:
            self._uploader = threading.Thread(target=self._fill, args=(fills, progress), daemon=True,
                                              name=f"llamavk-weights-{device.name}")
            self._uploader.start()
        else:
            self._fill(fills, progress)
            phases.mark("weight upload")
            self.wait_weights()
        self._step_pass = step_pass
        try:
            self._init_rest(graphs)
        except BaseException:
            self.wait_weights(raise_error=False)
            raise

    def _fill(self, fills, progress) -> None:
        """Queue every weight's copies, then wait for them (on the worker thread, or inline)."""
        transfer = self.device.transfer
        stats = transfer.stats
        transfer.on_job_done = progress       # weights read by the upload threads: as their jobs end
        try:
            for fill, nbytes in fills:
                queued = stats.file_bytes
                fill()
                nbytes -= stats.file_bytes - queued
                if progress is not None and nbytes > 0:
                    with stats._lock:
                        progress(nbytes)
            transfer.flush()                  # the copies were queued as the file was read
        except BaseException as exc:          # handed to the thread that waits (wait_weights)
            self._upload_error = exc
        finally:
            transfer.on_job_done = None
        self.upload_seconds = time.perf_counter() - self._upload_start

    def wait_weights(self, raise_error: bool = True) -> None:
        """Return once every weight is on the device; an error of the upload is raised here."""
        if self._uploader is not None:
            self._uploader.join()
            self._uploader = None
            phases.add("weight upload (worker thread)", self.upload_seconds)
            for what, seconds in self.device.transfer.stats.seconds.items():   # summed over the upload threads
                phases.add(f"upload threads' {what}", seconds)
        err, self._upload_error = self._upload_error, None
        if err is not None and raise_error:
            raise err

    def _init_rest(self, graphs) -> None:
        """KV cache, recurrent state, step buffers, fused graphs and activation plans."""
        device, n_ctx, n_ubatch = self.device, self.n_ctx, self.n_ubatch
        # KV cache for the layers whose attention runs here, as wide as the KV heads it holds.
        # All of it (and the recurrent state) in a few allocations, like the weights.
        state_blocks = MemoryBlocks(device)
        self.kv: dict[int, tuple[Buffer, Buffer]] = {}
        for g in graphs.values():
            for op in g.ops:
                if op.kind == "attention" and op.layer not in self.kv:
                    width = op.attrs.get("n_head_kv", self.cfg.n_head_kv) * self.cfg.head_dim
                    self.kv[op.layer] = (state_blocks.buffer(kv_cache.cache_bytes(self.kv_types.k, n_ctx, width)),
                                         state_blocks.buffer(kv_cache.cache_bytes(self.kv_types.v, n_ctx, width)))
        # Recurrent state of the DeltaNet layers that run here (qwen35), beside the KV cache: the
        # convolution's last inputs and the delta rule's state, as wide as the channels and heads held.
        # One sequence at a time: the state is that of the tokens evaluated so far (state_pos of them).
        self.ssm: dict[int, dict[str, Buffer]] = {}
        for g in graphs.values():
            for op in g.ops:
                a = op.attrs
                if op.kind == "ssm_conv":
                    bufs = self.ssm.setdefault(op.layer, {})
                    if "conv" not in bufs:
                        bufs["conv"] = state_blocks.buffer(deltanet.conv_state_bytes(a["channels"], a["d_conv"]))
                elif op.kind == "delta_net":
                    bufs = self.ssm.setdefault(op.layer, {})
                    if "state" not in bufs:
                        bufs["state"] = state_blocks.buffer(deltanet.state_bytes(a["n_v_heads"], a["head_dim"]))
        state_blocks.bind()
        self.state_pos = 0
        phases.mark("KV cache")
        self.step = Buffer(device, SLOTS * VIEW_ALIGN, host_visible=True)
        self.step_words = [self.step.array(np.uint32, STEP_WORDS, s * VIEW_ALIGN) for s in range(SLOTS)]
        self.ids_stride = _align(n_ubatch * 4)
        self.ids = Buffer(device, SLOTS * self.ids_stride, host_visible=True)
        self.ids_words = [self.ids.array(np.uint32, n_ubatch, s * self.ids_stride) for s in range(SLOTS)]
        # Logits: as wide as this device's part of the output (all of it when alone; none for a
        # device of a split that holds no output rows). All-logits batches may be smaller than
        # n_ubatch: one logits view must fit maxStorageBufferRange. The "last" steps write one row
        # per slot into a small buffer; the all-logits rows' buffer (2 x 65 MB for a 32000 vocabulary:
        # pinned host memory, slow to allocate) is made when an "all" step is first recorded.
        logits = graphs["last"].logits
        self.n_logits = logits.width if logits is not None else 0
        max_range = device.info.max_storage_buffer_range or (1 << 31)
        self.n_ubatch_all = max(1, min(n_ubatch, max_range // (max(self.n_logits, 1) * 4)))
        self.logits_stride = _align(self.n_ubatch_all * self.n_logits * 4)
        self._logits_buf: Buffer | None = None
        self.last_stride = _align(self.n_logits * 4)
        self.logits_last = Buffer(device, SLOTS * self.last_stride, host_visible=True) if self.n_logits else None
        self._slot_all = [False] * SLOTS        # whether a slot's last step wrote into the all-rows buffer
        self._writes_all: dict[tuple[str, int, int], bool] = {}    # the same per recording
        phases.mark("step, logit buffers")
        freqs = View.whole(self.freqs) if self.freqs is not None else None
        self.rope = rope.RopeParams.from_config(self.cfg, freqs)
        self.rope_swa = rope.RopeParams.from_config(self.cfg, freqs, self.cfg.swa_layers.index(True)) \
            if any(self.cfg.swa_layers) else self.rope
        # Matrix-vector steps (decode, small batches) run the fused graph: fewer dispatches and barriers.
        self.batch_graphs = {key: fuse_rope_kv(g) for key, g in graphs.items()}
        can_sum = lambda w: len(self.weights[w.name].chunks) == 1  # noqa: E731
        can_route = lambda w: moe.router_ok(self.weights[w.name])  # noqa: E731
        self.fused = {key: fuse_for_matvec(g, can_sum, can_route) for key, g in self.batch_graphs.items()}
        # One-token steps also take gate and up as one product, and RoPE + KV store in the Q/K/V
        # products, where this device's kernel can.
        def can_pair(g, u):
            wg, wu = self.weights[g.name], self.weights[u.name]
            return moe.matvec_id_pairs(wg, wu) if wg.experts else matmul.matvec_pairs(self.kc, wg, wu)

        # (the stream kernel writes f16 caches only: quantized ones keep the rope_kv dispatch)
        can_rope = lambda w: not self.kv_types.quantized and matmul.matvec_rope_ok(  # noqa: E731
            self.kc, self.weights[w.name], self.rope_of(w.layer), self.cfg.head_dim)
        can_gdn = lambda head_dim, d_conv: deltanet.decode_fusable(self.kc, head_dim, d_conv)  # noqa: E731
        # and a shared expert (qwen35moe) as one more slot of the routed experts' products
        can_shexp = lambda router, *mats: can_route(router) and moe.shexp_slot_ok(  # noqa: E731
            *(self.weights[w.name] for w in mats))
        # and a router in the product writing its input (the output projection), where that kernel can
        can_fold = lambda prod, router, n_used, shexp, sel_bias=False: moe.router_fold_ok(  # noqa: E731
            self.kc, self.weights[prod.name], self.weights[router.name], n_used, shexp, sel_bias)
        self.fused_one = {key: fuse_one_token(g, can_pair, can_rope, can_sum, can_route, can_fuse_gdn=can_gdn,
                                              can_shexp=can_shexp, can_fold_router=can_fold) or self.fused[key]
                          for key, g in self.batch_graphs.items()}
        if self._step_pass is not None:
            self.fused = {key: self._step_pass(g, False) for key, g in self.fused.items()}
            self.fused_one = {key: self._step_pass(g, True) for key, g in self.fused_one.items()}
        phases.mark("fused graphs")
        self.plans = {g: plan_activations(g, n_ubatch) for g in
                      list(self.batch_graphs.values()) + list(self.fused.values()) + list(self.fused_one.values())}
        self.arena = Buffer(device, max(p.arena_bytes for p in self.plans.values()))
        phases.mark("activation plans, arena")
        # recorded steps by (graph key, tokens, parameter slot, long_context: record())
        self.recordings: dict[tuple[str, int, int, bool], list[CommandSequence]] = {}
        # per recording: the producers chained to their consumers without a barrier, and what those wait for
        self.chains: dict[tuple[str, int, int, bool], list] = {}
        self._long_from: dict[tuple[str, int], int | None] = {}   # long_context_from() by (key, tokens)
        self.host_seconds = 0.0      # Python time spent preparing and submitting steps (not waiting)

    @property
    def logits_buf(self) -> Buffer | None:
        """The all-logits steps' buffer: SLOTS slots of logits_stride bytes (made on first use)."""
        if self._logits_buf is None and self.n_logits:
            self._logits_buf = Buffer(self.device, SLOTS * self.logits_stride, host_visible=True)
        return self._logits_buf

    def _logits_view(self, key: str, graph: Graph, slot: int) -> tuple[View | None, bool]:
        """Where a step writes its logits, and whether that is the all-rows buffer: "all" steps, and
        steps whose graph computes the logits of every row (a split's graph may take the last row
        after the output product) write there; the others' one row goes to the small buffer."""
        if not self.n_logits:
            return None, False
        one_row = False
        for op in graph.ops:
            one_row = one_row or op.kind == "last_row"
            if op.out is graph.logits:
                break
        if key == "all" or not one_row:
            return View(self.logits_buf, slot * self.logits_stride, self.logits_stride), True
        return View(self.logits_last, slot * self.last_stride, self.last_stride), False

    def rope_of(self, layer: int | None) -> rope.RopeParams:
        """The RoPE of a layer: a sliding-window layer's own (gemma3), else the model's."""
        return self.rope_swa if self.cfg.swa_rope(layer) else self.rope

    def graph_for(self, key: str, n_tokens: int) -> Graph:
        if n_tokens > LARGE_BATCH and f"{key}@large" in self.batch_graphs:
            return self.batch_graphs[f"{key}@large"]
        if n_tokens == 1:
            return self.fused_one[key]
        return self.fused[key] if n_tokens <= matmul.MATVEC_MAX_TOKENS else self.batch_graphs[key]

    # -- weights -------------------------------------------------------------------------------
    def _allocate(self, name: str, t: Tensor):
        """(the weight's device buffers, a function that queues its copies)."""
        # vectors, and the DeltaNet convolution's taps (a float table read as one vector), as plain f32;
        # matrices in their blocks, even a part of one row (a split of a small matrix)
        if len(self.model.weights[t.source or name].shape) == 1 or t.role in FLOAT_TABLES:
            return self._allocate_vector(t.source or name, t.part)
        raw, qtype = weight_part(self.model, t.source or name, t.part)
        return allocate_qweight(self.device, raw, qtype, t.rows * max(t.experts, 1), t.width, experts=t.experts,
                                source=self._file_source(t.source or name) if t.part is None else None,
                                blocks=self._weight_blocks)

    def _file_source(self, name: str):
        """(descriptor, offset) of a whole weight's bytes in the model file, for the upload threads to
        read (vk/transfer.py); None: copied from the file's map by this thread (LLAMAVK_UPLOAD=map,
        or a model that is not one GGUF file)."""
        gguf = getattr(self.model, "gguf", None)
        if gguf is None or not hasattr(gguf, "file_range") or os.environ.get("LLAMAVK_UPLOAD", "") == "map":
            return None
        return gguf.fileno(), gguf.file_range(name)[0]

    def _allocate_vector(self, name: str, part=None):
        """A float32 table (a vector, or a small matrix flattened: the DeltaNet convolution's taps),
        or its part: element ranges side by side. Its copy is queued like a matrix's (no wait)."""
        data = np.ascontiguousarray(self.model.dequantize(name), dtype=np.float32).reshape(-1)
        if part is not None:
            data = np.ascontiguousarray(np.concatenate([data[a:b] for a, b in part_ranges(part)]))
        buf = self._weight_blocks.buffer(data.nbytes)
        return buf, lambda: self.device.transfer.upload(buf, data, wait=False)

    def weight_bytes(self, experts_only: bool = False) -> int:
        """Bytes of weights on this device (experts_only: of the stacked expert matrices alone)."""
        total = 0
        for w in self.weights.values():
            if experts_only and not (isinstance(w, QWeight) and w.experts):
                continue
            total += sum(c.buffer.size for c in w.chunks) if isinstance(w, QWeight) else w.size
        return total

    def kv_bytes(self) -> int:
        return sum(k.size + v.size for k, v in self.kv.values())

    def state_bytes(self) -> int:
        """Bytes of the DeltaNet layers' recurrent and convolution state on this device."""
        return sum(b.size for bufs in self.ssm.values() for b in bufs.values())

    # -- recording -----------------------------------------------------------------------------
    def _view(self, plan: ActivationPlan, t: Tensor, n_tokens: int) -> View:
        return View(self.arena, plan.offsets[t], plan.sizes[t])

    def record(self, key: str, n_tokens: int, slot: int = 0, long_context: bool = False) -> list[CommandSequence]:
        """Record the step (graph `key`, n_tokens tokens, parameter slot) as command buffers: one,
        or one per round between exchange points where a split synchronises through the host.
        long_context: for n_kv past long_context_from (the decode attention's form for long contexts)."""
        graph = self.graph_for(key, n_tokens)
        plan = self.plans[graph]
        cfg, kc = self.cfg, self.kc
        name = f"{key}[{n_tokens}]#{slot}" + ("/long" if long_context else "")
        segments = [CommandSequence(self.device, name, profile=self.profile).begin()]
        step = View(self.step, slot * VIEW_ALIGN, VIEW_ALIGN)
        ids = View(self.ids, slot * self.ids_stride, self.ids_stride)
        logits_view, self._writes_all[(key, n_tokens, slot)] = self._logits_view(key, graph, slot)
        # a split's partials that their producers write straight into shared host memory (comm.py)
        direct = self.comm.direct_views(graph, n_tokens, slot) if self.comm is not None else {}
        act = lambda t: direct[t] if t in direct else self._view(plan, t, n_tokens)  # noqa: E731
        vec = lambda t: View.whole(self.weights[t.name])  # noqa: E731
        rows_out = n_tokens
        # stages chained without a barrier (kernels/chain.py): the producer recorded last whose
        # consumers may still follow, and what they wait for
        edges = chain_edges(kc) if n_tokens == 1 else ""
        # a slot per op, and two more per attention (edges q and k around its rope_kv)
        counters = ChainCounters(kc, len(graph.ops) + 2 * sum(op.kind == "attention" for op in graph.ops)) \
            if edges else None
        if counters is not None:
            counters.begin(segments[0])
        pending = None
        # (producer op, what its consumers wait for)
        chained = self.chains[(key, n_tokens, slot, long_context)] = []
        # a put whose producer writes my slot itself records nothing: the chain looks through it
        silent = self.comm.direct_puts() if self.comm is not None else set()
        ops = [op for op in graph.ops if op not in silent]
        # the split timeline (split/clock.py): an exchange point's sum -> its stamps, which the
        # products reading the sum share
        stamped = {}
        # prompt steps: each dequantize-then-f16 product's rows dequantized while the one before is
        # multiplied (matmul.DequantAhead; a stale plan after an error costs time, never a result)
        kc.dequant_ahead = self._dequant_ahead(ops, n_tokens)
        # edge q: Q/K/V products -> the rope_kv (or, RoPE in the products, the attention) after them
        qkv_signals = self._qkv_signals(ops, counters) if "q" in edges else {}
        rope_waits = {}   # id(attention op) -> [its Q/K/V products' signal, their workgroups] (edge q)
        route_waiters = set()   # ids of the expert products that read the route after their wait (edge p)
        done = set()    # ops recorded with the one before them (a residual add and the norm after it)
        for i, op in enumerate(ops):
            if i in done:
                continue
            n = 0    # the workgroups a signalling producer counts (set by the recorders that can signal)
            if pending is not None and not self._consumes(op, pending[0], edges):
                pending = None
            wait = pending[1] if pending is not None else None
            signal = counters.signal() if edges and self._consumes(ops[i + 1] if i + 1 < len(ops)
                                                                     else None, op, edges) else None
            k = op.kind
            seq = segments[-1]
            if self.profile:
                pair = f"+{op.attrs['pair'].role}" if "pair" in op.attrs else ""
                pair += "+router" if "router" in op.attrs else ""   # a router folded in (fusion.py)
                seq.label = f"{k}:{op.inputs[0].role}{pair}" if k in ("matmul", "matmul_id") else k
            if self.clock is not None and n_tokens == 1 and k in ("sync_reduce", "reduce"):
                stamped[op.out] = self.clock.stamp(op.attrs["exchange"], op.layer)
            if k == "sync_reduce":       # a split's exchange point and sum in one dispatch (comm.py)
                n = self.comm.sync_reduce(seq, op, n_tokens, act, step, slot, chain=signal, wait=wait,
                                          clock=stamped.get(op.out))
            elif k in EXCHANGE_OPS:
                if self.comm.record(seq, op, n_tokens, act, step, slot, clock=stamped.get(op.out)):
                    segments.append(CommandSequence(self.device, f"{name}/{len(segments)}", profile=self.profile).begin())
            elif k == "embed":
                matmul.get_rows(seq, kc, self.weights[op.inputs[0].name], ids, act(op.out), n_tokens)
            elif k == "rms_norm":
                x = op.inputs[0]
                weight = vec(op.inputs[1]) if len(op.inputs) > 1 else None
                size = rows_out * x.width
                _write_out(seq, kc, act(op.out), size, self._feeds_f16_products(ops, i, rows_out, graph.ops, size),
                           lambda out, f16: norm.rms_norm(seq, kc, act(x), out, rows_out, x.width, op.attrs["eps"],
                                                          weight, out_f16=f16), rows=rows_out)
            elif k == "head_norm" and op.attrs.get("stride"):   # the Q half of qwen35's [q | gate]
                x, w = op.inputs
                deltanet.head_norm_strided(seq, kc, act(x), vec(w), act(op.out), n_tokens, op.attrs["n_heads"],
                                           w.width, op.attrs["stride"], op.attrs["eps"])
            elif k == "head_norm":
                x, w = op.inputs
                n_heads = op.attrs["n_heads"]
                norm.rms_norm(seq, kc, act(x), act(op.out), n_tokens * n_heads, x.width // n_heads,
                              op.attrs["eps"], vec(w))
            elif k == "matmul" and "route" in op.attrs:     # a router picking the experts itself
                w, x = op.inputs[:2]
                r = op.attrs["route"]
                norm_w, shexp = op.attrs.get("norm"), op.attrs.get("shexp_gate")
                moe.router(seq, kc, self.weights[w.name], act(x), act(op.out), rows_out, r["n_used"], r["gating"],
                           r["norm"], r["scale"], norm_w=vec(norm_w) if norm_w is not None else None,
                           eps=op.attrs.get("eps", 0.0), wait=wait, shexp=vec(shexp) if shexp is not None else None,
                           bias=vec(op.inputs[2]) if len(op.inputs) > 2 else None,
                           sel_bias=vec(r["sel_bias"]) if "sel_bias" in r else None,
                           shexp_one=op.attrs.get("shexp_one", False))
            elif k == "matmul":
                w, x = op.inputs[0], op.inputs[1]
                bias = vec(op.inputs[2]) if len(op.inputs) > 2 else None
                out = logits_view if op.out is graph.logits else act(op.out)
                norm_w, resid, glu = op.attrs.get("norm"), op.attrs.get("residual"), op.attrs.get("glu")
                pair = op.attrs.get("pair")
                shared = qkv_signals.get(id(op))   # edge q: (the three's signal, id of their attention)
                if shared is not None:
                    signal = shared[0]
                n = matmul.matmul(seq, kc, self.weights[w.name], act(x), out, rows_out, bias=bias,
                              norm=vec(norm_w) if norm_w is not None else None, eps=op.attrs.get("eps", 0.0),
                              residual=act(resid) if resid is not None else None,
                              glu=act(glu) if glu is not None else None,
                              pair=self.weights[pair.name] if pair is not None else None,
                              rope=self._rope_out(op, step), wait=wait, signal=signal,
                              router=self._folded_router(op, act, vec), clock=stamped.get(x))
                if shared is not None:   # counted with the other two; no consumer right after it
                    rope_waits.setdefault(shared[1], [shared[0], 0])[1] += n
                    signal = None
            elif k == "rope":
                x = op.inputs[0]
                n_heads = op.attrs["n_heads"]
                rope.rope(seq, kc, act(x), step, n_tokens, n_heads, x.width // n_heads, self.rope_of(op.layer))
            elif k == "attention":
                q, kt, vt = op.inputs
                kcache, vcache = self.kv[op.layer]
                width = kt.width
                # a split mode may give this device some of the heads (tensor parallelism)
                n_head, n_head_kv = op.attrs.get("n_head", cfg.n_head), op.attrs.get("n_head_kv", cfg.n_head_kv)
                attn_wait = None   # edges k / q: the attention waits in its shader for rope_kv / the products
                if op.attrs.get("rope"):
                    qn, kn = op.attrs.get("q_norm"), op.attrs.get("k_norm")
                    rope_signal = counters.signal() if "k" in edges and attn_k.waits_ok(
                        kc, n_tokens, n_head, n_head_kv, cfg.head_dim) else None
                    n_rope = rope.rope_kv(seq, kc, act(q), act(kt), act(vt), View.whole(kcache), View.whole(vcache),
                                          step, n_tokens, n_head, n_head_kv, cfg.head_dim, self.rope_of(op.layer),
                                          self.n_ctx, q_norm=vec(qn) if qn is not None else None,
                                          k_norm=vec(kn) if kn is not None else None, eps=op.attrs.get("eps", 0.0),
                                          kv_types=self.kv_types, signal=rope_signal,
                                          wait=ChainCounters.wait(*rope_waits[id(op)]) if id(op) in rope_waits else None)
                    attn_wait = ChainCounters.wait(rope_signal, n_rope) if rope_signal is not None else None
                elif id(op) in rope_waits:   # edge q: RoPE and the KV store in the products, which count
                    attn_wait = ChainCounters.wait(*rope_waits[id(op)])
                elif not op.attrs.get("kv_stored"):   # kv_stored: the Q/K/V products did it (fusion.py)
                    attn_k.kv_store(seq, kc, act(kt), View.whole(kcache), step, n_tokens, width, self.kv_types.k)
                    attn_k.kv_store(seq, kc, act(vt), View.whole(vcache), step, n_tokens, width, self.kv_types.v)
                window = op.attrs.get("window", 0)
                # this device's heads (a tensor split gives it some: op.out is the whole width)
                size = n_tokens * n_head * cfg.head_dim
                f16 = (rows_out == n_tokens and self._feeds_f16_products(ops, i, rows_out, graph.ops, size)
                       and attn_k.writes_f16_ok(kc, n_tokens, n_head, n_head_kv, cfg.head_dim, self.n_ctx, window,
                                                self.kv_types))
                sinks = vec(op.attrs["sinks"]) if "sinks" in op.attrs else None
                n = _write_out(seq, kc, act(op.out), size, f16, lambda out, f16: attn_k.attention(
                    seq, kc, act(q), View.whole(kcache), View.whole(vcache), out, step, n_tokens, n_head, n_head_kv,
                    cfg.head_dim, self.n_ctx, signal=signal, scale=op.attrs.get("scale", 0.0), window=window,
                    kv_types=self.kv_types, out_f16=f16, wait=attn_wait, sinks=sinks, long_context=long_context),
                    rows=rows_out) or 0
            elif k == "moe_route":
                logits = op.inputs[0]
                a = op.attrs
                moe.route(seq, kc, act(logits), act(op.out), rows_out, logits.width, a["n_used"], a["gating"],
                          a["norm"], a["scale"], sel_bias=vec(a["sel_bias"]) if "sel_bias" in a else None)
                if rows_out > matmul.MATVEC_MAX_TOKENS:   # prompts: the expert products go by expert
                    moe.group(seq, kc, act(op.out), self._moe_groups(logits.width, n_tokens), rows_out,
                              a["n_used"], logits.width)
            elif k == "matmul_id":
                w, x, route = op.inputs
                a = op.attrs
                qw = self.weights[w.name]
                # edge p: the output projection writing the route is not behind a barrier, so the route
                # is read after the wait -- by the pair that waits for it, and by the down product
                # chained to that pair (its wait for the pair implies the route is written)
                route_wait = wait is not None and (pending[0].kind == "matmul" or id(pending[0]) in route_waiters)
                n_used = route.width // 2       # slots (a shared expert's included: fusion.fuse_shared_expert)
                shexp = (self.weights[a["shexp"].name],
                         self.weights[a["shexp_pair"].name] if "shexp_pair" in a else None) if "shexp" in a else None
                n = moe.matmul_id(seq, kc, qw, act(x), act(route), act(op.out), rows_out, n_used,
                              xslot=x.width != qw.cols, shexp=shexp,
                              groups=self._moe_groups(qw.experts, n_tokens) if rows_out > matmul.MATVEC_MAX_TOKENS else None,
                              norm=vec(a["norm"]) if "norm" in a else None, eps=a.get("eps", 0.0),
                              glu=act(a["glu"]) if "glu" in a else None, sum_slots=a.get("sum", False),
                              residual=act(a["residual"]) if "residual" in a else None,
                              pair=self.weights[a["pair"].name] if "pair" in a else None, wait=wait, signal=signal,
                              route_wait=route_wait, bias=vec(a["bias"]) if "bias" in a else None,
                              pair_bias=vec(a["pair_bias"]) if "pair_bias" in a else None, oai=a.get("oai"))
                if route_wait:
                    route_waiters.add(id(op))
            elif k == "moe_sum":
                y, route = op.inputs
                moe.moe_sum(seq, kc, act(y), act(route), act(op.out), rows_out, route.width // 2, op.out.width)
            elif k == "scale_sigmoid":
                y, x, w = op.inputs
                moe.scale_sigmoid(seq, kc, act(y), act(x), vec(w), act(op.out), rows_out, y.width, x.width)
            elif k == "attn_gate":
                a, qg = op.inputs
                deltanet.attn_gate(seq, kc, act(a), act(qg), act(op.out), rows_out, op.attrs["n_heads"],
                                   op.attrs["head_dim"])
            elif k == "ssm_conv":
                x, w = op.inputs
                deltanet.ssm_conv(seq, kc, act(x), vec(w), View.whole(self.ssm[op.layer]["conv"]), act(op.out), step,
                                  n_tokens, op.attrs["channels"], op.attrs["d_conv"])
            elif k == "delta_net":
                x, alpha, beta, dt, a_ = op.inputs
                at = op.attrs
                deltanet.delta_net(seq, kc, act(x), act(alpha), act(beta), vec(dt), vec(a_),
                                   View.whole(self.ssm[op.layer]["state"]), act(op.out), step, n_tokens,
                                   at["n_k_heads"], at["n_v_heads"], at["head_dim"], at["eps"],
                                   grouped=at.get("grouped", False))
            elif k == "delta_net_step":     # one token's conv, delta rule, gated norm (fusion.py)
                qkv, taps, alpha, beta, dt, a_, z, w = op.inputs
                at, bufs = op.attrs, self.ssm[op.layer]
                deltanet.delta_net_step(seq, kc, act(qkv), vec(taps), View.whole(bufs["conv"]), act(alpha), act(beta),
                                        vec(dt), vec(a_), View.whole(bufs["state"]), act(z), vec(w), act(op.out), step,
                                        at["n_k_heads"], at["n_v_heads"], at["head_dim"], at["d_conv"], at["eps"],
                                        at["norm_eps"], grouped=at.get("grouped", False))
            elif k == "gated_norm":
                x, z, w = op.inputs
                deltanet.gated_norm(seq, kc, act(x), act(z), vec(w), act(op.out), rows_out, op.attrs["n_heads"],
                                    w.width, op.attrs["eps"])
            elif k in ("swiglu", "geglu"):
                gate, up = op.inputs
                glu, size = (elementwise.swiglu if k == "swiglu" else elementwise.geglu), rows_out * gate.width
                _write_out(seq, kc, act(op.out), size, self._feeds_f16_products(ops, i, rows_out, graph.ops, size),
                           lambda out, f16: glu(seq, kc, act(gate), act(up), out, size, out_f16=f16), rows=rows_out)
            elif k == "swiglu_oai":
                gate, up = op.inputs
                size, a = rows_out * gate.width, op.attrs
                _write_out(seq, kc, act(op.out), size, self._feeds_f16_products(ops, i, rows_out, graph.ops, size),
                           lambda out, f16: elementwise.swiglu_oai(seq, kc, act(gate), act(up), out, size, a["alpha"],
                                                                   a["limit"], out_f16=f16), rows=rows_out)
            elif k == "add_id":
                y, bias, route = op.inputs
                n_used = route.width // 2
                moe.add_id(seq, kc, act(y), vec(bias), act(route), act(op.out), rows_out, n_used, y.width // n_used,
                           bias.width // (y.width // n_used))
            elif k == "scale":
                x = op.inputs[0]
                elementwise.scale(seq, kc, act(x), act(op.out), rows_out * x.width, op.attrs["scale"])
            elif k == "softcap":                              # in place, usually on the logits
                x = op.inputs[0]
                view = logits_view if x is graph.logits else act(x)
                elementwise.softcap(seq, kc, view, view, rows_out * x.width, op.attrs["cap"])
            elif k == "add" and (f16_norm := self._add_then_norm(ops, i, rows_out, graph.ops, act)) is not None:
                # the residual add and the norm of its sum in one dispatch (norm.add_rms_norm)
                a, b = op.inputs
                nrm = ops[i + 1]
                done.add(i + 1)
                _write_out(seq, kc, act(nrm.out), rows_out * a.width, f16_norm, lambda out, f16: norm.add_rms_norm(
                    seq, kc, act(a), act(b), act(op.out), out, rows_out, a.width, nrm.attrs["eps"], vec(nrm.inputs[1]),
                    out_f16=f16), rows=rows_out)
            elif k == "add":
                a, b = op.inputs
                elementwise.add(seq, kc, act(a), act(b), act(op.out), rows_out * a.width)
            elif k == "last_row":
                x = op.inputs[0]
                row = x.width * 4
                src, dst = act(x), act(op.out)
                seq.copy(src.buffer, dst.buffer, row, src.offset + (n_tokens - 1) * row, dst.offset)
                rows_out = 1
            else:
                raise LlamavkError(f"op {k} is not supported by the runtime")
            if signal is not None and n:
                if timing_only_skipped(op):   # benchmarks only: the consumer does not wait
                    n = 0
                pending = (op, ChainCounters.wait(signal, n))
                chained.append((op, pending[1]))
        kc.dequant_ahead = None
        return [seq.end() for seq in segments]

    def _qkv_signals(self, ops, counters) -> dict:
        """Edge q (kernels/chain.py): for each one-token attention right after the stream products
        writing its q, k and v, those products' ids -> (one shared signal, id(attention)). Its rope_kv
        (f16 or quantized caches) then waits in its shader for all three; where the products rotate and store K and
        V themselves (kv_stored), the decode attention does."""
        out = {}
        cfg = self.cfg
        for i, op in enumerate(ops):
            stored = op.kind == "attention" and op.attrs.get("kv_stored") and attn_k.waits_ok(
                self.kc, 1, op.attrs.get("n_head", cfg.n_head), op.attrs.get("n_head_kv", cfg.n_head_kv), cfg.head_dim)
            if op.kind != "attention" or not (op.attrs.get("rope") or stored) or i < 3:
                continue
            prods = ops[i - 3:i]
            if {p.out for p in prods} != set(op.inputs) or not all(
                    p.kind == "matmul" and not ({"route", "router", "residual", "pair"} & set(p.attrs))
                    and ("rope" in p.attrs) == bool(stored)
                    and matmul.matvec_chain_ok(self.kc, self.weights[p.inputs[0].name]) for p in prods):
                continue
            signal = counters.signal()
            out.update({id(p): (signal, id(op)) for p in prods})
        return out

    def _dequant_ahead(self, ops, n_tokens: int):
        """A prompt step's matmul.DequantAhead: its weight products in recording order, with the
        tokens each runs on (the logits' product after last_row: one)."""
        if n_tokens <= matmul.MATVEC_MAX_TOKENS or not matmul.dequant_ahead_on():
            return None
        plan, rows = [], n_tokens
        for op in ops:
            if op.kind == "last_row":
                rows = 1
            elif op.kind == "matmul" and "route" not in op.attrs:
                plan.append((self.weights[op.inputs[0].name], rows))
        return matmul.DequantAhead(self.kc, plan)

    def _moe_groups(self, n_expert: int, n_tokens: int) -> View:
        """The scratch buffer of per-expert token lists, sized for this device's largest batch."""
        return moe.group_scratch(self.kc, n_expert, max(n_tokens, self.n_ubatch))

    def _add_then_norm(self, ops, i: int, n_tokens: int, all_ops, act) -> bool | None:
        """Whether ops[i], an add, and the RMS norm (with a weight) of its sum right after it are
        recorded as one dispatch (norm.add_rms_norm): None if not, else whether the norm writes f16
        (_feeds_f16_products). Not where the arena overlaps their views (_one_pass_safe).
        LLAMAVK_ADD_NORM_FUSE=0: never (A/B)."""
        op, nxt = ops[i], ops[i + 1] if i + 1 < len(ops) else None
        if (nxt is None or nxt.kind != "rms_norm" or len(nxt.inputs) != 2 or nxt.inputs[0] is not op.out
                or nxt.inputs[0].width != op.inputs[0].width or os.environ.get("LLAMAVK_ADD_NORM_FUSE", "1") == "0"):
            return None
        f16_norm = self._feeds_f16_products(ops, i + 1, n_tokens, all_ops, n_tokens * op.inputs[0].width)
        outs = [act(op.out)] + ([] if f16_norm else [act(nxt.out)])
        return f16_norm if _one_pass_safe([act(t) for t in op.inputs], outs) else None

    def _feeds_f16_products(self, ops, i: int, n_tokens: int, all_ops, size: int) -> bool:
        """Whether ops[i]'s output, `size` values written, is read only by products reading their x
        as f16 (matmul.reads_x_f16; of all_ops, the graph's), all of that size (n_tokens x their
        columns: a tensor split's heads or FFN slice are less than the tensor's width), that come right
        after it (a layer's Q, K and V after its norm; gate and up; down after SwiGLU): then ops[i] may
        write that f16 x itself, and the products share it (matmul.f16_copy). LLAMAVK_CM2_X_SHARE=0:
        never (A/B)."""
        if n_tokens <= matmul.MATVEC_MAX_TOKENS or os.environ.get("LLAMAVK_CM2_X_SHARE", "1") == "0":
            return False
        out = ops[i].out
        readers = [o for o in all_ops if out in o.inputs]
        following = ops[i + 1:i + 1 + len(readers)]
        if not readers or len(following) < len(readers) or any(a is not b for a, b in zip(readers, following)):
            return False
        return all(o.kind == "matmul" and "route" not in o.attrs and o.inputs[1] is out and not any(
            o.attrs.get(a) is not None for a in ("norm", "residual", "glu", "pair", "router"))
            and n_tokens * self.weights[o.inputs[0].name].cols == size
            and matmul.reads_x_f16(self.kc, self.weights[o.inputs[0].name], n_tokens) for o in readers)

    def _consumes(self, op, producer, edges: str) -> bool:
        """Whether product `op` can wait in its shader for `producer` (recorded just before it, or
        before products that also wait for it), whose output is its input x: the edge is enabled
        (selection.chain_edges: a attention, o output projection, g gate/up, d down product, e the
        experts' gate/up pair -> their down product, r output projection -> the MoE router, x a split's
        partial -> its exchange point, m the experts' summing down product -> the next products, p the
        output projection picking the experts -> their gate/up pair) and both
        kernels can be chained (kernels/chain.py)."""
        if op is not None and op.kind == "sync_reduce":   # -sm graph: the exchange point waits in its shader
            return "x" in edges and op.attrs.get("overlap", False) and chain_x_ok(op.attrs["n_cols"]) \
                and self._signals_partial(producer, op)
        if op is not None and op.kind == "matmul_id" and producer.kind == "matmul_id":
            return ("e" in edges and op.inputs[1] is producer.out and "pair" in producer.attrs
                    and moe.matvec_id_chain_ok(self.weights[producer.inputs[0].name])
                    and moe.matvec_id_chain_ok(self.weights[op.inputs[0].name]))
        if op is not None and op.kind == "matmul_id" and producer.kind == "matmul":
            # edge p: the experts' gate/up pair after the output projection that picks the experts
            return ("p" in edges and "router" in producer.attrs and op.inputs[1] is producer.out
                    and op.inputs[2] is producer.attrs["route_out"] and "pair" in op.attrs
                    and matmul.matvec_chain_ok(self.kc, self.weights[producer.inputs[0].name])
                    and moe.matvec_id_chain_ok(self.weights[op.inputs[0].name]))
        if op is None or op.kind != "matmul" or op.inputs[1] is not producer.out:
            return False
        if "route" in op.attrs:   # a router picking the experts itself (moe_router.comp): edge r
            return ("r" in edges and producer.kind == "matmul" and producer.inputs[0].role == "o"
                    and matmul.matvec_chain_ok(self.kc, self.weights[producer.inputs[0].name]))
        if producer.kind == "attention":
            kind = "a"
        elif producer.kind == "matmul_id":   # a mixture of experts' summing down product: edge m
            kind = "m" if "sum" in producer.attrs and moe.matvec_id_chain_ok(self.weights[producer.inputs[0].name]) \
                else ""
        elif producer.kind == "sync_reduce":   # -sm graph: the next product's loads overlap the exchange
            return bool(edges) and producer.attrs.get("overlap", False) \
                and matmul.matvec_chain_ok(self.kc, self.weights[op.inputs[0].name])
        elif producer.kind == "matmul" and matmul.matvec_chain_ok(self.kc, self.weights[producer.inputs[0].name]):
            kind = {"o": "o", "gate": "g", "down": "d"}.get(producer.inputs[0].role, "")
        else:
            return False
        return kind != "" and kind in edges and matmul.matvec_chain_ok(self.kc, self.weights[op.inputs[0].name])

    def _signals_partial(self, producer, op) -> bool:
        """Whether `producer` is the product that writes sync_reduce `op`'s partial straight into my
        slot (a direct put, comm.direct_views) and can count its workgroups done in its shader."""
        put = self.comm.direct_put_of(producer.out) if self.comm is not None else None
        if put is None or put.attrs["exchange"] != op.attrs["exchange"]:
            return False
        if producer.kind == "matmul" and "route" not in producer.attrs:
            return matmul.matvec_chain_ok(self.kc, self.weights[producer.inputs[0].name])
        if producer.kind == "matmul_id":     # a mixture of experts' weighted sum of its down products
            return moe.matvec_id_chain_ok(self.weights[producer.inputs[0].name])
        return False

    def _folded_router(self, op, act, vec) -> moe.FoldedRouter | None:
        """The router a product computes from the rows it writes (fusion.fuse_router_into_products)."""
        a = op.attrs.get("router")
        if a is None:
            return None
        r = a["route"]
        return moe.FoldedRouter(self.weights[a["weight"].name], act(op.attrs["route_out"]), r["n_used"], r["gating"],
                                r["norm"], r["scale"], vec(a["norm"]) if a["norm"] is not None else None, a["eps"],
                                vec(a["shexp_gate"]) if a["shexp_gate"] is not None else None,
                                vec(a["bias"]) if a.get("bias") is not None else None,
                                vec(r["sel_bias"]) if "sel_bias" in r else None, a.get("shexp_one", False))

    def _rope_out(self, op, step) -> rope.RopeOut | None:
        """Where a Q/K/V product with RoPE in it (fusion.fuse_rope_into_products) writes: q rotated
        into its output, k rotated and v into row n_past of this layer's KV cache."""
        kind = op.attrs.get("rope")
        if not kind:
            return None
        cache = View.whole(self.kv[op.layer][0 if kind == "k" else 1]) if kind != "q" else None
        return rope.RopeOut(kind, self.rope_of(op.layer), step, self.cfg.head_dim, cache, self.n_ctx)

    def prerecord(self, prompt_tokens: int = 0) -> None:
        """Record the one-token step now (at load), so that the first generated token does not wait
        for it: ~0.1 s for a 32-layer model, which a 128-token completion otherwise pays in its
        decode time (H100, 7.2B: 325 against 410 t/s over the first 128 tokens). prompt_tokens > 0:
        also the micro-batches that eval("last", ...) splits a prompt of that many tokens into, so
        that the prompt's time is the GPU's (with a background upload, both overlap the copies); and
        the one-token step of the first token after it (a prompt past long_context_from: its form; the
        other side's is recorded when a context first passes the limit: 44-64 ms on a 7.2B, H200, the
        first time on a machine 0.29-1.12 s, its attention pipelines' creation, which the model's
        kernel list (vk/kernel_list.py) then prefetches at its later loads. Recording it during the
        upload instead cost the 1.1B's load 30 ms: the recording and the upload threads share the
        interpreter)."""
        self.sequence("last", 1, 0, prompt_tokens + 1)
        if prompt_tokens <= short_prompt_max():
            return      # eval runs it through the one-token step
        for n in sorted({min(self.n_ubatch, prompt_tokens - i) for i in range(0, prompt_tokens, self.n_ubatch)}):
            self.sequence("last", n, 0)

    def record_decode(self, n_kv: int) -> None:
        """Record the one-token step that a decode at n_kv replays, if not yet (a warm-up's)."""
        self.sequence("last", 1, 0, n_kv)

    def prerecord_scoring(self) -> None:
        """Record, at load, what perplexity's evaluation replays (token_scorer.py): full
        all-logits micro-batches -- not the one-token step, which it never runs. The second slot's
        only while the weights still upload (the load waits for them anyway); once they are in, it
        is recorded when the evaluation first uses it, while the device runs the first slot's."""
        self.sequence("all", self.n_ubatch_all, 0)
        for slot in range(1, SLOTS):
            if self.uploading():
                self.sequence("all", self.n_ubatch_all, slot)

    def uploading(self) -> bool:
        """Whether the weights are still on their way (a background upload that has not ended)."""
        return self._uploader is not None and self._uploader.is_alive()

    def sequence(self, key: str, n_tokens: int, slot: int = 0, n_kv: int = 0) -> list[CommandSequence]:
        """The step's recording (recorded on first use) for a run at n_kv: past long_context_from
        the one with the decode attention's long-context form."""
        rkey = self.recording_key(key, n_tokens, slot, n_kv)
        segs = self.recordings.get(rkey)
        if segs is None:
            segs = self.recordings[rkey] = self.record(*rkey)
        return segs

    def recording_key(self, key: str, n_tokens: int, slot: int = 0, n_kv: int = 0) -> tuple[str, int, int, bool]:
        """The key in `recordings` (and `chains`) of the step a run at n_kv replays."""
        start = self.long_context_from(key, n_tokens)
        return key, n_tokens, slot, start is not None and n_kv > start

    def long_context_from(self, key: str, n_tokens: int) -> int | None:
        """The n_kv past which the step (graph key, n_tokens) is recorded again for long contexts:
        where some layer's decode attention takes another form there (attention.decode_form); None
        where none does (why a recording per form: attention.decode_form; when each is made:
        prerecord)."""
        if (key, n_tokens) not in self._long_from:
            limits = {attn_k.long_context_from(self.kc, n_tokens, op.attrs.get("n_head", self.cfg.n_head),
                                               op.attrs.get("n_head_kv", self.cfg.n_head_kv), self.cfg.head_dim,
                                               attn_k.visible_span(self.n_ctx, op.attrs.get("window", 0), n_tokens))
                      for op in self.graph_for(key, n_tokens).ops if op.kind == "attention"} - {None}
            self._long_from[(key, n_tokens)] = min(limits) if limits else None
        return self._long_from[(key, n_tokens)]

    def prepare(self, key: str, tokens, n_past: int, slot: int = 0, sync_base: int = 0,
                seq_len: int = 0) -> list[CommandSequence]:
        """Write a step's token ids and parameters into `slot`; returns its recorded segments.
        seq_len > 0: the KV cache holds whole sequences of seq_len tokens back to back, row p being
        position p % seq_len of sequence p // seq_len (several perplexity chunks in one batch)."""
        n = len(tokens)
        if self._uploader is not None:
            self.wait_weights()
        self._advance_state(n_past, n)
        segs = self.sequence(key, n, slot, n_past + n)
        self._slot_all[slot] = self._writes_all.get((key, n, slot), True)
        self.ids_words[slot][:n] = tokens
        words = self.step_words[slot]
        words[STEP_N_PAST] = n_past
        words[STEP_N_TOKENS] = n
        words[STEP_N_KV] = n_past + n
        words[STEP_SYNC_BASE] = sync_base
        words[STEP_SEQ_LEN] = seq_len
        return segs

    def _advance_state(self, n_past: int, n: int) -> None:
        """The recurrent state follows the tokens evaluated: a batch either starts a fresh sequence
        (n_past 0: the kernels restart the state) or continues where the last one ended. Going back
        (or skipping ahead) is impossible for a recurrent state, unlike a KV cache."""
        if not self.ssm:
            return
        if n_past not in (0, self.state_pos):
            raise LlamavkError(f"this model's recurrent (DeltaNet) state holds the first {self.state_pos} tokens of "
                               f"the sequence; it cannot continue from position {n_past} (it cannot rewind): "
                               "evaluate the sequence again from its start")
        self.state_pos = n_past + n

    # -- execution -----------------------------------------------------------------------------
    def check_batch(self, key: str, n: int, n_past: int) -> None:
        if n > (self.n_ubatch_all if key == "all" else self.n_ubatch):
            raise ValueError("batch larger than the micro-batch size")
        if n_past + n > self.n_ctx:
            raise LlamavkError(f"context is full ({self.n_ctx} tokens); use a larger -c")

    def run_batch(self, key: str, tokens, n_past: int, seq_len: int = 0) -> int:
        """Evaluate up to n_ubatch tokens at KV rows n_past...; returns the number of logit rows.
        seq_len: as in prepare()."""
        n = len(tokens)
        self.check_batch(key, n, n_past)
        t0 = time.perf_counter()
        (seq,) = self.prepare(key, tokens, n_past, seq_len=seq_len)
        value = seq.submit()
        self.host_seconds += time.perf_counter() - t0
        # Matrix-vector steps take milliseconds: poll rather than sleep through the wake-up latency.
        if n <= matmul.MATVEC_MAX_TOKENS:
            self.device.timeline.wait_spinning(value, SPIN_SECONDS)
        else:
            self.device.timeline.wait(value)
        return n if key == "all" else 1

    def logits(self, rows: int, slot: int = 0) -> np.ndarray:
        """The last step's logits in `slot` (a view: copy before the slot is used again)."""
        n = self.n_logits
        if self._slot_all[slot]:
            return self.logits_buf.array(np.float32, rows * n, slot * self.logits_stride).reshape(rows, n)
        if rows != 1:
            raise ValueError("a one-row (\"last\") step's slot holds one row of logits")
        return self.logits_last.array(np.float32, n, slot * self.last_stride).reshape(1, n)

    def eval(self, key: str, tokens, n_past: int, seq_len: int = 0, short_ok: bool = False) -> np.ndarray:
        """Evaluate tokens at n_past... in micro-batches: every token's logits ("all"), or the last's.
        seq_len > 0: the tokens are whole sequences of seq_len tokens back to back (prepare()).
        short_ok: a short prompt may run through the one-token step (short_prompt_max; a prompt's
        caller, not a benchmark of prompt steps)."""
        ub = self.n_ubatch_all if key == "all" else self.n_ubatch
        if short_ok and key == "last" and not seq_len and 1 < len(tokens) <= short_prompt_max() \
                and self.recording_key("last", len(tokens)) not in self.recordings \
                and self.recording_key("last", 1, 0, n_past + len(tokens)) in self.recordings:
            for i, t in enumerate(tokens):       # a short prompt, token by token (short_prompt_max)
                self.run_batch("last", [t], n_past + i)
            return self.logits(1)[0].copy()
        rows = []
        for i in range(0, len(tokens), ub):
            n = self.run_batch(key, tokens[i:i + ub], n_past + i, seq_len)
            if key == "all":
                rows.append(self.logits(n).copy())
        return np.concatenate(rows) if key == "all" else self.logits(1)[0].copy()

    def close(self) -> None:
        # Buffers, kernels and recordings are released with the device.
        self.wait_weights(raise_error=False)
        self.recordings.clear()


SHORT_PROMPT_MAX = 16


def short_prompt_max() -> int:
    """Prompts of at most this many tokens whose own step is not recorded yet run through the
    one-token step (recorded at load), token by token, and `run` does not record theirs: recording
    a 9-token step is ~340 dispatches of Python (40-75 ms on the H100 machine, a tenth of a 1.1B
    `run`) against ~0.3 ms more of GPU time per token on a 1.1B (~1.2 ms on a 7.2B).
    LLAMAVK_SHORT_PROMPT=N sets the limit (0: every prompt through its own step)."""
    env = os.environ.get("LLAMAVK_SHORT_PROMPT", "")
    try:
        return int(env) if env else SHORT_PROMPT_MAX
    except ValueError:
        raise LlamavkError(f"LLAMAVK_SHORT_PROMPT={env!r}: expected a token count") from None


def _stored_bytes(weight) -> int:
    """Device bytes of an uploaded weight: a QWeight's chunks, or a vector's buffer."""
    return sum(c.buffer.size for c in weight.chunks) if isinstance(weight, QWeight) else weight.size


EXCHANGE_OPS = frozenset({"put", "sync", "get", "copy_cols", "reduce"})   # recorded by split/comm.py
# 2-D weights the graph reads as one float32 vector: the DeltaNet taps, gpt-oss's per-expert biases
FLOAT_TABLES = frozenset({"ssm_conv", "gate_exps_bias", "up_exps_bias", "down_exps_bias"})


def weight_part(model, name: str, part):
    """Raw GGUF data and type of a weight, or of a part of it (rows or columns). A column cut that
    does not fall on block boundaries cannot be expressed in the block format: that part is
    dequantized to f32 (exact values; more memory)."""
    raw, qtype = model.raw(name), model.tensor_type(name)
    if part is None:
        return raw, qtype
    axis, ranges = part[0], part_ranges(part)
    shape = model.weights[name].shape          # (rows, cols), or (experts, rows, cols): each cut alike
    experts, rows, cols = shape if len(shape) == 3 else (1,) + tuple(shape)
    info = quant_info(qtype, name)
    data = np.asarray(raw).view(np.uint8).reshape(experts, rows, info.row_bytes(cols))
    if axis == 0:
        return np.ascontiguousarray(np.concatenate([data[:, a:b] for a, b in ranges], axis=1)), qtype
    if all(a % info.block_size == 0 and b % info.block_size == 0 for a, b in ranges):
        return np.ascontiguousarray(np.concatenate(
            [data[:, :, info.row_bytes(a):info.row_bytes(b)] for a, b in ranges], axis=2)), qtype
    full = model.dequantize(name)
    return (np.ascontiguousarray(np.concatenate([full[..., a:b] for a, b in ranges], axis=-1)),
            GGMLQuantizationType.F32)


def part_ranges(part) -> list[tuple[int, int]]:
    """The (start, stop) ranges of a weight part (axis, start, stop[, start, stop ...]), in order."""
    return [(part[i], part[i + 1]) for i in range(1, len(part), 2)]
