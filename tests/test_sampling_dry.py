"""DRY by hand: llama.cpp's own test vectors (tests/test-sampling.cpp's test_dry), the sequence breakers'
token sequences against their definition over whole vocabularies, and run's flags. Against
llama-completion: tests/test_sampling_llamacpp.py's DRY configurations."""

import numpy as np
import pytest

from llamavk.cli.run import dry_breakers
from llamavk.sampling import Sampler, SamplingParams, _Candidates
from llamavk.sampling_dry import DEFAULT_BREAKERS, MAX_BREAKER_BYTES, MAX_TAIL_TOKENS, Dry, breaker_sequences
from llamavk.tokenizer import Tokenizer
from llamavk.tokenizer.stray_bytes import from_bytes, to_bytes

# llama.cpp's test_dry: (probabilities, tokens accepted, probabilities expected after DRY and a softmax,
# multiplier, base, allowed length, window, breakers as token sequences)
LLAMACPP_VECTORS = [
    ([0.25] * 4, [0, 1], [0.25] * 4, 1.0, 1.1, 2, 4, []),
    ([0.25] * 4, [0, 1, 2, 0, 1], [0.296923, 0.296923, 0.109232, 0.296923], 1.0, 1.1, 2, 5, []),
    ([0.2] * 5, [0, 1, 3, 4, 0, 1], [0.2] * 5, 1.0, 1.1, 2, 6, [[3]]),
    ([0.2] * 5, [0, 1, 2, 0, 1], [0.241818, 0.241818, 0.032727, 0.241818, 0.241818], 2.0, 1.1, 2, 5, []),
    ([0.2] * 5, [0, 1, 2, 3, 4, 0, 1], [0.2] * 5, 1.0, 1.1, 4, 7, []),
]


def softmax(v):
    e = np.exp(v - v.max())
    return e / e.sum()


@pytest.mark.parametrize("probs,accepted,expected,mult,base,allowed,last_n,breakers", LLAMACPP_VECTORS)
def test_llamacpp_test_vectors(probs, accepted, expected, mult, base, allowed, last_n, breakers):
    params = SamplingParams(dry_multiplier=mult, dry_base=base, dry_allowed_length=allowed,
                            dry_penalty_last_n=last_n, dry_sequence_breakers=())
    s = Sampler(params, history=accepted)
    for seq in breakers:                  # llama_sampler_init_dry_testing: head token, then the tail
        s.dry.breakers.setdefault(seq[0], set()).add(tuple(seq[1:]))
    c = _Candidates(np.log(np.asarray(probs, dtype=np.float32)))
    s._dry(c)
    assert np.abs(softmax(c.vals) - expected).max() < 1e-5


def test_repeats_by_hand():
    """The example in llama.cpp's comments (a b c c b c y a b c: c extends 'a b c' to 4, y 'b c' to 3,
    b 'c' to 2), a breaker capping the lengths, and the window."""
    a, b, c, y = 0, 1, 2, 3
    d = Dry(1.0, 2.0, 1, 64, {})
    for t in (a, b, c, c, b, c, y, a, b, c):
        d.accept(t)
    assert d.repeats() == {c: 3, b: 1, y: 2}
    d.breakers = {a: {()}}                # 'a' 2 tokens back: repeats capped at 2
    assert d.repeats() == {c: 2, b: 1, y: 2}
    d.breakers = {c: {()}}                # the last token a breaker: nothing repeats
    assert d.repeats() is None
    d.breakers = {b: {(c,)}}              # 'b c' at the end: cap 0
    assert d.repeats() is None
    w = Dry(1.0, 2.0, 1, 4, {})           # a window of 4: y a b c
    for t in (a, b, c, c, b, c, y, a, b, c):
        w.accept(t)
    assert list(w.recent) == [y, a, b, c] and w.repeats() == {}
    assert Dry(0.0, 2.0, 1, 64, {}).enabled is False and Dry(1.0, 0.9, 1, 64, {}).enabled is False
    assert Dry(1.0, 2.0, 1, 0, {}).enabled is False


