"""Evaluation text read as llama-perplexity reads it: a UTF-8 byte-order mark and CR LF line ends stay in
the text and are tokenized like any other character, one final LF is dropped. The rule by hand, then
the ids against llama.cpp's CPU build (SPM: the synthetic 32k vocabulary through `llamavk perplexity`;
BPE: SmolLM2's vocabulary) on a small text with a BOM, CR LF, a lone CR and a final CR LF."""

import subprocess
import sys

import numpy as np
import pytest

from llamavk.gguf_file import GGUFFile
from llamavk.kld import HEADER, MAGIC, KLDBase
from llamavk.perplexity import read_text
from llamavk.synthetic import synthetic_vocab
from llamavk.tokenizer import Tokenizer
from llamavk.tokenizer.vocab import load_vocab

from .llamacpp_ref import run_tool

BOM = "\ufeff"


def raw_text() -> bytes:
    """~0.5 kB as a Windows editor saves it: BOM, CR LF line ends (a blank line, spaces before a line
    end, one "\\r\\r\\n"), a lone CR, a BOM inside a line, a final CR LF."""
    words = ("the master said that he would come back when the school was over and all of us "
             "waited in the hall for him until the night").split()
    lines = [" ".join(words[(i * 7) % len(words):][:9]) for i in range(14)]
    lines[3] += "  "                      # spaces right before a CR LF
    lines[5] = ""                         # a blank line
    lines[8] += "\r"                      # "\r\r\n"
    lines[10] = lines[10].replace(" ", "\r", 1)      # a lone CR inside a line
    lines[12] = BOM + lines[12]           # a BOM that is not at the start
    return (BOM + "\r\n".join(lines) + "\r\n").encode("utf-8")


# -- the rule ------------------------------------------------------------------------------------------

@pytest.mark.parametrize("data, text", [
    (b"\xef\xbb\xbfab\r\ncd\r\n", "\ufeffab\r\ncd\r"),   # BOM kept, CR kept, only the final LF dropped
    (b"a\n\n", "a\n"),                                   # one final LF only
    (b"a\r", "a\r"),
    (b"a", "a"),
    (b"", ""),
])
def test_read_text_keeps_bom_and_cr(tmp_path, data, text):
    f = tmp_path / "t.txt"
    f.write_bytes(data)
    assert read_text(f) == text


def test_read_text_keeps_stray_bytes(tmp_path):
    """Bytes that are not UTF-8 stay, as surrogate escapes (tokenized as llama.cpp: test_stray_bytes.py)."""
    f = tmp_path / "t.txt"
    f.write_bytes(b"ab\xff\r\n")
    assert read_text(f) == "ab\udcff\r"


def test_spm_tokenizes_bom_and_cr_as_bytes():
    """Hand-computed with the synthetic vocabulary (ids: <s> 1, <0xXX> 3 + XX, "▁" 259, printable
    ASCII c at 260 + c - 33): the space prefix goes before the BOM, the BOM and CR have no pieces
    and fall back to their UTF-8 bytes; nothing is stripped."""
    tokens, scores, types = synthetic_vocab(500)
    meta = {"tokenizer.ggml.model": "llama", "tokenizer.ggml.tokens": tokens,
            "tokenizer.ggml.scores": scores, "tokenizer.ggml.token_type": types}
    tok = Tokenizer(load_vocab(meta))
    byte = lambda b: 3 + b
    char = lambda c: 260 + ord(c) - 33
    assert tok.encode(BOM + "P\r\nQ", parse_special=False) == [
        1, 259, byte(0xEF), byte(0xBB), byte(0xBF), char("P"), byte(0x0D), byte(0x0A), char("Q")]


# -- against llama.cpp ---------------------------------------------------------------------------------

def llamacpp_all_tokens(model, text_file, tmp_path) -> list[int]:
    """Every id llama-perplexity makes of a file, read from a KL-divergence base file written with a
    one-token context: one chunk per token, so the header's chunk count is the token count. (Its
    log's "tokenizes to only N tokens" line is not used: the log is written by a thread and has come
    out empty, exit status 0, on loaded machines.)"""
    base = tmp_path / "llamacpp-all.kld"
    run_tool("llama-perplexity", "-m", model, "-f", text_file, "-c", 1, "-b", 1, "--chunks", 1 << 24, "-ngl", 0,
             "-t", 2, "--kl-divergence-base", base, timeout=300)
    data = base.read_bytes()
    magic, n_ctx, _, n_chunks = HEADER.unpack_from(data)
    assert magic == MAGIC and n_ctx == 1 and len(data) >= HEADER.size + 4 * n_chunks
    return np.frombuffer(data, "<i4", n_chunks, HEADER.size).tolist()


def llamacpp_base_tokens(model, text_file, n_ctx, base) -> list[int]:
    """The ids of the first 2 * n_ctx tokens, from llama-perplexity's KL-divergence base file."""
    run_tool("llama-perplexity", "-m", model, "-f", text_file, "-c", n_ctx, "--chunks", 2, "-ngl", 0, "-t", 2,
             "--kl-divergence-base", base, timeout=300)
    with KLDBase(base) as b:
        return b.tokens


def test_spm_ids_equal_llamacpp_on_raw_text(synthetic_model, tmp_path):
    """`llamavk perplexity` and llama-perplexity on the same raw file, the synthetic 32,000-token SPM
    vocabulary: the same ids, all of them, and the same ids in the base files both write (two chunks
    that cover the text up to its last token, or all but it)."""
    model = synthetic_model("llama", "q8_0", n_vocab=32000)
    text = tmp_path / "raw.txt"
    text.write_bytes(raw_text())
    ours = Tokenizer.from_metadata(GGUFFile(model).metadata).encode(read_text(text), parse_special=False)
    assert llamacpp_all_tokens(model, text, tmp_path) == ours
    n = len(ours)
    assert ours.count(3 + 0x0D) == raw_text().count(b"\r")       # every CR is a token of its own
    n_ctx = n // 2
    theirs = llamacpp_base_tokens(model, text, n_ctx, tmp_path / "llamacpp.kld")
    r = subprocess.run([sys.executable, "-m", "llamavk", "perplexity", "-m", str(model), "-f", str(text),
                        "-c", str(n_ctx), "--chunks", "2", "--kl-divergence-base", str(tmp_path / "llamavk.kld")],
                       capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr
    with KLDBase(tmp_path / "llamavk.kld") as b:
        assert b.tokens == theirs == ours[:len(theirs)]


def test_bpe_ids_equal_llamacpp_on_raw_text(smollm2_path, tmp_path):
    """SmolLM2's byte-level BPE vocabulary on the same raw file: count and ids equal llama.cpp's."""
    text = tmp_path / "raw.txt"
    text.write_bytes(raw_text())
    ours = Tokenizer.from_metadata(GGUFFile(smollm2_path).metadata).encode(read_text(text), parse_special=False)
    assert llamacpp_all_tokens(smollm2_path, text, tmp_path) == ours
    theirs = llamacpp_base_tokens(smollm2_path, text, len(ours) // 2, tmp_path / "llamacpp.kld")
    assert theirs == ours[:len(theirs)]
