"""GBNF grammars by hand: the language each accepts against the same language as a regular expression
(the `regex` module, which also answers "is this a prefix of a match", partial=True), on random
strings; parse errors; UTF-8 decoding across tokens and the partial-character rule; the tokens a state
allows against whole texts. Against llama-completion: tests/test_sampling_llamacpp.py's --grammar
configurations."""

import random

import pytest
import regex

from llamavk.grammar import CharClass, Grammar, GrammarError, GrammarState, decode_utf8

# (GBNF, the same language as a regular expression, the alphabet of the random strings)
LANGUAGES = [
    ('root ::= [a-c]+ ("x" | "yz")? [0-9]{1,3}', r"[a-c]+(x|yz)?[0-9]{1,3}", "abcxyz01"),
    ('root ::= ("ab" | "cd")* "."', r"(ab|cd)*\.", "abcd."),
    ('root ::= [^a-z]{2,4} "x"  # a comment', r"[^a-z]{2,4}x", "ab12x-"),
    ('root ::= "q" . . "\\x41\\u00e9\\n"', "(?s)q..A\u00e9\n", "qA\u00e9\nz"),
    ('root ::= x y?\nx ::= "a" |\n  "b" x\ny ::= ( "c"\n  | "d" )+', r"b*a[cd]*", "abcd"),
    ('root ::= [\\-\\]a]{3}', r"[\-\]a]{3}", "-]ab"),
]


@pytest.mark.parametrize("gbnf,pattern,alphabet", LANGUAGES)
def test_language_equals_the_regular_expression(gbnf, pattern, alphabet):
    g = Grammar(gbnf)
    rx = regex.compile(pattern)
    rng = random.Random(7)
    checked = 0
    for _ in range(2500):
        s = "".join(rng.choice(alphabet) for _ in range(rng.randint(0, 9)))
        assert g.accepts(s) == (rx.fullmatch(s) is not None), s
        assert g.accepts(s, complete=False) == (rx.fullmatch(s, partial=True) is not None), s
        checked += g.accepts(s, complete=False)
    assert checked > 50            # the random strings reach into the language, not only around it


def test_recursion_through_rules():
    g = Grammar('root ::= word (" " word){0,2}\nword ::= [a-b]+ | "{" word "}"')
    assert g.accepts("a {ab} {{b}}") and g.accepts("{{{a}}}")
    assert not g.accepts("a b a b") and not g.accepts("{a") and g.accepts("{a", complete=False)
    assert not g.accepts("a}", complete=False)


@pytest.mark.parametrize("bad,why", [
    ('root ::= root "a"', "left recursion"), ('root ::= x\nx ::= "b"? root', "left recursion"),
    ('root ::= ("a"*)*', "left recursion"), ('root ::= "a" | missing', "never defined"),
    ('x ::= "a"', "no root"), ('root ::= "\\q"', "unknown escape"), ('root ::= "abc', "unterminated"),
    ('root ::= [ab', "unterminated"), ('root ::= ("a"', "expected \\)"), ('root ::= *', "nothing before"),
    ('root ::= "a"{3,2}', "maximum"), ('root ::= "a" <[12]>', "token references"), ('root "a"', "::="),
    ('root ::= "a" ) "b"', "end of the rule"), ('root ::= "\\x4"', "hex digits"),
    ('root ::= "a"{2001}', "more than 2000"), ('root ::= ("a"?){0,1500} "b"', "nested too deeply")])
def test_parse_errors(bad, why):
    with pytest.raises(GrammarError, match=why):
        Grammar(bad)


def test_decode_utf8_across_tokens():
    assert decode_utf8("é".encode(), 0, 0) == ([0xE9], 0xE9, 0)
    cps, value, n = decode_utf8(b"a\xe2\x82", 0, 0)             # "a", then 2 of €'s 3 bytes
    assert cps == [0x61] and n == 1
    assert decode_utf8(b"\xacb", value, n)[0] == [0x20AC, 0x62]
    assert decode_utf8(b"\x80", 0, 0)[2] == -1                   # a continuation byte first: invalid
    assert decode_utf8(b"b", 0x2, 1)[2] == -1                    # a character cut by a new one


