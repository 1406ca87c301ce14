"""Bad input ends in a one-line LlamavkError that names the problem."""

from __future__ import annotations

import numpy as np
import gguf
import pytest
from gguf import GGMLQuantizationType as T

from llamavk.errors import LlamavkError
from llamavk.models import load_model_file
from llamavk.quant import tensor_nbytes
from llamavk.synthetic import synthetic_plan, write_synthetic_model


def write_gguf(path, arch="llama", drop=(), retype=None, reshape=None, preset_arch="llama", data=None,
               **overrides):
    """A tiny model written tensor by tensor (zeros, or data[name]: a retyped tensor's raw bytes), with
    some tensors dropped/retyped/reshaped."""
    plan = synthetic_plan("tiny", "f32", preset_arch, **overrides)
    w = gguf.GGUFWriter(path, arch)
    for key, value in plan.metadata.items():
        if isinstance(value, bool):
            w.add_bool(key, value)
        elif isinstance(value, int):
            w.add_uint32(key, value)
        elif isinstance(value, float):
            w.add_float32(key, value)
        elif isinstance(value, str):
            w.add_string(key, value)
        else:
            w.add_array(key, value)
    retype, reshape = retype or {}, reshape or {}
    for t in plan.tensors:
        name = t.spec.name
        if name in drop:
            continue
        shape = reshape.get(name, t.spec.shape)
        qtype = retype.get(name, T.F32)
        raw = (data or {}).get(name)
        if qtype == T.F32 and raw is None:
            w.add_tensor(name, np.zeros(shape, np.float32))
        else:  # raw bytes shaped (rows, bytes per row); the writer derives the element shape
            rows = int(np.prod(shape[:-1]))
            raw = np.zeros((rows, tensor_nbytes(qtype, shape) // rows), np.uint8) if raw is None else raw
            w.add_tensor(name, raw, raw_dtype=qtype)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def error_of(path) -> str:
    with pytest.raises(LlamavkError) as info:
        load_model_file(path)
    msg = str(info.value)
    assert "\n" not in msg
    return msg


def test_valid_file_loads(tmp_path):
    m = load_model_file(write_gguf(tmp_path / "ok.gguf"))
    assert m.config.n_layer == 2


def test_missing_file(tmp_path):
    assert "not found" in error_of(tmp_path / "nope.gguf")


def test_not_a_gguf(tmp_path):
    p = tmp_path / "junk.gguf"
    p.write_bytes(b"PK\x03\x04 this is a zip file, not a model" * 10)
    assert "not a GGUF file" in error_of(p)


def test_empty_file(tmp_path):
    p = tmp_path / "empty.gguf"
    p.write_bytes(b"")
    assert "not a GGUF file" in error_of(p)


@pytest.mark.parametrize("keep", [12, 100, 5000])
def test_truncated_header(tmp_path, keep):
    full = write_synthetic_model(tmp_path / "full.gguf", "tiny", "q4_0").read_bytes()
    p = tmp_path / "cut.gguf"
    p.write_bytes(full[:keep])
    assert "truncated" in error_of(p)


@pytest.mark.parametrize("missing", [1, 1000])
def test_truncated_tensor_data(tmp_path, missing):
    full = write_synthetic_model(tmp_path / "full.gguf", "tiny", "q4_0").read_bytes()
    p = tmp_path / "cut.gguf"
    p.write_bytes(full[:-missing])
    msg = error_of(p)
    assert "truncated" in msg and "tensor" in msg


def test_unknown_architecture(tmp_path):
    msg = error_of(write_gguf(tmp_path / "a.gguf", arch="mamba"))
    assert "'mamba'" in msg
    assert "gemma3, glm4moe, gpt-oss, llama, mistral3, qwen2, qwen2moe, qwen3, qwen35, qwen35moe, qwen3moe" in msg


def test_unsupported_tensor_type(tmp_path):
    p = write_gguf(tmp_path / "a.gguf", retype={"blk.0.attn_q.weight": T.NVFP4},
                   reshape={"blk.0.attn_q.weight": (256, 256)})
    # shapes are checked after types: NVFP4 needs 64-element rows, so use a 256-wide tensor
    msg = error_of(p)
    assert "blk.0.attn_q.weight has type NVFP4, which llamavk does not support" in msg


def test_missing_tensor(tmp_path):
    msg = error_of(write_gguf(tmp_path / "a.gguf", drop=("blk.1.ffn_up.weight",)))
    assert "blk.1.ffn_up.weight" in msg and "missing" in msg


def test_shape_mismatch(tmp_path):
    msg = error_of(write_gguf(tmp_path / "a.gguf", reshape={"blk.0.attn_k.weight": (64, 64)}))
    assert "blk.0.attn_k.weight" in msg and "(64, 64)" in msg and "(32, 64)" in msg


def test_missing_metadata_key(tmp_path):
    # a qwen2 file whose metadata uses llama.* keys: qwen2.* keys are missing
    msg = error_of(write_gguf(tmp_path / "a.gguf", arch="qwen2"))
    assert "qwen2." in msg and "missing" in msg


def _same_as_gguf_reader(path):
    """llamavk's own parser gives what gguf.GGUFReader (the gguf package's independent one) gives."""
    from llamavk.gguf_file import GGUFFile

    ours = GGUFFile(path)
    ref = gguf.GGUFReader(path, "r")
    want = {k: f.contents() for k, f in ref.fields.items() if not k.startswith("GGUF.")}
    assert ours.metadata.keys() == want.keys()
    for k, v in want.items():
        assert ours.metadata[k] == v and type(ours.metadata[k]) is type(v), k
        if isinstance(v, list) and v:
            assert {type(x) for x in ours.metadata[k]} == {type(x) for x in v}, k
    assert list(ours.tensors) == [t.name for t in ref.tensors]
    for t in ref.tensors:
        got = ours.tensor_data(t.name)
        assert got.dtype == t.data.dtype and got.shape == t.data.shape and np.array_equal(got, t.data), t.name
        assert ours.tensor_type(t.name) == t.tensor_type


@pytest.mark.parametrize("qtype", ["f16", "q4_k", "iq4_nl", "mxfp4"])
def test_parser_matches_gguf_reader_on_synthetic_models(tmp_path, qtype):
    _same_as_gguf_reader(write_synthetic_model(tmp_path / "m.gguf", "tiny", qtype, "qwen2"))


def test_parser_matches_gguf_reader_on_smollm2(smollm2_path):
    _same_as_gguf_reader(smollm2_path)


def _header_bytes(path):
    from llamavk.gguf_file import read_header

    data = path.read_bytes()
    return data, read_header(path)


def test_duplicate_key_and_tensor_names(tmp_path):
    p = write_synthetic_model(tmp_path / "m.gguf", "tiny", "q4_0")
    data = p.read_bytes()
    # rename the second key to the first one's name where both have the same length
    first, second = b"general.type", b"general.name"
    bad = tmp_path / "dup.gguf"
    bad.write_bytes(data.replace(second, first, 1))
    assert "metadata key general.type appears twice" in error_of(bad)
    bad.write_bytes(data.replace(b"blk.1.attn_q.weight", b"blk.0.attn_q.weight", 1))
    assert "tensor blk.0.attn_q.weight appears twice" in error_of(bad)


def test_bad_utf8_and_tensor_offsets(tmp_path):
    p = write_synthetic_model(tmp_path / "m.gguf", "tiny", "q4_0")
    data = p.read_bytes()
    bad = tmp_path / "bad.gguf"
    bad.write_bytes(data.replace(b"synthetic-tiny", b"synthetic\xfftiny", 1))
    assert "metadata general.name: string at byte" in error_of(bad) and "not valid UTF-8" in error_of(bad)
    # the second tensor's data offset made to point into the first one's data
    from llamavk.gguf_file import read_header

    h = read_header(p)
    second = list(h.tensors.values())[1]
    rel = (second.offset - h.data_start).to_bytes(8, "little")
    at = data.index(second.name.encode()) + len(second.name) + 4 + 8 * len(second.shape) + 4
    assert data[at:at + 8] == rel
    bad.write_bytes(data[:at] + (32).to_bytes(8, "little") + data[at + 8:])
    assert "overlap" in error_of(bad)
    bad.write_bytes(data[:at] + (second.offset - h.data_start + 1).to_bytes(8, "little") + data[at + 8:])
    assert "not a multiple of the alignment 32" in error_of(bad)


def _string_array_gguf(path, items: list[bytes], count: int | None = None):
    """A GGUF v3 header with one key, a string array of `items` (raw bytes, lengths as stored)."""
    import struct

    key = b"tokenizer.ggml.tokens"
    body = b"".join(struct.pack("<Q", len(s)) + s for s in items)
    path.write_bytes(b"GGUF" + struct.pack("<IQQ", 3, 0, 1) + struct.pack("<Q", len(key)) + key
                     + struct.pack("<IIQ", 9, 8, len(items) if count is None else count) + body)
    return path


def test_string_arrays_read_fast_and_checked(tmp_path):
    """String arrays (vocabularies) go through a tight loop of their own: same values, same errors."""
    from llamavk.gguf_file import read_header

    items = ["a", "", "é", "<0x0A>", "x" * 300, "日本"]
    p = _string_array_gguf(tmp_path / "ok.gguf", [s.encode() for s in items])
    assert read_header(p).metadata["tokenizer.ggml.tokens"] == items

    def error(path):
        with pytest.raises(LlamavkError) as info:
            read_header(path)
        return str(info.value)

    bad = _string_array_gguf(tmp_path / "utf8.gguf", [b"a", b"b", b"c\xc3", b"d"])
    msg = error(bad)
    assert "tokenizer.ggml.tokens[2]" in msg and "not valid UTF-8" in msg
    cut = _string_array_gguf(tmp_path / "cut.gguf", [b"a", b"bb", b"ccc"])
    cut.write_bytes(cut.read_bytes()[:-2])                       # the last string's bytes cut short
    msg = error(cut)
    assert "tokenizer.ggml.tokens[2] (a string of 3 bytes)" in msg and "truncated" in msg
    cut = _string_array_gguf(tmp_path / "cut2.gguf", [b"a", b"bb", b"ccc", b""])
    cut.write_bytes(cut.read_bytes()[:-4])                       # the last length field cut short
    assert "tokenizer.ggml.tokens[3] (a string of" not in error(cut)
    assert "a header field at byte" in error(cut) and "needs 8 bytes, 4 are left" in error(cut)
    huge = _string_array_gguf(tmp_path / "huge.gguf", [b"a", b"b"])
    data = bytearray(huge.read_bytes())
    data[-1 - 8:-1] = (2**63).to_bytes(8, "little")              # the second string claims 2^63 bytes
    huge.write_bytes(bytes(data))
    assert "tokenizer.ggml.tokens[1] (a string of 9223372036854775808 bytes)" in error(huge)
