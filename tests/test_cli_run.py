"""`llamavk run`: output, timings, errors, exit codes."""

import subprocess
import sys

import pytest

from llamavk.errors import UsageError


def run(*args, **kw):
    return subprocess.run([sys.executable, "-m", "llamavk", "run", *args], capture_output=True, text=True,
                          errors="replace", timeout=600, **kw)     # a random model's bytes need not be UTF-8


def test_greedy_completion_on_smollm2(smollm2_path):
    r = run("-m", str(smollm2_path), "-p", "The capital of France is", "-n", "5", "--temp", "0", "-c", "128")
    assert r.returncode == 0, r.stderr
    assert r.stdout == "The capital of France is Paris.\n\nThe\n"
    for label in ("load time", "prompt eval time", "eval time", "total time"):
        assert label in r.stderr
    assert "/     5 tokens" in r.stderr and "/     4 runs" in r.stderr


def test_sampling_flags_and_seed_reach_the_sampler(synthetic_model):
    """-s and the sampling flags give exactly the API's tokens for the same values (so none is
    dropped or mixed up on the way), written as their bytes; another seed, other text."""
    import llamavk

    path = str(synthetic_model("llama", "q4_0"))
    flags = dict(temp=1.5, top_k=7, top_p=0.9, min_p=0.02, typical_p=0.95, top_n_sigma=2.0, repeat_penalty=1.1,
                 presence_penalty=0.4, frequency_penalty=0.1, repeat_last_n=16, xtc_probability=0.5, xtc_threshold=0.2)
    cli = [f"--{k.replace('_', '-')}={v}" for k, v in flags.items()]
    args = [sys.executable, "-m", "llamavk", "run", "-m", path, "-p", "hello", "-n", "12", "-c", "64", *cli]
    a = subprocess.run(args + ["-s", "7"], capture_output=True, timeout=600)
    b = subprocess.run(args + ["-s", "8"], capture_output=True, timeout=600)
    assert a.returncode == 0 and b.returncode == 0, a.stderr + b.stderr
    with llamavk.load(path, n_ctx=64, warn=lambda m: None) as m:
        ids = m.generate("hello", n=12, seed=7, **flags)
        want = b"".join(m.tokenizer.token_to_piece(t, special=False) for t in ids)
    assert a.stdout == b"hello" + want + b"\n" and len(want) > 12
    assert b.stdout != a.stdout
    mirostat = subprocess.run(args[:args.index("-c") + 2] + ["-s", "7", "--mirostat", "2", "--mirostat-lr", "0.2",
                                                              "--mirostat-ent", "6"], capture_output=True, timeout=600)
    with llamavk.load(path, n_ctx=64, warn=lambda m: None) as m:
        ids = m.generate("hello", n=12, seed=7, mirostat=2, mirostat_eta=0.2, mirostat_tau=6.0)
        want = b"".join(m.tokenizer.token_to_piece(t, special=False) for t in ids)
    assert mirostat.returncode == 0 and mirostat.stdout == b"hello" + want + b"\n", mirostat.stderr
    base = args[:args.index("-c") + 2] + ["-s", "7", "--temp", "1.5", "--min-p", "0.3"]
    named = subprocess.run(base + ["--samplers", "temp;top_k;min-p"], capture_output=True, timeout=600)
    letters = subprocess.run(base + ["--sampling-seq", "tkm"], capture_output=True, timeout=600)
    with llamavk.load(path, n_ctx=64, warn=lambda m: None) as m:
        ids = m.generate("hello", n=12, seed=7, temp=1.5, min_p=0.3, samplers=("temperature", "top_k", "min_p"))
        want = b"".join(m.tokenizer.token_to_piece(t, special=False) for t in ids)
    assert named.stdout == letters.stdout == b"hello" + want + b"\n", named.stderr + letters.stderr
    both = subprocess.run(base + ["--samplers", "top_k", "--sampling-seq", "k"], capture_output=True, text=True)
    assert both.returncode == 2 and "not both" in both.stderr