def test_partial_character_rule():
    e_acute = CharClass(((0xE9, 0xE9),))
    assert e_acute.matches_partial(0x3, 1)                       # \xc3: U+00C0..U+00FF
    assert not e_acute.matches_partial(0x4, 1)                   # \xc4: U+0100..U+013F
    assert not e_acute.matches_partial(0x1, 1)                   # an overlong form
    assert CharClass(((0x41, 0x41),), negated=True).matches_partial(0x3, 1)
    assert CharClass((), negated=True).matches_partial(0x2, 2)   # `.`


@pytest.fixture(scope="module")
def tok(spm_tokenizer):
    return spm_tokenizer


def test_allowed_tokens_are_those_that_keep_a_prefix(tok):
    """After each token of a valid text, a token is allowed exactly where the text with its piece is
    still a prefix of the language (whole characters; the byte tokens that start é are allowed where
    é or another of their characters may come); the end of text only where the text is complete."""
    g = Grammar('root ::= "ca" ("f" "é"? | "t") (" " [a-c]+)?')
    state = GrammarState(g, tok)
    text = b""
    checked = {True: 0, False: 0}
    for piece in ("c", "a", "f", "<0xC3>", "<0xA9>", "▁", "ab"):
        for t in range(tok.n_vocab):
            if tok.is_eog(t):     # as llama.cpp: by the whole characters so far (a pending byte aside)
                assert state.allows(t) == g.accepts(text.decode("utf-8", "ignore")), (text, t)
                continue
            raw = tok.token_to_piece(t)
            try:
                whole = (text + raw).decode("utf-8")
            except UnicodeDecodeError:
                continue                       # ends inside a character: the partial rule (above)
            want = bool(raw) and raw[0] != 0 and g.accepts(whole, complete=False)
            assert state.allows(t) == want, (text, raw)
            checked[want] += 1
        t = tok.vocab.tokens.index(piece)
        state.accept(t)
        text += tok.token_to_piece(t)
    assert text.decode() == "café ab" and state.allows(tok.eos_id) and checked[True] >= 10
    c3 = tok.vocab.tokens.index("<0xC3>")
    fresh = GrammarState(g, tok)
    for piece in "caf":
        fresh.accept(tok.vocab.tokens.index(piece))
    assert fresh.allows(c3) and not fresh.allows(tok.vocab.tokens.index("<0xC4>"))


def test_mask_is_every_token_refused_one_by_one(tok, smollm2_path):
    """The mask (a walk over the sorted texts, whole prefixes refused at once) refuses exactly the
    tokens `allows` refuses, in states that take few tokens and many, with a character pending or not,
    on the synthetic SPM vocabulary and SmolLM2's 49k BPE one."""
    from llamavk.gguf_file import GGUFFile
    from llamavk.tokenizer import Tokenizer

    smol = Tokenizer.from_metadata(GGUFFile(smollm2_path).metadata)
    g = Grammar('root ::= "{" ws "\\"" [^"\\\\]* "\\"" ws ":" ws ( [0-9]+ | "é" [à-ÿ]* ) ws "}"\nws ::= [ ]?')
    pieces = ("{", "▁", '"', "ab", "▁", "c", '"', ":", "▁", "<0xC3>", "<0xA9>")
    spm_ids = [tok.vocab.tokens.index(p) for p in pieces]
    smol_ids = smol.encode('{ "name": é', add_special=False)
    for tokenizer, ids in ((tok, spm_ids), (smol, smol_ids)):
        state = GrammarState(g, tokenizer)
        for t in ids:
            refused = set(state.mask(tokenizer.n_vocab))
            assert refused == {u for u in range(tokenizer.n_vocab) if not state.allows(u)}
            assert t not in refused
            state.accept(t)
        assert len(state.mask(tokenizer.n_vocab)) < tokenizer.n_vocab     # [à-ÿ]*, ws, "}" are left
