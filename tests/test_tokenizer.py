"""Tokenizer tests: real SmolLM2 vocab (ids from llama.cpp / HF), a synthetic SPM vocab, streaming."""

from __future__ import annotations

import time

import numpy as np
import pytest

from llamavk.errors import LlamavkError
from llamavk.tokenizer import Tokenizer
from llamavk.tokenizer.bpe import BYTE_TO_UNICODE
from llamavk.tokenizer.pretokenizers import PreTokenizer

TRICKY = [
    "12345 1.5",
    "3.14159 and 1,000,000 items; 2024-01-31",
    "several     spaces   here ",
    "\n\n\t",
    "line one\n\n  indented\tline\r\nend\n",
    "café naïve Ωμέγα 日本語",
    "👍🏽 emoji 🇯🇵!",
    "don't I'LL we've they'RE it's",
    "   leading and trailing   ",
    "",
    " ",
    "a",
    "def f(x):\n    return x**2  # comment",
    "Mixed: ½ ² Ⅻ ١٢٣ (non-ASCII numbers)",
    "<|im_start|> not parsed when parse_special=False",
]

# ---------------------------------------------------------------------------------------------
# SmolLM2 (byte-level BPE, pre "smollm")


@pytest.fixture(scope="module")
def smollm2_meta(smollm2_path):
    from llamavk.gguf_file import GGUFFile

    return GGUFFile(smollm2_path).metadata


@pytest.fixture(scope="module")
def smol(smollm2_meta):
    return Tokenizer.from_metadata(smollm2_meta)


def _hf_reference(meta, pre_tokenizer, ignore_merges=False):
    """An HF `tokenizers` BPE built from the same GGUF vocab+merges (independent reference)."""
    tokenizers = pytest.importorskip("tokenizers")
    from tokenizers import models

    vocab = {t: i for i, t in enumerate(meta["tokenizer.ggml.tokens"])}
    merges = [tuple(m.split(" ", 1)) for m in meta["tokenizer.ggml.merges"]]
    hf = tokenizers.Tokenizer(models.BPE(vocab=vocab, merges=merges, ignore_merges=ignore_merges))
    hf.pre_tokenizer = pre_tokenizer
    return hf


def test_smollm2_basic(smol):
    assert smol.encode("The capital of France is") == [504, 3575, 282, 4649, 314]
    assert smol.n_vocab == 49152
    assert (smol.bos_id, smol.eos_id, smol.add_bos, smol.add_eos) == (1, 2, False, False)
    # add_bos_token is false in the file: add_special adds nothing
    assert smol.encode("Hi", add_special=True) == smol.encode("Hi", add_special=False)


def test_smollm2_matches_hf(smollm2_meta, smol):
    pt = pytest.importorskip("tokenizers.pre_tokenizers")
    hf = _hf_reference(smollm2_meta, pt.Sequence([
        pt.Digits(individual_digits=True),
        pt.ByteLevel(add_prefix_space=False, use_regex=True),
    ]))
    for text in TRICKY:
        ours = smol.encode(text, add_special=False, parse_special=False)
        assert ours == hf.encode(text, add_special_tokens=False).ids, text
        assert smol.decode(ours) == text