def test_dry_flags_reach_the_sampler(synthetic_model):
    """run's DRY flags give the API's tokens for the same values, and each set below gives other tokens
    than the one before it (so a flag dropped or mixed up would show): the base (--dry-base below 1 is
    ignored, as llama.cpp does), the allowed length, a breaker given with an escape (a byte that is not
    UTF-8, then "ar": two tokens), the window. The prompt's greedy completion on this model loops
    (tests/test_sampling_llamacpp.py)."""
    import llamavk
    from llamavk.tokenizer.stray_bytes import from_bytes

    path = str(synthetic_model("llama", "f32"))
    prompt = "to be: or not to be: that is: to be"
    cases = [(["--temp", "0", "--dry-multiplier", "0.1", "--dry-base", "0.5"], dict(temp=0, dry_multiplier=0.1)),
             (["--temp", "0", "--dry-multiplier", "0.1", "--dry-base", "2"],
              dict(temp=0, dry_multiplier=0.1, dry_base=2.0)),
             (["--temp", "0", "--dry-multiplier", "0.1", "--dry-base", "2", "--dry-allowed-length", "3"],
              dict(temp=0, dry_multiplier=0.1, dry_base=2.0, dry_allowed_length=3)),
             (["--temp", "0", "--dry-multiplier", "1", "--dry-sequence-breaker", "\\xb1ar"],
              dict(temp=0, dry_multiplier=1.0, dry_sequence_breakers=(from_bytes(b"\xb1ar"),))),
             (["--temp", "0", "--dry-multiplier", "1"], dict(temp=0, dry_multiplier=1.0)),
             (["-s", "2", "--temp", "0.5", "--dry-multiplier", "1", "--dry-penalty-last-n", "8"],
              dict(seed=2, temp=0.5, dry_multiplier=1.0, dry_penalty_last_n=8)),
             (["-s", "2", "--temp", "0.5", "--dry-multiplier", "1"], dict(seed=2, temp=0.5, dry_multiplier=1.0))]
    with llamavk.load(path, n_ctx=64, warn=lambda m: None) as m:
        want = [b"".join(m.tokenizer.token_to_piece(t, special=False) for t in m.generate(prompt, n=24, **kw))
                for _, kw in cases]
    assert all(a != b for a, b in zip(want, want[1:]))
    for (flags, _), w in zip(cases, want):
        r = subprocess.run([sys.executable, "-m", "llamavk", "run", "-m", path, "-p", prompt, "-n", "24", "-c", "64",
                            "--no-display-prompt", *flags], capture_output=True, timeout=600)
        assert r.returncode == 0 and r.stdout == w + b"\n", (flags, r.stderr)
        assert (b"--dry-base 0.5 is below 1" in r.stderr) == (flags[-2:] == ["--dry-base", "0.5"])


def test_logit_bias_reverse_prompt_and_special_flags(synthetic_model):
    """-l, -r and -sp reach the sampler and the output as the API's values do. The first case's greedy
    completion draws <unk> (an unknown-type token): printed as nothing, as llama-completion prints it,
    or as its text with -sp."""
    import llamavk
    from llamavk.cli.run import parse_logit_bias

    path = str(synthetic_model("llama", "f32"))
    prompt = "to be: or not to be: that is: to be"
    base = [sys.executable, "-m", "llamavk", "run", "-m", path, "-p", prompt, "-n", "24", "-c", "64",
            "--no-display-prompt", "--temp", "0"]
    biased = subprocess.run(base + ["-l", "371-inf"], capture_output=True, timeout=600)
    special = subprocess.run(base + ["--logit-bias", "371 - inf", "-sp"], capture_output=True, timeout=600)
    stopped = subprocess.run(base + ["-r", "cfk"], capture_output=True, timeout=600)
    with llamavk.load(path, n_ctx=64, warn=lambda m: None) as m:
        ids = list(m.generate(prompt, n=24, temp=0, logit_bias=[(371, float("-inf"))]))
        plain = b"".join(m.tokenizer.token_to_piece(t, special=False) for t in ids)
        texts = b"".join(m.tokenizer.token_to_piece(t) for t in ids)
        cut = list(m.generate(prompt, n=24, temp=0, reverse_prompts=["cfk"]))
        assert len(cut) < 24
        cut_bytes = b"".join(m.tokenizer.token_to_piece(t, special=False) for t in cut)
    assert 0 in ids and b"<unk>" in texts and b"<unk>" not in plain
    assert biased.returncode == 0 and biased.stdout == plain + b"\n", biased.stderr
    assert special.returncode == 0 and special.stdout == texts + b"\n", special.stderr
    assert stopped.returncode == 0 and stopped.stdout == cut_bytes + b"\n" and cut_bytes.endswith(b"cfk")
    assert parse_logit_bias("15043+1") == (15043, 1.0) and parse_logit_bias(" 7 - 2.5") == (7, -2.5)
    for bad in ("15043", "15043*1", "a+1", "1+x"):
        with pytest.raises(UsageError):
            parse_logit_bias(bad)
    one_line_error(run("-m", path, "-p", "hi", "-n", "2", "-c", "16", "-l", "99999+1"), 2)
    one_line_error(run("-m", path, "-p", "hi", "-n", "2", "-c", "16", "-l", "5+"), 2)


