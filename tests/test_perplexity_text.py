"""`llamavk perplexity --chunks N` tokenizes only the head of the text its chunks need during the
load, and counts the whole text on a thread while the device evaluates (perplexity_text.py): the
output must be that of a run that tokenized the whole text first (LLAMAVK_PPL_PREFIX=0)."""

from __future__ import annotations

import io
import os
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from llamavk.errors import LlamavkError
from llamavk.perplexity_text import ENV, EvaluationText
from llamavk.tokenizer import Tokenizer

from .conftest import missing
from .test_tokenizer import CHARS, spm_meta

TIMED = ("seconds per pass", " s in all")        # lines whose numbers are timings


def botchan_path() -> Path:
    path = Path(os.environ.get("LLAMAVK_BOTCHAN") or Path.home() / ".cache/llamavk/botchan.txt")
    if not path.is_file():
        missing(f"botchan.txt not found at {path} (set LLAMAVK_BOTCHAN or run scripts/fetch-test-data.sh)")
    return path


def run_cli(env_prefix: str, *args) -> list[str]:
    """The command's stdout and stderr in one stream, in the order written, timings dropped."""
    env = dict(os.environ, **{ENV: env_prefix})
    r = subprocess.run([sys.executable, "-m", "llamavk", "perplexity", *map(str, args)], env=env,
                       stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=300)
    assert r.returncode == 0, r.stdout
    return [line for line in r.stdout.splitlines() if not any(t in line for t in TIMED)]


def test_cli_output_and_base_file_equal_a_whole_text_run(synthetic_model, tmp_path, monkeypatch):
    """botchan with the tiny model's 500-piece vocabulary (218,698 ids: its count takes longer than
    the first chunks, whose lines then wait for it): the same lines in the same order, the same
    KL-divergence base file byte for byte, as when the whole text is tokenized during the load."""
    model, text = synthetic_model("llama", "q8_0"), botchan_path()
    monkeypatch.chdir(tmp_path)
    out = {}
    for prefix in ("1", "0"):
        (tmp_path / prefix).mkdir()
        os.chdir(tmp_path / prefix)               # the same base file name (it is printed) in both runs
        out[prefix] = run_cli(prefix, "-m", model, "-f", text, "-c", "32", "-b", "32", "--chunks", "3",
                              "--kl-divergence-base", "base.kld")
    assert out["1"] == out["0"]
    assert "perplexity: tokenized the input into 218698 tokens" in out["1"]
    assert any(line.startswith("[1]") and "[3]" in line for line in out["1"])
    assert (tmp_path / "1/base.kld").read_bytes() == (tmp_path / "0/base.kld").read_bytes()


def small_tokenizer():
    return Tokenizer.from_metadata(spm_meta(CHARS + [("▁h", -1.0), ("el", -2.0), ("lo", -3.0), ("▁w", -1.0)]))


class FakeModel:
    """Calls on_chunk as a model's perplexity_tokens does; the whole text's count is held until
    `release`, set after chunk `release_after` or the last one (the chunks before it are done while
    the thread still counts)."""

    def __init__(self, release_after: int, release: threading.Event):
        self.tokenizer = small_tokenizer()
        self.release_after, self.release = release_after, release

    def perplexity_tokens(self, tokens, n_ctx, n_chunks, bos, on_chunk, n_seq, kl_divergence_base):
        from llamavk.perplexity import PerplexityResult

        for i in range(n_chunks):
            on_chunk(i, 10.0 + i)
            if i == self.release_after:
                self.release.set()
        self.release.set()          # the count may finish after the last chunk
        return PerplexityResult(12.0, 0.5, n_ctx, n_chunks, 7, [])


class Recorder(io.StringIO):
    """stdout and stderr into one text, in the order written."""

    def __init__(self, shared):
        super().__init__()
        self.shared = shared

    def write(self, s):
        self.shared.append(s)
        return len(s)


