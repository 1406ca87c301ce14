"""The sampler chain and its seeded draws against llama-completion's (CPU build): the same model, prompt,
seed and flags give the same tokens' bytes. An f32 synthetic model keeps the two engines' logits within
rounding of each other (a quantized one would not: llama.cpp's CPU products quantize activations), so
no draw falls on the other side of a candidate's edge in these few tokens. Each configuration takes
another path of llamavk/sampling.py: the default chain, min-p on candidates in token order (no
top-k), typical with presence and frequency penalties, top-n-sigma with top-p and min-p, the repeat
penalty, greedy with every penalty, XTC (its own random numbers), Mirostat 2.0 and Mirostat, two other
orders of the samplers (--samplers), and DRY: greedy and sampled, its length and base, a short window,
after top-k and min-p, and sequence breakers of one token and of two (a byte token then "▁ar": the tail
as llama.cpp tokenizes it, with SPM's space prefix) on a prompt whose greedy completion loops. Each DRY
configuration changes the tokens (test_dry_configurations_matter), so a DRY left out would fail it."""

import subprocess

import pytest

import llamavk
from llamavk.cli.run import dry_breakers, parse_logit_bias
from llamavk.kv_override import parse_kv_override
from llamavk.rope_options import rope_options
from llamavk.llamacpp_compat import process_escapes

from .llamacpp_ref import CPU_ENV, completion_until_waiting, llamacpp_tool

PROMPT = "the master said"
N = 16                 # tokens compared. Each configuration's first 28-40 tokens were the same here.
                       # Where a set's edge lies in the dense middle of a random model's 500 logits the
                       # engines' rounding (llama.cpp's CPU attention takes Q in f16, ~1e-3 of a logit)
                       # moves a token across it sooner: typical-p 0.9 and top-n-sigma 1.5 parted after
                       # 18-20 tokens; Mirostat 2.0 (~200 candidates) after 4-17 for seeds 11, 13, 14 --
                       # replaying seed 13 with 1e-3 relative noise on our logits flips the same token
