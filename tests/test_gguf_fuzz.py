"""Seeded mutation ("fuzz") test: a corrupt GGUF ends in one line of error, never a traceback.

Two small valid files (an SPM and a byte-level BPE vocabulary) are mutated in several ways: random
bits flipped and bytes overwritten in the header, cuts at random lengths, absurd counts and lengths
written into the header's count and length fields, invalid UTF-8 put into keys and strings, value
types changed, tensor types / ranks / dimensions / offsets changed, and files rewritten with
metadata values of the wrong type or range (a head count of 0, a string where a number belongs, token
ids outside the vocabulary, a BYTE token that is not <0xXX>...). Each mutant goes through everything
that reads the file before the engine runs: the model loader, the tokenizer (encode and decode),
bench's model description. It must load, or fail with a one-line LlamavkError: any other exception
is a bug. A few mutants go through `llamavk run`: exit code 1, no traceback.

The field map the byte-level mutations aim at comes from a walk of the header written here (GGUF
spec), not from llamavk's parser.
"""

from __future__ import annotations

import signal
import struct
import subprocess
import sys
import traceback
from dataclasses import dataclass
from pathlib import Path

import gguf
import numpy as np
import pytest
from gguf import GGUFValueType as V

from llamavk.bench import model_info
from llamavk.errors import LlamavkError
from llamavk.models import load_model_file
from llamavk.synthetic import random_blocks, synthetic_plan
from llamavk.tokenizer import Tokenizer
from llamavk.tokenizer.bpe import BYTE_TO_UNICODE

SEED = 20251125
MUTANTS_PER_KIND = 40
ABSURD = [0, 1, 7, 2**16 + 1, 2**31, 2**32 + 7, 2**62, 2**63 - 1, 2**64 - 1]


# ----------------------------------------------------------------------------------------------
# valid base files
# ----------------------------------------------------------------------------------------------

def _scalar_type(value):
    if isinstance(value, bool):
        return V.BOOL
    if isinstance(value, int):
        return V.UINT32 if value >= 0 else V.INT32
    if isinstance(value, float):
        return V.FLOAT32
    if isinstance(value, str):
        return V.STRING
    raise TypeError(value)


_PACK = {V.UINT8: "B", V.INT8: "b", V.UINT16: "H", V.INT16: "h", V.UINT32: "I", V.INT32: "i",
         V.FLOAT32: "f", V.BOOL: "?", V.UINT64: "Q", V.INT64: "q", V.FLOAT64: "d"}


def pack_value(value, vtype, sub=None) -> bytes:
    """A GGUF value of exactly this type (gguf.GGUFWriter refuses empty arrays)."""
    if vtype == V.STRING:
        raw = value.encode("utf-8")
        return struct.pack("<Q", len(raw)) + raw
    if vtype == V.ARRAY:
        sub = sub if sub is not None else (_scalar_type(value[0]) if value else V.INT32)
        return struct.pack("<IQ", sub, len(value)) + b"".join(pack_value(v, sub) for v in value)
    return struct.pack("<" + _PACK[vtype], value)


