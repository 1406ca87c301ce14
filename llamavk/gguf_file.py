"""Open a GGUF file: metadata as plain Python values, tensors as memory-mapped arrays.

A GGUF file is untrusted input (a download from the internet), so this module parses it itself and
checks every field before anything uses it: the magic and version, counts and lengths against the
bytes that are left, strict UTF-8 for every key and string, known value and tensor types, unique keys
and tensor names, `general.alignment` a power of two, tensor ranks and dimensions, rows that are whole
blocks of their type, and tensor data aligned, inside the file and not overlapping. Each failure is
one LlamavkError line that says what is wrong and where. (gguf.GGUFReader raises whatever Python
raises on bad input, and takes seconds to build its per-element field objects for a large
vocabulary, while this walk takes a fraction of that; weights are never read into Python memory:
`tensor_data` returns views into one read-only map of the file.)

Metadata values come out as gguf's `ReaderField.contents()` gives them: int, float, bool, str, or a
list of them for arrays.
"""

from __future__ import annotations

import math
import mmap
import os
import struct
import weakref
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from .errors import LlamavkError
from .quant import GGML_QUANT_SIZES, GGUF_DEFAULT_ALIGNMENT, GGMLQuantizationType, tensor_nbytes

GGUF_MAGIC = b"GGUF"
MAX_DIMS = 4            # GGML_MAX_DIMS: llama.cpp refuses tensors of higher rank

# GGUFValueType -> struct format of a scalar (strings and arrays are handled separately)
_SCALAR_FMT = {0: "B", 1: "b", 2: "H", 3: "h", 4: "I", 5: "i", 6: "f", 7: "?", 10: "Q", 11: "q", 12: "d"}
_NUMPY_DTYPE = {0: "<u1", 1: "<i1", 2: "<u2", 3: "<i2", 4: "<u4", 5: "<i4", 6: "<f4", 7: "?", 10: "<u8",
                11: "<i8", 12: "<f8"}
_STRING, _ARRAY = 8, 9
_U64 = struct.Struct("<Q").unpack_from
# Fewest bytes a key-value pair (key length, value type, a one-byte value) and a tensor-info record
# (name length, rank, type, offset) can take: counts beyond what the file can hold are corrupt.
_MIN_KV_BYTES, _MIN_TENSOR_BYTES = 8 + 4 + 1, 8 + 4 + 4 + 8


@dataclass(frozen=True)
class TensorEntry:
    """One tensor-info record of the header, as stored (shape in numpy order: rows first)."""
    name: str
    shape: tuple[int, ...]
    type_id: int
    offset: int  # absolute file offset of the first byte
    nbytes: int = 0

    @property
    def qtype(self) -> GGMLQuantizationType:
        return GGMLQuantizationType(self.type_id)


@dataclass(frozen=True)
class GGUFHeader:
    version: int
    metadata: dict[str, Any]
    tensors: dict[str, TensorEntry]     # in file order
    alignment: int
    data_start: int
    file_size: int


class _Corrupt(Exception):
    """A check failed; the message says what (read_header adds the path)."""


class _Truncated(Exception):
    """A field runs past the end of the file: a cut download, or a corrupt length or count."""