CONFIGS = [
    dict(seed=42),
    dict(seed=1, temp=1.0, top_k=0, top_p=1.0, min_p=0.02),
    dict(seed=5, temp=1.0, typical_p=0.5, presence_penalty=0.5, frequency_penalty=0.2),
    dict(seed=4, temp=0.9, top_n_sigma=0.7, top_p=0.9, min_p=0.01),
    dict(seed=6, temp=0.7, repeat_last_n=8, repeat_penalty=1.3),
    dict(seed=2, temp=0.0, presence_penalty=2.0, frequency_penalty=1.0, repeat_penalty=1.5),
    dict(seed=3, temp=1.0, xtc_probability=0.9, xtc_threshold=0.02),
    dict(seed=15, temp=0.9, mirostat=2, mirostat_tau=6.0, mirostat_eta=0.2),
    dict(seed=16, temp=1.0, mirostat=1, mirostat_tau=7.0, mirostat_eta=0.1),
    dict(seed=21, temp=1.5, min_p=0.2, samplers="temperature;top_k;min_p"),     # min-p after the temperature
    dict(seed=25, temp=0.0, samplers="top_k;top_p"),                            # no temperature: --temp 0 unused
]
LOOPS = "to be: or not to be: that is: to be"   # greedy: ... bj <0xB1> ▁ar bj <0xB1> ▁ar ... from token 10
N_DRY = 24             # tokens compared under DRY, -l and -r (DRY bites once the loop has begun)
OFF, NO_BREAKERS = dict(dry_multiplier=0.0), dict(dry_sequence_breaker=["none"])
# (configuration, the changes to it that must change its tokens: what the oracle comparison covers)
DRY_CASES = [
    (dict(prompt=LOOPS, seed=1, temp=0.0, dry_multiplier=0.5, dry_allowed_length=1, dry_base=2.5),
     [OFF, dict(dry_allowed_length=3)]),
    (dict(prompt=LOOPS, seed=1, temp=0.0, dry_multiplier=0.1, dry_base=2.0),
     [OFF, dict(dry_base=1.75), dict(dry_allowed_length=3)]),
    (dict(prompt=LOOPS, seed=2, temp=0.5, dry_multiplier=1.0), [OFF, dict(dry_multiplier=0.3)]),
    (dict(prompt=LOOPS, seed=2, temp=0.5, dry_multiplier=1.0, dry_penalty_last_n=8), [dict(dry_penalty_last_n=64)]),
    (dict(prompt=LOOPS, seed=3, temp=0.4, top_k=5, dry_multiplier=1.0, samplers="top_k;min_p;dry;temperature"),
     [OFF, dict(dry_penalty_last_n=8)]),
    # the breakers stop DRY in the loop: one token, then two (the byte's token and "▁ar")
    (dict(prompt=LOOPS, seed=1, temp=0.0, dry_multiplier=3.0, dry_sequence_breaker=["bj"]), [NO_BREAKERS]),
    (dict(prompt=LOOPS, seed=1, temp=0.0, dry_multiplier=1.0, dry_sequence_breaker=["\\xb1ar"]), [NO_BREAKERS]),
]
DRY_CONFIGS = [c for c, _ in DRY_CASES]
NO_BIAS, NO_STOP, NO_OVERRIDE = dict(logit_bias=[]), dict(reverse_prompt=[]), dict(override_kv=[])
# -l and -r: biases (one to -inf) where both engines' candidates' edges are far apart (top-k 5 and 8),
# and reverse prompts found in the text or only in its last token's bytes plus the slack
FLAG_CASES = [
    (dict(prompt=LOOPS, seed=1, temp=0.0, logit_bias=["27+5.5", "371-inf"]), [NO_BIAS]),
    (dict(prompt=LOOPS, seed=3, temp=0.8, top_k=5, min_p=0.0, top_p=1.0, logit_bias=["100+2", "27+1.5"]), [NO_BIAS]),
    (dict(prompt=LOOPS, seed=3, temp=0.8, top_k=8, min_p=0.1, logit_bias=["100-inf", "371-2"]), [NO_BIAS]),
    (dict(prompt=LOOPS, seed=1, temp=0.0, reverse_prompt=["\\xb1"]), [NO_STOP]),
    (dict(prompt=LOOPS, seed=1, temp=0.0, reverse_prompt=["m\\xe2", "ar"]), [NO_STOP]),
    (dict(prompt=LOOPS, seed=1, temp=0.0, reverse_prompt=["cfk"]), [NO_STOP]),
    # --override-kv: RoPE's base, the norm's epsilon, no BOS (the metadata read by the model and the vocabulary)
    (dict(prompt=LOOPS, seed=1, temp=0.0, override_kv=["llama.rope.freq_base=float:1000"]), [NO_OVERRIDE]),
    (dict(prompt=LOOPS, seed=4, temp=0.8, top_k=5, override_kv=["llama.attention.layer_norm_rms_epsilon=float:0.5",
                                                                "tokenizer.ggml.add_bos_token=bool:false"]),
     [NO_OVERRIDE]),
]
# RoPE's context options (rope_options.py), each changing the tokens: the base, linear and YaRN scaling,
# YaRN's original context, blend and betas, a blend without the yarn type, scaling switched off
ROPE_CASES = [
    (dict(prompt=LOOPS, seed=1, temp=0.0, rope_freq_base=2000), [dict(rope_freq_base=0)]),
    (dict(prompt=LOOPS, seed=1, temp=0.0, rope_freq_scale=0.25), [dict(rope_freq_scale=0)]),
    (dict(prompt=LOOPS, seed=1, temp=0.0, rope_scale=3, rope_scaling="yarn"), [dict(rope_scaling="linear")]),
    (dict(prompt=LOOPS, seed=1, temp=0.0, rope_scale=3, rope_scaling="yarn", yarn_orig_ctx=128),
     [dict(yarn_orig_ctx=0)]),
    (dict(prompt=LOOPS, seed=1, temp=0.0, rope_scaling="yarn", rope_freq_scale=0.5, yarn_ext_factor=0.5,
          yarn_beta_fast=8, yarn_beta_slow=2), [dict(yarn_ext_factor=-1)]),
    (dict(prompt=LOOPS, seed=1, temp=0.0, rope_freq_scale=0.5, yarn_ext_factor=0.7, yarn_orig_ctx=64),
     [dict(yarn_ext_factor=-1)]),
    (dict(prompt=LOOPS, seed=1, temp=0.0, rope_freq_scale=0.5, rope_scaling="none"), [dict(rope_scaling="linear")]),
    (dict(prompt=LOOPS, seed=1, temp=0.0, rope_scale=3, yarn_attn_factor=3), [dict(yarn_attn_factor=-1)]),
    (dict(prompt=LOOPS, seed=1, temp=0.0, rope_scale=3, rope_scaling="yarn", yarn_attn_factor=3), []),  # ignored
]
# --grammar (grammar.py): the chain's first draw and, where the grammar refuses it, the second one on
# the masked logits; bytes of a character split over tokens (é and [à-ÿ] through byte tokens)
NO_GRAMMAR = dict(grammar=None)
SAMPLED = dict(seed=5, temp=0.7, top_k=0, top_p=1.0, min_p=0.0)
GRAMMAR_CASES = [
    (dict(prompt=LOOPS, seed=1, temp=0.0, grammar='root ::= [a-z]+ " " [0-9]{2,4} ("!" | "?")'), [NO_GRAMMAR]),
    (dict(prompt=LOOPS, seed=3, temp=1.0, grammar='root ::= "yes" | "no"'), [NO_GRAMMAR]),
    (dict(prompt=LOOPS, seed=3, temp=1.0, grammar='root ::= ("ab" | "cd")* "."'), [NO_GRAMMAR]),
    (dict(prompt=LOOPS, **SAMPLED, grammar='root ::= [^a-z]{3,8} "x"'), [NO_GRAMMAR]),
    (dict(prompt=LOOPS, seed=1, temp=0.0, grammar='root ::= "caf" ("é" | "e") " " [à-ÿ]+ "."'), [NO_GRAMMAR]),
    (dict(prompt=LOOPS, **SAMPLED, grammar='root ::= "caf" ("é" | "e") " " [à-ÿ]+ "."'), [NO_GRAMMAR]),
    (dict(prompt=LOOPS, **SAMPLED, grammar='root ::= obj\nobj ::= "{" ws ( pair ( "," ws pair )* )? "}"\n'
          'pair ::= "\\"" [a-z]+ "\\"" ws ":" ws val\nval ::= [0-9]+ | obj\nws ::= [ ]?'), [NO_GRAMMAR]),
    (dict(prompt=LOOPS, **SAMPLED, grammar='root ::= . . . "z"'), [NO_GRAMMAR]),
]
FLAG_CASES += ROPE_CASES + GRAMMAR_CASES
FLAG_CONFIGS = [c for c, _ in FLAG_CASES]
ROPE_FLAGS = ("rope_freq_base", "rope_freq_scale", "rope_scale", "rope_scaling", "yarn_orig_ctx", "yarn_ext_factor",
              "yarn_beta_fast", "yarn_beta_slow", "yarn_attn_factor")