@pytest.mark.parametrize("pre,pattern,ignore_merges", [
    ("llama-bpe", r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+", True),
    ("qwen2", r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+", False),
])
def test_other_pretokenizers_match_hf(smollm2_meta, pre, pattern, ignore_merges):
    """Llama 3 / Qwen2 pre-tokenizers, run on the SmolLM2 vocab against HF with the tokenizer.json regex."""
    Regex = pytest.importorskip("tokenizers").Regex
    from tokenizers import pre_tokenizers as pt

    meta = dict(smollm2_meta, **{"tokenizer.ggml.pre": pre})
    del meta["tokenizer.ggml.add_bos_token"]
    tok = Tokenizer.from_metadata(meta)
    assert tok.add_bos is (pre == "llama-bpe")  # llama.cpp's default per pre-tokenizer
    hf = _hf_reference(meta, pt.Sequence([
        pt.Split(Regex(pattern), behavior="isolated"),
        pt.ByteLevel(add_prefix_space=False, use_regex=False),
    ]), ignore_merges=ignore_merges)
    for text in TRICKY:
        ours = tok.encode(text, add_special=False, parse_special=False)
        assert ours == hf.encode(text, add_special_tokens=False).ids, text


def test_gpt2_pretokenizer_matches_hf():
    pt = pytest.importorskip("tokenizers.pre_tokenizers")
    hf = pt.ByteLevel(add_prefix_space=False, use_regex=True)
    ours = PreTokenizer("gpt2")
    for text in TRICKY:
        expect = [w for w, _ in hf.pre_tokenize_str(text)]
        got = ["".join(BYTE_TO_UNICODE[b] for b in w.encode()) for w in ours.split(text)]
        assert got == expect, text


def test_smollm2_special_tokens(smol):
    ids = smol.encode("<|im_start|>user\nHi<|im_end|>\n")
    assert ids[0] == 1 and ids[-2] == 2
    assert ids[1:-2] == smol.encode("user\nHi")
    assert smol.encode("\n") == [ids[-1]]
    # not parsed: the control token text is tokenized as ordinary text
    plain = smol.encode("<|im_start|>", parse_special=False)
    assert 1 not in plain and smol.decode(plain) == "<|im_start|>"
    # decode renders special tokens as their text
    assert smol.decode(ids) == "<|im_start|>user\nHi<|im_end|>\n"
    assert smol.token_to_piece(2) == b"<|im_end|>"


def test_smollm2_eog(smol):
    assert smol.is_eog(2) and smol.is_eog(0)       # <|im_end|> (eos), <|endoftext|>
    assert not smol.is_eog(1) and not smol.is_eog(504) and not smol.is_eog(None)


def test_smollm2_streaming_emoji(smol):
    emoji = "👍"
    byte_ids = [smol.vocab.token_to_id[BYTE_TO_UNICODE[b]] for b in emoji.encode()]
    st = smol.stream()
    assert [st.feed(i) for i in byte_ids] == ["", "", "", emoji]
    assert st.flush() == ""
    # a real encoding streamed token by token reassembles the text, never a broken character
    text = "café 👍🏽 日本語 ok"
    st = smol.stream()
    parts = [st.feed(i) for i in smol.encode(text)] + [st.flush()]
    assert "".join(parts) == text and all("\ufffd" not in p for p in parts)


def test_botchan_count_and_speed(smollm2_meta, botchan_text):
    tok = Tokenizer.from_metadata(smollm2_meta)  # fresh: no warm word cache
    t0 = time.perf_counter()
    ids = tok.encode(botchan_text)
    dt = time.perf_counter() - t0
    assert len(ids) == 70187  # llama.cpp's count (SPEC §7)
    assert dt < 5.0, f"tokenizing botchan took {dt:.2f}s"
    assert tok.decode(ids) == botchan_text


def test_long_word_is_not_quadratic(smol):
    text = "x" * 20000 + " " * 20000 + "ab" * 10000
    t0 = time.perf_counter()
    ids = smol.encode(text)
    assert time.perf_counter() - t0 < 3.0
    assert smol.decode(ids) == text


# ---------------------------------------------------------------------------------------------
# Synthetic SentencePiece vocab


def spm_meta(extra_tokens, byte_tokens=True, **keys):
    tokens = ["<unk>", "<s>", "</s>"]
    types = [2, 3, 3]
    scores = [0.0, 0.0, 0.0]
    if byte_tokens:
        tokens += [f"<0x{b:02X}>" for b in range(256)]
        types += [6] * 256
        scores += [0.0] * 256
    for text, score in extra_tokens:
        tokens.append(text)
        types.append(1)
        scores.append(score)
    meta = {
        "tokenizer.ggml.model": "llama",
        "tokenizer.ggml.tokens": tokens,
        "tokenizer.ggml.token_type": types,
        "tokenizer.ggml.scores": scores,
    }
    meta.update({f"tokenizer.ggml.{k}": v for k, v in keys.items()})
    return meta


CHARS = [(c, -10.0) for c in "▁helowrdab"]


def ids_of(tok, *texts):
    return [tok.vocab.token_to_id[t] for t in texts]


def test_spm_prefix_escape_and_bos():
    tok = Tokenizer.from_metadata(spm_meta(CHARS + [("▁h", -1.0), ("el", -2.0), ("lo", -3.0),
                                                    ("▁hel", -1.5), ("▁hello", -0.5), ("▁w", -1.0)]))
    assert (tok.bos_id, tok.eos_id, tok.add_bos, tok.add_eos) == (1, 2, True, False)
    # " hello" -> "▁hello" via ▁h, ▁hel, then lo cannot merge with ▁hel... check exact path:
    # pairs: ▁h(-1) el(-2) lo(-3) -> ▁h first, then "▁h"+"e" not a token; el(-2) -> ▁h|el|l|o;
    # ▁hel(-1.5) -> ▁hel|l|o; lo(-3) -> ▁hel|lo; "▁hello" is the concatenation -> merged.
    assert tok.encode("hello") == [1] + ids_of(tok, "▁hello")
    assert tok.encode("hello w", add_special=False) == ids_of(tok, "▁hello", "▁w")
    assert tok.decode(tok.encode("hello w", add_special=False)) == "hello w"
    assert tok.decode(tok.encode("hello w")) == "<s> hello w"  # as llama_detokenize(special=true)
    no_prefix = Tokenizer.from_metadata(spm_meta(CHARS + [("he", -1.0)], add_space_prefix=False))
    assert no_prefix.encode("he", add_special=False) == ids_of(no_prefix, "he")


def test_spm_score_order_and_ties():
    # "▁he": ▁h (-5) vs he (-2): the better score wins even though ▁h is further left
    tok = Tokenizer.from_metadata(spm_meta(CHARS + [("▁h", -5.0), ("he", -2.0)]))
    assert tok.encode("he", add_special=False) == ids_of(tok, "▁", "he")
    tok = Tokenizer.from_metadata(spm_meta(CHARS + [("▁h", -1.0), ("he", -2.0)]))
    assert tok.encode("he", add_special=False) == ids_of(tok, "▁h", "e")
    # equal scores: the leftmost pair merges first ("aaa" -> "aa" + "a")
    tok = Tokenizer.from_metadata(spm_meta(CHARS + [("aa", -1.0)], add_space_prefix=False))
    assert tok.encode("aaa", add_special=False) == ids_of(tok, "aa", "a")


def test_spm_word_segments_equal_one_pass(monkeypatch):
    """Long texts are tokenized word by word (cached); a cut before a U+2581 is made only where no
    token has the character before it followed by U+2581, so the ids stay those of one merge pass over
    the whole text. Here "a▁" (score -0.5) beats "▁b" (-1): "a b" must give a▁ b, as one pass does,
    and "▁▁" glues space runs."""
    from llamavk.tokenizer import spm

    monkeypatch.setattr(spm, "LONG_TEXT", 0)       # every fragment goes word by word
    tok = Tokenizer.from_metadata(spm_meta(CHARS + [("a▁", -0.5), ("▁b", -1.0), ("▁▁", -0.7), ("▁▁h", -0.2),
                                                    ("he", -2.0), ("▁he", -1.2), ("ll", -3.0), ("lo", -2.5)]))
    assert tok.encode("a b", add_special=False) == ids_of(tok, "▁", "a▁", "b")
    rng = np.random.default_rng(5)
    alphabet = list("abhelowré  ")
    for _ in range(200):
        text = "".join(rng.choice(alphabet, int(rng.integers(1, 40))))
        escaped = ("\u2581" + text).replace(" ", "\u2581")
        assert tok._spm.encode(escaped) == tok._spm._encode_segment(escaped), repr(text)


def test_spm_segments_with_regex_metacharacters_before_spaces(monkeypatch):
    """The cut before a U+2581 is a regex built from the characters tokens have before one: those
    that mean something in a character class (] ^ - \\) must glue as any other."""
    from llamavk.tokenizer import spm

    monkeypatch.setattr(spm, "LONG_TEXT", 0)
    chars = [(c, -10.0) for c in "▁ab]^-\\"]
    tok = Tokenizer.from_metadata(spm_meta(chars + [("]▁", -1.0), ("^▁", -1.5), ("-▁", -2.0), ("\\▁", -2.5),
                                                    ("▁a", -3.0), ("ab", -3.5)]))
    rng = np.random.default_rng(7)
    alphabet = list("ab]^-\\  ")
    for _ in range(200):
        text = "".join(rng.choice(alphabet, int(rng.integers(1, 40))))
        escaped = ("\u2581" + text).replace(" ", "\u2581")
        assert tok._spm.encode(escaped) == tok._spm.one_pass(escaped), repr(text)
    assert tok._spm._segments("a]▁b▁a^▁a▁b") == ["a]▁b", "▁a^▁a", "▁b"]


def test_spm_short_scan_merges_as_the_heap():
    """Short segments (words) merge with a list scan instead of the heap: the same merge order (best
    score, leftmost on ties) on random vocabularies with many tied scores, pieces built from merges,
    characters outside the vocabulary; a vocabulary with a non-finite score keeps the heap."""
    from llamavk.tokenizer import spm

    rng = np.random.default_rng(11)
    alphabet = list("ab▁cé")
    for trial in range(40):
        pieces = {"".join(rng.choice(alphabet, int(rng.integers(2, 5)))) for _ in range(25)}
        # few distinct scores: ties everywhere
        extra = [(c, -10.0) for c in "ab▁c"] + [(p, float(rng.integers(-4, 0))) for p in sorted(pieces)]
        tok = Tokenizer.from_metadata(spm_meta(extra))
        s = tok._spm
        assert s._scan_ok
        for _ in range(30):
            text = "".join(rng.choice(alphabet, int(rng.integers(1, spm.SHORT_SEGMENT + 1))))
            heap = [x for x in s._merge_heap(list(text), s.token_to_id.get) if x]
            assert s._merge_scan(text) == heap, (trial, text)
            assert s._encode_segment(text) == s._ids(heap, s.token_to_id.get)
    odd = Tokenizer.from_metadata(spm_meta(CHARS + [("he", float("-inf")), ("ll", float("inf"))]))
    assert not odd._spm._scan_ok
    assert odd.encode("hell", add_special=False) == ids_of(odd, "▁", "he", "ll")   # ll (inf), then he (-inf)


def test_spm_byte_fallback_and_unk():
    tok = Tokenizer.from_metadata(spm_meta(CHARS))
    assert tok.encode("hé", add_special=False) == ids_of(tok, "▁", "h", "<0xC3>", "<0xA9>")
    assert tok.decode(tok.encode("hé", add_special=False)) == "hé"
    no_bytes = Tokenizer.from_metadata(spm_meta(CHARS, byte_tokens=False))
    assert no_bytes.encode("hé", add_special=False) == ids_of(no_bytes, "▁", "h") + [0, 0]


def test_spm_special_and_metadata_flags():
    tok = Tokenizer.from_metadata(spm_meta(CHARS, add_bos_token=False, add_eos_token=True))
    assert tok.encode("a") == ids_of(tok, "▁", "a") + [2]
    # a space prefix is added after every special token, as llama.cpp does
    assert tok.encode("a</s>b", add_special=False) == ids_of(tok, "▁", "a") + [2] + ids_of(tok, "▁", "b")
    assert tok.encode("</s>", add_special=False, parse_special=False) != [2]
    assert tok.is_eog(2) and not tok.is_eog(1)


def test_spm_streaming_bytes():
    tok = Tokenizer.from_metadata(spm_meta(CHARS))
    ids = tok.encode("👍", add_special=False)
    st = tok.stream()
    outs = [st.feed(i) for i in ids]
    assert outs == [" ", "", "", "", "👍"] and st.flush() == ""


def test_bad_metadata():
    with pytest.raises(LlamavkError, match="tokenizer.ggml.model"):
        Tokenizer.from_metadata({"tokenizer.ggml.model": "nope", "tokenizer.ggml.tokens": ["a"]})
    with pytest.raises(LlamavkError, match="tokenizer.ggml.pre"):
        Tokenizer.from_metadata({"tokenizer.ggml.model": "gpt2", "tokenizer.ggml.tokens": ["a"],
                                 "tokenizer.ggml.merges": [], "tokenizer.ggml.pre": "nope"})
    with pytest.raises(LlamavkError):
        Tokenizer.from_metadata({})
    tok = Tokenizer.from_metadata(spm_meta(CHARS))
    with pytest.raises(LlamavkError):
        tok.token_to_piece(10**6)
    with pytest.raises(LlamavkError, match="suppress_tokens"):
        Tokenizer.from_metadata(spm_meta(CHARS, suppress_tokens=["a"]))


def test_suppressed_tokens():
    """tokenizer.ggml.suppress_tokens (never sampled): ids outside the vocabulary dropped, as llama.cpp."""
    tok = Tokenizer.from_metadata(spm_meta(CHARS, suppress_tokens=[5, -1, 10**6, 2]))
    assert tok.vocab.suppress_ids == [5, 2]
    assert Tokenizer.from_metadata(spm_meta(CHARS)).vocab.suppress_ids == []


# ---------------------------------------------------------------------------------------------
# Qwen3.5 (byte-level BPE, pre "qwen35"): llama.cpp's own test vectors, and combining marks vs HF

QWEN35_REGEX = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+|\p{N}| ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*"
                r"|\s*[\r\n]+|\s+(?!\S)|\s+")                        # tokenizer.json's, as llama.cpp quotes it
MARKS = ["cafe\u0301 nai\u0308ve", "नमस्ते दुनिया", "ที่นี่ ไม่", "\u0915\u094d\u0937 a\u0300\u0301b", "x\u20d7 + y\u20d7"]


def llamacpp_vocab(name):
    """llama.cpp's models/ggml-vocab-NAME.gguf + .inp/.out (scripts/fetch-test-data.sh puts them in
    ~/.cache/llamavk/vocab, or $LLAMAVK_VOCAB_DIR)."""
    import os
    from pathlib import Path

    d = Path(os.environ.get("LLAMAVK_VOCAB_DIR") or Path.home() / ".cache/llamavk/vocab")
    path = d / f"ggml-vocab-{name}.gguf"
    if not (path.is_file() and path.with_suffix(".gguf.out").is_file()):
        pytest.skip(f"llama.cpp's tokenizer test vectors not found in {d} (scripts/fetch-test-data.sh)")
    return path


@pytest.mark.parametrize("name,cases", [("qwen35", 50), ("llama-spm", 46), ("phi-3", 46), ("llama-bpe", 46),
                                        ("qwen2", 46), ("falcon", 46), ("gpt-2", 46), ("mpt", 46), ("command-r", 46),
                                        ("refact", 46), ("starcoder", 46), ("deepseek-coder", 46),
                                        ("deepseek-llm", 46)])
def test_matches_llamacpp_test_vectors(name, cases):
    """Every case of llama.cpp's tests/test-tokenizer-0 for this vocabulary (add_special and
    parse_special false, as there); decoded back to the text where nothing cleans spaces up (SPM:
    a leading space is not restored, llama.cpp's detokenizer alike)."""
    from llamavk.gguf_file import GGUFFile
    from llamavk.tokenizer.pretokenizers import pre_flags

    path = llamacpp_vocab(name)
    meta = GGUFFile(path).metadata
    tok = Tokenizer.from_metadata(meta)
    exact_decode = meta["tokenizer.ggml.model"] == "gpt2" and not pre_flags(meta.get("tokenizer.ggml.pre"))[1]
    raw = path.with_suffix(".gguf.inp").read_bytes().decode()
    texts = raw.split("\n__ggml_vocab_test__\n")
    if texts and texts[-1] == "":               # the file ends with a separator
        texts.pop()
    ids = [[int(v) for v in line.split()] for line in path.with_suffix(".gguf.out").read_text().splitlines()]
    assert len(texts) == len(ids) == cases
    for text, want in zip(texts, ids):
        assert tok.encode(text, add_special=False, parse_special=False) == want, repr(text)
        if exact_decode:
            assert tok.decode(want) == text


def test_llama_spm_botchan_is_fast_and_one_pass(botchan_text):
    """The llama SPM vocabulary on a whole text: cut into word segments (cached), its ids are those of
    one merge pass over the whole text (the heap-ordered merges llama.cpp runs), in a fraction of its time."""
    from llamavk.gguf_file import GGUFFile

    tok = Tokenizer.from_metadata(GGUFFile(llamacpp_vocab("llama-spm")).metadata)
    text = botchan_text[:40000]
    t0 = time.perf_counter()
    ids = tok.encode(text, add_special=False, parse_special=False)
    dt = time.perf_counter() - t0
    assert ids == tok._spm._encode_segment(("\u2581" + text).replace(" ", "\u2581"))
    assert dt < 1.0, f"tokenizing 40 kB took {dt:.2f}s"


def test_qwen35_pretokenizer_keeps_marks_in_words(smollm2_meta):
    """Qwen3.5's pattern counts combining marks (\\p{M}) as part of a word, where Qwen2's splits them
    off: against HF tokenizers with tokenizer.json's regex, on text where the two differ."""
    Regex = pytest.importorskip("tokenizers").Regex
    from tokenizers import pre_tokenizers as pt

    meta = dict(smollm2_meta, **{"tokenizer.ggml.pre": "qwen35"})
    tok = Tokenizer.from_metadata(meta)
    hf = _hf_reference(meta, pt.Sequence([pt.Split(Regex(QWEN35_REGEX), behavior="isolated"),
                                          pt.ByteLevel(add_prefix_space=False, use_regex=False)]))
    for text in MARKS + TRICKY:
        assert tok.encode(text, add_special=False, parse_special=False) == hf.encode(text, add_special_tokens=False).ids, text
    qwen2, qwen35 = PreTokenizer("qwen2"), PreTokenizer("qwen35")
    assert qwen35.split("cafe\u0301 x") == ["cafe\u0301", " x"]
    assert all(qwen2.split(t) != qwen35.split(t) for t in MARKS)


# ---------------------------------------------------------------------------------------------
# Tekken (Mistral Nemo / Small 3) against llama.cpp itself: its ids follow llama.cpp's rewrite of
# tokenizer.json's case classes, so no HF reference; SmolLM2's vocabulary in a tiny model whose
# tokenizer says pre "tekken" and nothing about BOS (Tekken's default: add it).

TEKKEN_TEXTS = [t for t in TRICKY if t.strip() and "<|" not in t] + [
    "HelloWorld XMLHttpRequest fooBAR getHTTPResponseCode",
    "ÉcoleNormale straße ΩμέγαΑλφα ǅungla İstanbul",
    "path/to/file/\nnext/ line //comment\r\n",
    "CamelCase2024Version x86_64 A1b2C3",
]


def smollm2_vocab_model(smollm2_meta, path, pre: str, new=(), new_merges=()):
    """A tiny model with SmolLM2's vocabulary under another pre-tokenizer (no BOS key, no scores),
    without the merge that makes " Hello" (a token of its own: only ignore_merges' whole-word lookup
    finds it then), plus `new` tokens whose merges go first: (model path, vocab metadata, Tokenizer)."""
    from llamavk.synthetic import write_synthetic_model

    vocab = {k: v for k, v in smollm2_meta.items() if k.startswith("tokenizer.ggml.")}
    merges = [m for m in vocab["tokenizer.ggml.merges"] if m.replace(" ", "") != "ĠHello"]
    assert len(merges) == len(vocab["tokenizer.ggml.merges"]) - 1
    assert not set(new) & set(vocab["tokenizer.ggml.tokens"])
    vocab.update({"tokenizer.ggml.pre": pre, "tokenizer.ggml.add_bos_token": None,
                  "tokenizer.ggml.add_space_prefix": None, "tokenizer.ggml.scores": None,
                  "tokenizer.ggml.tokens": vocab["tokenizer.ggml.tokens"] + list(new),
                  "tokenizer.ggml.token_type": vocab["tokenizer.ggml.token_type"] + [1] * len(new),
                  "tokenizer.ggml.merges": list(new_merges) + merges})
    model = write_synthetic_model(path, "tiny", "q8_0", "llama", metadata=vocab,
                                  n_vocab=len(vocab["tokenizer.ggml.tokens"]))
    tok = Tokenizer.from_metadata({k: v for k, v in dict(smollm2_meta, **vocab).items() if v is not None})
    return model, vocab, tok


def test_tekken_ids_equal_llamacpp(smollm2_meta, tmp_path):
    from .llamacpp_ref import llamacpp_prompt_tokens

    model, vocab, tok = smollm2_vocab_model(smollm2_meta, tmp_path / "tekken.gguf", "tekken")
    assert tok.add_bos and tok.bos_id == 1
    rng = np.random.default_rng(7)     # and random text of cased and uncased scripts, digits, slashes
    pool = list("abcXYZéÉßΩωЖжἈ中אǅ0123456789 .,/;:!?'-()\n\t") + ["  ", "HelloWorld", "getHTTP", "x86_64", "İs"]
    text = " | ".join(TEKKEN_TEXTS + ["".join(rng.choice(pool, 120)) for _ in range(4)])
    ours = tok.encode(text, add_special=True, parse_special=True)
    assert vocab["tokenizer.ggml.tokens"].index("ĠHello") in ours
    assert llamacpp_prompt_tokens(model, "-no-cnv", "-c", "2048", "-p", text) == ours
    split = PreTokenizer("tekken").split
    assert split("getHTTPResponse ΩμέγαΑλφα") == ["get", "HTTPResponse", " ΩμέγαΑλφα"]
    assert split("a/b/\nc") == ["a", "/b", "/\n", "c"]


# ---------------------------------------------------------------------------------------------
# GPT-4o (OpenAI's o200k: gpt-oss, Llama 4) against llama.cpp itself, as Tekken above: the same
# case-split letter runs, with contractions kept on the word and digits in threes; no BOS by default.

GPT4O_TEXTS = TEKKEN_TEXTS + [
    "DON'T it's They'LL we'Ve I'm YOU'D she'll 'tis o'clock rock'n'roll ÉCOLE'S straße's",
    "7 42 123 1234 12345 123456 1234567 3.14159 1,000,000 v2 x86_64 ٣٤٥٦ 12½",
    "a/b/\nc https://example.com/a/b?q=1 //\n\n/* c */\r\n\\path\\",
    "cafe\u0301 nai\u0308ve \u0301lone NAI\u0308VE Cafe\u0301Bar नमस्ते ที่นี่",
    "中文Text 日本語のテキスト עברית Ж жЖ ǅungla ǈJ İstanbul ΣΊΣΥΦΟΣ",
]


def test_gpt4o_ids_equal_llamacpp(smollm2_meta, tmp_path):
    """llama.cpp's ids for pre "gpt-4o" (no BOS, merges not ignored); with Tekken's regex they differ."""
    from llamavk.tokenizer.pretokenizers import pre_flags

    from .llamacpp_ref import llamacpp_prompt_tokens

    # without ignore_merges nothing may reach " Hello". SmolLM2's vocabulary never joins digits, nor a
    # letter to an apostrophe: tokens (merged first) that do, so that ids tell GPT-4o's split from
    # Tekken's (digits in threes, contractions on the word)
    new = ["12", "123", "t'", "N'", "y'"]
    model, vocab, tok = smollm2_vocab_model(smollm2_meta, tmp_path / "gpt4o.gguf", "gpt-4o", new,
                                            ["1 2", "12 3", "t '", "N '", "y '"])
    assert not tok.add_bos
    rng = np.random.default_rng(11)    # and random text: cased and uncased scripts, marks, digits, apostrophes
    pool = list("abcXYZéÉßΩωЖжἈ中אǅ0123456789 .,/;:!?'-()\n\t\u0301\u0308") + [
        "  ", "HelloWorld", "getHTTP", "x86_64", "İs", "'s", "'LL", "'re", "n't", "1234567"]
    text = " | ".join(GPT4O_TEXTS + ["".join(rng.choice(pool, 120)) for _ in range(4)])
    ours = tok.encode(text, add_special=True, parse_special=True)
    ids = {t: vocab["tokenizer.ggml.tokens"].index(t) for t in new + ["ĠHello"]}
    assert ids["ĠHello"] not in ours and " Hello" in text
    assert all(ids[t] in ours for t in new), [t for t in new if ids[t] not in ours]
    assert llamacpp_prompt_tokens(model, "-no-cnv", "-c", "2048", "-p", text) == ours
    assert all(pre_flags(n) == ("gpt4o", False, False, False) for n in ("gpt-4o", "llama4", "kanana2", "talkie"))
    split, tekken = PreTokenizer("gpt4o").split, PreTokenizer("tekken").split
    assert split("getHTTPResponse ΩμέγαΑλφα") == ["get", "HTTPResponse", " ΩμέγαΑλφα"]
    assert split("a/b/\nc") == ["a", "/b", "/\n", "c"]
    assert split("DON'T it's They'LL") == ["DON'T", " it's", " They'LL"]
    assert tekken("DON'T it's They'LL") == ["DON", "'T", " it", "'s", " They", "'LL"]
    assert split("1234567 12") == ["123", "456", "7", " ", "12"]
    assert tekken("1234567") == list("1234567")
    assert split("cafe\u0301x") == ["cafe", "\u0301x"]
