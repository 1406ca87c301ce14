"""What every split mode shares: the plan it produces, proportional partitions, and DeviceGraphs,
the builder that turns the model's graph into one graph per device.

A split mode is a function `plan(graph, devices, ts, mg, options) -> DeviceGraphs` (one module each
in this package). It walks the model's ops in order and places each one on one or more devices,
cutting weights into parts (`Tensor.sliced`) and adding exchange ops (split/exchange.py) where an
activation must cross devices. The models are never edited: placement goes by op kind and weight
role, the vocabulary every architecture module already uses.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from ..errors import UsageError
from ..graph import Graph, Op, Tensor

DEFAULT_MODE = "layer"
MODES = ("none", "layer", "row", "tensor", "graph")
REDUCE_TYPES = ("f32", "f16", "bf16")


@dataclass
class SplitOptions:
    mode: str = DEFAULT_MODE
    tensor_split: list[float] | None = None    # -ts proportions (None: free memory)
    main_gpu: int = 0                          # -mg: index among the selected devices
    max_gpu: int | None = None                 # --max-gpu (graph mode)
    reduce_type: str = "f16"                   # --reduce-type: partials of batches > 32 tokens (graph)


def check_options(opts: SplitOptions, n_devices: int) -> None:
    """Usage errors (exit 2) for flag values that cannot work on these devices."""
    if opts.mode not in MODES:
        raise UsageError(f"unknown split mode {opts.mode!r}; choose one of {', '.join(MODES)}")
    if opts.reduce_type not in REDUCE_TYPES:
        raise UsageError(f"unknown reduce type {opts.reduce_type!r}; choose one of {', '.join(REDUCE_TYPES)}")
    if not 0 <= opts.main_gpu < n_devices:
        raise UsageError(f"-mg {opts.main_gpu} is out of range: {n_devices} device(s) selected")
    ts = opts.tensor_split
    if ts is not None:
        if len(ts) > n_devices:
            raise UsageError(f"-ts has {len(ts)} values for {n_devices} device(s)")
        if any(v < 0 for v in ts) or sum(ts) <= 0:
            raise UsageError("-ts values must be non-negative and not all zero")
    if opts.max_gpu is not None and opts.max_gpu < 1:
        raise UsageError("--max-gpu must be at least 1")


def proportions(opts: SplitOptions, free_bytes: list[int | None]) -> list[float]:
    """Share of each device: -ts (missing entries 0), else free memory, else equal."""
    n = len(free_bytes)
    if opts.tensor_split is not None:
        ts = list(opts.tensor_split) + [0.0] * (n - len(opts.tensor_split))
    elif all(f for f in free_bytes):
        ts = [float(f) for f in free_bytes]
    else:
        ts = [1.0] * n
    total = sum(ts)
    return [v / total for v in ts]


def partition(total: int, shares: list[float], granularity: int = 1) -> list[tuple[int, int]]:
    """Cut [0, total) into contiguous ranges by cumulative share, on multiples of `granularity`
    (the last range ends at total). A device with share 0 gets an empty range."""
    units = -(-total // granularity)
    bounds, acc = [0], 0.0
    for s in shares[:-1]:
        acc += s
        bounds.append(min(total, round(acc * units) * granularity))
    bounds.append(total)
    return [(bounds[i], max(bounds[i], bounds[i + 1])) for i in range(len(shares))]


@dataclass
class Exchange:
    """One exchange point of a step: who writes into its slots, who waits for them."""
    index: int
    producers: set[int] = field(default_factory=set)
    consumers: set[int] = field(default_factory=set)


class DeviceGraphs:
    """One graph per device, built from the model's graph by a split mode."""

    def __init__(self, model_graph: Graph, n_devices: int):
        self.model = model_graph
        self.n = n_devices
        self.graphs = [Graph(model_graph.config) for _ in range(n_devices)]
        self.maps: list[dict[Tensor, Tensor]] = [{} for _ in range(n_devices)]   # model -> device tensor
        self.exchanges: list[Exchange] = []
        self.put_bytes_per_token = 0                 # largest slot a device fills in one exchange
        self.logits_parts: list[tuple[int, int, int]] = []   # (device, first vocab column, end)
        self.holds: list[list[str]] = [[] for _ in range(n_devices)]  # for -v
        # Layer mode's hops each wait for a whole block of layers: its exchange points get more
        # lines to poll (split/comm.py). (Relaying them through the host instead measured slower
        # and erratic on 4 H200s: GPUs idle between their turns and lose their clocks.)
        self.long_waits = False
        # -sm graph: in one-token steps the product after an all-reduce is chained to it, so that its
        # weight loads overlap the exchange (split/matvec_steps.py)
        self.overlap = False

    # -- ops -----------------------------------------------------------------------------------
    def tensor(self, d: int, t: Tensor) -> Tensor:
        """The device-`d` tensor for model tensor `t` (weights: registered in d's graph)."""
        if t.kind == "weight":
            self.graphs[d].weights.setdefault(t.name, t)
            return t
        try:
            return self.maps[d][t]
        except KeyError:
            raise AssertionError(f"{t.name} is not on device {d} (split plan bug)") from None

    def has(self, d: int, t: Tensor) -> bool:
        return t in self.maps[d]

    def emit(self, d: int, kind: str, inputs, width: int | None, layer=None, out: Tensor | None = None,
             **attrs) -> Tensor | None:
        """Append an op to device d's graph; inputs are device tensors (weights get registered)."""
        g = self.graphs[d]
        for t in inputs:
            if t.kind == "weight":
                g.weights.setdefault(t.name, t)
        for v in attrs.values():
            if isinstance(v, Tensor) and v.kind == "weight":
                g.weights.setdefault(v.name, v)
        if out is None and width is not None:
            g._count += 1
            out = Tensor(f"{kind}.d{d}.{g._count}", width, layer=layer)
        g.ops.append(Op(kind, tuple(inputs), out, layer, attrs))
        return out

    def place(self, d: int, op: Op, inputs=None, **attrs) -> Tensor | None:
        """Copy a model op onto device d (inputs mapped, optionally replaced; attrs updated)."""
        inputs = tuple(self.tensor(d, t) for t in op.inputs) if inputs is None else tuple(inputs)
        merged = dict(op.attrs)
        merged.update(attrs)
        merged = {k: (self.tensor(d, v) if isinstance(v, Tensor) else v) for k, v in merged.items()}
        out = self.emit(d, op.kind, inputs, op.out.width if op.out is not None else None, op.layer, **merged)
        if op.out is not None:
            self.maps[d][op.out] = out
        elif op.kind == "rope":          # in place: the output is the input
            self.maps[d][op.inputs[0]] = inputs[0]
        return out

    def bind(self, d: int, model_tensor: Tensor, device_tensor: Tensor) -> None:
        self.maps[d][model_tensor] = device_tensor

    def set_logits(self, d: int, t: Tensor) -> None:
        self.graphs[d].logits = t

    # -- exchanges -----------------------------------------------------------------------------
    def new_exchange(self) -> Exchange:
        e = Exchange(len(self.exchanges))
        self.exchanges.append(e)
        return e

    def note_put(self, width: int, bytes_per_value: int = 4) -> None:
        self.put_bytes_per_token = max(self.put_bytes_per_token, width * bytes_per_value)

