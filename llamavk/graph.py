"""A tiny IR for the forward pass: tensors and ops, in execution order.

Model modules build a `Graph` with readable calls (`g.rms_norm`, `g.matmul`, ...); the runtime turns
it into recorded dispatches; split modes (llamavk/split/) rewrite it into one graph per device, with
parts of weights and exchange ops (`put`, `sync`, `get`, `reduce`; see split/exchange.py). Activations
are [n_tokens, width] float32; the batch size is not part of the graph, so one graph serves every
step shape.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from .errors import LlamavkError


@dataclass(eq=False)
class Tensor:
    name: str
    width: int                       # activations: columns per token; weights: cols
    kind: str = "act"                # "act" | "weight"
    rows: int = 0                    # weights: rows (output features)
    role: str | None = None          # weights: WeightSpec role
    layer: int | None = None
    # weights cut by a split mode: the GGUF tensor this is part of, and which part:
    # (axis, start, stop) with axis 0 = rows (output features), 1 = columns (input features); or
    # (axis, start0, stop0, start1, stop1, ...): several ranges side by side (gathered())
    source: str | None = None
    part: tuple[int, int, int] | None = None
    # stacked expert matrices (n_expert, rows, cols): rows and width are one expert's, and a part
    # cuts every expert alike
    experts: int = 0

    def sliced(self, axis: int, start: int, stop: int) -> "Tensor":
        """A part of this weight (vectors, rows == 1, are cut along their only axis: pass axis 0)."""
        if self.source is not None:   # a part of a part: the same ranges of the GGUF tensor
            return self.gathered(axis, [(start, stop)])
        if self.rows == 1 and not self.experts:
            return Tensor(f"{self.name}[{start}:{stop}]", stop - start, "weight", 1, self.role, self.layer,
                          self.name, (0, start, stop))
        if axis == 0:
            return Tensor(f"{self.name}[r{start}:{stop}]", self.width, "weight", stop - start, self.role,
                          self.layer, self.name, (0, start, stop), self.experts)
        return Tensor(f"{self.name}[c{start}:{stop}]", stop - start, "weight", self.rows, self.role,
                      self.layer, self.name, (1, start, stop), self.experts)

    def gathered(self, axis: int, ranges) -> "Tensor":
        """Several ranges of this weight along one axis, side by side, as one part: a device's share
        of a DeltaNet layer, whose value heads of one key head lie apart (every n_k_heads-th)."""
        ranges = [(a, b) for a, b in ranges if b > a]
        if self.source is not None:
            return self._part_of_part(axis, ranges)
        if len(ranges) == 1:
            return self.sliced(axis, *ranges[0])
        n = sum(b - a for a, b in ranges)
        part = (0 if self.rows == 1 and not self.experts else axis,) + tuple(v for r in ranges for v in r)
        tag = ",".join(f"{a}:{b}" for a, b in ranges)
        if self.rows == 1 and not self.experts:
            return Tensor(f"{self.name}[{tag}]", n, "weight", 1, self.role, self.layer, self.name, part)
        if axis == 0:
            return Tensor(f"{self.name}[r{tag}]", self.width, "weight", n, self.role, self.layer, self.name, part,
                          self.experts)
        return Tensor(f"{self.name}[c{tag}]", n, "weight", self.rows, self.role, self.layer, self.name, part,
                      self.experts)

    def _part_of_part(self, axis: int, ranges) -> "Tensor":
        """Ranges of this part (a split mode cutting a weight a model already reads in parts, such as
        qwen3next's rows of ssm_in) as ranges of the GGUF tensor itself, along the same axis."""
        own_axis, own = self.part[0], list(zip(self.part[1::2], self.part[2::2]))
        if (0 if self.rows == 1 and not self.experts else axis) != own_axis:
            raise LlamavkError(f"{self.name}: a part along another axis of a weight read in parts")
        mapped = []
        for a, b in ranges:
            base = 0
            for s0, s1 in own:           # this part's values [base, base + s1 - s0) lie at [s0, s1)
                lo, hi = max(a, base), min(b, base + s1 - s0)
                if hi > lo:
                    mapped.append((s0 + lo - base, s0 + hi - base))
                base += s1 - s0
        merged = []
        for a, b in mapped:               # neighbouring ranges as one
            if merged and merged[-1][1] == a:
                merged[-1] = (merged[-1][0], b)
            else:
                merged.append((a, b))
        whole = Tensor(self.source, self.width, "weight", self.rows, self.role, self.layer, experts=self.experts)
        return whole.gathered(own_axis, merged)

    def __repr__(self):
        return f"Tensor({self.name}, {self.kind}, width={self.width})"


# attrs naming a tensor the op writes besides its output: a product's route (a router folded into it,
# fusion.fuse_router_into_products)
WRITTEN_ATTRS = ("route_out",)


@dataclass(eq=False)
class Op:
    kind: str
    inputs: tuple[Tensor, ...]
    out: Tensor | None
    layer: int | None = None
    attrs: dict = field(default_factory=dict)

    def reads(self) -> tuple[Tensor, ...]:
        """Every tensor the op reads: its inputs and tensors carried in attrs (fused operands)."""
        extra = tuple(v for k, v in self.attrs.items() if isinstance(v, Tensor) and k not in WRITTEN_ATTRS)
        return self.inputs + extra

    def writes(self) -> tuple[Tensor, ...]:
        """Every tensor the op writes: its output, and a fused op's second output (WRITTEN_ATTRS)."""
        extra = tuple(self.attrs[k] for k in WRITTEN_ATTRS if k in self.attrs)
        return ((self.out,) if self.out is not None else ()) + extra

    def __repr__(self):
        return f"Op({self.kind}, {[t.name for t in self.inputs]} -> {self.out.name if self.out else None})"


class Graph:
    """Builder + container. Every method appends one op and returns its output tensor."""

    def __init__(self, config):
        self.config = config
        self.ops: list[Op] = []
        self.weights: dict[str, Tensor] = {}
        self.layer: int | None = None     # set by the model while building a block
        self.logits: Tensor | None = None
        self._count = 0

    # -- tensors -------------------------------------------------------------------------------
    def weight(self, name: str, rows: int, cols: int, role: str, layer: int | None = None,
               experts: int = 0) -> Tensor:
        """A weight matrix (rows, cols), or `experts` stacked ones (experts, rows, cols)."""
        t = self.weights.get(name)
        if t is None:
            t = self.weights[name] = Tensor(name, cols, "weight", rows, role, layer, experts=experts)
        return t

    def weight_rows(self, name: str, rows: int, cols: int, role: str, layer: int | None,
                    ranges: list[tuple[int, int]]) -> Tensor:
        """Rows `ranges` of a weight matrix (rows, cols), side by side, as a weight of its own with its
        own role: a model that reads one GGUF matrix as several products (qwen3next's ssm_in)."""
        t = Tensor(name, cols, "weight", rows, role, layer).gathered(0, ranges)
        return self.weights.setdefault(t.name, t)

    def _op(self, kind: str, inputs, width: int | None, **attrs) -> Tensor | None:
        out = None
        if width is not None:
            self._count += 1
            out = Tensor(f"{kind}.{self._count}", width, layer=self.layer)
        self.ops.append(Op(kind, tuple(inputs), out, self.layer, attrs))
        return out

    # -- ops -----------------------------------------------------------------------------------
    def embed(self, table: Tensor) -> Tensor:
        """Rows of the token-embedding table for this step's token ids."""
        return self._op("embed", [table], table.width)

    def rms_norm(self, x: Tensor, weight: Tensor | None, eps: float) -> Tensor:
        return self._op("rms_norm", [x] + ([weight] if weight is not None else []), x.width, eps=eps)

    def head_norm(self, x: Tensor, weight: Tensor, n_heads: int, eps: float, stride: int = 0) -> Tensor:
        """RMS norm of each head's slice (qwen3's Q/K norm). stride > 0: x holds each head in `stride`
        values of which the first weight.width are normed (qwen35's Q beside its output gate); the
        output is the normed heads alone, weight.width each."""
        if stride:
            return self._op("head_norm", [x, weight], n_heads * weight.width, eps=eps, n_heads=n_heads,
                            stride=stride)
        return self._op("head_norm", [x, weight], x.width, eps=eps, n_heads=n_heads)

    def matmul(self, w: Tensor, x: Tensor, bias: Tensor | None = None) -> Tensor:
        return self._op("matmul", [w, x] + ([bias] if bias is not None else []), w.rows)

    def rope(self, x: Tensor, n_heads: int) -> Tensor:
        """Rotary embedding, in place (the output tensor aliases x)."""
        self._op("rope", [x], None, n_heads=n_heads)
        return x

    def attention(self, q: Tensor, k: Tensor, v: Tensor, window: int = 0, scale: float = 0.0,
                  sinks: Tensor | None = None) -> Tensor:
        """Append k, v to this layer's KV cache, then causal attention of q over the cache.
        window > 0: position p sees positions p - window + 1 .. p only (sliding-window layers);
        scale: of q.k (0: 1/sqrt(head_dim)); sinks (gpt-oss): per query head one more logit in the
        softmax, unscaled, whose value is 0."""
        attrs = {name: value for name, value in (("window", window), ("scale", scale), ("sinks", sinks)) if value}
        return self._op("attention", [q, k, v], q.width, **attrs)

    def moe_route(self, logits: Tensor, n_used: int, gating: str, norm: bool, scale: float,
                  sel_bias: Tensor | None = None) -> Tensor:
        """The experts each token runs: router logits -> probabilities (softmax or sigmoid over the
        experts) -> the n_used most probable (of probability + sel_bias, where given: glm4moe) -> their
        weights, the probabilities (renormalized to sum 1 where `norm`, times `scale`). Output per
        token: n_used expert ids (uint32 bits), then their n_used weights."""
        extra = {"sel_bias": sel_bias} if sel_bias is not None else {}
        return self._op("moe_route", [logits], 2 * n_used, n_used=n_used, gating=gating, norm=norm, scale=scale,
                        **extra)

    def matmul_id(self, w: Tensor, x: Tensor, route: Tensor) -> Tensor:
        """Each token's products with its chosen experts' matrices: y[t, s] = W[id[t, s]] x[t] (x one
        vector per token) or W[id[t, s]] x[t, s] (x one vector per expert slot). Output per token: the
        n_used slots' rows side by side."""
        n_used = route.width // 2
        return self._op("matmul_id", [w, x, route], n_used * w.rows)

    def add_id(self, y: Tensor, bias: Tensor, route: Tensor) -> Tensor:
        """An expert product's per-expert bias: y[t, s] + bias[id[t, s]] (bias: n_expert rows of
        y's slot width, one vector; ggml_add_id)."""
        return self._op("add_id", [y, bias, route], y.width)

    def moe_sum(self, y: Tensor, route: Tensor) -> Tensor:
        """The weighted sum of a token's expert outputs: sum_s weight[t, s] * y[t, s]."""
        return self._op("moe_sum", [y, route], y.width // (route.width // 2))

    def scale_sigmoid(self, y: Tensor, x: Tensor, w: Tensor) -> Tensor:
        """y[t] * sigmoid(w . x[t]): the shared expert's output, gated per token."""
        return self._op("scale_sigmoid", [y, x, w], y.width)

    def attn_gate(self, a: Tensor, qg: Tensor, n_heads: int, head_dim: int) -> Tensor:
        """a * sigmoid(gate), the gate being the second head_dim values of each head's 2 * head_dim in qg
        (qwen35's gated attention: the Q product yields [q | gate] per head)."""
        return self._op("attn_gate", [a, qg], n_heads * head_dim, n_heads=n_heads, head_dim=head_dim)

    def ssm_conv(self, x: Tensor, w: Tensor, d_conv: int) -> Tensor:
        """Causal depthwise convolution of each channel over the last d_conv tokens (earlier ones from
        the layer's conv state), then SiLU. w: channels x d_conv taps, the last for the current token."""
        return self._op("ssm_conv", [x, w], x.width, channels=x.width, d_conv=d_conv)

    def delta_net(self, x: Tensor, alpha: Tensor, beta: Tensor, dt: Tensor, a: Tensor, n_k_heads: int,
                  n_v_heads: int, head_dim: int, eps: float, grouped: bool = False) -> Tensor:
        """The gated delta rule over this layer's recurrent state. x per token: [q | k | v] (n_k_heads,
        n_k_heads, n_v_heads heads of head_dim; value head h reads key head h % n_k_heads, or with
        grouped h // (n_v_heads / n_k_heads)); q and k L2-normed; decay exp(softplus(alpha + dt) * a),
        write strength sigmoid(beta), per value head. Output: n_v_heads heads of head_dim."""
        return self._op("delta_net", [x, alpha, beta, dt, a], n_v_heads * head_dim, n_k_heads=n_k_heads,
                        n_v_heads=n_v_heads, head_dim=head_dim, eps=eps, grouped=grouped)

    def gated_norm(self, x: Tensor, z: Tensor, w: Tensor, n_heads: int, eps: float) -> Tensor:
        """RMS norm of each head of x (weight w), times silu(z)."""
        return self._op("gated_norm", [x, z, w], n_heads * w.width, n_heads=n_heads, eps=eps)

    def swiglu(self, gate: Tensor, up: Tensor) -> Tensor:
        return self._op("swiglu", [gate, up], gate.width)

    def swiglu_oai(self, gate: Tensor, up: Tensor, alpha: float, limit: float) -> Tensor:
        """g sigmoid(alpha g) (u + 1), g = min(gate, limit), u = clamp(up, -limit, limit) (gpt-oss)."""
        return self._op("swiglu_oai", [gate, up], gate.width, alpha=alpha, limit=limit)

    def geglu(self, gate: Tensor, up: Tensor) -> Tensor:
        """gelu(gate) * up with GELU's tanh approximation (gemma3's FFN)."""
        return self._op("geglu", [gate, up], gate.width)

    def scale(self, x: Tensor, s: float) -> Tensor:
        """x * s (gemma3's embedding scale)."""
        return self._op("scale", [x], x.width, scale=s)

    def softcap(self, x: Tensor, cap: float) -> Tensor:
        """x = cap * tanh(x / cap), in place (the output tensor aliases x): final logit soft-capping,
        where x is the logits (split modes keep them cut by vocabulary: an in-place element-wise op
        stays with each part)."""
        self._op("softcap", [x], None, cap=cap)
        return x

    def add(self, a: Tensor, b: Tensor) -> Tensor:
        return self._op("add", [a, b], a.width)

    def last_row(self, x: Tensor) -> Tensor:
        """The last token's row only (generation needs logits for one token, not the batch)."""
        return self._op("last_row", [x], x.width)

    def output(self, logits: Tensor) -> Tensor:
        self.logits = logits
        return logits
