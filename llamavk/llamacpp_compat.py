"""What llama.cpp's flags mean in llamavk (SPEC §6 "What a llama.cpp user brings along").

Command lines written for llama-completion, llama-perplexity and llama-bench should run unchanged
where llamavk can honour them, and stop with a one-line usage error where it cannot:

- `-ngl N`: llamavk keeps every layer on the GPUs, so only values meaning "all of them" are
  accepted: -1, `all`, `auto` or N >= the model's layer count (99 is the usual spelling).
- `-fa on|auto|1`: llamavk's attention is always a flash-attention kernel; `off`/`0` is an error.
- `-ctk/-ctv TYPE`: the KV cache's K and V types, f16 (default), q8_0, q4_0, q4_1, q5_0 or q5_1 (llamavk/kv_cache.py);
  the other types llama.cpp knows are a usage error saying which llamavk has; any other name is a
  usage error listing llama.cpp's names.
- `-t N`, `--no-warmup`, `-no-cnv`, `--jinja`: accepted, no effect (said under -v).
- `-e/--escape` (on by default, as in llama.cpp) / `--no-escape`: `process_escapes`.

Pure functions: the CLI's options are in cli/llamacpp_flags.py.
"""

from __future__ import annotations

from .errors import UsageError
from .kv_cache import KV_CACHE_TYPES, KVTypes

# llama.cpp's -ctk/-ctv names (common/arg.cpp's kv_cache_types at 0c1e570), and what llamavk does.
LLAMACPP_CACHE_TYPES = ("f32", "f16", "bf16", "q8_0", "q4_0", "q4_1", "iq4_nl", "q5_0", "q5_1")
CACHE_TYPES = KV_CACHE_TYPES

FLASH_ATTN_ON = ("on", "enabled", "1", "true", "auto", "-1")
FLASH_ATTN_OFF = ("off", "disabled", "0", "false")


def parse_gpu_layers(text: str | None) -> int | None:
    """-ngl's value: an integer, or -1 for llama.cpp's `all` / `auto`; None when not given."""
    if text is None:
        return None
    value = text.strip().lower()
    if value in ("all", "auto"):
        return -1
    try:
        n = int(value)
    except ValueError:
        raise UsageError(f"-ngl: expected a number, 'all' or 'auto', got {text!r}") from None
    if n < -1:
        raise UsageError(f"-ngl: {n} is not a layer count (use -1 or 99: every layer on the GPUs)")
    return n


def check_gpu_layers(n: int | None, n_layer: int) -> None:
    """Only "every layer on the GPUs" exists in llamavk: a smaller -ngl is a usage error saying so."""
    if n is None or n == -1 or n >= n_layer:
        return
    raise UsageError(f"-ngl {n}: llamavk keeps every layer on the GPUs (this model has {n_layer}); "
                     f"there is no CPU offload, so use -ngl 99 or leave it out")


def check_flash_attn(text: str | None) -> None:
    if text is None or text.strip().lower() in FLASH_ATTN_ON:
        return
    if text.strip().lower() in FLASH_ATTN_OFF:
        raise UsageError(f"-fa {text}: llamavk's attention is always a flash-attention kernel; "
                         "use -fa on (or leave it out)")
    raise UsageError(f"-fa: bad value {text!r}; expected on, off or auto")


def check_cache_type(flag: str, text: str) -> str:
    """-ctk/-ctv: the type's name (kv_cache.KV_CACHE_TYPES); llama.cpp's other names are usage errors that
    say which types llamavk has; other names list llama.cpp's."""
    name = str(text).strip().lower()
    if name in CACHE_TYPES:
        return name
    if name in LLAMACPP_CACHE_TYPES:
        raise UsageError(f"{flag} {name}: llamavk's KV cache types are {', '.join(CACHE_TYPES)}")
    raise UsageError(f"{flag}: unknown KV cache type {text!r}; llama.cpp's types are "
                     f"{', '.join(LLAMACPP_CACHE_TYPES)}")


def kv_types_of(type_k: str, type_v: str, flags: tuple[str, str] = ("type_k", "type_v")) -> KVTypes:
    """The KV cache types named by -ctk / -ctv (or the API's type_k= / type_v=), checked."""
    return KVTypes(check_cache_type(flags[0], type_k), check_cache_type(flags[1], type_v))


def check_common(gpu_layers: str | None, flash_attn: str | None, cache_type_k: str, cache_type_v: str) -> int | None:
    """Checks every subcommand shares; returns -ngl as a number (None when not given)."""
    check_flash_attn(flash_attn)
    check_cache_type("-ctk", cache_type_k)
    check_cache_type("-ctv", cache_type_v)
    return parse_gpu_layers(gpu_layers)


def no_effect_notes(threads: int | None = None, no_warmup: bool = False, no_conversation: bool = False,
                    jinja: bool = False, mlock: bool = False, no_mmap: bool = False) -> list[str]:
    """What -v says about the flags that are accepted only so that llama.cpp command lines run."""
    notes = []
    if threads is not None:
        notes.append(f"-t {threads}: no effect (the GPUs compute; the CPU only orchestrates)")
    if no_warmup:
        notes.append("--no-warmup: no effect (no separate warm-up pass is run)")
    if no_conversation:
        notes.append("-no-cnv: no effect (llamavk run is always one-shot)")
    if jinja:
        notes.append("--jinja: no effect (--chat always renders the template with jinja2)")
    if mlock:
        notes.append("--mlock: no effect (the weights live in device memory; the file is only read)")
    if no_mmap:
        notes.append("--no-mmap: no effect (the file is read as the weights upload, whichever way)")
    return notes


# llama.cpp's escapes (common.cpp string_process_escapes): a backslash and one of n r t ' " \, or
# \xHH with two hex digits (a byte). Any other backslash stays as it is, with the character after it.
_SIMPLE_ESCAPES = {ord("n"): b"\n", ord("r"): b"\r", ord("t"): b"\t", ord("'"): b"'", ord('"'): b'"',
                   ord("\\"): b"\\"}
_HEX = frozenset(b"0123456789abcdefABCDEF")


def process_escapes(text: str) -> str:
    """The prompt with llama.cpp's escape sequences replaced (llama-completion does this by default,
    for -p, -f and -sys alike). Works on the text's bytes, as llama.cpp does, so `\\xc3\\xa9` is "é"; bytes
    that are not UTF-8 (`\\xff`) come back as surrogate escapes (tokenizer/stray_bytes.py)."""
    if "\\" not in text:
        return text
    from .tokenizer.stray_bytes import from_bytes, to_bytes

    src = to_bytes(text)
    out = bytearray()
    i, n = 0, len(src)
    while i < n:
        c = src[i]
        if c != 0x5C or i + 1 >= n:            # not a backslash, or one ending the text
            out.append(c)
            i += 1
            continue
        nxt = src[i + 1]
        if nxt in _SIMPLE_ESCAPES:
            out += _SIMPLE_ESCAPES[nxt]
            i += 2
        elif nxt == ord("x") and i + 3 < n and src[i + 2] in _HEX and src[i + 3] in _HEX:
            out.append(int(src[i + 2:i + 4], 16))
            i += 4
        else:                                   # unknown escape: kept, backslash included
            out += src[i:i + 2]
            i += 2
    return from_bytes(bytes(out))
