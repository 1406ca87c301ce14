"""Text that is not UTF-8 (a Latin-1 file, a truncated character, `\\xff` in a prompt) is tokenized as
llama.cpp tokenizes it (llamavk/tokenizer/stray_bytes.py): the rules by hand, SentencePiece's segment
cuts against one merge pass over the whole text, then every id of a file against llama-perplexity's
(the synthetic SPM vocabulary and SmolLM2's byte-level BPE), and `llamavk run` given such bytes."""

import subprocess
import sys

import numpy as np
import pytest

from llamavk.errors import LlamavkError
from llamavk.gguf_file import GGUFFile
from llamavk.kld import KLDBase
from llamavk.llamacpp_compat import process_escapes
from llamavk.perplexity import read_text
from llamavk.tokenizer import Tokenizer
from llamavk.tokenizer.stray_bytes import from_bytes, has_stray_bytes, llamacpp_text, spm_symbols, to_bytes

from .test_raw_text import llamacpp_all_tokens, llamacpp_base_tokens
from .test_tokenizer import CHARS, ids_of, spm_meta
from .test_tokenizer_prefix import check_heads


def stray_text(bpe: bool) -> bytes:
    """~0.7 kB of lines with every kind of stray byte, several right before a space (where an SPM lead
    byte swallows part of the escaped space) and one at the very end; valid multi-byte characters
    between them. A code point past U+10FFFF only for SPM (llama.cpp's BPE aborts on it)."""
    words = ("the master said that he would come back when the school was over and all of us "
             "waited in the hall for him until the night").split()
    strays = [b"caf\xe9", b"na\xefve", b"r\xe9sum\xe9", b"\xff", b"x\xc0\xafy", b"\xed\xa0\x80", b"\xe2\x82",
              b"\x80\x80z", b"\xf8", b"\xc3", "日本é".encode(), b"\xe9\xe9\xe9", b"\xf0\x9f\x98"]
    if not bpe:
        strays.append(b"\xf4\x90\x80\x80")
    lines = []
    for i in range(12):
        line = [w.encode() for w in words[(i * 5) % len(words):][:8]]
        for k, s in enumerate(strays[i % len(strays):][:3]):
            line.insert(2 * k + 1, s)
        lines.append(b" ".join(line))
    return b"\n".join(lines) + b"  \xe9 \xe2\x82\n"


# -- the rules ------------------------------------------------------------------------------------------

def test_bytes_round_trip():
    rng = np.random.default_rng(3)
    for _ in range(200):
        data = rng.integers(0, 256, int(rng.integers(0, 40)), dtype=np.uint8).tobytes()
        assert to_bytes(from_bytes(data)) == data
    assert from_bytes("né".encode()) == "né" and not has_stray_bytes("né")
    assert has_stray_bytes(from_bytes(b"n\xe9"))


@pytest.mark.parametrize("data, text", [
    (b"a\xc0\xafb", "a/b"),                 # overlong: decoded, as llama.cpp does
    (b"a\xed\xa0\x80b", "a\ud800b"),        # an encoded surrogate: its code point
    (b"\xe2\x82 x", "\ufffd\ufffd x"),       # a truncated character: one U+FFFD per byte (Python: one)
    (b"\x80\x80z", "\ufffd\ufffdz"),
    (b"a\xf8 y", "a\ufffd y"),
    (b"x\xc3", "x\ufffd"),
    ("日本é".encode(), "日本é"),
])
def test_bpe_reads_stray_bytes_as_llamacpp(data, text):
    assert llamacpp_text(from_bytes(data)) == text


def test_bpe_refuses_code_points_past_unicode():
    with pytest.raises(LlamavkError, match="f4 90 80 80 encode U[+]110000"):
        llamacpp_text(from_bytes(b"a\xf4\x90\x80\x80b"))


def test_spm_symbols_by_lead_byte():
    """A lead byte's nibble sets its symbol's length whatever follows: 0xF8 takes the 3 bytes of U+2581."""
    assert spm_symbols(from_bytes(b"a\xf8" + "▁y".encode())) == [b"a", b"\xf8\xe2\x96\x81", b"y"]
    assert spm_symbols(from_bytes(b"x\xe2\x82")) == [b"x", b"\xe2\x82"]        # cut at the end
    assert spm_symbols(from_bytes(b"\x80\xc0\xaf")) == [b"\x80", b"\xc0\xaf"]
    assert spm_symbols("é▁") == [b"\xc3\xa9", b"\xe2\x96\x81"]


def test_escapes_make_stray_bytes():
    """llama-completion's `\\xHH` escapes make bytes; those that are not UTF-8 are tokenized."""
    assert process_escapes("a\\xffb\\xc3\\xa9") == "a\udcffbé"


