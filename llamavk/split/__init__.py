"""Split modes (SPEC §5): one model over several Vulkan devices of any vendors.

Each mode is one module with `plan(graph, shares, opts, blocks) -> DeviceGraphs`:

  layer.py   contiguous blocks of layers per device            (exchange: once per boundary)
  row.py     every matrix split by rows, the rest on -mg       (broadcast + gather per product group)
  tensor.py  Megatron-style heads / FFN columns / vocab        (two all-reduces per layer; one in a
             mixture of experts, whose attention is mirrored)
  graph.py   tensor's structure, ring reduce + f16 for big batches, --max-gpu, empty devices

base.py has the shared plan machinery, exchange.py the communication patterns as graph ops,
comm.py the shared host memory and how exchange ops are recorded, runtime.py SplitRuntime.
"""

from __future__ import annotations

import importlib

from ..kv_cache import KVTypes
from ..quant import quant_info
from .base import DEFAULT_MODE, MODES, REDUCE_TYPES, SplitOptions, check_options, proportions

__all__ = ["DEFAULT_MODE", "MODES", "REDUCE_TYPES", "SplitOptions", "check_options", "choose_devices",
           "build_split_runtime"]


def mode_module(mode: str):
    """The module of a split mode (layer.py, row.py, tensor.py, graph.py), imported when a model is
    split: a run on one device does not pay for importing the modes and their communication."""
    if mode not in ("layer", "row", "tensor", "graph"):
        raise KeyError(mode)
    return importlib.import_module(f".{mode}", __name__)


def choose_devices(opts: SplitOptions, entries) -> tuple[list[int], list[float]]:
    """Indices of the selected devices that take part, and their shares (summing to 1).

    none: the main device alone. Others: every device with a non-zero share (-ts, else free memory);
    graph mode keeps the --max-gpu largest; row mode always keeps the main device (it runs the
    norms and attention)."""
    check_options(opts, len(entries))
    if opts.mode == "none" or len(entries) == 1:
        return [opts.main_gpu if opts.mode == "none" else 0], [1.0]
    shares = proportions(opts, [e.info.free_bytes for e in entries])
    if opts.mode == "graph" and opts.max_gpu is not None:
        keep = sorted(range(len(shares)), key=lambda i: -shares[i])[:opts.max_gpu]
        shares = [s if i in keep else 0.0 for i, s in enumerate(shares)]
    active = [i for i, s in enumerate(shares) if s > 0 or (opts.mode == "row" and i == opts.main_gpu)]
    total = sum(shares[i] for i in active)
    return active, [shares[i] / total for i in active]


def build_split_runtime(model_file, devices, shares, opts: SplitOptions, graphs: dict, n_ctx: int, n_ubatch: int,
                        profile: bool = False, progress=None, kv_types: KVTypes = KVTypes()):
    """Plan every graph for the devices (already opened, in `choose_devices` order), check that each
    device's part fits its memory, and load the model onto them. opts.main_gpu must index `devices`.
    progress(done_bytes, total_bytes): as the weights reach the devices."""
    from ..memory_fit import check_fit, estimate_device_need, free_memory, weight_progress
    from .comm import choose_sync
    from .runtime import SplitRuntime

    module = mode_module(opts.mode)
    blocks = {}
    for role, name in (("down", "blk.0.ffn_down.weight"), ("o", "blk.0.attn_output.weight"),
                       ("down_exps", "blk.0.ffn_down_exps.weight"), ("down_shexp", "blk.0.ffn_down_shexp.weight")):
        if name in model_file.weights:
            blocks[role] = quant_info(model_file.tensor_type(name), name).block_size
    plans = {key: module.plan(g, shares, opts, blocks) for key, g in graphs.items()}
    if opts.mode == "graph":
        plans.update({f"{key}@large": module.plan(g, shares, opts, blocks, large=True) for key, g in graphs.items()})
    needs = [estimate_device_need(model_file, {k: dg.graphs[i] for k, dg in plans.items()}, n_ctx, n_ubatch, dev,
                                  kv_types)
             for i, dev in enumerate(devices)]
    check_fit(needs, free_memory(devices), n_available=len(devices))
    return SplitRuntime(model_file, devices, plans, n_ctx, n_ubatch, choose_sync(devices), profile=profile,
                        progress=weight_progress(progress, sum(n.weights for n in needs)), kv_types=kv_types)
