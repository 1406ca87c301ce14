"""The lattice grids of the IQ1 / IQ2 / IQ3 weight types, as the bytes the kernels read.

A group of 8 weights of these types is one entry of a fixed grid (IQ1: 8 values of -1, 0, 1; IQ2: of
8, 25, 43; IQ3: two 4-value entries of small odd or 4 mod 8 numbers), picked by an index in the block,
then signed and scaled. The grids are part of the format: they come from the `gguf` package
(gguf.quants decodes llama.cpp's tables), imported only when a model holds one of these types, so
the kernels and the numpy reference that tests compare them with read the same numbers. On the
device each grid follows the weight chunk's blocks in its buffer (kernels.allocate_qweight,
shaders/quants.glsl iq_grid): entry i as its signed bytes, little-endian.
"""

from __future__ import annotations

from functools import lru_cache

import numpy as np

from .quant import GGMLQuantizationType as T

# type -> the gguf.quants class whose grid it indexes (IQ1_M shares IQ1_S's)
_GRID_OF = {T.IQ2_XXS: "IQ2_XXS", T.IQ2_XS: "IQ2_XS", T.IQ2_S: "IQ2_S", T.IQ3_XXS: "IQ3_XXS",
            T.IQ3_S: "IQ3_S", T.IQ1_S: "IQ1_S", T.IQ1_M: "IQ1_S"}
LATTICE_TYPES = frozenset(_GRID_OF)


@lru_cache(maxsize=None)
def grid_bytes(qtype) -> np.ndarray | None:
    """The grid of a lattice type as uint8 (entries of 8 or 4 signed bytes, in index order), None
    for every other type."""
    name = _GRID_OF.get(T(int(qtype)))
    if name is None:
        return None
    from gguf import quants

    cls = getattr(quants, name)
    cls.init_grid()
    values = np.asarray(cls.grid, dtype=np.float32).reshape(cls.grid_shape)
    as_int = values.astype(np.int64)
    if not (as_int == values).all() or as_int.min() < -128 or as_int.max() > 127:
        raise ValueError(f"gguf's {name} grid does not hold signed bytes")
    out = as_int.astype(np.int8).view(np.uint8).reshape(-1)
    out.flags.writeable = False
    return out
