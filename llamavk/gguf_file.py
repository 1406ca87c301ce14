"""Open a GGUF file: metadata as plain Python values, tensors as memory-mapped arrays.

Weights are never read into Python memory: `gguf.GGUFReader` maps the file and every tensor's `.data`
is a view into that map.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import gguf

from .errors import LlamavkError


class GGUFFile:
    """A GGUF file opened read-only (memory-mapped)."""

    def __init__(self, path: str | Path):
        self.path = Path(path)
        if not self.path.is_file():
            raise LlamavkError(f"model file not found: {self.path}")
        try:
            self.reader = gguf.GGUFReader(self.path, "r")
        except Exception as exc:  # the gguf package raises ValueError/struct errors on bad input
            raise LlamavkError(f"{self.path}: not a valid GGUF file ({exc})") from None
        self.metadata: dict[str, Any] = read_metadata(self.reader)
        self.tensors = {t.name: t for t in self.reader.tensors}


def read_metadata(reader: gguf.GGUFReader) -> dict[str, Any]:
    """Every key-value field as a plain Python value (str, int, float, bool, or a list of them)."""
    return {key: field.contents() for key, field in reader.fields.items()}
