"""--override-kv KEY=TYPE:VALUE, as llama.cpp reads it: a GGUF metadata value replaced (or added) before
the model's configuration and vocabulary are read from the metadata.

- TYPE is int, float, bool (true / false) or str (at most 127 bytes); the key at most 127 bytes.
- Where the file has the key, the override's type must be the value's (an int for any integer key,
  a float for a float one); arrays cannot be overridden. llama.cpp refuses the same.
- A value that does not parse is an error here (llama.cpp's atol / atof read a bad number as 0).
"""

from __future__ import annotations

import math

from .errors import UsageError

MAX_BYTES = 127           # llama_model_kv_override's key and string buffers hold 128 bytes
TYPES = {"int": int, "float": float, "bool": bool, "str": str}


def parse_kv_override(text: str) -> tuple[str, object]:
    """(key, value) of one --override-kv argument; a UsageError naming what is wrong."""
    key, sep, typed = text.partition("=")
    if not sep or not key or len(key.encode()) > MAX_BYTES:
        raise UsageError(f"--override-kv {text!r}: expected KEY=TYPE:VALUE (TYPE int, float, bool or str)")
    kind, colon, value = typed.partition(":")
    if not colon or kind not in TYPES:
        raise UsageError(f"--override-kv {text!r}: the type must be int, float, bool or str")
    try:
        if kind == "int":
            return key, int(value, 10)
        if kind == "float":
            parsed = float(value)
            if math.isnan(parsed):
                raise ValueError
            return key, parsed
    except ValueError:
        raise UsageError(f"--override-kv {text!r}: {value!r} is not a valid {kind}") from None
    if kind == "bool":
        if value not in ("true", "false"):
            raise UsageError(f"--override-kv {text!r}: a bool is true or false")
        return key, value == "true"
    if len(value.encode()) > MAX_BYTES:
        raise UsageError(f"--override-kv {text!r}: a string value is at most {MAX_BYTES} bytes")
    return key, value


def _kind(value) -> str:
    if isinstance(value, bool):
        return "bool"
    if isinstance(value, int):
        return "int"
    if isinstance(value, float):
        return "float"
    if isinstance(value, str):
        return "str"
    return "array"


def apply_kv_overrides(metadata: dict, overrides) -> dict:
    """A copy of `metadata` with the (key, value) overrides in, checked against the file's types."""
    if not overrides:
        return metadata
    out = dict(metadata)
    for key, value in overrides:
        if key in metadata and _kind(metadata[key]) != _kind(value):
            raise UsageError(f"--override-kv {key}: the file's value is of type {_kind(metadata[key])}, "
                             f"the override's {_kind(value)}")
        out[key] = value
    return out