class _Walker:
    """Reads little-endian fields from the mapped file, never past its end."""

    def __init__(self, buf, size: int):
        self.buf, self.size, self.pos = buf, size, 0

    def take(self, n: int, what: str = "a header field") -> int:
        """Reserve n bytes; returns where they start."""
        if n > self.size - self.pos:
            raise _Truncated(f"{what} at byte {self.pos} needs {n} bytes, {self.size - self.pos} are left")
        start = self.pos
        self.pos += n
        return start

    def unpack(self, fmt: str) -> Any:
        fmt = "<" + fmt
        return struct.unpack_from(fmt, self.buf, self.take(struct.calcsize(fmt)))[0]

    def string(self, what: str) -> str:
        n = self.unpack("Q")
        start = self.take(n, f"{what} (a string of {n} bytes)")
        try:
            return bytes(self.buf[start:start + n]).decode("utf-8")
        except UnicodeDecodeError as exc:
            raise _Corrupt(f"{what}: string at byte {start} is not valid UTF-8 ({exc.reason} at "
                           f"byte {start + exc.start})") from None

    def value(self, vtype: int, what: str, in_array: bool = False) -> Any:
        if vtype in _SCALAR_FMT:
            return self.unpack(_SCALAR_FMT[vtype])
        if vtype == _STRING:
            return self.string(what)
        if vtype == _ARRAY and not in_array:
            item_type, count = self.unpack("I"), self.unpack("Q")
            if item_type == _ARRAY:
                raise _Corrupt(f"{what}: arrays of arrays are not supported")
            if item_type not in _SCALAR_FMT and item_type != _STRING:
                raise _Corrupt(f"{what}: unknown array element type {item_type}")
            item_bytes = struct.calcsize(_SCALAR_FMT[item_type]) if item_type in _SCALAR_FMT else 8
            if count > (self.size - self.pos) // item_bytes:   # before looping over a corrupt count
                raise _Truncated(f"{what} (an array of {count} elements) at byte {self.pos} does not fit "
                                 f"the {self.size - self.pos} bytes left")
            if item_type in _SCALAR_FMT:      # one numpy read instead of count struct calls
                start = self.take(count * item_bytes)
                return np.frombuffer(self.buf, _NUMPY_DTYPE[item_type], count, start).tolist()
            return self.strings(count, what)
        raise _Corrupt(f"{what}: unknown value type {vtype}")

    def strings(self, count: int, what: str) -> list[str]:
        """`count` strings one after another: the checks of string(), in one tight loop (a vocabulary
        and its merges are 100k-300k strings, read at every load)."""
        buf, size, pos = self.buf, self.size, self.pos
        view = memoryview(buf)
        out: list[str] = []
        append = out.append
        i = 0
        try:
            for i in range(count):
                if size - pos < 8:
                    break
                (n,) = _U64(buf, pos)
                if n > size - pos - 8:
                    break
                append(str(view[pos + 8:pos + 8 + n], "utf-8"))
                pos += 8 + n
            else:
                self.pos = pos
                return out
        except UnicodeDecodeError:
            pass
        finally:
            view.release()
        self.pos = pos                   # the start of element i
        self.string(f"{what}[{i}]")      # the failing element again, for the error that says why
        raise AssertionError("unreachable: string() raises for the element that failed here")


def read_header(path: Path) -> GGUFHeader:
    """Parse and check a GGUF header (see the module docstring); the file is mapped, not read."""
    path = Path(path)
    try:
        size = path.stat().st_size
        with open(path, "rb") as f:
            buf = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) if size else b""
    except OSError as exc:
        raise LlamavkError(f"{path}: cannot read the file ({exc.strerror or exc})") from None
    try:
        return _parse(buf, size)
    except _Truncated as exc:
        raise LlamavkError(f"{path}: truncated or corrupt GGUF file: {exc} (the file has {size} bytes); "
                           "re-download or re-convert the model") from None
    except _Corrupt as exc:
        raise LlamavkError(f"{path}: corrupt GGUF file: {exc}") from None
    except _NotGGUF as exc:
        raise LlamavkError(f"{path}: {exc}") from None
    finally:
        if isinstance(buf, mmap.mmap):
            buf.close()


class _NotGGUF(Exception):
    pass