def test_grammar_flags(synthetic_model, tmp_path):
    """--grammar-file gives --grammar's tokens; a malformed grammar, both flags, or an unreadable file
    are one-line usage errors before the load."""
    path = str(synthetic_model("llama", "f32"))
    gbnf = 'root ::= "ca" ("f" "é"? | "t") " " [a-c]+ "."'
    (tmp_path / "g.gbnf").write_text(gbnf + "\n", encoding="utf-8")
    base = [sys.executable, "-m", "llamavk", "run", "-m", path, "-p", "hi", "-n", "16", "-c", "64",
            "--no-display-prompt", "-s", "3", "--temp", "1"]
    inline = subprocess.run(base + ["--grammar", gbnf], capture_output=True, timeout=600)
    from_file = subprocess.run(base + ["--grammar-file", str(tmp_path / "g.gbnf")], capture_output=True, timeout=600)
    assert inline.returncode == 0 and inline.stdout == from_file.stdout, inline.stderr + from_file.stderr
    assert inline.stdout.startswith(b"ca") and inline.stdout.rstrip(b"\n").endswith(b".")
    for extra in (["--grammar", 'root ::= "a" | nothing'], ["--grammar", "x", "--grammar-file", "y"],
                  ["--grammar-file", str(tmp_path / "missing.gbnf")]):
        one_line_error(run("-m", path, "-p", "hi", "-n", "2", "-c", "16", *extra), 2)


def test_prompt_from_file(tmp_path, synthetic_model):
    f = tmp_path / "prompt.txt"
    f.write_text("hello world")
    r = run("-m", str(synthetic_model("llama", "q4_0")), "-f", str(f), "-n", "2", "--temp", "0", "-c", "64")
    assert r.returncode == 0 and r.stdout.startswith("hello world")


def test_prompt_file_read_as_llama_completion_reads_it(tmp_path, synthetic_model):
    """-f keeps a BOM and CR LF line ends and drops one final LF (llama.cpp's -f): with -n 0 stdout is
    the prompt and the closing line break."""
    f = tmp_path / "prompt.txt"
    f.write_bytes(b"\xef\xbb\xbfhello\r\nworld\r\n\n")
    r = subprocess.run([sys.executable, "-m", "llamavk", "run", "-m", str(synthetic_model("llama", "q4_0")),
                        "-f", str(f), "-n", "0", "-c", "64"], capture_output=True, timeout=600)
    assert r.returncode == 0, r.stderr
    assert r.stdout == b"\xef\xbb\xbfhello\r\nworld\r\n" + b"\n"


def one_line_error(r, code):
    assert r.returncode == code, (r.returncode, r.stderr)
    assert "Traceback" not in r.stderr
    lines = [l for l in r.stderr.splitlines() if l.strip() and not l.startswith("warning:")]
    assert len(lines) == 1 and lines[0].startswith("error: "), r.stderr


def test_missing_model_file(tmp_path):
    one_line_error(run("-m", str(tmp_path / "nope.gguf"), "-p", "x"), 1)


def test_model_path_that_is_a_directory(tmp_path):
    r = run("-m", str(tmp_path), "-p", "x")
    one_line_error(r, 1)
    assert "is a directory" in r.stderr


def test_not_a_gguf(tmp_path):
    bad = tmp_path / "bad.gguf"
    bad.write_bytes(b"this is not a gguf file at all" * 10)
    one_line_error(run("-m", str(bad), "-p", "x"), 1)


def test_prompt_and_file_together_is_usage_error(tmp_path, synthetic_model):
    one_line_error(run("-m", str(synthetic_model("llama", "q4_0")), "-p", "x", "-f", str(tmp_path / "p")), 2)


def test_unknown_device_is_usage_error(synthetic_model):
    one_line_error(run("-m", str(synthetic_model("llama", "q4_0")), "-p", "x", "-dev", "Vulkan9"), 2)


