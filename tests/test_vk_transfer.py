"""Uploads through the staging ring (vk/transfer.py): pieces of any element size, split across many
slots, land byte for byte where they belong; planar weights' pieces make the kernels' layout."""

import numpy as np
import pytest
from gguf import GGMLQuantizationType as T

from llamavk.kernels import PLANAR, PLANES, device_pieces, planes
from llamavk.vk import Buffer
from llamavk.vk import transfer


def test_pieces_across_slots(dev, monkeypatch):
    monkeypatch.setattr(transfer, "SLOT_BYTES", 1000)    # tiny slots: pieces split at every boundary
    rng = np.random.default_rng(0)
    for n_blocks in (5000, 333, 1):
        raw = rng.integers(0, 256, n_blocks * 18, dtype=np.uint8)
        pieces = device_pieces(T.Q4_0, raw) + [rng.integers(0, 256, 2777, dtype=np.uint8)]
        blocks = raw.reshape(n_blocks, 18)
        want = np.concatenate([blocks[:, 2:].reshape(-1), blocks[:, :2].reshape(-1), pieces[-1]])
        t = transfer.Transfer(dev)
        buf = Buffer(dev, want.size + 64)
        t.upload_pieces(buf, pieces, 64)       # returns with copies in flight
        t.flush()
        # read back through t: buf.read would make the device's own transfer with these tiny slots,
        # and every later upload on this module's device would turn them (24 MB took 16 s)
        assert np.frombuffer(t.download(buf, want.size, 64), np.uint8).tobytes() == want.tobytes()
        t.close()


def test_planar_pieces_per_type():
    rng = np.random.default_rng(1)
    for name, (head, size) in PLANAR.items():
        raw = rng.integers(0, 256, 7 * size, dtype=np.uint8)
        quants, scales = (np.ascontiguousarray(p).view(np.uint8) for p in device_pieces(T[name], raw))
        assert quants.tobytes() == raw.reshape(7, size)[:, head:].tobytes()
        assert scales.tobytes() == raw.reshape(7, size)[:, :head].tobytes()
    assert device_pieces(T.Q4_K, raw)[0] is raw
    # Q6_K: ql + qh, the 16 scales, d -- three planes
    raw = rng.integers(0, 256, 7 * 210, dtype=np.uint8)
    got = [np.ascontiguousarray(p).view(np.uint8).tobytes() for p in device_pieces(T.Q6_K, raw)]
    blocks = raw.reshape(7, 210)
    assert got == [blocks[:, :192].tobytes(), blocks[:, 192:208].tobytes(), blocks[:, 208:].tobytes()]


def test_large_pieces_copied_by_several_threads(dev):
    """Pieces above PARALLEL_BYTES are cut among the copy threads; slots fill and wrap."""
    rng = np.random.default_rng(2)
    n_blocks = 700_000                                # 23.8 MB of Q8_0 blocks: slot boundaries inside pieces
    raw = rng.integers(0, 256, n_blocks * 34, dtype=np.uint8)
    pieces = device_pieces(T.Q8_0, raw) + [raw]
    blocks = raw.reshape(n_blocks, 34)
    want = np.concatenate([blocks[:, 2:].reshape(-1), blocks[:, :2].reshape(-1), raw])
    assert transfer.COPY_THREADS < 2 or pieces[0].nbytes > transfer.PARALLEL_BYTES
    buf = Buffer(dev, want.size)
    dev.transfer.upload_pieces(buf, pieces)
    dev.transfer.flush()
    assert np.frombuffer(buf.read(want.size), np.uint8).tobytes() == want.tobytes()


def test_uploads_from_two_threads_while_another_records(dev, monkeypatch):
    """A load's worker thread uploads while the main thread writes small buffers through the same
    transfer and records command buffers from the device's pool: every byte lands, nothing races."""
    import threading

    from llamavk.vk import CommandSequence

    monkeypatch.setattr(transfer, "SLOT_BYTES", 4096)   # many slot turns: the lock is taken often
    rng = np.random.default_rng(3)
    big = [rng.integers(0, 256, 50_000 + i, dtype=np.uint8) for i in range(6)]
    small = [rng.integers(0, 256, 300 + i, dtype=np.uint8) for i in range(40)]
    t = transfer.Transfer(dev)
    monkeypatch.setattr(dev, "_transfer", t)
    big_bufs = [Buffer(dev, a.size) for a in big]
    small_bufs = [Buffer(dev, a.size) for a in small]
    errors = []

    def worker():
        try:
            for b, a in zip(big_bufs, big):
                t.upload_pieces(b, [a])
            t.flush()
        except BaseException as exc:   # pragma: no cover - reported below
            errors.append(exc)

    th = threading.Thread(target=worker)
    th.start()
    for b, a in zip(small_bufs, small):
        b.write(a)                                       # device-local: through the same transfer
        seq = CommandSequence(dev, "record").begin()     # the device's pool, on this thread
        seq.fill(b, 0, 4, 0)
        seq.end()
    th.join()
    assert not errors
    for b, a in zip(big_bufs + small_bufs, big + small):
        assert np.frombuffer(b.read(a.size), np.uint8).tobytes() == a.tobytes()
    t.close()


# -- weights read from the file by the upload threads (upload_file) ---------------------------------

def _file_with(tmp_path, data: bytes, lead: int = 13):
    """A file holding `data` after `lead` bytes of junk (offsets that are not aligned), opened."""
    import os

    path = tmp_path / "weights.bin"
    path.write_bytes(b"\xa5" * lead + data + b"\x5a" * 7)
    fd = os.open(path, os.O_RDONLY)
    return fd, lead


