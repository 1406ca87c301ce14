"""KV cache types (-ctk / -ctv, API type_k= / type_v=): f16 (the default), q8_0, q4_0, q4_1, q5_0 and
q5_1.

A cache of width W (KV heads x head_dim) holds n_ctx rows; a quantized one is a flat array of ggml
blocks of 32 values, a row being W / 32 blocks (shaders/kv_quant.glsl has the layouts): q8_0 34
bytes a block (f16 scale + 32 int8), q4_0 18 bytes (f16 scale + 16 bytes of nibbles), q4_1 20
(scale, offset, nibbles), q5_0 22 (scale, 32 fifth bits, nibbles), q5_1 24. K and V
types are chosen separately, as in llama.cpp. Every head_dim must then be a multiple of 32, so
that a block never spans two heads (true of every supported model; checked at load).
"""

from __future__ import annotations

from dataclasses import dataclass

from .errors import LlamavkError

# name -> (shader type code: kv_quant.glsl's KV_F16 / KV_Q8_0 / ..., values per block, bytes per block)
_TYPES = {"f16": (0, 1, 2), "q8_0": (1, 32, 34), "q4_0": (2, 32, 18), "q4_1": (3, 32, 20), "q5_0": (4, 32, 22),
          "q5_1": (5, 32, 24)}
KV_CACHE_TYPES = tuple(_TYPES)


def type_code(name: str) -> int:
    return _TYPES[name][0]


def row_bytes(name: str, width: int) -> int:
    """Bytes of one cache row of `width` values."""
    _, block, nbytes = _TYPES[name]
    return width // block * nbytes


def cache_bytes(name: str, n_ctx: int, width: int) -> int:
    """Bytes of a cache of n_ctx rows, rounded up to 16 (the kernels read it in 16-byte pieces)."""
    return -(-n_ctx * row_bytes(name, width) // 16) * 16


@dataclass(frozen=True)
class KVTypes:
    """The K and V cache types of a model's every attention layer."""
    k: str = "f16"
    v: str = "f16"

    def __post_init__(self):
        for which, name in (("K", self.k), ("V", self.v)):
            if name not in _TYPES:
                raise LlamavkError(f"unknown {which} cache type {name!r}; expected one of {', '.join(_TYPES)}")

    @property
    def quantized(self) -> bool:
        return self.k != "f16" or self.v != "f16"

    @property
    def codes(self) -> tuple[int, int]:
        return type_code(self.k), type_code(self.v)

    def check_head_dim(self, head_dim: int) -> None:
        """A quantized cache needs whole blocks per head: one line otherwise."""
        if self.quantized and head_dim % 32:
            raise LlamavkError(f"KV cache types {self.k}/{self.v}: head_dim {head_dim} is not a multiple of 32 "
                               "(quantized blocks hold 32 values of one head); use -ctk f16 -ctv f16")

    def layer_bytes(self, n_ctx: int, width: int) -> int:
        """K and V cache bytes of one attention layer of `width` values a row."""
        return cache_bytes(self.k, n_ctx, width) + cache_bytes(self.v, n_ctx, width)
