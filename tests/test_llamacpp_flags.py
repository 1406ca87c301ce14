"""llama.cpp's flags on run / perplexity / bench (SPEC §6 "What a llama.cpp user brings along").

Escapes are checked against llama-completion itself (the tokens of the prompt it evaluates), the rest
against what the spec and llama.cpp's --help say each flag means."""


import numpy as np
import pytest
from typer.testing import CliRunner

from llamavk.errors import UsageError
from llamavk.llamacpp_compat import (check_cache_type, check_flash_attn, check_gpu_layers, no_effect_notes,
                                     parse_gpu_layers, process_escapes)

from .llamacpp_ref import llamacpp_prompt_tokens


# -- -ngl ---------------------------------------------------------------------------------------
@pytest.mark.parametrize("text,n", [(None, None), ("99", 99), ("-1", -1), ("all", -1), ("AUTO", -1), ("0", 0)])
def test_gpu_layers_values(text, n):
    assert parse_gpu_layers(text) == n


@pytest.mark.parametrize("text", ["x", "1.5", "-2", ""])
def test_gpu_layers_bad_values(text):
    with pytest.raises(UsageError, match="-ngl"):
        parse_gpu_layers(text)


def test_gpu_layers_must_mean_every_layer():
    for n in (None, -1, 30, 31, 99):
        check_gpu_layers(n, 30)
    for n in (0, 5, 29):
        with pytest.raises(UsageError, match=r"every layer on the GPUs \(this model has 30\)"):
            check_gpu_layers(n, 30)


# -- -fa, -ctk/-ctv --------------------------------------------------------------------------------
def test_flash_attn():
    for v in (None, "on", "auto", "1", "enabled", "-1", "true"):
        check_flash_attn(v)
    for v in ("off", "0", "disabled"):
        with pytest.raises(UsageError, match="always a flash-attention kernel"):
            check_flash_attn(v)
    with pytest.raises(UsageError, match="expected on, off or auto"):
        check_flash_attn("maybe")


def test_cache_types():
    assert check_cache_type("-ctk", "f16") == "f16"
    assert check_cache_type("-ctv", "F16") == "f16"
    assert check_cache_type("-ctk", "q8_0") == "q8_0"
    assert check_cache_type("-ctv", " Q4_0") == "q4_0"
    with pytest.raises(UsageError, match="-ctv bf16: llamavk's KV cache types are f16, q8_0, q4_0"):
        check_cache_type("-ctv", "bf16")
    with pytest.raises(UsageError, match="f32, f16, bf16, q8_0, q4_0, q4_1, iq4_nl, q5_0, q5_1"):
        check_cache_type("-ctk", "q3_k")


def test_no_effect_notes():
    assert no_effect_notes() == []
    notes = no_effect_notes(threads=8, no_warmup=True, no_conversation=True, jinja=True, mlock=True, no_mmap=True)
    assert [n.split(":")[0] for n in notes] == ["-t 8", "--no-warmup", "-no-cnv", "--jinja", "--mlock", "--no-mmap"]


# -- -e: escapes ---------------------------------------------------------------------------------
@pytest.mark.parametrize("text,expected", [
    ("plain", "plain"),
    (r"a\nb\tc\rd", "a\nb\tc\rd"),
    (r"\'\"\\", "'\"\\"),
    (r"\x41\x62", "Ab"),
    (r"\xc3\xa9t\xc3\xa9", "été"),             # bytes, as llama.cpp: two escapes make one character
    (r"\q\x4g\x", r"\q\x4g\x"),                # unknown escapes, a short \x and a final \x stay
    ("ends with \\", "ends with \\"),
    (r"\\n", r"\n"),                           # an escaped backslash, then a plain n
])
def test_process_escapes(text, expected):
    assert process_escapes(text) == expected


def test_escape_to_bytes_that_are_not_text_keeps_the_bytes():
    """As llama.cpp: the byte goes to the tokenizer (test_stray_bytes.py), as a surrogate escape."""
    assert process_escapes(r"a\xff\xc3") == "a\udcff\udcc3"


def test_escapes_give_llama_completions_prompt_tokens(smollm2_path):
    from llamavk.models import load_model_file
    from llamavk.tokenizer import Tokenizer

    prompt = r"Line one\nLine\ttwo \x41\x42 \q end\\"
    expected = llamacpp_prompt_tokens(smollm2_path, "-no-cnv", "-p", prompt)
    tok = Tokenizer.from_metadata(load_model_file(smollm2_path).metadata)
    assert tok.encode(process_escapes(prompt)) == expected
    assert tok.encode(prompt) != expected          # the escapes did change the prompt


# -- the commands ----------------------------------------------------------------------------------
def cli(*args):
    from llamavk.cli import app
    return CliRunner().invoke(app, list(args))