def test_negative_context_is_usage_error(synthetic_model):
    one_line_error(run("-m", str(synthetic_model("llama", "q4_0")), "-p", "x", "-c", "-5"), 2)


def test_sampling_values_that_would_give_nan_are_usage_errors(synthetic_model):
    path = str(synthetic_model("llama", "q4_0"))
    for flag, value in (("--repeat-penalty", "0"), ("--repeat-penalty", "-1"), ("--temp", "nan"), ("--top-p", "inf"),
                        ("--dry-multiplier", "nan"), ("--dry-penalty-last-n", "-1")):
        r = run("-m", path, "-p", "hi", "-n", "4", "-c", "16", flag, value)
        one_line_error(r, 2)
        assert flag in r.stderr and r.stdout == ""


def test_prompt_longer_than_the_context_fails_before_it_is_printed(synthetic_model):
    """The error stands alone: nothing of the prompt on stdout before it (llama-completion checks the
    prompt's length before it prints anything)."""
    r = run("-m", str(synthetic_model("llama", "q4_0")), "-p", "hello world again and again", "-c", "4")
    one_line_error(r, 2)
    assert "do not fit the context of 4" in r.stderr and r.stdout == ""


def test_bad_visible_devices_is_one_usage_error(synthetic_model):
    """The early thread's attempt at the default device fails the same way; the load reports it once."""
    import os

    one_line_error(run("-m", str(synthetic_model("llama", "q4_0")), "-p", "x",
                       env={**os.environ, "LLAMAVK_VISIBLE_DEVICES": "7"}), 2)


def test_ctrl_c_stops_cleanly_and_prints_timings(synthetic_model, monkeypatch):
    """Ctrl-C during generation: the text so far stays on stdout, the timing summary still goes to
    stderr, exit code 130, no traceback."""
    from typer.testing import CliRunner

    from llamavk.api import Model
    from llamavk.cli import app

    real_generate = Model.generate

    def interrupted(self, *args, **kwargs):
        for i, token in enumerate(real_generate(self, *args, **kwargs)):
            if i == 3:
                raise KeyboardInterrupt
            yield token

    monkeypatch.setattr(Model, "generate", interrupted)
    r = CliRunner().invoke(app, ["run", "-m", str(synthetic_model("llama", "q4_0")), "-p", "hello", "-n", "50",
                                 "--temp", "0", "-c", "64"])
    assert r.exit_code == 130, r.output
    assert r.stdout.startswith("hello") and "Traceback" not in r.output
    assert "eval time" in r.stderr and "total time" in r.stderr


def test_phase_breakdown(synthetic_model):
    """LLAMAVK_PHASES=1: one line per phase in the order they run, each ending where the next
    starts (durations add up to the time since process start); without it, no such line."""
    import os
    import re

    path = str(synthetic_model("llama", "q4_0"))
    r = run("-m", path, "-p", "hello", "-n", "3", "--temp", "0", "-c", "64",
            env={**os.environ, "LLAMAVK_PHASES": "1"})
    assert r.returncode == 0, r.stderr
    rows = re.findall(r"^phase (.+?) +(\d+\.\d) ms   at +(\d+\.\d) ms$", r.stderr, re.M)
    names = [n for n, _, _ in rows]
    assert names == ["interpreter start", "imports, arguments", "GGUF parse", "vocabulary", "Vulkan instance",
                     "device", "graphs, fit check", "weight buffers", "KV cache", "step, logit buffers",
                     "fused graphs", "activation plans, arena", "prompt tokenized", "recordings",
                     "weights in (upload wait)", "prompt, first token", "generation", "teardown"], r.stderr
    at = 0.0
    for _, dur, end in rows:
        at += float(dur)
        assert abs(at - float(end)) < 0.15 * len(rows)
    # pipelines made by the recordings, or (a model loaded before: vk/kernel_list.py) by prefetch threads
    assert re.search(r"\(of which pipeline creation( \(prefetch threads\))?:", r.stderr)
    assert "(of which weight upload (worker thread):" in r.stderr
    assert all(f"(of which upload threads' {what}:" in r.stderr
               for what in ("file read", "copy into staging", "wait for a slot", "submit"))
    # no device option: the device was opened on the early thread (llamavk/early_device.py) and taken
    assert "(of which wait for the device opened on the early thread:" in r.stderr
    # -sm none names the same device, opened by the load itself: the same completion
    quiet = run("-m", path, "-p", "hello", "-n", "3", "--temp", "0", "-c", "64", "-sm", "none")
    assert quiet.returncode == 0 and "phase " not in quiet.stderr and quiet.stdout == r.stdout