LIST_FLAGS = dict(dry_sequence_breaker="--dry-sequence-breaker", logit_bias="-l", reverse_prompt="-r",
                  override_kv="--override-kv")
FLAGS = dict(seed="-s", temp="--temp", top_k="--top-k", top_p="--top-p", min_p="--min-p",
             typical_p="--typical", top_n_sigma="--top-nsigma", presence_penalty="--presence-penalty",
             frequency_penalty="--frequency-penalty", repeat_last_n="--repeat-last-n",
             repeat_penalty="--repeat-penalty", xtc_probability="--xtc-probability", xtc_threshold="--xtc-threshold",
             mirostat="--mirostat", mirostat_tau="--mirostat-ent", mirostat_eta="--mirostat-lr", samplers="--samplers",
             dry_multiplier="--dry-multiplier", dry_base="--dry-base", dry_allowed_length="--dry-allowed-length",
             dry_penalty_last_n="--dry-penalty-last-n", grammar="--grammar",
             **{k: "--" + k.replace("_", "-") for k in ROPE_FLAGS})


def llamacpp_completion(model, config, need: int | None) -> tuple[bytes, bool]:
    """llama-completion's generated bytes (6 N tokens asked; stdout, the prompt not echoed,
    " [end of text]" and the line breaks it adds dropped), and whether they are all it made. Its
    output goes through a logging thread it leaves running at exit (common/log.cpp leaks it), so a
    run can end before the thread has written its last lines, or any: retried until `need` bytes or
    the whole output came out (need None: the whole output only -- where ours ended early, its first
    need bytes cannot tell where llama.cpp's ended; a run whose stderr lost "total time" once gave
    its text and the line break it adds at the end as such a prefix, twice). A longer run than
    compared gives the thread time to write them. With a reverse prompt it returns as soon as the
    prompt comes out, most runs before the thread writes anything (here 14-16 of 20, and on a busy
    machine every one of 16, twice); at a short end of text (a grammar's) a busy machine lost
    "total time" in 16 of 16 runs too: both run interactive, held where they stop until all of the
    text is out (llamacpp_until_waiting). Once (CI, a busy machine) a run's text held two tokens
    twice; so two runs must agree on what is returned."""
    config = dict(config)
    interactive = need is None or bool(config.get("reverse_prompt"))
    args = [str(llamacpp_tool("llama-completion")), "-m", str(model), "-p", config.pop("prompt", PROMPT), "-n",
            str(6 * N), "-ngl", "0", "-t", "2", "-no-cnv", "--no-display-prompt", "-c", "128"]
    for key, flag in LIST_FLAGS.items():
        for value in config.pop(key, ()):
            args += [flag, value]
    for key, value in config.items():
        args += [FLAGS[key], str(value)]
    seen: set = set()
    longest = 0
    for _ in range(16):
        answers = []
        if interactive:
            text = completion_until_waiting(args)
            longest = max(longest, len(text or b""))
            if text is not None:        # at the end of text it prints a line break, then waits
                answers.append((text.rstrip(b"\n"), True))
        else:
            r = subprocess.run(args, capture_output=True, timeout=300, stdin=subprocess.DEVNULL, env=CPU_ENV)
            assert r.returncode == 0, r.stderr[-2000:]
            longest = max(longest, len(r.stdout))
            if b"total time" in r.stderr:        # printed after the text: all of it is there
                answers.append((r.stdout.rstrip(b"\n").removesuffix(b" [end of text]").rstrip(b"\n"), True))
            if need is not None and len(r.stdout) >= need:
                answers.append((r.stdout[:need], False))
        for answer in answers:
            if answer in seen:
                return answer
            seen.add(answer)
    raise AssertionError(f"no two llama-completion runs agreed in 16 (the longest printed {longest} bytes, "
                         f"{'the whole output' if need is None else need} needed)")


