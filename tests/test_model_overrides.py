"""What the command line changes in a model by hand: --override-kv (the argument's forms and errors, the
file's types checked, the override reaching the configuration, the vocabulary and both commands) and
RoPE's context options resolved against the model's. Against llama-completion:
tests/test_sampling_llamacpp.py's --override-kv and RoPE configurations."""

import subprocess
import sys

import pytest

import llamavk
from llamavk.errors import UsageError
from llamavk.kv_override import apply_kv_overrides, parse_kv_override


def test_parse_forms():
    assert parse_kv_override("llama.context_length=int:64") == ("llama.context_length", 64)
    assert parse_kv_override("a.b=float:-1.5e3") == ("a.b", -1500.0)
    assert parse_kv_override("x=bool:true") == ("x", True) and parse_kv_override("x=bool:false") == ("x", False)
    assert parse_kv_override("name=str:a=b:c") == ("name", "a=b:c")      # the first = and : separate
    assert parse_kv_override("name=str:") == ("name", "")


@pytest.mark.parametrize("bad", ["x", "=int:1", "x=1", "x=long:1", "x=int:1.5", "x=int:", "x=float:abc",
                                 "x=float:nan", "x=bool:yes", "x=bool:1", "k" * 128 + "=int:1",
                                 "x=str:" + "s" * 128])
def test_parse_errors(bad):
    with pytest.raises(UsageError):
        parse_kv_override(bad)


def test_types_checked_against_the_file():
    meta = {"i": 3, "f": 1.0, "b": True, "s": "x", "a": [1, 2]}
    out = apply_kv_overrides(meta, [("i", 4), ("f", 2.5), ("b", False), ("s", "y"), ("new", 7)])
    assert out == {"i": 4, "f": 2.5, "b": False, "s": "y", "a": [1, 2], "new": 7} and meta["i"] == 3
    for key, value in (("i", 1.0), ("f", 1), ("b", 1), ("i", True), ("s", 1), ("a", 1)):
        with pytest.raises(UsageError):
            apply_kv_overrides(meta, [(key, value)])


def test_override_reaches_config_and_vocabulary(synthetic_model):
    path = str(synthetic_model("llama", "f32"))
    overrides = [("llama.rope.freq_base", 1000.0), ("tokenizer.ggml.add_bos_token", False),
                 ("llama.context_length", 64)]
    with llamavk.load(path, n_ctx=0, warn=lambda m: None, kv_overrides=overrides) as m:
        assert m.config.rope_base == 1000.0 and m.n_ctx == 64
        assert m.tokenize("to be")[0] != m.tokenizer.bos_id
    with llamavk.load(path, n_ctx=0, warn=lambda m: None) as m:
        assert m.config.rope_base != 1000.0 and m.tokenize("to be")[0] == m.tokenizer.bos_id


def test_commands_take_overrides(synthetic_model, tmp_path):
    """run and perplexity: the override's tokens / score as the API's, errors as one line."""
    path = str(synthetic_model("llama", "f32"))
    kv = "llama.rope.freq_base=float:1000"
    with llamavk.load(path, n_ctx=64, warn=lambda m: None, kv_overrides=[parse_kv_override(kv)]) as m:
        want = b"".join(m.tokenizer.token_to_piece(t, special=False) for t in m.generate("to be", n=8, temp=0))
        text = "to be or not to be that is the question " * 8
        ppl = m.perplexity(text, n_ctx=32).ppl
    cmd = [sys.executable, "-m", "llamavk"]
    r = subprocess.run(cmd + ["run", "-m", path, "-p", "to be", "-n", "8", "--temp", "0", "-c", "64",
                              "--no-display-prompt", "--override-kv", kv], capture_output=True, timeout=600)
    assert r.returncode == 0 and r.stdout == want + b"\n", r.stderr
    (tmp_path / "t.txt").write_text(text)
    p = subprocess.run(cmd + ["perplexity", "-m", path, "-f", str(tmp_path / "t.txt"), "-c", "32",
                              "--override-kv", kv], capture_output=True, text=True, timeout=600)
    assert p.returncode == 0 and f"PPL = {ppl:.4f}" in p.stdout + p.stderr, p.stderr[-2000:]
    bad = subprocess.run(cmd + ["run", "-m", path, "-p", "x", "-n", "1", "--override-kv", "llama.rope.freq_base=int:1"],
                         capture_output=True, text=True, timeout=600)
    assert bad.returncode == 2 and bad.stderr.count("\n") == 1 and "type float" in bad.stderr


# -- RoPE's context options (rope_options.py); against llama-completion: test_sampling_llamacpp.py

def test_rope_options_resolved_against_the_model(synthetic_model):
    """A model with YaRN metadata (factor 4): the options replace what they name and keep the rest."""
    from llamavk.models import load_model_file
    from llamavk.rope_options import RopeOptions, apply_rope_options, rope_options

    cfg = load_model_file(synthetic_model("llama", "f32", rope_scaling="yarn", rope_factor=4.0)).config
    s = cfg.rope_scaling
    assert s.type == "yarn" and s.factor == 4.0
    assert apply_rope_options(cfg, RopeOptions()) is cfg
    assert apply_rope_options(cfg, rope_options(scaling="none")).rope_scaling is None
    half = apply_rope_options(cfg, rope_options(freq_scale=0.5)).rope_scaling
    assert (half.type, half.factor, half.orig_ctx, half.ext_factor) == ("yarn", 2.0, s.orig_ctx, 1.0)
    assert apply_rope_options(cfg, rope_options(scale=8)).rope_scaling.factor == 8.0
    lin = apply_rope_options(cfg, rope_options(scaling="linear")).rope_scaling
    assert (lin.type, lin.factor, lin.ext_factor) == ("linear", 4.0, 0.0)
    tuned = apply_rope_options(cfg, rope_options(freq_base=500, yarn_orig_ctx=64, yarn_beta_fast=8,
                                                 yarn_beta_slow=2, yarn_ext_factor=0.5))
    t = tuned.rope_scaling
    assert tuned.rope_base == 500 and (t.orig_ctx, t.beta_fast, t.beta_slow, t.ext_factor) == (64, 8, 2, 0.5)
    # the attention factor: taken without YaRN's blend, the model's own with it
    assert apply_rope_options(cfg, rope_options(yarn_attn_factor=3)).rope_scaling.attn_factor == s.attn_factor
    assert apply_rope_options(cfg, rope_options(scaling="linear", yarn_attn_factor=3)).rope_scaling.attn_factor == 3
    plain = load_model_file(synthetic_model("llama", "f32")).config      # no scaling metadata: linear
    lin2 = apply_rope_options(plain, rope_options(freq_scale=0.25)).rope_scaling
    assert (lin2.type, lin2.factor, lin2.orig_ctx) == ("linear", 4.0, plain.n_ctx_train)
    only_attn = apply_rope_options(plain, rope_options(yarn_attn_factor=2)).rope_scaling
    assert (only_attn.factor, only_attn.attn_factor, only_attn.ext_factor) == (1.0, 2.0, 0.0)
    with pytest.raises(UsageError):
        rope_options(scaling="ntk")
    with pytest.raises(UsageError):
        rope_options(scale=-2)
