"""The tensor types llamavk supports, with their block geometry.

A GGUF tensor is stored as a sequence of blocks along each row: `block_size` elements packed into
`type_size` bytes. F32/F16/BF16 are "blocks" of one element. A row of `n` elements therefore takes
`n // block_size * type_size` bytes, and `n` must be a multiple of `block_size`.
"""

from __future__ import annotations

from dataclasses import dataclass

import gguf
from gguf import GGMLQuantizationType as T

from .errors import LlamavkError


@dataclass(frozen=True)
class QuantInfo:
    qtype: T
    block_size: int  # elements per block
    type_size: int   # bytes per block

    @property
    def name(self) -> str:
        return self.qtype.name

    def row_bytes(self, n: int) -> int:
        """Bytes taken by a row of `n` elements (n must be a multiple of block_size)."""
        return n // self.block_size * self.type_size


SUPPORTED_TYPES: tuple[T, ...] = (
    T.F32, T.F16, T.BF16,
    T.Q8_0, T.Q4_0, T.Q4_1, T.Q5_0, T.Q5_1,
    T.Q2_K, T.Q3_K, T.Q4_K, T.Q5_K, T.Q6_K,
    T.IQ4_NL, T.IQ4_XS, T.MXFP4,
)

QUANT_INFO: dict[T, QuantInfo] = {
    t: QuantInfo(t, *gguf.GGML_QUANT_SIZES[t]) for t in SUPPORTED_TYPES
}


def qtype_from_name(name: str) -> T:
    """'q4_0' / 'Q4_0' / 'f16' -> GGMLQuantizationType, restricted to the supported set."""
    try:
        qtype = T[name.upper()]
    except KeyError:
        qtype = None
    if qtype not in QUANT_INFO:
        names = ", ".join(t.name.lower() for t in SUPPORTED_TYPES)
        raise LlamavkError(f"unknown or unsupported tensor type {name!r}; supported: {names}")
    return qtype


def quant_info(qtype: T, tensor_name: str = "tensor") -> QuantInfo:
    """Block geometry of a supported type; a clear error naming the tensor otherwise."""
    info = QUANT_INFO.get(qtype)
    if info is None:
        tname = qtype.name if isinstance(qtype, T) else str(qtype)
        raise LlamavkError(f"{tensor_name} has type {tname}, which llamavk does not support "
                           f"(supported: {', '.join(t.name for t in SUPPORTED_TYPES)})")
    return info


def tensor_nbytes(qtype: T, shape: tuple[int, ...]) -> int:
    """Bytes of a tensor of `shape` (numpy order, last axis contiguous) for any type gguf knows."""
    block_size, type_size = gguf.GGML_QUANT_SIZES[qtype]
    n = 1
    for d in shape:
        n *= int(d)
    return n // block_size * type_size
