"""Open a GGUF file: metadata as plain Python values, tensors as memory-mapped arrays.

Weights are never read into Python memory: `gguf.GGUFReader` maps the file and every tensor's `.data`
is a view into that map.

Before handing the file to `gguf.GGUFReader` we walk the header ourselves (`scan_header`): the reader
fails with confusing errors (or none at all) on a bad magic, a truncated header or tensor data cut off
by a truncated download. The walk turns each of those into a one-line LlamavkError.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO

import gguf
import numpy as np

from .errors import LlamavkError
from .quant import tensor_nbytes

GGUF_MAGIC = b"GGUF"

# GGUFValueType -> struct format of a scalar (strings and arrays are handled separately)
_SCALAR_FMT = {0: "B", 1: "b", 2: "H", 3: "h", 4: "I", 5: "i", 6: "f", 7: "?", 10: "Q", 11: "q", 12: "d"}
_STRING, _ARRAY = 8, 9


@dataclass(frozen=True)
class TensorEntry:
    """One tensor-info record of the header, as stored (shape in numpy order: rows first)."""
    name: str
    shape: tuple[int, ...]
    type_id: int
    offset: int  # absolute file offset of the first byte


class _Truncated(Exception):
    pass


class _HeaderWalker:
    def __init__(self, f: BinaryIO):
        self.f = f

    def read(self, n: int) -> bytes:
        b = self.f.read(n)
        if len(b) != n:
            raise _Truncated()
        return b

    def unpack(self, fmt: str) -> Any:
        return struct.unpack("<" + fmt, self.read(struct.calcsize(fmt)))[0]

    def string(self) -> str:
        return self.read(self.unpack("Q")).decode("utf-8", errors="replace")

    def value(self, vtype: int) -> Any:
        if vtype in _SCALAR_FMT:
            return self.unpack(_SCALAR_FMT[vtype])
        if vtype == _STRING:
            return self.string()
        if vtype == _ARRAY:
            item_type, count = self.unpack("I"), self.unpack("Q")
            if item_type in _SCALAR_FMT:  # skip the block in one read
                size = struct.calcsize(_SCALAR_FMT[item_type]) * count
                self.read(size) if size < (1 << 26) else self.f.seek(size, 1)
                return None
            for _ in range(count):
                self.value(item_type)
            return None
        raise ValueError(f"unknown metadata value type {vtype}")


def scan_header(path: Path) -> tuple[list[TensorEntry], int]:
    """Walk the GGUF header. Returns (tensor entries with absolute offsets, file size).

    Raises LlamavkError for: bad magic, unsupported version, truncated header, tensor data past EOF.
    """
    size = path.stat().st_size
    with open(path, "rb") as f:
        magic = f.read(4)
        if magic != GGUF_MAGIC:
            raise LlamavkError(f"{path}: not a GGUF file (magic {magic!r}, expected b'GGUF')")
        w = _HeaderWalker(f)
        try:
            version = w.unpack("I")
            if version not in (2, 3):
                raise LlamavkError(f"{path}: GGUF version {version} is not supported (only v2 and v3)")
            n_tensors, n_kv = w.unpack("Q"), w.unpack("Q")
            alignment = gguf.GGUF_DEFAULT_ALIGNMENT
            for _ in range(n_kv):
                key = w.string()
                val = w.value(w.unpack("I"))
                if key == "general.alignment":
                    alignment = int(val)
            raw = []
            for _ in range(n_tensors):
                name = w.string()
                n_dims = w.unpack("I")
                dims = [w.unpack("Q") for _ in range(n_dims)]
                raw.append((name, tuple(reversed(dims)), w.unpack("I"), w.unpack("Q")))
            pos = f.tell()
        except _Truncated:
            raise LlamavkError(f"{path}: truncated GGUF file (header cut off at {size} bytes); "
                               "re-download or re-convert the model") from None
        except (ValueError, UnicodeDecodeError, OverflowError, MemoryError) as exc:
            raise LlamavkError(f"{path}: corrupt GGUF header ({exc})") from None
    data_start = (pos + alignment - 1) // alignment * alignment
    entries = []
    for name, shape, type_id, rel in raw:
        entry = TensorEntry(name, shape, type_id, data_start + rel)
        try:
            qtype = gguf.GGMLQuantizationType(type_id)
        except ValueError:
            raise LlamavkError(f"{path}: tensor {name} has unknown type id {type_id}, "
                               "which llamavk does not support") from None
        end = entry.offset + tensor_nbytes(qtype, shape)
        if end > size:
            raise LlamavkError(f"{path}: truncated GGUF file: tensor {name} ends at byte {end} but the "
                               f"file has only {size} bytes; re-download or re-convert the model")
        entries.append(entry)
    return entries, size


class GGUFFile:
    """A GGUF file opened read-only (memory-mapped)."""

    def __init__(self, path: str | Path):
        self.path = Path(path)
        if not self.path.is_file():
            raise LlamavkError(f"model file not found: {self.path}")
        self.entries, self.file_size = scan_header(self.path)
        try:
            self.reader = gguf.GGUFReader(self.path, "r")
        except Exception as exc:  # the gguf package raises ValueError/struct errors on bad input
            raise LlamavkError(f"{self.path}: not a valid GGUF file ({exc})") from None
        self.metadata: dict[str, Any] = read_metadata(self.reader)
        self.tensors = {t.name: t for t in self.reader.tensors}

    def tensor_type(self, name: str) -> gguf.GGMLQuantizationType:
        return gguf.GGMLQuantizationType(self.tensors[name].tensor_type)

    def tensor_shape(self, name: str) -> tuple[int, ...]:
        """Logical shape in numpy order (rows, cols): the reverse of GGUF's (ne0, ne1)."""
        return tuple(int(d) for d in reversed(self.tensors[name].shape.tolist()))

    def tensor_data(self, name: str) -> np.ndarray:
        """The memory-mapped data as stored (uint8 blocks for quantized types)."""
        return self.tensors[name].data


def read_metadata(reader: gguf.GGUFReader) -> dict[str, Any]:
    """Every key-value field as a plain Python value (str, int, float, bool, or a list of them)."""
    return {key: field.contents() for key, field in reader.fields.items()}