def write_model(path: Path, meta: dict, n_vocab: int, typed: dict | None = None) -> Path:
    """A tiny llama model (Q4_0 weights, random blocks) with this metadata, written byte by byte.
    typed: key -> (value, GGUFValueType[, element type]) written exactly so (wrong types on purpose)."""
    plan = synthetic_plan("tiny", "q4_0", "llama", n_vocab=n_vocab, n_layer=1)
    typed = typed or {}
    kv = b""
    items = {"general.architecture": "llama", **meta, **{k: None for k in typed if k not in meta}}
    for key, value in items.items():
        if key in typed:
            value, vtype, *sub = typed[key]
        else:
            vtype, sub = (V.ARRAY if isinstance(value, list) else _scalar_type(value)), []
        kv += pack_value(key, V.STRING) + struct.pack("<I", vtype) + pack_value(value, vtype, *sub)
    rng = np.random.default_rng(0)
    infos, blobs, offset = b"", [], 0
    for t in plan.tensors:
        if len(t.spec.shape) == 2:
            blob = random_blocks(rng, t.qtype, t.nbytes // 18, t.std).tobytes()
        else:
            blob = np.ones(t.spec.shape, np.float32).tobytes()
        dims = tuple(reversed(t.spec.shape))
        infos += pack_value(t.spec.name, V.STRING) + struct.pack(f"<I{len(dims)}QIQ", len(dims), *dims,
                                                                   t.qtype, offset)
        blobs.append(blob + bytes(-len(blob) % 32))
        offset += len(blobs[-1])
    head = b"GGUF" + struct.pack("<IQQ", 3, len(plan.tensors), len(items)) + kv + infos
    path.write_bytes(head + bytes(-len(head) % 32) + b"".join(blobs))
    return path


def spm_meta(n_vocab=300) -> dict:
    return dict(synthetic_plan("tiny", "q4_0", "llama", n_vocab=n_vocab, n_layer=1).metadata)


def bpe_meta(n_vocab=300) -> dict:
    """Byte-level BPE: the 256 byte characters, then merges of common pairs."""
    meta = spm_meta(n_vocab)
    tokens = list(BYTE_TO_UNICODE)
    merges = []
    for a, b in [("Ġ", "t"), ("h", "e"), ("Ġt", "he"), ("i", "n"), ("Ġ", "a"), ("e", "r")]:
        merges.append(f"{a} {b}")
        tokens.append(a + b)
    tokens += [f"<|special{i}|>" for i in range(n_vocab - len(tokens))]
    meta.update({"tokenizer.ggml.model": "gpt2", "tokenizer.ggml.pre": "default",
                 "tokenizer.ggml.tokens": tokens, "tokenizer.ggml.merges": merges,
                 "tokenizer.ggml.token_type": [1] * 262 + [3] * (n_vocab - 262),
                 "tokenizer.ggml.bos_token_id": n_vocab - 1, "tokenizer.ggml.eos_token_id": n_vocab - 1})
    for k in ("tokenizer.ggml.scores", "tokenizer.ggml.unknown_token_id", "tokenizer.ggml.add_space_prefix"):
        meta.pop(k)
    return meta


@pytest.fixture(scope="module")
def bases(tmp_path_factory):
    d = tmp_path_factory.mktemp("fuzz")
    return {"spm": write_model(d / "spm.gguf", spm_meta(), 300), "bpe": write_model(d / "bpe.gguf", bpe_meta(), 300)}


# ----------------------------------------------------------------------------------------------
# what reads a file before the engine runs
# ----------------------------------------------------------------------------------------------

def open_everything(path: Path) -> None:
    m = load_model_file(path)
    tok = Tokenizer.from_metadata(m.metadata)
    ids = tok.encode("Hello world, the <s> quick \u00e9t\u00e9 \U0001F600")
    tok.decode(ids + list(range(min(tok.n_vocab, 300))))
    s = tok.stream()
    for t in ids:
        s.feed(t)
    s.flush()
    model_info(path)


class _Hang(Exception):
    pass


def _alarm(signum, frame):
    raise _Hang()


def outcome(path: Path, limit_s: int = 10) -> str | None:
    """None if the file opened; the error line if it was refused. Anything else, or taking longer
    than limit_s (a loop over a corrupt count), fails the test."""
    old = signal.signal(signal.SIGALRM, _alarm)
    signal.alarm(limit_s)
    try:
        open_everything(path)
    except LlamavkError as exc:
        msg = str(exc)
        assert msg and "\n" not in msg, f"multi-line error for {path.name}: {msg!r}"
        return msg
    except _Hang:
        pytest.fail(f"{path.name}: still reading it after {limit_s} s")
    except Exception:
        pytest.fail(f"{path.name}: {traceback.format_exc()}")
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, old)
    return None


def test_base_files_are_valid(bases):
    for path in bases.values():
        assert outcome(path) is None


# ----------------------------------------------------------------------------------------------
# the header's fields (an independent walk of the GGUF layout)
# ----------------------------------------------------------------------------------------------

@dataclass
class Field:
    kind: str      # count, strlen, strbytes, vtype, itemtype, ndims, dim, ttype, toffset
    offset: int
    size: int


_SCALAR_SIZE = {0: 1, 1: 1, 2: 2, 3: 2, 4: 4, 5: 4, 6: 4, 7: 1, 10: 8, 11: 8, 12: 8}


