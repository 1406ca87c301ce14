"""Tokenizer.encode_prefix: the first ids of a long text from a head of it (perplexity over a few
chunks). The reference is the whole text's encode -- for the SentencePiece vocabulary with glue
tokens, the one merge pass over the whole text that llama.cpp runs."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest

from llamavk.tokenizer import Tokenizer
from llamavk.tokenizer import prefix as prefix_mod
from llamavk.tokenizer.pretokenizers import REGEX_SEQUENCES, PreTokenizer

from .conftest import missing
from .test_tokenizer import CHARS, llamacpp_vocab, spm_meta


def check_heads(tok, text, needs, whole=None, parse_special=False):
    """Every min_tokens in `needs`: the head's ids are the whole's first ones, at least that many
    (or all of them), `complete` exactly when they are all."""
    whole = tok.encode(text, parse_special=parse_special) if whole is None else whole
    for need in needs:
        ids, complete = tok.encode_prefix(text, need, parse_special=parse_special)
        assert ids == whole[:len(ids)], (need, len(ids))
        assert len(ids) >= min(need, len(whole)), (need, len(ids), len(whole))
        assert complete == (len(ids) == len(whole)), (need, len(ids), len(whole))
    return whole


@pytest.fixture()
def small_steps(monkeypatch):
    """Heads grown in many short steps: each step ends at a cut, so a text of a few kB is cut at
    dozens of places."""
    monkeypatch.setattr(prefix_mod, "PROBE_TOKENS", 4)
    monkeypatch.setattr(prefix_mod, "MIN_STEP", 3)
    monkeypatch.setattr(prefix_mod, "OVERSHOOT", 0.3)


def vocab_tokenizer(name):
    from llamavk.gguf_file import GGUFFile
    return Tokenizer.from_metadata(GGUFFile(llamacpp_vocab(name)).metadata)


def synthetic_spm():
    from llamavk.synthetic import synthetic_vocab
    tokens, scores, types = synthetic_vocab(32000)
    return Tokenizer.from_metadata({"tokenizer.ggml.model": "llama", "tokenizer.ggml.tokens": tokens,
                                    "tokenizer.ggml.scores": scores, "tokenizer.ggml.token_type": types})


BOTCHAN_NEEDS = [1, 2 * 64, 4 * 128, 8 * 256 + 1, 16 * 512, 10**9]     # (chunks, n_ctx) of perplexity runs


@pytest.fixture(scope="module")
def botchan_file_text():
    """botchan.txt as llama-perplexity's -f reads it (UTF-8 BOM and CR LF kept)."""
    from llamavk.perplexity import read_text

    path = Path(os.environ.get("LLAMAVK_BOTCHAN") or Path.home() / ".cache/llamavk/botchan.txt")
    if not path.is_file():
        missing(f"botchan.txt not found at {path} (set LLAMAVK_BOTCHAN or run scripts/fetch-test-data.sh)")
    return read_text(path)


@pytest.mark.parametrize("vocab", ["synthetic-spm", "llama-spm", "qwen35", "smollm2"])
def test_botchan_heads_are_the_whole_texts_first_ids(vocab, botchan_file_text, request):
    """SentencePiece (the synthetic models' 32k vocabulary, Llama 2's) and byte-level BPE (Qwen3.5's,
    SmolLM2's) on botchan, for the chunk counts and contexts perplexity runs use, and more than the
    text has."""
    from llamavk.gguf_file import GGUFFile

    if vocab == "synthetic-spm":
        tok = synthetic_spm()
    elif vocab == "smollm2":
        tok = Tokenizer.from_metadata(GGUFFile(request.getfixturevalue("smollm2_path")).metadata)
    else:
        tok = vocab_tokenizer(vocab)
    whole = check_heads(tok, botchan_file_text, BOTCHAN_NEEDS)
    ids, complete = tok.encode_prefix(botchan_file_text, 16 * 512, parse_special=False)
    assert not complete and len(ids) < len(whole) // 4      # a head, not the whole book


LETTERS = list("abcxyzéЖж中א") + ["e\u0301", "HelloWorld"]
OTHERS = list("0123456789.,!?'-\"()") + ["'s", "'ll", "...", "—"]
SPACES = [" ", " ", " ", "  ", "\n", "\n\n", " \n", "\t", "\r\n", "   "]


def random_text(rng, n_words):
    """Words of letters, digits, punctuation and their mixes, between runs of every kind of space:
    the cases where pre-tokenizers look ahead, glue a space or punctuation to the next word, or
    keep newlines together."""
    out = []
    for _ in range(n_words):
        kind = rng.integers(4)
        pool = LETTERS if kind < 2 else OTHERS if kind == 2 else LETTERS + OTHERS
        out.append("".join(rng.choice(pool, int(rng.integers(1, 6)))))
        out.append(SPACES[int(rng.integers(len(SPACES)))])
    return "".join(out)