def _parse(buf, size: int) -> GGUFHeader:
    magic = bytes(buf[:4])
    if magic != GGUF_MAGIC:
        raise _NotGGUF(f"not a GGUF file (magic {magic!r}, expected b'GGUF')")
    w = _Walker(buf, size)
    w.take(4)
    version = w.unpack("I")
    if version not in (2, 3):
        raise _NotGGUF(f"GGUF version {version} is not supported (only v2 and v3)")
    n_tensors, n_kv = w.unpack("Q"), w.unpack("Q")
    left = size - w.pos
    if n_kv > left // _MIN_KV_BYTES or n_tensors > left // _MIN_TENSOR_BYTES:
        raise _Corrupt(f"the header claims {n_kv} metadata keys and {n_tensors} tensors, more than "
                       f"a file of {size} bytes can hold")

    metadata: dict[str, Any] = {}
    for i in range(n_kv):
        key = w.string(f"metadata key #{i}")
        if key in metadata:
            raise _Corrupt(f"metadata key {key} appears twice")
        vtype = w.unpack("I")
        metadata[key] = w.value(vtype, f"metadata {key}")
    alignment = metadata.get("general.alignment", GGUF_DEFAULT_ALIGNMENT)
    if not _is_int(alignment) or alignment < 1 or alignment & (alignment - 1):
        raise _Corrupt(f"general.alignment = {alignment!r} is not a power of two")

    raw = []
    names: set[str] = set()
    for i in range(n_tensors):
        name = w.string(f"tensor name #{i}")
        if name in names:
            raise _Corrupt(f"tensor {name} appears twice")
        names.add(name)
        n_dims = w.unpack("I")
        if not 1 <= n_dims <= MAX_DIMS:
            raise _Corrupt(f"tensor {name} has {n_dims} dimensions (1 to {MAX_DIMS} are possible)")
        dims = [w.unpack("Q") for _ in range(n_dims)]
        raw.append((name, dims, w.unpack("I"), w.unpack("Q")))
    data_start = (w.pos + alignment - 1) // alignment * alignment

    tensors: dict[str, TensorEntry] = {}
    for name, dims, type_id, rel in raw:
        try:
            qtype = GGMLQuantizationType(type_id)
            block_size, _ = GGML_QUANT_SIZES[qtype]
        except (ValueError, KeyError):
            raise _Corrupt(f"tensor {name} has unknown type id {type_id}") from None
        if dims[0] % block_size:
            raise _Corrupt(f"tensor {name} has rows of {dims[0]} elements, not a multiple of the "
                           f"{qtype.name} block size {block_size}")
        shape = tuple(reversed(dims))
        nbytes = tensor_nbytes(qtype, shape)       # Python ints: no overflow, checked against the file
        if rel % alignment:
            raise _Corrupt(f"tensor {name} data offset {rel} is not a multiple of the alignment {alignment}")
        entry = TensorEntry(name, shape, type_id, data_start + rel, nbytes)
        if entry.offset + nbytes > size:
            raise _Truncated(f"tensor {name} ends at byte {entry.offset + nbytes}, past the end of the "
                             "file (a cut download, or a corrupt shape or offset)")
        tensors[name] = entry
    ordered = sorted((e for e in tensors.values() if e.nbytes), key=lambda e: e.offset)
    for a, b in zip(ordered, ordered[1:]):
        if a.offset + a.nbytes > b.offset:
            raise _Corrupt(f"tensors {a.name} and {b.name} overlap in the file")
    return GGUFHeader(version, metadata, tensors, alignment, data_start, size)


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def scan_header(path: Path) -> tuple[list[TensorEntry], int]:
    """The header's tensor entries (absolute offsets) and the file size; every check of read_header."""
    h = read_header(path)
    return list(h.tensors.values()), h.file_size


def check_model_path(path: Path) -> Path:
    """`path`, or the one-line error a user gets for a model path that is not a file."""
    if path.is_dir():
        raise LlamavkError(f"{path} is a directory, not a model file")
    if not path.is_file():
        raise LlamavkError(f"model file not found: {path}")
    return path


class GGUFFile:
    """A GGUF file opened read-only: checked header, tensors mapped from the file."""

    def __init__(self, path: str | Path):
        self.path = check_model_path(Path(path))
        header = read_header(self.path)
        self.version = header.version
        self.metadata: dict[str, Any] = header.metadata
        self.tensors: dict[str, TensorEntry] = header.tensors
        self.entries = list(header.tensors.values())
        self.file_size = header.file_size
        self._map = np.memmap(self.path, dtype=np.uint8, mode="r")
        self._fd: int | None = None

    def fileno(self) -> int:
        """A descriptor of the file opened for reading (weights are read with os.preadv: no page
        faults on the map), closed when this object goes."""
        if self._fd is None:
            self._fd = os.open(self.path, os.O_RDONLY)
            weakref.finalize(self, os.close, self._fd)
        return self._fd

    def file_range(self, name: str) -> tuple[int, int]:
        """(absolute file offset, bytes) of a tensor's data."""
        e = self.tensors[name]
        return e.offset, e.nbytes

    def tensor_type(self, name: str) -> GGMLQuantizationType:
        return self.tensors[name].qtype

    def tensor_shape(self, name: str) -> tuple[int, ...]:
        """Logical shape in numpy order (rows, cols): the reverse of GGUF's (ne0, ne1)."""
        return self.tensors[name].shape

    def tensor_data(self, name: str) -> np.ndarray:
        """The memory-mapped data as stored, as gguf.GGUFReader gives it: F32 / F16 elements in the
        tensor's shape, uint8 block bytes (rows, bytes per row) for every other type."""
        e = self.tensors[name]
        data = self._map[e.offset:e.offset + e.nbytes]
        if e.type_id == GGMLQuantizationType.F32:
            return data.view(np.float32).reshape(e.shape)
        if e.type_id == GGMLQuantizationType.F16:
            return data.view(np.float16).reshape(e.shape)
        rows = math.prod(e.shape[:-1])
        return data.reshape(e.shape[:-1] + (e.nbytes // rows if rows else 0,))
