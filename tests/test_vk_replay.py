"""A sequence recorded once and replayed with new parameters gives the right answer every time."""

import struct

import numpy as np

from llamavk.vk import Buffer, CommandSequence, Kernel



def test_replay_reads_new_parameters(dev):
    n = 777
    x = np.random.default_rng(0).standard_normal(n, dtype=np.float32)
    params, X, Y = Buffer(dev, 16, host_visible=True), Buffer(dev, x.nbytes), Buffer(dev, x.nbytes, host_visible=True)
    X.write(x)
    k = Kernel(dev, "axpb_params", "rrw")
    seq = CommandSequence(dev).begin()
    seq.dispatch(k, [params, X, Y], ((n + 63) // 64,))
    seq.end()
    for step, (alpha, beta, count) in enumerate([(2.0, 1.0, n), (-0.5, 3.0, 500), (1.5, -2.0, 1)]):
        Y.array(np.float32)[:] = np.nan
        params.array(np.float32, 2)[:] = (alpha, beta)
        params.array(np.uint32, 1, offset=8)[0] = count
        seq.run()
        y = Y.array(np.float32, n)
        np.testing.assert_allclose(y[:count], np.float32(alpha) * x[:count] + np.float32(beta), rtol=1e-6)
        assert np.isnan(y[count:]).all(), f"step {step}: wrote past the parameterised length"


def test_replay_with_indirect_dispatch(dev):
    """Grid size read from a buffer at execution time: the same recording covers any length."""
    n = 4096
    a = np.ones(n, dtype=np.float32)
    A, B = Buffer(dev, a.nbytes), Buffer(dev, a.nbytes)
    A.write(a)
    B.write(a)
    C = Buffer(dev, a.nbytes, host_visible=True)
    args = Buffer(dev, 12, host_visible=True)
    k = Kernel(dev, "add_f32", "rrw", push_size=4)
    seq = CommandSequence(dev).begin()
    seq.dispatch(k, [A, B, C], push=struct.pack("<I", n), indirect=(args, 0))
    seq.end()
    for groups in (1, 3, 16):
        C.array(np.float32)[:] = 0
        args.array(np.uint32)[:] = (groups, 1, 1)
        seq.run()
        c = C.array(np.float32)
        assert (c[:256 * groups] == 2).all() and (c[256 * groups:] == 0).all()


def test_automatic_barriers_order_dependent_dispatches(dev):
    """c = a + b and e = a + a are independent (no barrier); d = c + c reads c (one barrier)."""
    n = 100_000
    rng = np.random.default_rng(5)
    a, b = rng.standard_normal(n, dtype=np.float32), rng.standard_normal(n, dtype=np.float32)
    A, B, C, E = (Buffer(dev, a.nbytes) for _ in range(4))
    D = Buffer(dev, a.nbytes, host_visible=True)
    A.write(a)
    B.write(b)
    k = Kernel(dev, "add_f32", "rrw", push_size=4)
    seq = CommandSequence(dev).begin()
    groups = ((n + 255) // 256,)
    push = struct.pack("<I", n)
    seq.dispatch(k, [A, B, C], groups, push)
    seq.dispatch(k, [A, A, E], groups, push)
    assert seq.n_barriers == 0
    seq.dispatch(k, [C, C, D], groups, push)
    assert seq.n_barriers == 1
    seq.end().run()
    np.testing.assert_allclose(D.array(np.float32, n), 2 * (a + b), rtol=1e-6)


def test_copy_after_compute_across_an_intervening_barrier(dev):
    """A copy of data written by a dispatch before an intervening barrier (placed for another
    dependency) must be ordered after that write: barriers reach transfers as well as dispatches."""
    n = 4096
    a = np.arange(n, dtype=np.float32)
    A, B, C, E = (Buffer(dev, a.nbytes) for _ in range(4))
    D = Buffer(dev, a.nbytes, host_visible=True)
    A.write(a)
    B.write(a)
    k = Kernel(dev, "add_f32", "rrw", push_size=4)
    groups, push = ((n + 255) // 256,), struct.pack("<I", n)
    seq = CommandSequence(dev).begin()
    seq.dispatch(k, [A, B, C], groups, push)       # C = 2a
    seq.dispatch(k, [C, C, E], groups, push)       # reads C: a barrier
    assert seq.n_barriers == 1
    seq.copy(C, D, a.nbytes)                       # C was written before that barrier
    seq.end().run()
    np.testing.assert_array_equal(D.array(np.float32), 2 * a)


def test_a_chained_dispatch_records_no_barrier_and_later_ones_still_wait(dev):
    """dispatch(chained=True) skips the barrier its hazards would put in (its shader waits for the
    producer itself: kernels/chain.py); a later dispatch reading what either wrote still gets one.
    Only recorded: these kernels do not wait, so running it chained would race on a GPU."""
    n = 4096
    A, B, C, D, E = (Buffer(dev, 4 * n) for _ in range(5))
    k = Kernel(dev, "add_f32", "rrw", push_size=4)
    groups, push = ((n + 255) // 256,), struct.pack("<I", n)
    seq = CommandSequence(dev).begin()
    seq.dispatch(k, [A, B, C], groups, push)
    seq.dispatch(k, [C, C, D], groups, push, chained=True)   # reads C: no barrier all the same
    assert seq.n_barriers == 0
    seq.dispatch(k, [C, D, E], groups, push)                 # reads C and D: a barrier after both
    assert seq.n_barriers == 1
    seq.end()