def test_prompt_prepared_during_the_load(synthetic_model):
    """Model(prepare_prompt=...) tokenizes while the weights upload and records the prompt's
    micro-batches then: generate() on those tokens records nothing more and gives the tokens of a
    model loaded without the hook."""
    import llamavk

    path = str(synthetic_model("llama", "q4_0"))
    text = "hello world, once more " * 3
    with llamavk.load(path, n_ctx=128, n_ubatch=16, warn=lambda m: None,
                      prepare_prompt=lambda m: m.tokenize(text)) as m:
        tokens = m.prepared_tokens
        assert tokens == m.tokenize(text) and len(tokens) > 16 and len(tokens) % 16
        before = set(m.runtime.recordings)
        assert {("last", 1, 0, False), ("last", 16, 0, False), ("last", len(tokens) % 16, 0, False)} <= before
        got = list(m.generate(tokens, n=6, temp=0))
        assert set(m.runtime.recordings) == before
    with llamavk.load(path, n_ctx=128, n_ubatch=16, warn=lambda m: None) as m:
        assert list(m.generate(tokens, n=6, temp=0)) == got


def test_option_errors_are_one_line():
    """click's own usage errors (unknown option or command, a value of the wrong type, a missing value)
    are one `error:` line and exit 2, as the commands' own, not typer's box under the usage lines."""
    for args, says in ((["run", "--foo"], "No such option: --foo (see "),
                       (["run", "-c", "abc"], "Invalid value for '--ctx-size'"),
                       (["perplexity", "-f"], "requires an argument"),
                       (["frobnicate"], "No such command 'frobnicate'")):
        r = subprocess.run([sys.executable, "-m", "llamavk", *args], capture_output=True, text=True, timeout=600)
        one_line_error(r, 2)
        assert says in r.stderr


def test_verbose_prompt_lists_llama_completions_prompt_tokens(smollm2_path):
    """--verbose-prompt: the prompt's ids and pieces on stderr, the ids llama-completion's
    --verbose-prompt prints for the same prompt."""
    from .llamacpp_ref import llamacpp_prompt_tokens

    r = run("-m", str(smollm2_path), "-p", "Hello, world! 12345", "-n", "1", "--temp", "0", "--verbose-prompt")
    assert r.returncode == 0, r.stderr
    lines = r.stderr.splitlines()
    at = lines.index("prompt: 'Hello, world! 12345'")
    n = int(lines[at + 1].removeprefix("number of tokens in prompt = "))
    ids = [int(line.split(" -> ")[0]) for line in lines[at + 2:at + 2 + n]]
    assert ids == llamacpp_prompt_tokens(smollm2_path, "-p", "Hello, world! 12345", "-no-cnv")
    assert lines[at + 2].endswith("-> 'Hello'")


def test_option_names_with_underscores_as_llama_cpp_takes_them(synthetic_model):
    """--repeat_penalty is --repeat-penalty (llama.cpp's parser spells "--" names either way); a value
    with underscores and an unknown name stay as they are."""
    from llamavk.cli import build_app, llamacpp_spelling

    app = build_app(["run"])
    argv = ["run", "--repeat_penalty", "1.3", "-p", "--top_k", "--top_k=5", "--no_such", "--", "--n_predict"]
    assert llamacpp_spelling(app, argv) == ["run", "--repeat-penalty", "1.3", "-p", "--top_k", "--top-k=5",
                                            "--no_such", "--", "--n_predict"]
    path = str(synthetic_model("llama", "f32"))
    a = run("-m", path, "-p", "hi", "--n_predict", "6", "--temp", "0", "--repeat_penalty", "1.5", "-c", "64")
    b = run("-m", path, "-p", "hi", "--n-predict", "6", "--temp", "0", "--repeat-penalty", "1.5", "-c", "64")
    assert a.returncode == 0 and a.stdout == b.stdout and "/     5 runs" in a.stderr, a.stderr
    assert "error: No such option: --no_such" in run("-m", path, "-p", "hi", "--no_such").stderr