@pytest.fixture(scope="module")
def model(synthetic_model):
    return synthetic_model("llama", "f32")


def ours(path, config) -> list[int]:
    """Our first n_compared tokens for a configuration (its list flags as run takes them)."""
    n = n_compared(config)
    config = dict(config)
    overrides = [parse_kv_override(v) for v in config.pop("override_kv", ())]
    rope = rope_options(**{k.removeprefix("rope_"): config.pop(k) for k in ("rope_freq_base", "rope_freq_scale",
                                                                          "rope_scale") if k in config},
                        **{k.replace("rope_", ""): config.pop(k) for k in ROPE_FLAGS[3:] if k in config})
    prompt = config.pop("prompt", PROMPT)
    if "dry_sequence_breaker" in config:
        config["dry_sequence_breakers"] = dry_breakers(config.pop("dry_sequence_breaker"), escape=True)
    config["logit_bias"] = [parse_logit_bias(v) for v in config.pop("logit_bias", ())]
    stops = [process_escapes(v) for v in config.pop("reverse_prompt", ())]
    with llamavk.load(str(path), n_ctx=128, warn=lambda m: None, kv_overrides=overrides, rope=rope) as m:
        ids = list(m.generate(prompt, n=n, reverse_prompts=stops, **config))
        return ids, b"".join(m.tokenizer.token_to_piece(t, special=False) for t in ids)


def n_compared(config) -> int:
    return N if config in CONFIGS else N_DRY


def config_id(c) -> str:
    return ",".join(f"{k}={v}" for k, v in c.items() if k != "prompt") + (",loops" if c.get("prompt") == LOOPS else "")


@pytest.mark.parametrize("config", CONFIGS + DRY_CONFIGS + FLAG_CONFIGS, ids=config_id)
def test_tokens_equal_llama_completions(model, config):
    """Our first N tokens' bytes begin llama-completion's output (are all of it where the end of
    text came first)."""
    ids, ours_bytes = ours(model, config)
    early = len(ids) < n_compared(config)
    theirs, whole = llamacpp_completion(model, config, None if early else len(ours_bytes) + 1)
    if early:   # the end of text or a reverse prompt: llama.cpp's too, at the same place
        assert whole and theirs == ours_bytes.rstrip(b"\n"), (ours_bytes, theirs)
    else:
        assert theirs.startswith(ours_bytes.rstrip(b"\n")), (ours_bytes, theirs)


@pytest.mark.parametrize("case", DRY_CASES + FLAG_CASES, ids=lambda case: config_id(case[0]))
def test_configurations_matter(model, case):
    """Each DRY configuration's tokens differ from those with DRY off, or with its length, base,
    window or breakers changed; each -l / -r / --override-kv one's from those without it: the oracle
    comparison sees what each part does."""
    config, contrasts = case
    got = ours(model, config)[0]
    for change in contrasts:
        assert got != ours(model, dict(config, **change))[0], change
