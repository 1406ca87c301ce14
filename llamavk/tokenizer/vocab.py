"""Vocabulary from GGUF metadata: tokens, types, special ids and flags, with llama.cpp's defaults.

Mirrors llama_vocab::impl::load so that BOS/EOS, add_bos/add_eos, end-of-generation tokens and the
set of "special" tokens parsed in prompts match llama.cpp when keys are missing from the file.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from typing import Any

from ..errors import LlamavkError
from .pretokenizers import pre_flags

# GGUF token types (gguf TokenType / llama_token_type)
NORMAL, UNKNOWN, CONTROL, USER_DEFINED, UNUSED, BYTE = 1, 2, 3, 4, 5, 6

# Texts that llama.cpp recognises as end-of-turn / end-of-generation when no key says so.
_EOT_TEXTS = ("<|eot_id|>", "<|im_end|>", "<|end|>", "<end_of_turn>", "<|endoftext|>",
              "<|end_of_text|>", "<EOT>", "_<EOT>", "<｜end▁of▁sentence｜>", "<end_of_utterance>")
_EOG_TEXTS = ("<|eot_id|>", "<|im_end|>", "<|end|>", "<|return|>", "<|call|>", "<end_of_turn>",
              "<|endoftext|>", "<|eom_id|>", "<EOT>", "_<EOT>", "<|end_of_text|>", "<end_of_utterance>")
# FIM tokens found by text; llama.cpp also treats pad/repo/sep FIM tokens as end-of-generation.
_FIM_TEXTS = {
    "fim_pre": ("<|fim_prefix|>", "<fim-prefix>", "<fim_prefix>", "<｜fim▁begin｜>", "<PRE>", "▁<PRE>", "<|code_prefix|>"),
    "fim_suf": ("<|fim_suffix|>", "<fim-suffix>", "<fim_suffix>", "<｜fim▁hole｜>", "<SUF>", "▁<SUF>", "<|code_suffix|>"),
    "fim_mid": ("<|fim_middle|>", "<fim-middle>", "<fim_middle>", "<｜fim▁end｜>", "<MID>", "▁<MID>", "<|code_middle|>"),
    "fim_pad": ("<|fim_pad|>", "<fim-pad>", "<fim_pad>", "<PAD>"),
    "fim_rep": ("<|fim_repo|>", "<|repo_name|>", "<fim-repo>", "<REPO>", "<reponame>"),
    "fim_sep": ("<|file_sep|>",),
}

_GPT_OSS_SHOWN = ("<|channel|>", "<|message|>", "<|start|>", "<|constrain|>")
# every text the loader looks for by name
_SPECIAL_TEXTS = frozenset(_EOT_TEXTS + ("<|eom_id|>",) + sum(_FIM_TEXTS.values(), ()) + _EOG_TEXTS
                           + _GPT_OSS_SHOWN)

_K = "tokenizer.ggml."
# metadata key suffix -> special-id field; the deprecated prefix/suffix/middle keys come last so they
# override, as in llama.cpp's table.
_ID_KEYS = (
    ("bos_token_id", "bos"), ("eos_token_id", "eos"), ("eot_token_id", "eot"), ("eom_token_id", "eom"),
    ("unknown_token_id", "unk"), ("seperator_token_id", "sep"), ("padding_token_id", "pad"),
    ("mask_token_id", "mask"), ("fim_pre_token_id", "fim_pre"), ("fim_suf_token_id", "fim_suf"),
    ("fim_mid_token_id", "fim_mid"), ("fim_pad_token_id", "fim_pad"), ("fim_rep_token_id", "fim_rep"),
    ("fim_sep_token_id", "fim_sep"), ("prefix_token_id", "fim_pre"), ("suffix_token_id", "fim_suf"),
    ("middle_token_id", "fim_mid"),
)


@dataclass
class Vocab:
    model: str                      # "llama" (SPM) or "gpt2" (BPE)
    tokens: list[str]
    types: list[int]
    scores: list[float]
    token_to_id: dict[str, int]
    ids: dict[str, int | None]      # bos, eos, eot, eom, unk, sep, pad, mask, fim_*
    add_bos: bool
    add_eos: bool
    add_space_prefix: bool
    clean_spaces: bool
    ignore_merges: bool
    pre_family: str | None          # BPE regex family (pretokenizers.REGEX_SEQUENCES key)
    merges: list[str] = field(default_factory=list)
    eog_ids: set[int] = field(default_factory=set)
    special_ids: list[int] = field(default_factory=list)  # control/user-defined/unknown, longest first
    rstrip: set[int] = field(default_factory=set)
    suppress_ids: list[int] = field(default_factory=list)   # never sampled (tokenizer.ggml.suppress_tokens)


def _get(meta: dict[str, Any], key: str, kind: type, default: Any = None) -> Any:
    v = meta.get(_K + key, default)
    if v is default:
        return v
    if kind is int and isinstance(v, bool) or not isinstance(v, kind):
        raise LlamavkError(f"bad GGUF metadata: {_K}{key} should be {kind.__name__}, got {type(v).__name__}")
    return v


def _get_list(meta: dict[str, Any], key: str, kind: type | tuple) -> list | None:
    """An array value whose every element is of `kind` (bools are not numbers); None if absent."""
    v = _get(meta, key, list)
    if v is not None and not _all_of(v, kind):
        for i, x in enumerate(v):
            if isinstance(x, bool) or not isinstance(x, kind) or x != x:   # x != x: NaN
                raise LlamavkError(f"bad GGUF metadata: {_K}{key}[{i}] = {x!r} is not "
                                   f"{'a string' if kind is str else 'a number'}")
    return v


def _all_of(values: list, kind: type | tuple) -> bool:
    """Every element is exactly a str (kind str) or an int/float that is not NaN (bools are not
    numbers): one pass in C over a 150k-token vocabulary instead of a Python loop. False sends the
    caller to its element-by-element check, which names the first bad element."""
    if kind is str:
        return set(map(type, values)) <= {str}
    types = set(map(type, values))
    if not types <= {int, float}:
        return False
    return float not in types or not any(map(math.isnan, values))


_BYTE_TOKEN = re.compile(r"<0x[0-9A-Fa-f]{2}>")


def load_vocab(meta: dict[str, Any]) -> Vocab:
    model = _get(meta, "model", str)
    if model is None:
        raise LlamavkError("GGUF metadata has no tokenizer (tokenizer.ggml.model missing)")
    if model not in ("llama", "gpt2"):
        raise LlamavkError(f"unsupported tokenizer.ggml.model '{model}' (supported: llama, gpt2)")

    tokens = _get_list(meta, "tokens", str)
    if not tokens:
        raise LlamavkError("GGUF metadata has no tokenizer vocabulary (tokenizer.ggml.tokens)")
    n = len(tokens)
    # llama.cpp renames empty tokens so that every text maps back to one id
    tokens = [t if t else f"[EMPTY_{i}]" for i, t in enumerate(tokens)]
    types = _get_list(meta, "token_type", int) or [NORMAL] * n
    scores = _get_list(meta, "scores", (int, float)) or [0.0] * n
    if len(types) != n or len(scores) != n:
        raise LlamavkError("bad GGUF metadata: tokenizer token_type/scores length differs from tokens")
    types = [t if t in (NORMAL, UNKNOWN, CONTROL, USER_DEFINED, UNUSED, BYTE) else 0 for t in types]
    if model == "llama":   # SPM byte tokens are decoded from their text
        for i, t in enumerate(types):
            if t == BYTE and not _BYTE_TOKEN.fullmatch(tokens[i]):
                raise LlamavkError(f"bad GGUF metadata: token {i} has type BYTE but its text "
                                   f"{tokens[i][:20]!r} is not <0xXX>")
    token_to_id = {t: i for i, t in enumerate(tokens)}  # later duplicates win, as in llama.cpp

    ids: dict[str, int | None] = {k: None for _, k in _ID_KEYS}
    merges: list[str] = []
    if model == "llama":
        ids.update(bos=1, eos=2, unk=0)
        add_bos, add_eos, add_space_prefix, clean_spaces, ignore_merges = True, False, True, False, False
        family = None
    else:
        merges = _get_list(meta, "merges", str)
        if merges is None:
            raise LlamavkError("bad GGUF metadata: gpt2 tokenizer without tokenizer.ggml.merges")
        pre = _get(meta, "pre", str)
        family, clean_spaces, ignore_merges, add_bos = pre_flags(pre)
        ids.update(bos=11, eos=11)  # llama.cpp's (odd) GPT-2 defaults
        if pre in ("glm4", "chatglm-bpe"):
            ids["bos"] = None
        add_eos, add_space_prefix = False, False

    add_space_prefix = _get(meta, "add_space_prefix", bool, add_space_prefix)
    for name, v in ids.items():   # a default that the vocabulary is too small for names no token
        if v is not None and v >= n:
            ids[name] = None
    for key, name in _ID_KEYS:
        v = _get(meta, key, int)
        if v is not None and 0 <= v < n:  # out-of-range ids keep the default, like llama.cpp
            ids[name] = v
    add_bos = _get(meta, "add_bos_token", bool, add_bos)
    add_eos = _get(meta, "add_eos_token", bool, add_eos)

    # Auto-detect EOT/EOM/FIM tokens by text when no key names them; such tokens become CONTROL.
    # Only tokens whose text is one of those looked for matter: found by one set lookup each.
    found = [(i, t) for i, t in enumerate(tokens) if t in _SPECIAL_TEXTS]
    for i, t in found:
        for name, texts in (("eot", _EOT_TEXTS), ("eom", ("<|eom_id|>",)), *_FIM_TEXTS.items()):
            if ids[name] is None and t in texts:
                ids[name] = i
                types[i] = CONTROL
    eog: set[int] = {ids[k] for k in ("fim_pad", "fim_rep", "fim_sep") if ids[k] is not None}
    for i, t in found:
        if t in _EOG_TEXTS:
            eog.add(i)
            types[i] = CONTROL
        if t in _GPT_OSS_SHOWN:  # gpt-oss: always shown
            types[i] = USER_DEFINED
    eog.update(ids[k] for k in ("eos", "eot", "eom") if ids[k] is not None)
    # gpt-oss (o200k_harmony): "<|end|>" separates messages and must not stop generation
    texts = {tokens[i]: i for i in eog}
    if "<|return|>" in texts and "<|call|>" in texts and "<|end|>" in texts:
        eog.discard(texts["<|end|>"])
        types[texts["<|end|>"]] = USER_DEFINED

    special = [i for i, t in enumerate(types) if t in (CONTROL, USER_DEFINED, UNKNOWN)]
    special.sort(key=lambda i: -len(tokens[i].encode("utf-8")))  # longest first (bytes, like C++)

    # Phi-3 strips whitespace after most special tokens (llama.cpp keys this on general.name).
    rstrip: set[int] = set()
    name = str(meta.get("general.name", "")).lower()
    if "phi-3" in name or "phi3" in name:
        rstrip = set(special)
        if "</s>" in token_to_id:
            rstrip.add(token_to_id["</s>"])
        for t in ("<unk>", "<s>", "<|endoftext|>"):
            rstrip.discard(token_to_id.get(t, -1))

    # tokens the sampler never draws (llama.cpp: a -inf logit bias); ids outside the vocabulary dropped
    suppress = [int(t) for t in _get_list(meta, "suppress_tokens", int) or () if 0 <= t < n]

    return Vocab(model=model, tokens=tokens, types=types, scores=[float(s) for s in scores],
                 token_to_id=token_to_id, ids=ids, add_bos=add_bos, add_eos=add_eos,
                 add_space_prefix=add_space_prefix, clean_spaces=clean_spaces,
                 ignore_merges=ignore_merges, pre_family=family, merges=merges, eog_ids=eog,
                 special_ids=special, rstrip=rstrip, suppress_ids=suppress)