def test_penalty_arithmetic():
    d = Dry(0.8, 1.75, 2, 64, {})
    assert d.penalty(2) == np.float32(0.8) and d.penalty(5) == np.float32(0.8 * float(np.float32(1.75)) ** 3)
    big = Dry(1.0, 3.0, 0, 64, {})        # the exponent capped where base ** e would pass float's max
    cap = int(np.float32(88.7228391) / np.log(np.float32(3.0)))
    assert big.penalty(10_000) == big.penalty(cap) and np.isfinite(big.penalty(10_000))


def test_dry_changes_greedy_choice():
    """Greedy (the chain's shortcut) applies DRY too: the token extending a repeat loses the argmax."""
    params = SamplingParams(temp=0.0, dry_multiplier=5.0, dry_sequence_breakers=())
    s = Sampler(params, history=[5, 6, 7, 5, 6])
    logits = np.zeros(10, dtype=np.float32)
    logits[7], logits[8] = 2.0, 1.0       # 7 would make '5 6 7' again
    assert s.sample(logits) == 8
    assert Sampler(SamplingParams(temp=0.0), history=[5, 6, 7, 5, 6]).sample(logits) == 7


def expected_sequences(tok, breakers) -> dict:
    """The breakers' token sequences from their definition: a token holding a breaker is one by
    itself; a token whose text ends in a proper beginning of one (of k bytes) is a head whose tail is
    the rest tokenized alone (at most 20 ids)."""
    out: dict = {}
    for tid in range(tok.n_vocab):
        word = tok.decode_bytes([tid])
        for s in (to_bytes(b)[:MAX_BREAKER_BYTES] for b in breakers):
            if not s:
                continue
            if s in word:
                out.setdefault(tid, set()).add(())
                continue
            for k in range(1, len(s)):
                if word.endswith(s[:k]):
                    rest = from_bytes(s[k:])
                    tail = tok.encode(rest, add_special=False, parse_special=False)[:MAX_TAIL_TOKENS]
                    out.setdefault(tid, set()).add(tuple(tail))
    return out


@pytest.fixture(scope="module")
def spm(spm_tokenizer):
    return spm_tokenizer


@pytest.fixture(scope="module")
def smol(smollm2_path):
    from llamavk.gguf_file import GGUFFile

    return Tokenizer.from_metadata(GGUFFile(smollm2_path).metadata)


LONG = "a breaker of more than forty bytes, é cut in two " * 2


def test_breaker_sequences_spm(spm):
    breakers = DEFAULT_BREAKERS + ("ab", "tbe", from_bytes(b"\xb1ar"), LONG)
    got = breaker_sequences(spm, breakers)
    assert got == expected_sequences(spm, breakers)
    ids = {t: i for i, t in enumerate(spm.vocab.tokens)}
    # SPM's space prefix: the tail of "tbe" after a token ending in t is "▁be", not "be"
    assert got[ids["t"]] == {(ids["\u2581be"],)} and got[ids[":"]] == {()}
    assert got[ids["<0xB1>"]] == {(ids["\u2581ar"],)}


def test_breaker_sequences_bpe(smol):
    breakers = DEFAULT_BREAKERS + (" said:", "\n\n###", LONG)
    got = breaker_sequences(smol, breakers)
    assert got == expected_sequences(smol, breakers)
    said = smol.encode(" said", add_special=False)
    assert len(said) == 1 and (tuple(smol.encode(":", add_special=False)),) == tuple(got[said[0]] - {()})


def test_run_flag_breakers():
    assert dry_breakers(None, True) == DEFAULT_BREAKERS
    assert dry_breakers(["\\n", "x"], True) == ("\n", "x")
    assert dry_breakers(["\\n"], False) == ("\\n",)
    assert dry_breakers(["a", "none", "b"], True) == ("b",) and dry_breakers(["none"], True) == ()