def _expected_layout(name: str, raw: np.ndarray) -> bytes:
    """The kernels' layout by plain slicing: every block's quants, then every block's scale bytes
    (planar types; Q6_K: ql + qh, scales, d), else the blocks as stored."""
    if name in PLANES:
        size, ranges = PLANES[name]
        blocks = raw.reshape(-1, size)
        return b"".join(blocks[:, s:e].tobytes() for s, e in ranges)
    if name not in PLANAR:
        return raw.tobytes()
    head, size = PLANAR[name]
    blocks = raw.reshape(-1, size)
    return blocks[:, head:].tobytes() + blocks[:, :head].tobytes()


@pytest.mark.parametrize("name", ["Q4_0", "Q8_0", "Q4_1", "Q5_0", "Q5_1", "IQ4_NL", "MXFP4", "Q4_K", "Q6_K", "F16", "F32"])
def test_file_reads_land_in_the_device_layout(dev, tmp_path, monkeypatch, name):
    """Every type, read from a file by several threads through tiny slots and a tiny bounce buffer
    (jobs and reads cut at many block boundaries), downloaded and compared byte for byte."""
    import os

    from llamavk.quant import quant_info

    monkeypatch.setattr(transfer, "SLOT_BYTES", 3000)
    monkeypatch.setattr(transfer, "BOUNCE_BYTES", 700)
    monkeypatch.setattr(transfer, "UPLOAD_THREADS", 3)
    info = quant_info(T[name])
    rng = np.random.default_rng(4)
    n_blocks = 30_000 // info.type_size + 7            # > 10 slots' worth, odd
    raw = rng.integers(0, 256, n_blocks * info.type_size, dtype=np.uint8)
    fd, lead = _file_with(tmp_path, raw.tobytes())
    t = transfer.Transfer(dev)
    try:
        buf = Buffer(dev, raw.size + 256)
        t.upload_file(buf, fd, lead, raw.size, planes(T[name]), dst_offset=256)
        t.flush()
        assert buf.read(raw.size, 256) == _expected_layout(name, raw)
        assert t.stats.jobs > 10 and t.stats.bytes == raw.size
    finally:
        t.close()
        os.close(fd)


@pytest.mark.parametrize("qtype,experts", [(T.Q4_0, 0), (T.Q8_0, 4), (T.Q4_K, 0), (T.Q6_K, 3)])
def test_chunked_weights_from_the_file(dev, tmp_path, qtype, experts):
    """allocate_qweight with a file source: row chunks (whole experts each) hold their rows in the
    kernels' layout, the same bytes as the path that copies from the map (device_pieces)."""
    import os

    from llamavk.kernels import allocate_qweight, to_device_layout
    from llamavk.quant import quant_info

    rows, cols = 48, 512
    row_bytes = quant_info(qtype).row_bytes(cols)
    raw = np.random.default_rng(5).integers(0, 256, rows * row_bytes, dtype=np.uint8)
    fd, lead = _file_with(tmp_path, raw.tobytes(), lead=100)
    try:
        w, fill = allocate_qweight(dev, raw, qtype, rows, cols, max_chunk_bytes=13 * row_bytes, experts=experts,
                                   source=(fd, lead))
        fill()
        dev.transfer.flush()
        assert len(w.chunks) > 1
        for c in w.chunks:
            if experts:
                assert c.row_start % (rows // experts) == 0 and c.n_rows % (rows // experts) == 0
            part = raw[c.row_start * row_bytes:(c.row_start + c.n_rows) * row_bytes]
            assert c.buffer.read(part.size) == to_device_layout(qtype, part).tobytes()
    finally:
        os.close(fd)


def test_a_file_shorter_than_its_header_says_is_an_error(dev, tmp_path):
    """A read past the end of the file (truncated after the header was checked) fails at flush()
    with a message, not with garbage on the device."""
    import os

    fd, lead = _file_with(tmp_path, b"\x01" * 1000, lead=0)
    t = transfer.Transfer(dev)
    try:
        buf = Buffer(dev, 4096)
        t.upload_file(buf, fd, 0, 18 * 200, planes(T.Q4_0))
        with pytest.raises(OSError, match="ended early"):
            t.flush()
    finally:
        t.close()
        os.close(fd)


def test_a_loaded_model_holds_its_file_s_weights(synthetic_model, monkeypatch):
    """A whole load (weights read by the upload threads on the load's worker thread, experts
    included): every weight on the device equals the file's bytes in the kernels' layout."""
    import llamavk
    from llamavk.kernels import QWeight, to_device_layout
    from llamavk.quant import quant_info

    monkeypatch.setattr(transfer, "SLOT_BYTES", 64 << 10)     # many jobs even for a tiny model
    for arch, qtype in (("llama", "q4_0"), ("qwen3moe", "q8_0"), ("llama", "q4_k")):
        seen = []
        with llamavk.load(synthetic_model(arch, qtype), warn=lambda m: None,
                          progress=lambda done, total: seen.append((done, total))) as m:
            rt, f = m.runtime, m.file
            assert rt.device.transfer.stats.jobs > 0
            # the progress reaches every stored byte, counted once (file jobs as they end)
            assert seen[-1][0] == seen[-1][1] == rt.weight_bytes() and len(seen) > rt.device.transfer.stats.jobs
            n = 0
            for name, w in rt.weights.items():
                if not isinstance(w, QWeight):
                    continue
                raw = np.asarray(f.raw(name)).view(np.uint8).reshape(-1)
                row_bytes = quant_info(w.qtype).row_bytes(w.cols)
                for c in w.chunks:
                    part = raw[c.row_start * row_bytes:(c.row_start + c.n_rows) * row_bytes]
                    assert c.buffer.read(part.size) == to_device_layout(w.qtype, part).tobytes(), name
                n += 1
            assert n > 5
