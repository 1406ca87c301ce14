"""llamavk.quant's own copy of the GGUF type table, checked against the gguf package (the independent
reference), and its interplay with gguf's enum members (tests and the synthetic writer pass those)."""

from __future__ import annotations

import gguf
import numpy as np
import pytest

from llamavk.errors import LlamavkError
from llamavk.quant import (GGML_QUANT_SIZES, GGUF_DEFAULT_ALIGNMENT, QUANT_INFO, SUPPORTED_TYPES,
                           GGMLQuantizationType, qtype_from_name, quant_info, tensor_nbytes)

G = gguf.GGMLQuantizationType


@pytest.mark.parametrize("qtype", list(GGMLQuantizationType), ids=lambda t: t.name)
def test_type_id_name_and_block_geometry_equal_ggufs(qtype):
    theirs = G.__members__.get(qtype.name)
    if theirs is None:       # gguf>=0.10 is allowed: an older one may not know the newest types yet
        pytest.skip(f"the installed gguf package does not know {qtype.name}")
    assert int(theirs) == int(qtype)
    assert G(int(qtype)).name == qtype.name
    assert GGML_QUANT_SIZES[qtype] == gguf.GGML_QUANT_SIZES[theirs]


def test_every_type_has_a_size_and_the_supported_ones_are_known_to_gguf():
    assert set(GGML_QUANT_SIZES) == set(GGMLQuantizationType)
    assert all(t.name in G.__members__ for t in SUPPORTED_TYPES)
    assert GGUF_DEFAULT_ALIGNMENT == gguf.GGUF_DEFAULT_ALIGNMENT


def test_gguf_members_work_as_keys_and_arguments():
    # IntEnum: gguf's member equals and hashes as ours, so lookups keyed by either agree
    assert QUANT_INFO[G.Q4_K] is QUANT_INFO[GGMLQuantizationType.Q4_K]
    assert G.Q6_K in QUANT_INFO and G.Q8_1 not in QUANT_INFO
    assert quant_info(G.Q4_0).name == "Q4_0"
    assert quant_info(G.Q4_0).row_bytes(64) == 36
    assert GGMLQuantizationType(G.MXFP4) is GGMLQuantizationType.MXFP4
    assert tensor_nbytes(G.Q6_K, (3, 512)) == 3 * 2 * 210
    assert qtype_from_name("iq4_xs") == G.IQ4_XS
    assert {G.Q4_0: "x"}[qtype_from_name("q4_0")] == "x"


@pytest.mark.parametrize("qtype", [G.Q8_1, GGMLQuantizationType.Q8_1, 9], ids=["gguf", "llamavk", "int"])
def test_unsupported_type_error_names_the_type(qtype):
    with pytest.raises(LlamavkError, match=r"blk\.0\.ffn_up\.weight has type Q8_1, which llamavk does not"):
        quant_info(qtype, "blk.0.ffn_up.weight")


def test_unknown_type_id_error():
    with pytest.raises(LlamavkError, match="has type 4, which"):
        quant_info(4, "w")


@pytest.mark.parametrize("qtype", ["f32", "f16", "bf16", "q8_0"])
def test_model_dequantize_equals_ggufs(qtype, tmp_path):
    """ModelFile.dequantize converts F32 / F16 / BF16 itself (no gguf import on load): the same
    values as gguf.quants.dequantize."""
    from gguf.quants import dequantize, quantize

    from llamavk.models.base import ModelFile

    rng = np.random.default_rng(3)
    x = rng.standard_normal((2, 256)).astype(np.float32) * 4
    t = getattr(G, qtype.upper())
    raw = quantize(x, t)

    class File:            # the two GGUFFile methods ModelFile.dequantize reads
        def tensor_type(self, name):
            return GGMLQuantizationType(t)

        def tensor_data(self, name):
            return raw

    class Spec:
        shape = (2, 256)

    m = ModelFile.__new__(ModelFile)
    m.gguf, m.weights = File(), {"w": Spec()}
    got = m.dequantize("w")
    assert got.dtype == np.float32 and got.shape == (2, 256)
    np.testing.assert_array_equal(got, dequantize(raw, t).reshape(2, 256))