def header_fields(data: bytes) -> tuple[list[Field], int]:
    """Every field of the header, and where the tensor data starts."""
    fields: list[Field] = []
    pos = 8

    def u(fmt, kind):
        nonlocal pos
        size = struct.calcsize(fmt)
        fields.append(Field(kind, pos, size))
        v = struct.unpack_from("<" + fmt, data, pos)[0]
        pos += size
        return v

    def string():
        nonlocal pos
        n = u("Q", "strlen")
        fields.append(Field("strbytes", pos, n))
        pos += n

    n_tensors, n_kv = u("Q", "count"), u("Q", "count")
    for _ in range(n_kv):
        string()
        t = u("I", "vtype")
        if t == 8:
            string()
        elif t == 9:
            it, n = u("I", "itemtype"), u("Q", "count")
            for _ in range(n):
                if it == 8:
                    string()
                else:
                    pos += _SCALAR_SIZE[it]
        else:
            pos += _SCALAR_SIZE[t]
    for _ in range(n_tensors):
        string()
        nd = u("I", "ndims")
        for _ in range(nd):
            u("Q", "dim")
        u("I", "ttype")
        u("Q", "toffset")
    return fields, (pos + 31) // 32 * 32


def put(buf: bytearray, f: Field, value: int) -> None:
    buf[f.offset:f.offset + f.size] = (value % (1 << (8 * f.size))).to_bytes(f.size, "little")