@pytest.mark.parametrize("release_after", [0, 2, 9])
def test_chunk_lines_wait_for_the_count(monkeypatch, release_after):
    """Whenever the count arrives (before the first chunk, between chunks, after the last), the
    header lines come first, with the whole text's count, then every chunk's value in order."""
    from llamavk.cli.perplexity import run_perplexity

    release = threading.Event()
    m = FakeModel(release_after, release)
    tok = m.tokenizer
    text = EvaluationText("hello world " * 400, n_ctx=8, chunks=4)
    text.tokenize(m)
    assert not text.complete and len(text.ids) >= 32
    whole = tok.encode(text.text, parse_special=False)
    slow_encode = tok.encode

    def held(*args, **kwargs):
        release.wait(10)
        return slow_encode(*args, **kwargs)

    monkeypatch.setattr(tok, "encode", held)
    written: list[str] = []
    monkeypatch.setattr(sys, "stdout", Recorder(written))
    monkeypatch.setattr(sys, "stderr", Recorder(written))
    run_perplexity(m, text, 8, 4, 1, 8, None)
    lines = "".join(written).splitlines()
    assert lines[0] == f"perplexity: tokenized the input into {len(whole)} tokens"
    assert lines[1] == "perplexity: calculating perplexity over 4 chunks, n_ctx=8, batch_size=8, n_seq=1"
    assert "seconds per pass" in lines[2]
    assert lines[3] == "[1]10.0000,[2]11.0000,[3]12.0000,[4]13.0000,"
    assert lines[4:] == ["Final estimate: PPL = 12.0000 +/- 0.50000", "perplexity: 7 tokens scored"]


def test_head_that_differs_from_the_whole_text_is_an_error(monkeypatch):
    """A head whose ids are not the whole text's first ones (a tokenizer bug) stops the run with a
    one-line error before any value is shown."""
    m = FakeModel(0, threading.Event())
    text = EvaluationText("hello world " * 400, n_ctx=8, chunks=4)
    real = m.tokenizer.encode_prefix

    def wrong(*args, **kwargs):
        ids, complete = real(*args, **kwargs)
        return ids[:5] + [ids[5] + 1] + ids[6:], complete

    monkeypatch.setattr(m.tokenizer, "encode_prefix", wrong)
    text.tokenize(m)
    with pytest.raises(LlamavkError, match="tokenizer bug: .* at id 5 "):
        text.n_tokens()


def test_whole_text_where_every_chunk_is_wanted_or_prefix_off(monkeypatch):
    """--chunks -1 needs every id, LLAMAVK_PPL_PREFIX=0 asks for them: the load tokenizes the whole
    text and no thread runs."""
    m = FakeModel(0, threading.Event())
    words = "hello world " * 400
    whole = m.tokenizer.encode(words, parse_special=False)
    for chunks, env in ((-1, "1"), (4, "0")):
        monkeypatch.setenv(ENV, env)
        text = EvaluationText(words, n_ctx=8, chunks=chunks)
        assert text.tokenize(m) == whole and text.complete and text.counted() and text.n_tokens() == len(whole)
        text.count_in_background()
        assert text._thread is None


@pytest.mark.parametrize("uploading", [True, False])
def test_load_uses_the_wait_for_the_weights(synthetic_model, monkeypatch, uploading):
    """A perplexity load (prerecord="score") whose weights are still on their way after the first
    slot's recording records the second slot's too and calls while_uploading (the count starts
    there); once they are in, neither: the evaluation records the second slot when it needs it."""
    import llamavk
    from llamavk.runtime import DeviceRuntime

    monkeypatch.setattr(DeviceRuntime, "uploading", lambda self: uploading)
    calls = []
    with llamavk.load(synthetic_model("llama", "q8_0"), n_ctx=128, n_ubatch=64, warn=lambda m: None,
                      prerecord="score", while_uploading=calls.append) as m:
        assert calls == ([m] if uploading else [])
        assert {k[2] for k in m.runtime.recordings if k[0] == "all"} == ({0, 1} if uploading else {0})
