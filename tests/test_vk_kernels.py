"""Real kernels on a real Vulkan device against numpy."""

import struct

import numpy as np
import pytest

from llamavk.vk import Buffer, CommandSequence, Kernel



def test_add(dev):
    rng = np.random.default_rng(1)
    n = 1000  # not a multiple of the workgroup size
    a, b = rng.standard_normal(n, dtype=np.float32), rng.standard_normal(n, dtype=np.float32)
    A, B, C = Buffer(dev, a.nbytes), Buffer(dev, b.nbytes), Buffer(dev, a.nbytes, host_visible=True)
    A.write(a)
    B.write(b)
    C.array(np.float32)[:] = np.nan  # poison: every element must be written
    k = Kernel(dev, "add_f32", "rrw", push_size=4)
    seq = CommandSequence(dev).begin()
    seq.dispatch(k, [A, B, C], ((n + 255) // 256,), struct.pack("<I", n))
    seq.end().run()
    np.testing.assert_array_equal(C.array(np.float32, n), a + b)


@pytest.mark.parametrize("name,dtype", [("matvec_f32", np.float32), ("matvec_f16", np.float16)])
@pytest.mark.parametrize("rows,cols", [(1, 1), (37, 300), (128, 1000)])
def test_matvec(dev, name, dtype, rows, cols):
    rng = np.random.default_rng(rows * cols)
    w = rng.standard_normal((rows, cols)).astype(dtype)
    x = rng.standard_normal(cols).astype(np.float32)
    W, X, Y = Buffer(dev, w.nbytes), Buffer(dev, x.nbytes), Buffer(dev, 4 * rows, host_visible=True)
    W.write(w)
    X.write(x)
    Y.array(np.float32)[:] = np.nan
    k = Kernel(dev, name, "rrw", push_size=8, spec=[64])
    seq = CommandSequence(dev).begin()
    seq.dispatch(k, [W, X, Y], (rows,), struct.pack("<II", rows, cols))
    seq.end().run()
    ref = w.astype(np.float64) @ x.astype(np.float64)
    np.testing.assert_allclose(Y.array(np.float32, rows), ref, rtol=1e-4, atol=1e-4 * np.sqrt(cols))


def test_device_local_roundtrip(dev):
    data = np.arange(3_000_000, dtype=np.uint32)  # bigger than one staging chunk would need
    buf = Buffer(dev, data.nbytes)
    buf.write(data)
    assert np.array_equal(np.frombuffer(buf.read(), dtype=np.uint32), data)


def test_texel_views(dev):
    """A "t" binding's view (vk/kernel.py): whole 16-byte texels reaching past an odd-sized range's
    end (the CPU kernels' Q8_0 tests read a last block's scale there), one view per range, offsets
    in whole texels."""
    from llamavk.errors import LlamavkError
    if not dev.info.is_cpu:
        pytest.skip("buffers take texel views on software devices only")
    buf = Buffer(dev, 20)
    assert buf.alloc_size == 32
    view = buf.texel_view(0, 20)
    assert buf.texel_view(0, 20) == view and buf.texel_view(16, 4) != view
    with pytest.raises(LlamavkError, match="not a multiple of 16"):
        buf.texel_view(4, 16)
