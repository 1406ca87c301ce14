"""Reverse prompts (-r) by hand: where the text search looks, the one-token rule, a prompt that already
ends with one. Against llama-completion: tests/test_sampling_llamacpp.py's -r configurations."""

import pytest

import llamavk
from llamavk.reverse_prompt import SLACK, WINDOW, ReversePrompts

LOOPS = "to be: or not to be: that is: to be"


@pytest.fixture(scope="module")
def tok(spm_tokenizer):
    return spm_tokenizer


def ids(tok, *pieces):
    return [tok.vocab.tokens.index(p) for p in pieces]


def test_text_search_with_slack(tok):
    """Found in the last len + 2 bytes of the window's text: "ab" then up to two bytes, not three."""
    assert ReversePrompts(tok, ["ab"]).seen(ids(tok, "▁x", "ab"))
    assert ReversePrompts(tok, ["ab"]).seen(ids(tok, "▁x", "ab", "c", "d"))
    assert not ReversePrompts(tok, ["ab"]).seen(ids(tok, "▁x", "ab", "c", "d", "e"))
    assert ReversePrompts(tok, ["b c"]).seen(ids(tok, "ab", "▁c"))          # across tokens
    assert not ReversePrompts(tok, ["zz"]).seen(ids(tok, "ab", "▁c"))
    assert SLACK == 2 and WINDOW == 32


def test_tokens_seen_one_at_a_time(tok):
    stop = ReversePrompts(tok, ["qr", "▁xy"])    # the second: its text, " xy", as llama.cpp matches bytes
    assert not stop.seen(ids(tok, "▁a", "q"))
    assert stop.seen(ids(tok, "r"))
    stop = ReversePrompts(tok, [" xy"])
    assert stop.seen(ids(tok, "▁x", "y"))


def test_window_of_32_tokens(tok):
    """Only the last 32 tokens' text is searched: a reverse prompt spread over more is not seen."""
    far = ReversePrompts(tok, ["a" * 33])
    assert not far.seen(ids(tok, *["a"] * 40))
    assert ReversePrompts(tok, ["a" * 32]).seen(ids(tok, *["a"] * 40))


def test_one_token_reverse_prompt(tok):
    """A reverse prompt that is one token (special tokens parsed: "</s>" is the end of text) is that
    token; it stops where the token is last, not where it lies further back than the slack."""
    stop = ReversePrompts(tok, ["</s>"])
    assert stop.tokens == {2} and stop.seen([5, 2])
    assert not ReversePrompts(tok, ["</s>"]).seen([2, 5, 6, 7])


def test_empty_reverse_prompt_stops_at_once(tok):
    """llama.cpp's find of "" succeeds anywhere: -r "" ends generation before it starts."""
    assert ReversePrompts(tok, [""]).seen(ids(tok, "▁x"))
    assert not ReversePrompts(tok, []).seen(ids(tok, "▁x"))


def test_generate_stops_after_the_token_and_before_a_prompt_that_ends_with_one(synthetic_model):
    with llamavk.load(str(synthetic_model("llama", "f32")), n_ctx=128, warn=lambda m: None) as m:
        full = list(m.generate(LOOPS, n=24, temp=0))
        pieces = [m.tokenizer.token_to_piece(t) for t in full]
        cut = next(i for i, p in enumerate(pieces) if p == b"\xb1")
        from llamavk.tokenizer.stray_bytes import from_bytes

        assert list(m.generate(LOOPS, n=24, temp=0, reverse_prompts=[from_bytes(b"\xb1")])) == full[:cut + 1]
        assert list(m.generate(LOOPS, n=24, temp=0, reverse_prompts=["be"])) == []
        assert m.timings.prompt_tokens == 0 and m.timings.eval_runs == 0
