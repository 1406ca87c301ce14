"""Before anything is allocated: do weights + KV cache + activations fit each device?

Without this check a model too big for a device fails half-way through the upload with the driver's
out-of-memory code, after seconds or minutes of copying. With it, the load stops at once with one line
naming the device, the bytes needed and free, and what to change (-c, -ts, -sm, -dev).

- `estimate_device_need` adds up what a DeviceRuntime will allocate for its graphs: every weight (or
  part of one) as the runtime stores it, the KV cache (of its -ctk/-ctv types) of the layers whose attention runs there
  and the DeltaNet layers' recurrent state, the
  activation arena (planned over the unfused graph; the fused plans of llama-like and MoE graphs fit in it,
  a hybrid's can need a few per cent more: tiny qwen35 51,712 against 49,664 bytes) and the
  logits buffers, and on coopmat2 devices the f16 scratch of prompt products dequantized first; with a
  quantized KV cache on cooperative-matrix devices, the f16 copies of one layer's K and V rows.
  Small buffers (step parameters, token ids, staging, mixture-of-experts scratch) are left out.
- `free_memory` reads what each physical device has free now: VK_EXT_memory_budget where the driver
  has it (budget - usage of the device-local heaps), else the device-local heap size. Software devices
  (llvmpipe) allocate host memory and do not hold to their advertised heap (Mesa 22's llvmpipe says
  2 GiB and hands out more), so for them the host's available memory counts.
- `check_fit` is pure (tested with made-up numbers): virtual devices on one physical device
  (`-dev Vulkan0,Vulkan0`) add up against that device's one free figure.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass

from .errors import LlamavkError

GiB = 1 << 30


@dataclass(frozen=True)
class DeviceNeed:
    """Bytes one logical device will allocate. `physical` identifies the device whose memory it uses."""
    name: str                # "Vulkan0", "Vulkan0#1"
    physical: int            # index of the physical device (virtual devices share it)
    weights: int
    kv: int
    activations: int

    @property
    def total(self) -> int:
        return self.weights + self.kv + self.activations


@dataclass(frozen=True)
class FreeMemory:
    """What a physical device has free, and where the figure comes from."""
    description: str         # "NVIDIA H100 80GB HBM3"
    free: int
    source: str              # "free" (memory budget), "heap size" (no budget), "host memory" (software)


def _gib(n: int) -> str:
    return f"{n / GiB:.2f} GiB" if n >= GiB else f"{n / 2**20:.1f} MiB"


def check_fit(needs: list[DeviceNeed], free: dict[int, FreeMemory], n_available: int = 1) -> None:
    """Raise a one-line LlamavkError when the needs of any physical device exceed what it has free.
    n_available: devices the user could have selected (suggests a split when one is not used)."""
    by_device: dict[int, list[DeviceNeed]] = {}
    for need in needs:
        by_device.setdefault(need.physical, []).append(need)
    for physical, group in by_device.items():
        mem = free.get(physical)
        if mem is None:
            continue
        total = sum(n.total for n in group)
        if total <= mem.free:
            continue
        weights, kv = sum(n.weights for n in group), sum(n.kv for n in group)
        acts = sum(n.activations for n in group)
        names = " and ".join(n.name for n in group)
        verb = "needs" if len(group) == 1 else "need"
        raise LlamavkError(
            f"{names} ({mem.description}) {verb} {_gib(total)} (weights {_gib(weights)}, KV cache {_gib(kv)}, "
            f"activations {_gib(acts)}) but {'has' if len(group) == 1 else 'share'} {_gib(mem.free)} "
            f"{'free' if mem.source == 'free' else f'({mem.source})'}: {advice(needs, kv, n_available)}")


def advice(needs: list[DeviceNeed], kv: int, n_available: int) -> str:
    """What to change, in the order that usually helps most."""
    tips = []
    if kv > 0:
        tips.append("a smaller context (-c)")
    if len(needs) > 1:
        tips.append("other shares (-ts) or another split mode (-sm)")
    elif n_available > 1:
        tips.append("a split over more devices (-dev, -sm layer)")
    tips.append("a smaller or more quantized model")
    return "use " + ", or ".join(tips)


# -- what a device runtime will allocate ------------------------------------------------------------
def weight_bytes(model_file, t) -> int:
    """Bytes the runtime stores for weight tensor `t` (runtime.DeviceRuntime._upload / weight_part):
    vectors as f32; matrices (or stacks of expert matrices) in their GGUF type, except a column cut
    off block boundaries (f32)."""
    from .quant import quant_info

    if t.rows == 1:
        return t.width * 4
    rows = t.rows * max(getattr(t, "experts", 0), 1)
    source = t.source or t.name
    qtype = model_file.tensor_type(source)
    info = quant_info(qtype, source)
    if t.part is not None and t.part[0] == 1 and (t.part[1] % info.block_size or t.part[2] % info.block_size):
        return rows * t.width * 4
    return rows * info.row_bytes(t.width)


def estimate_device_need(model_file, graphs: dict, n_ctx: int, n_ubatch: int, device, kv_types=None) -> DeviceNeed:
    """What a DeviceRuntime over `graphs` (key -> Graph) will allocate on `device` (the KV cache of
    kv_types, a kv_cache.KVTypes; None: f16)."""
    from .kv_cache import KVTypes
    from .runtime import SLOTS, _align, plan_activations

    cfg = model_file.config
    seen: dict[str, int] = {}
    for g in graphs.values():
        for name, t in g.weights.items():
            if name not in seen:
                seen[name] = weight_bytes(model_file, t)
    weights = sum(seen.values())
    if "rope_freqs.weight" in model_file.weights:
        weights += math.prod(model_file.weights["rope_freqs.weight"].shape) * 4
    kv_layers: dict[int, int] = {}
    for g in graphs.values():
        for op in g.ops:
            if op.kind == "attention" and op.layer not in kv_layers:
                kv_layers[op.layer] = op.attrs.get("n_head_kv", cfg.n_head_kv) * cfg.head_dim
    kv_types = kv_types or KVTypes()
    kv = sum(kv_types.layer_bytes(n_ctx, width) for width in kv_layers.values())     # K and V
    kv += recurrent_state_bytes(graphs)
    if kv_types.quantized and (getattr(device, "features", None) or {}).get("coopmat", False) and kv_layers:
        # prompt attention's f16 copies of one layer's K and V rows (attention.coop_over_f16_copies)
        kv += 2 * n_ctx * max(kv_layers.values()) * 2
    arena = max((plan_activations(g, n_ubatch).arena_bytes for g in graphs.values()), default=0)
    logits = graphs["last"].logits if "last" in graphs else None
    n_logits = logits.width if logits is not None else 0
    logit_bytes = 0
    if n_logits:
        max_range = device.info.max_storage_buffer_range or (1 << 31)
        rows = max(1, min(n_ubatch, max_range // (n_logits * 4)))
        logit_bytes = SLOTS * _align(rows * n_logits * 4)
    scratch = dequant_scratch_bytes(model_file, graphs, n_ubatch, device)
    return DeviceNeed(device.name, device.info.index, weights, kv, arena + logit_bytes + scratch)


def recurrent_state_bytes(graphs: dict) -> int:
    """The DeltaNet layers' recurrent and convolution state (runtime.DeviceRuntime.ssm): one of each
    per layer, whatever the context."""
    from .kernels import deltanet

    conv, state = {}, {}
    for g in graphs.values():
        for op in g.ops:
            a = op.attrs
            if op.kind == "ssm_conv":
                conv.setdefault(op.layer, deltanet.conv_state_bytes(a["channels"], a["d_conv"]))
            elif op.kind == "delta_net":
                state.setdefault(op.layer, deltanet.state_bytes(a["n_v_heads"], a["head_dim"]))
    return sum(conv.values()) + sum(state.values())


def dequant_scratch_bytes(model_file, graphs: dict, n_ubatch: int, device) -> int:
    """The f16 scratch of prompt products dequantized first (kernels/matmul.py mul_mm_cm2d) on a
    device with coopmat2: one buffer per power-of-two size class of the row slices its weights'
    products use (a 7.2B Q4_K: 128 + 32 + 8 MiB), two where the next slice is dequantized while
    one is multiplied (matmul.DequantAhead, the default)."""
    from .kernels import selection
    from .kernels.matmul import cm2d_slices, dequant_ahead_on

    features = getattr(device, "features", None) or {}
    if not features.get("coopmat2") or os.environ.get("LLAMAVK_CM2", "1") == "0":
        return 0
    types = selection.cm2_dequant_types()
    if not types or n_ubatch < selection.cm2_dequant_min():
        return 0
    classes = set()
    for g in graphs.values():
        products = {op.inputs[0].name for op in g.ops if op.kind == "matmul"}
        for name, t in g.weights.items():
            if name not in products or t.rows == 1 or getattr(t, "experts", 0):
                continue
            qtype = model_file.tensor_type(t.source or name)
            if qtype.name.lower() not in types:
                continue
            tile_rows = selection.cm2_tile(n_ubatch, t.rows, "f16")[0]
            rows = max(n for _, n in cm2d_slices(t.rows, t.width, tile_rows))
            classes.add(1 << max(12, (2 * rows * t.width - 1).bit_length()))
    return sum(classes) * (2 if dequant_ahead_on() else 1)


# -- what the devices have free -----------------------------------------------------------------
def host_available_bytes() -> int | None:
    """The host's available memory (Linux MemAvailable; else free pages), None when unknown."""
    import os

    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    try:
        return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):
        return None


def free_memory(devices) -> dict[int, FreeMemory]:
    """Free memory of the physical devices behind `devices` (logical Devices), read now."""
    from .vk.physical import read_memory_heaps

    out: dict[int, FreeMemory] = {}
    for d in devices:
        info = d.info
        if info.index in out:
            continue
        if info.is_cpu:
            host = host_available_bytes()
            if host is not None:
                out[info.index] = FreeMemory(info.name, host, "host memory")
            continue
        heaps = read_memory_heaps(d.physical, "VK_EXT_memory_budget" in info.extensions)
        local = [h for h in heaps if h.device_local] or heaps
        if local and all(h.budget is not None for h in local):
            out[info.index] = FreeMemory(info.name, sum(max(0, h.budget - (h.usage or 0)) for h in local), "free")
        elif local:
            out[info.index] = FreeMemory(info.name, sum(h.size for h in local), "heap size")
    return out


def weight_progress(progress, total: int):
    """A per-weight callback (bytes of one weight) feeding progress(done, total); None without one."""
    if progress is None:
        return None
    done = [0]

    def advance(nbytes: int) -> None:
        done[0] += nbytes
        progress(done[0], total)

    return advance