def one_line_error(r, code):
    assert r.exit_code == code, (r.exit_code, r.output)
    assert "Traceback" not in r.output
    lines = [l for l in r.stderr.splitlines() if l.strip() and not l.startswith("warning:")]
    assert len(lines) == 1 and lines[0].startswith("error: "), r.stderr
    return lines[0]


@pytest.mark.parametrize("command", ["run", "perplexity"])
@pytest.mark.parametrize("flags,code,words", [
    (("-ngl", "1"), 2, "keeps every layer on the GPUs (this model has 2)"),
    (("-ngl", "many"), 2, "-ngl"),
    (("-fa", "off"), 2, "flash-attention"),
    (("-ctk", "q8_0"), 1, "head_dim 16 is not a multiple of 32"),   # the tiny llama's heads
    (("-ctv", "iq4_nl"), 2, "KV cache types are f16, q8_0, q4_0, q4_1, q5_0, q5_1"),
    (("-ctk", "fp8"), 2, "llama.cpp's types"),
])
def test_refused_flags_are_one_line_errors(command, flags, code, words, synthetic_model, tmp_path):
    text = tmp_path / "t.txt"
    text.write_text("hello world " * 20)
    args = ["-p", "hi"] if command == "run" else ["-f", str(text)]
    line = one_line_error(cli(command, "-m", str(synthetic_model("llama", "q4_0")), *args, *flags), code)
    assert words in line


def test_run_accepts_a_llama_completion_command_line(synthetic_model):
    """A llama-completion command line runs unchanged and gives the same text as llamavk's own flags."""
    path = str(synthetic_model("llama", "q4_0"))
    plain = cli("run", "-m", path, "-p", "hello", "-n", "4", "--temp", "0", "-c", "64")
    assert plain.exit_code == 0, plain.output
    r = cli("run", "-m", path, "-p", "hello", "-n", "4", "--temp", "0", "-c", "64", "-ngl", "99", "-fa", "on",
            "-ctk", "f16", "-ctv", "f16", "-t", "8", "--no-warmup", "-no-cnv", "-e", "--mlock", "--no-mmap", "-v")
    assert r.exit_code == 0, r.output
    assert r.stdout == plain.stdout
    for note in no_effect_notes(threads=8, no_warmup=True, no_conversation=True, mlock=True, no_mmap=True):
        assert note in r.stderr


def test_no_display_prompt(synthetic_model):
    path = str(synthetic_model("llama", "q4_0"))
    shown = cli("run", "-m", path, "-p", "hello", "-n", "3", "--temp", "0", "-c", "64")
    hidden = cli("run", "-m", path, "-p", "hello", "-n", "3", "--temp", "0", "-c", "64", "--no-display-prompt")
    assert shown.exit_code == 0 and hidden.exit_code == 0, hidden.output
    assert shown.stdout == "hello" + hidden.stdout and len(hidden.stdout.strip()) > 0


def test_ignore_eos_never_samples_end_of_generation(smollm2_path):
    """SmolLM2 answers this with one word, then <|im_end|>: --ignore-eos goes on, each step taking the
    best token that is not an end-of-generation one (checked against the logits of that context)."""
    import llamavk
    from llamavk.chat_template import chat_messages

    with llamavk.load(smollm2_path, n_ctx=128, warn=lambda msg: None) as m:
        prompt = m.tokenize(m.apply_chat_template(chat_messages("Reply with one word: yes or no. Is the sky blue?")))
        stopped = list(m.generate(prompt, n=3, temp=0))
        assert len(stopped) == 1
        going = list(m.generate(prompt, n=3, temp=0, ignore_eos=True))
        assert len(going) == 3 and going[0] == stopped[0]
        eog = sorted(m.tokenizer.vocab.eog_ids)
        logits = m.logits(prompt + going[:1])
        assert int(np.argmax(logits)) in eog          # without the flag, generation ends here
        logits[eog] = -np.inf
        assert going[1] == int(np.argmax(logits))


def test_bench_accepts_llama_bench_flags_and_checks_ngl(synthetic_model):
    path = str(synthetic_model("llama", "q4_0"))
    line = one_line_error(cli("bench", "-m", path, "-p", "4", "-n", "0", "-r", "1", "-ngl", "99,1"), 2)
    assert "-ngl 1" in line and "(this model has 2)" in line
    one_line_error(cli("bench", "-m", path, "-p", "4", "-n", "0", "-r", "1", "-ctk", "q4_0"), 1)   # head_dim 16
    one_line_error(cli("bench", "-m", path, "-p", "4", "-n", "0", "-r", "1", "-ctv", "f16,iq4_nl"), 2)
    r = cli("bench", "-m", path, "-p", "4", "-n", "0", "-r", "1", "-ngl", "99", "-fa", "on", "-ctk", "f16",
            "-ctv", "f16", "-t", "4", "-o", "csv")
    assert r.exit_code == 0, r.output
    assert len(r.stdout.strip().splitlines()) == 2      # header + one pp4 row
