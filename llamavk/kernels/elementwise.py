"""Element-wise recorders: residual add, SwiGLU, GeGLU, broadcast bias, scale, soft-cap
(shaders/elementwise*.comp, unary.comp)."""

from __future__ import annotations

import struct

from . import groups_2d
from .norm import _range

WG = 256


def _groups(n: int):
    return groups_2d((n + WG - 1) // WG)


def add(seq, kc, a, b, out, n: int) -> None:
    """out[i] = a[i] + b[i] for i < n (float32); out may be a or b (residual add in place)."""
    if n <= 0:
        return
    kernel = kc.get("ew_add_f32", "rrw", push_size=4, spec=(WG,))
    seq.dispatch(kernel, [_range(a), _range(b), _range(out)], _groups(n), struct.pack("<I", n))


def swiglu(seq, kc, gate, up, out, n: int, out_f16: bool = False) -> None:
    """out[i] = silu(gate[i]) * up[i], silu(g) = g / (1 + exp(-g)), for i < n; out may alias an input.
    out_f16: out holds f16 values (rounded as collective.convert rounds)."""
    _glu(seq, kc, "swiglu", gate, up, out, n, out_f16)


def geglu(seq, kc, gate, up, out, n: int, out_f16: bool = False) -> None:
    """out[i] = gelu(gate[i]) * up[i] for i < n, GELU's tanh approximation; out may alias an input
    (out_f16: as swiglu's)."""
    _glu(seq, kc, "geglu", gate, up, out, n, out_f16)


def swiglu_oai(seq, kc, gate, up, out, n: int, alpha: float, limit: float, out_f16: bool = False) -> None:
    """out[i] = g sigmoid(alpha g) (u + 1) with g = min(gate[i], limit), u = clamp(up[i], -limit, limit)
    (gpt-oss's experts, ggml_swiglu_oai); out may alias an input (out_f16: as swiglu's)."""
    _glu(seq, kc, "swiglu_oai", gate, up, out, n, out_f16, struct.pack("<ff", alpha, limit))


def _glu(seq, kc, op: str, gate, up, out, n: int, out_f16: bool, extra: bytes = b"") -> None:
    if n <= 0:
        return
    push = struct.pack("<I", n) + extra
    kernel = kc.get(f"{op}_f32_to_f16" if out_f16 else f"{op}_f32", "rrw", push_size=len(push), spec=(WG,))
    seq.dispatch(kernel, [_range(gate), _range(up), _range(out)], _groups(n), push)


def scale(seq, kc, x, out, n: int, s: float) -> None:
    """out[i] = s * x[i] for i < n; out may be x."""
    _unary(seq, kc, "scale_f32", x, out, n, s)


def softcap(seq, kc, x, out, n: int, cap: float) -> None:
    """out[i] = cap * tanh(x[i] / cap) for i < n (cap > 0); out may be x."""
    if not cap > 0:
        raise ValueError(f"softcap: cap must be positive, not {cap}")
    _unary(seq, kc, "softcap_f32", x, out, n, cap)


def _unary(seq, kc, name: str, x, out, n: int, s: float) -> None:
    if n <= 0:
        return
    kernel = kc.get(name, "rw", push_size=8, spec=(WG,))
    seq.dispatch(kernel, [_range(x), _range(out)], _groups(n), struct.pack("<If", n, s))


def add_bias(seq, kc, x, bias, n_tokens: int, width: int) -> None:
    """x[t, :] += bias for t < n_tokens, in place (x = [n_tokens][width], bias = [width])."""
    if n_tokens <= 0 or width <= 0:
        return
    if n_tokens > 65535:
        raise ValueError("add_bias: at most 65535 rows per call")
    kernel = kc.get("add_bias_f32", "rw", push_size=8, spec=(WG,))
    seq.dispatch(kernel, [_range(bias), _range(x)], ((width + WG - 1) // WG, n_tokens, 1),
                 struct.pack("<II", width, n_tokens))