def byte_mutants(data: bytes, rng: np.random.Generator):
    """(kind, mutated bytes) pairs."""
    fields, data_start = header_fields(data)
    by_kind: dict[str, list[Field]] = {}
    for f in fields:
        by_kind.setdefault(f.kind, []).append(f)
    for _ in range(MUTANTS_PER_KIND):
        b = bytearray(data)
        for _ in range(int(rng.integers(1, 9))):
            b[int(rng.integers(0, data_start))] ^= 1 << int(rng.integers(0, 8))
        yield "flip", bytes(b)
    for _ in range(MUTANTS_PER_KIND):
        b = bytearray(data)
        at = int(rng.integers(0, data_start - 16))
        b[at:at + 16] = rng.integers(0, 256, 16, dtype=np.uint8).tobytes()[:int(rng.integers(1, 17))].ljust(16, b"\0")
        yield "bytes", bytes(b)
    for _ in range(MUTANTS_PER_KIND):
        yield "truncate", data[:int(rng.integers(0, len(data)))]
    lengths = by_kind["count"] + by_kind["strlen"] + by_kind["ndims"] + by_kind["dim"]
    for _ in range(MUTANTS_PER_KIND):
        b = bytearray(data)
        put(b, lengths[int(rng.integers(0, len(lengths)))], ABSURD[int(rng.integers(0, len(ABSURD)))])
        yield "absurd", bytes(b)
    strings = [f for f in by_kind["strbytes"] if f.size]
    for _ in range(MUTANTS_PER_KIND):
        b = bytearray(data)
        f = strings[int(rng.integers(0, len(strings)))]
        bad = [b"\xff", b"\x80", b"\xc3", b"\xe2\x82", b"\xed\xa0\x80", b"\xc0\xaf"][int(rng.integers(0, 6))]
        at = f.offset + int(rng.integers(0, max(1, f.size - len(bad) + 1)))
        b[at:at + len(bad)] = bad[:f.offset + f.size - at]
        yield "utf8", bytes(b)
    types = by_kind["vtype"] + by_kind["itemtype"]
    for _ in range(MUTANTS_PER_KIND):
        b = bytearray(data)
        put(b, types[int(rng.integers(0, len(types)))], [0, 4, 6, 7, 8, 9, 12, 13, 2**31][int(rng.integers(0, 9))])
        yield "vtype", bytes(b)
    tensor_fields = by_kind["ttype"] + by_kind["toffset"] + by_kind["dim"]
    for _ in range(MUTANTS_PER_KIND):
        b = bytearray(data)
        f = tensor_fields[int(rng.integers(0, len(tensor_fields)))]
        old = int.from_bytes(data[f.offset:f.offset + f.size], "little")
        put(b, f, [old + 1, old + 32, old * 2, old // 2, 3, 20, 40, len(data), 2**40][int(rng.integers(0, 9))])
        yield "tensor", bytes(b)


# wrong types and ranges of metadata values: key -> alternatives (value, type[, element type])
A = V.ARRAY
SEMANTIC = {
    "llama.embedding_length": [("64", V.STRING), (0, V.UINT32), (2**40, V.UINT64), (64.0, V.FLOAT32),
                               (-64, V.INT32), (True, V.BOOL), ([64, 64], A, V.UINT32)],
    "llama.attention.head_count": [(0, V.UINT32), (3, V.UINT32), ("four", V.STRING), ([4, 4], A, V.UINT32)],
    "llama.attention.head_count_kv": [(0, V.UINT32), (3, V.UINT32), (8, V.UINT32), (2.0, V.FLOAT64)],
    "llama.block_count": [(0, V.UINT32), (2**31 - 1, V.UINT32), (1.5, V.FLOAT32), (2**63, V.UINT64)],
    "llama.feed_forward_length": [([], A, V.INT32), ([160, 80], A, V.INT32), ("x", V.STRING),
                                  (["a"], A, V.STRING), (0, V.UINT32)],
    "llama.context_length": [(0, V.UINT32), (-1, V.INT32), ("long", V.STRING)],
    "llama.rope.freq_base": [("x", V.STRING), (-1.0, V.FLOAT32), (float("nan"), V.FLOAT32),
                             (float("inf"), V.FLOAT64)],
    "llama.attention.layer_norm_rms_epsilon": [(0.0, V.FLOAT32), (float("nan"), V.FLOAT32), ("e", V.STRING)],
    "llama.rope.dimension_count": [(7, V.UINT32), (1000, V.UINT32), (0, V.UINT32), (16.0, V.FLOAT32)],
    "llama.vocab_size": [(10, V.UINT32), (2**31, V.UINT64), ("300", V.STRING)],
    "llama.rope.scaling.type": [("cubic", V.STRING), (5, V.UINT32)],
    "llama.rope.scaling.factor": [("2", V.STRING), (-4.0, V.FLOAT32), (float("nan"), V.FLOAT32)],
    "general.architecture": [(5, V.UINT32), (["llama"], A, V.STRING), ("gemma9", V.STRING)],
    "general.alignment": [(0, V.UINT32), (3, V.UINT32), (2**40, V.UINT64), ("32", V.STRING)],
    "general.file_type": [("Q4_0", V.STRING), (10**9, V.UINT32), (2.0, V.FLOAT32)],
    "general.name": [(3, V.UINT32), ([1], A, V.UINT8)],
    "tokenizer.ggml.model": [(7, V.UINT32), ("bert", V.STRING), ([1], A, V.INT8)],
    "tokenizer.ggml.tokens": [([1, 2, 3], A, V.INT32), ([], A, V.STRING), (["a", "b"], A, V.STRING),
                              ("tokens", V.STRING)],
    "tokenizer.ggml.token_type": [(["x"] * 300, A, V.STRING), ([1] * 10, A, V.INT32), ([99] * 300, A, V.INT32),
                                  (5, V.INT32)],
    "tokenizer.ggml.scores": [(["a"] * 300, A, V.STRING), ([float("nan")] * 300, A, V.FLOAT32),
                              ([True] * 300, A, V.BOOL)],
    "tokenizer.ggml.bos_token_id": [(10**9, V.UINT32), (-5, V.INT32), ("1", V.STRING), (1.5, V.FLOAT32),
                                    (2**64 - 1, V.UINT64)],
    "tokenizer.ggml.eos_token_id": [(300, V.UINT32), (-1, V.INT64)],
    "tokenizer.ggml.add_bos_token": [("yes", V.STRING), (2, V.UINT8)],
    "tokenizer.ggml.add_space_prefix": [(1, V.INT32)],
    "tokenizer.ggml.merges": [([1, 2], A, V.INT32), (["nospace", ""], A, V.STRING), ("a b", V.STRING)],
    "tokenizer.ggml.pre": [(5, V.UINT32), ("unknown-pre", V.STRING)],
}


def semantic_mutants(bases_meta: dict, rng: np.random.Generator):
    """(name, base, metadata, typed overrides) for every entry of SEMANTIC, plus broken byte tokens."""
    for key, alternatives in SEMANTIC.items():
        for i, alt in enumerate(alternatives):
            base = "bpe" if key == "tokenizer.ggml.merges" else ("spm", "bpe")[int(rng.integers(0, 2))]
            meta = dict(bases_meta[base])
            yield f"{base}-{key}-{i}", meta, {key: alt}
    meta = dict(bases_meta["spm"])
    tokens = list(meta["tokenizer.ggml.tokens"])
    for i, text in enumerate(["<0xZZ>", "<0x1>", "byte", ""]):
        tokens[3 + i] = text          # tokens 3.. are the SPM byte tokens (type BYTE)
    yield "spm-byte-tokens", dict(meta, **{"tokenizer.ggml.tokens": tokens}), {}


# ----------------------------------------------------------------------------------------------
# the tests
# ----------------------------------------------------------------------------------------------

def test_byte_level_mutations(bases, tmp_path):
    rng = np.random.default_rng(SEED)
    counts: dict[str, list[int]] = {}
    for base, path in bases.items():
        for i, (kind, data) in enumerate(byte_mutants(path.read_bytes(), rng)):
            p = tmp_path / f"{base}-{kind}-{i}.gguf"
            p.write_bytes(data)
            refused = outcome(p) is not None
            counts.setdefault(kind, [0, 0])[refused] += 1
            p.unlink()
    # the mutations reach the checks: most of each kind are refused (flipped bits may land in
    # values, where they change nothing that has to be refused)
    for kind, (opened, refused) in counts.items():
        assert refused >= (opened + refused) // 3, f"{kind}: only {refused} of {opened + refused} refused"


def test_metadata_of_wrong_type_or_range(tmp_path):
    rng = np.random.default_rng(SEED)
    base_meta = {"spm": spm_meta(), "bpe": bpe_meta()}
    refused = []
    for name, meta, typed in semantic_mutants(base_meta, rng):
        p = write_model(tmp_path / f"{name}.gguf", meta, 300, typed)
        msg = outcome(p)
        if msg is not None:
            refused.append(name)
    # values that must be refused (others, e.g. an out-of-range BOS id, keep llama.cpp's defaults)
    for must in ["llama.embedding_length-0", "llama.attention.head_count-1", "llama.block_count-1",
                 "llama.feed_forward_length-0", "llama.rope.freq_base-2", "llama.rope.dimension_count-0",
                 "general.alignment-0", "tokenizer.ggml.tokens-0", "tokenizer.ggml.scores-1",
                 "tokenizer.ggml.merges-0", "spm-byte-tokens"]:
        assert any(r.endswith(must) for r in refused), f"{must} was accepted"


def _run_cli(path: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "llamavk", "run", "-m", str(path), "-p", "hello", "-n", "2",
                           "-c", "32", "--temp", "0"], capture_output=True, text=True, errors="replace", timeout=120)


def test_cli_on_corrupt_files(bases, tmp_path):
    """One refused mutant of several kinds through `llamavk run`: exit code 1, one error line."""
    rng = np.random.default_rng(SEED + 1)
    data = bases["spm"].read_bytes()
    picked: dict[str, Path] = {}
    for i, (kind, mutant) in enumerate(byte_mutants(data, rng)):
        if kind in picked or kind == "flip":
            continue
        p = tmp_path / f"{kind}-{i}.gguf"
        p.write_bytes(mutant)
        if outcome(p) is not None:
            picked[kind] = p
    p = tmp_path / "heads.gguf"
    picked["semantic"] = write_model(p, spm_meta(), 300, {"llama.attention.head_count": (0, V.UINT32)})
    for kind, p in picked.items():
        r = _run_cli(p)
        assert r.returncode == 1, (kind, r.returncode, r.stderr[-2000:])
        assert "Traceback" not in r.stderr, (kind, r.stderr[-2000:])
        lines = [l for l in r.stderr.splitlines() if l.strip() and not l.startswith("warning:")]
        assert len(lines) == 1 and lines[0].startswith("error: "), (kind, r.stderr)


def test_cli_runs_a_file_with_ignorable_corruption(tmp_path):
    """Out-of-range special token ids keep llama.cpp's defaults: the model still runs."""
    p = write_model(tmp_path / "ids.gguf", spm_meta(), 300,
                    {"tokenizer.ggml.bos_token_id": (10**9, V.UINT32), "tokenizer.ggml.eos_token_id": (-1, V.INT64)})
    r = _run_cli(p)
    assert r.returncode == 0 and "Traceback" not in r.stderr, r.stderr[-2000:]
    assert r.stdout.startswith("hello")
