"""The tensor types llamavk supports, with their block geometry.

A GGUF tensor is stored as a sequence of blocks along each row: `block_size` elements packed into
`type_size` bytes. F32/F16/BF16 are "blocks" of one element. A row of `n` elements therefore takes
`n // block_size * type_size` bytes, and `n` must be a multiple of `block_size`.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import IntEnum

from .errors import LlamavkError

# These tables are data of the GGUF file format (ggml's `enum ggml_type` and its type traits), kept
# here so that opening and running a model does not import the `gguf` package (gguf.metadata pulls
# in yaml and gguf's writer: a quarter of a second of start-up on a slow Python). tests/test_quant.py
# checks them against gguf's GGMLQuantizationType and GGML_QUANT_SIZES.

GGUF_DEFAULT_ALIGNMENT = 32   # tensor data alignment when `general.alignment` is absent


class GGMLQuantizationType(IntEnum):
    """A tensor's type id in a GGUF file, with ggml's names. IntEnum: a member equals, and hashes as,
    its id, so gguf.GGMLQuantizationType members and plain ints work as keys and in comparisons.
    Ids 4, 5 and 31 to 33, 36 to 38 belong to types ggml has removed: a file using them is refused."""
    F32 = 0
    F16 = 1
    Q4_0 = 2
    Q4_1 = 3
    Q5_0 = 6
    Q5_1 = 7
    Q8_0 = 8
    Q8_1 = 9
    Q2_K = 10
    Q3_K = 11
    Q4_K = 12
    Q5_K = 13
    Q6_K = 14
    Q8_K = 15
    IQ2_XXS = 16
    IQ2_XS = 17
    IQ3_XXS = 18
    IQ1_S = 19
    IQ4_NL = 20
    IQ3_S = 21
    IQ2_S = 22
    IQ4_XS = 23
    I8 = 24
    I16 = 25
    I32 = 26
    I64 = 27
    F64 = 28
    IQ1_M = 29
    BF16 = 30
    TQ1_0 = 34
    TQ2_0 = 35
    MXFP4 = 39
    NVFP4 = 40
    Q1_0 = 41


T = GGMLQuantizationType
QK_K = 256   # elements per super-block of the k-quants and most i-quants

# type -> (elements per block, bytes per block), for every type of the format: a file's tensor of a
# type llamavk cannot run still has a known size, so the error can name the type.
GGML_QUANT_SIZES: dict[T, tuple[int, int]] = {
    T.F32: (1, 4),
    T.F16: (1, 2),
    T.Q4_0: (32, 2 + 16),
    T.Q4_1: (32, 2 + 2 + 16),
    T.Q5_0: (32, 2 + 4 + 16),
    T.Q5_1: (32, 2 + 2 + 4 + 16),
    T.Q8_0: (32, 2 + 32),
    T.Q8_1: (32, 4 + 4 + 32),
    T.Q2_K: (QK_K, 2 + 2 + QK_K // 16 + QK_K // 4),
    T.Q3_K: (QK_K, 2 + QK_K // 4 + QK_K // 8 + 12),
    T.Q4_K: (QK_K, 2 + 2 + QK_K // 2 + 12),
    T.Q5_K: (QK_K, 2 + 2 + QK_K // 2 + QK_K // 8 + 12),
    T.Q6_K: (QK_K, 2 + QK_K // 2 + QK_K // 4 + QK_K // 16),
    T.Q8_K: (QK_K, 4 + QK_K + QK_K // 8),
    T.IQ2_XXS: (QK_K, 2 + QK_K // 4),
    T.IQ2_XS: (QK_K, 2 + QK_K // 4 + QK_K // 32),
    T.IQ3_XXS: (QK_K, 2 + QK_K // 4 + QK_K // 8),
    T.IQ1_S: (QK_K, 2 + QK_K // 8 + QK_K // 16),
    T.IQ4_NL: (32, 2 + 16),
    T.IQ3_S: (QK_K, 2 + QK_K // 4 + QK_K // 8 + QK_K // 32 + 4),
    T.IQ2_S: (QK_K, 2 + QK_K // 4 + QK_K // 16),
    T.IQ4_XS: (QK_K, 2 + 2 + QK_K // 2 + QK_K // 64),
    T.I8: (1, 1),
    T.I16: (1, 2),
    T.I32: (1, 4),
    T.I64: (1, 8),
    T.F64: (1, 8),
    T.IQ1_M: (QK_K, QK_K // 8 + QK_K // 16 + QK_K // 32),
    T.BF16: (1, 2),
    T.TQ1_0: (QK_K, 2 + 4 * 13),
    T.TQ2_0: (QK_K, 2 + 64),
    T.MXFP4: (32, 1 + 16),
    T.NVFP4: (64, 4 + 32),
    T.Q1_0: (128, 2 + 16),
}


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
    T.IQ2_XXS, T.IQ2_XS, T.IQ2_S, T.IQ3_XXS, T.IQ3_S, T.IQ1_S, T.IQ1_M,
    T.TQ1_0, T.TQ2_0,
)

QUANT_INFO: dict[T, QuantInfo] = {
    t: QuantInfo(t, *GGML_QUANT_SIZES[t]) for t in SUPPORTED_TYPES
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
        try:
            tname = T(qtype).name      # also for a gguf.GGMLQuantizationType member or a plain id
        except (ValueError, TypeError):
            tname = str(qtype)
        raise LlamavkError(f"{tensor_name} has type {tname}, which llamavk does not support "
                           f"(supported: {', '.join(t.name for t in SUPPORTED_TYPES)})")
    return info


def tensor_nbytes(qtype: T, shape: tuple[int, ...]) -> int:
    """Bytes of a tensor of `shape` (numpy order, last axis contiguous) for any type of the format."""
    block_size, type_size = GGML_QUANT_SIZES[qtype]
    n = 1
    for d in shape:
        n *= int(d)
    return n // block_size * type_size