@pytest.mark.parametrize("pre", ["default", "gpt2", "llama-bpe", "qwen2", "qwen35", "smollm", "falcon", "bloom",
                                 "viking", "seed-coder", "bailingmoe", "tekken", "gpt-4o", "deepseek-llm",
                                 "deepseek-coder"])
def test_bpe_heads_on_random_text_every_pretokenizer(pre, smollm2_path, small_steps):
    """SmolLM2's byte-level BPE vocabulary under every pre-tokenizer family: random text cut at
    many places (short steps) gives the whole text's first ids."""
    from llamavk.gguf_file import GGUFFile

    meta = dict(GGUFFile(smollm2_path).metadata, **{"tokenizer.ggml.pre": pre})
    tok = Tokenizer.from_metadata(meta)
    rng = np.random.default_rng([ord(c) for c in pre])
    for _ in range(6):
        text = random_text(rng, 300)
        whole = tok.encode(text, parse_special=False)
        check_heads(tok, text, [1, 5, 17, 60, 200, len(whole) // 2, len(whole) - 1, len(whole)], whole)


@pytest.mark.parametrize("family", sorted(REGEX_SEQUENCES))
def test_every_cut_splits_as_the_whole_text(family):
    """The pre-tokenizer's cuts (pretokenizers.CUT, CUTS) on random text with letters of several
    scripts (cased, CJK, Hebrew, marks): the pieces on either side of each cut are the whole text's."""
    pre = PreTokenizer(family)
    rng = np.random.default_rng([ord(c) for c in family])
    for text in ["ab cd \u05d0 \u05d1 \u4e2d \u4e2d e\u0301 f HelloWorld x \u0416 \u0436"] + \
            [random_text(rng, 60) for _ in range(20)]:
        whole, c = pre.split(text), pre.next_cut(text, 1)
        while c != -1:
            assert pre.split(text[:c]) + pre.split(text[c:]) == whole, (family, text, c)
            c = pre.next_cut(text, c + 1)


def test_spm_heads_with_glue_tokens_on_random_text(small_steps, monkeypatch):
    """A SentencePiece vocabulary where "a▁" and "▁▁" glue across spaces: the head is cut only where
    no merge can cross, and its ids are those of one merge pass over the whole text."""
    from llamavk.tokenizer import spm

    monkeypatch.setattr(spm, "LONG_TEXT", 0)
    tok = Tokenizer.from_metadata(spm_meta(CHARS + [("a▁", -0.5), ("▁b", -1.0), ("▁▁", -0.7), ("▁▁h", -0.2),
                                                    ("he", -2.0), ("▁he", -1.2), ("ll", -3.0), ("lo", -2.5)]))
    rng = np.random.default_rng(3)
    alphabet = list("abhelowré  ") + ["\n"]
    for _ in range(30):
        text = "".join(rng.choice(alphabet, int(rng.integers(200, 600))))
        one_pass = [tok.bos_id] + tok._spm.one_pass(("\u2581" + text).replace(" ", "\u2581"))
        check_heads(tok, text, [1, 3, 10, 40, len(one_pass) // 2, len(one_pass)], one_pass)


def test_heads_across_special_tokens(small_steps):
    """User-defined tokens split the text into fragments (as in encode, over the whole text), each
    with SentencePiece's space prefix after it; rstrip/lstrip as the vocabulary says."""
    meta = spm_meta(CHARS + [("▁h", -1.0), ("el", -2.0), ("▁w", -1.0), ("<x>", 0.0), ("<yy>", 0.0)])
    types = meta["tokenizer.ggml.token_type"]
    for t in ("<x>", "<yy>"):
        types[meta["tokenizer.ggml.tokens"].index(t)] = 4          # USER_DEFINED
    tok = Tokenizer.from_metadata(meta)
    rng = np.random.default_rng(9)
    pieces = ["hello", "world", "he", "ow", "<x>", "<yy>", "<x><yy>", " ", " ", "  ", "\n"]
    for _ in range(30):
        text = "".join(rng.choice(pieces, 120))
        for parse_special in (False, True):
            whole = tok.encode(text, parse_special=parse_special)
            check_heads(tok, text, [1, 2, 7, 30, len(whole) // 3, len(whole)], whole, parse_special)


def test_texts_without_cuts_and_eos():
    """A text with no place to cut is tokenized whole; so is any text where the vocabulary appends
    EOS (it closes the text); without add_special neither BOS nor EOS."""
    tok = synthetic_spm()
    text = "abcdefgh" * 200                         # no space: no cut
    assert tok.encode_prefix(text, 5, parse_special=False) == (tok.encode(text, parse_special=False), True)
    eos = Tokenizer.from_metadata(spm_meta(CHARS, add_eos_token=True))
    ids, complete = eos.encode_prefix("hello world " * 50, 3)
    assert complete and ids == eos.encode("hello world " * 50) and ids[-1] == eos.eos_id
    ids, complete = eos.encode_prefix("hello world " * 50, 3, add_special=False)
    assert not complete and ids == eos.encode("hello world " * 50, add_special=False)[:len(ids)]