def test_spm_segments_and_heads_equal_one_pass(monkeypatch):
    """Long SPM texts merge word by word and heads are cut before U+2581s: with stray lead bytes
    before the spaces (their symbols run into the escaped space) the ids stay one merge pass's."""
    from llamavk.tokenizer import prefix, spm

    monkeypatch.setattr(spm, "LONG_TEXT", 0)            # every fragment word by word
    for name, value in (("PROBE_TOKENS", 4), ("MIN_STEP", 3), ("OVERSHOOT", 0.3)):
        monkeypatch.setattr(prefix, name, value)        # heads in many short steps: cut everywhere
    tok = Tokenizer.from_metadata(spm_meta(CHARS + [("a▁", -0.5), ("▁b", -1.0), ("▁▁", -0.7), ("he", -2.0),
                                                    ("▁he", -1.2), ("ll", -3.0), ("é", -1.0)]))
    stray = "\udce9", "\udcff", "\udc80", "\udcc3", "\udcf0"
    rng = np.random.default_rng(9)
    alphabet = list("abhelé  ") + list(stray)
    for _ in range(300):
        text = "".join(rng.choice(alphabet, int(rng.integers(1, 60))))
        escaped = ("\u2581" + text).replace(" ", "\u2581")
        whole = tok._spm.one_pass(escaped)
        assert tok._spm.encode(escaped) == whole, repr(text)
        check_heads(tok, text, [1, 3, 8, 20], [tok.bos_id] + whole)
    swallowed = [3 + 0xFF, 3 + 0xE2, 3 + 0x96, 3 + 0x81]     # 0xFF's symbol takes the escaped space's bytes
    assert tok.encode("a\udcff b", add_special=False) == ids_of(tok, "▁", "a") + swallowed + ids_of(tok, "b")


# -- against llama.cpp ---------------------------------------------------------------------------------

def test_spm_ids_equal_llamacpp(synthetic_model, tmp_path):
    """Every id of the file, then `llamavk perplexity`'s two chunks (their heads cut from the text)."""
    model = synthetic_model("llama", "q8_0", n_vocab=32000)
    text = tmp_path / "stray.txt"
    text.write_bytes(stray_text(bpe=False))
    ours = Tokenizer.from_metadata(GGUFFile(model).metadata).encode(read_text(text), parse_special=False)
    assert llamacpp_all_tokens(model, text, tmp_path) == ours
    n_ctx = len(ours) // 3
    r = subprocess.run([sys.executable, "-m", "llamavk", "perplexity", "-m", str(model), "-f", str(text),
                        "-c", str(n_ctx), "--chunks", "2", "--kl-divergence-base", str(tmp_path / "llamavk.kld")],
                       capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr
    with KLDBase(tmp_path / "llamavk.kld") as b:
        assert b.tokens == llamacpp_base_tokens(model, text, n_ctx, tmp_path / "llamacpp.kld") == ours[:2 * n_ctx]


def test_bpe_ids_equal_llamacpp(smollm2_path, tmp_path):
    text = tmp_path / "stray.txt"
    text.write_bytes(stray_text(bpe=True))
    ours = Tokenizer.from_metadata(GGUFFile(smollm2_path).metadata).encode(read_text(text), parse_special=False)
    assert llamacpp_all_tokens(smollm2_path, text, tmp_path) == ours


# -- the command line ----------------------------------------------------------------------------------

def test_run_with_a_prompt_that_is_not_utf8(synthetic_model, smollm2_path):
    """The prompt's bytes as the command line gives them: tokenized, echoed as they were; a code point
    past Unicode in a BPE prompt is a one-line error."""
    model = synthetic_model("llama", "q4_0")
    prompt = b"caf\xe9 \xff ok"
    r = subprocess.run([sys.executable, "-m", "llamavk", "run", "-m", str(model), "-n", "2", "--temp", "0",
                        "-p", prompt], capture_output=True, timeout=600)
    assert r.returncode == 0, r.stderr.decode(errors="replace")
    assert r.stdout.startswith(prompt)
    r = subprocess.run([sys.executable, "-m", "llamavk", "run", "-m", str(smollm2_path), "-n", "1",
                        "-p", b"a\xf4\x90\x80\x80"], capture_output=True, timeout=600)
    err = r.stderr.decode()
    assert r.returncode == 1 and "Traceback" not in err
    assert err.strip().splitlines()[-1].startswith("error: the text's bytes f4 90 80 80")


def test_api_takes_bytes(synthetic_model):
    """Model.tokenize / generate take bytes as llama_tokenize does: the same ids as their text."""
    import llamavk

    with llamavk.load(str(synthetic_model("llama", "q4_0")), n_ctx=64) as m:
        data = b"caf\xe9 \xff ok"
        assert m.tokenize(data) == m.tokenize(from_bytes(data))
        assert list(m.generate(data, n=2, temp=0.0)) == list(m.generate(from_bytes(data), n=2, temp=0.0))
