"""Pre-tokenizers for byte-level BPE: split text into words before merging.

llama.cpp (src/llama-vocab.cpp, llm_tokenizer_bpe) picks a *list* of regexes per `tokenizer.ggml.pre`
and applies them one after the other (unicode.cpp, unicode_regex_split): each regex re-splits every
piece produced by the previous one, and the text between two matches is kept as a piece of its own
(nothing is ever dropped). We reproduce that here with the `regex` package, whose \\p{L}/\\p{N}/\\s
classes follow Unicode like llama.cpp's tables (\\s is exactly White_Space in both).

The patterns are the ones llama.cpp uses, written out independently. Two notes:
- llama.cpp's hand-written matcher for the GPT-2 pattern behaves like the pattern with a trailing
  `|\\s+` (a lone whitespace before a non-space becomes its own piece). Since unmatched text is kept
  as a piece anyway, both readings give the same split.
- The Llama 3 / Qwen2 patterns use `(?i:'s|...)` in their tokenizer.json; llama.cpp spells the case
  folding out as `'[sS]` etc. We use llama.cpp's spelling so behaviour is identical.
"""

from __future__ import annotations

from ..errors import LlamavkError

# -- the building blocks, one per family ---------------------------------------------------------

_GPT2 = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)"

_CONTRACTIONS_CI = r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])"

_LLAMA3 = (
    _CONTRACTIONS_CI
    + r"|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)

_QWEN2 = (
    _CONTRACTIONS_CI
    + r"|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)

# Qwen3.5: Qwen2's, with combining marks (\p{M}) kept inside letter runs
_QWEN35 = (
    _CONTRACTIONS_CI
    + r"|[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+|\p{N}| ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)

_SEED_CODER = (
    _CONTRACTIONS_CI
    + r"|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1}| ?[^\s\p{L}\p{N}\r\n]+|\s*[\r\n]+|\s+(?!\S)|\s+"
)

_BAILINGMOE = (
    r"'(?:[sSdDmMtT]|[lL][lL]|[vV][eE]|[rR][eE])"
    r"|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]|\s+(?!\S)|\s+"
)

_BLOOM = r" ?[^(\s|.,!?…。，、।۔،)]+"

# Mistral's Tekken (Mistral Nemo, Mistral Small 3): tokenizer.json splits letter runs at case changes
# with \p{Lu}\p{Lt}... classes; llama.cpp runs a rewrite in which "upper" is a letter other than a-z and
# "lower" a letter other than A-Z (so every non-ASCII letter is both), and that is what its ids follow.
_TEKKEN = (
    r"[^\r\n\p{L}\p{N}]?(?:(?=\p{L})[^a-z])*(?:(?=\p{L})[^A-Z])+"
    r"|[^\r\n\p{L}\p{N}]?(?:(?=\p{L})[^a-z])+(?:(?=\p{L})[^A-Z])*"
    r"|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)

# OpenAI's o200k (gpt-oss, Llama 4, "gpt-4o"): Tekken's case-split letter runs (the same rewrite of
# tokenizer.json's classes), each with an optional contraction after it (tokenizer.json's
# `(?i:'s|...)?`, spelled out as llama.cpp does), and digits in runs of up to three.
_GPT4O = (
    r"[^\r\n\p{L}\p{N}]?(?:(?=\p{L})[^a-z])*(?:(?=\p{L})[^A-Z])+" + _CONTRACTIONS_CI + "?"
    r"|[^\r\n\p{L}\p{N}]?(?:(?=\p{L})[^a-z])+(?:(?=\p{L})[^A-Z])*" + _CONTRACTIONS_CI + "?"
    r"|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)

# DeepSeek LLM / Coder (llama architecture): newlines alone first, then letter runs with one
# whitespace before them, ... -- regexes of explicit ranges, run by llama.cpp on the text as it is.
# `\Z` where llama.cpp writes `$`: the end of the piece only (Python's `$` also matches before a
# final newline).
_CJK = r"[\u4e00-\u9fa5\u0800-\u4e00\uac00-\ud7ff]+"
# DeepSeek LLM's letters: the cased letters (Lu, Ll, Lt) of the Unicode version its tokenizer.json was
# made with, as ranges (so a newer `regex` package's tables cannot move them)
_DEEPSEEK_CASED = (
    r"[A-Za-z\u00b5\u00c0-\u00d6\u00d8-\u00f6\u00f8-\u01ba\u01bc-\u01bf\u01c4-\u0293\u0295-\u02af"
    r"\u0370-\u0373\u0376\u0377\u037b-\u037d\u037f\u0386\u0388-\u038a\u038c\u038e-\u03a1\u03a3-\u03f5"
    r"\u03f7-\u0481\u048a-\u052f\u0531-\u0556\u10a0-\u10c5\u13a0-\u13f5\u13f8-\u13fd\u1c90-\u1cba"
    r"\u1cbd-\u1cbf\u1d00-\u1d2b\u1d6b-\u1d77\u1d79-\u1d9a\u1e00-\u1f15\u1f18-\u1f1d\u1f20-\u1f45"
    r"\u1f48-\u1f4d\u1f50-\u1f57\u1f59\u1f5b\u1f5d\u1f5f-\u1f7d\u1f80-\u1fb4\u1fb6-\u1fbc\u1fbe"
    r"\u1fc2-\u1fc4\u1fc6-\u1fcc\u1fd0-\u1fd3\u1fd6-\u1fdb\u1fe0-\u1fec\u1ff2-\u1ff4\u1ff6-\u1ffc"
    r"\u2102\u2107\u210a-\u2113\u2115\u2119-\u211d\u2124\u2126\u2128\u212a-\u212d\u212f-\u2134\u2139"
    r"\u213c-\u213f\u2145-\u2149\u214e\u2183\u2184\u2c00-\u2c7b\u2c7e-\u2ce4\u2ceb-\u2cee\u2cf2\u2cf3"
    r"\ua640-\ua66d\ua680-\ua69b\ua722-\ua76f\ua771-\ua787\ua78b-\ua78e\uab70-\uabbf\ufb00-\ufb06"
    r"\ufb13-\ufb17\uff21-\uff3a\uff41-\uff5a\U00010400-\U0001044f\U000104b0-\U000104d3"
    r"\U000104d8-\U000104fb\U00010c80-\U00010cb2\U00010cc0-\U00010cf2\U000118a0-\U000118df"
    r"\U0001e900-\U0001e943]"
)
_DEEPSEEK_LETTERS = r"\s?" + _DEEPSEEK_CASED + "+"
_DEEPSEEK_PUNCT = r"\s?[!-/:-~\uff01-\uff0f\uff1a-\uff5e\u2018-\u201f\u3000-\u3002]+"

# Where every family's split of a text is the splits of its two sides: before a space between two
# letters. Why, for each pattern above: (1) no match can hold a letter followed by a space (letter
# runs, digit runs and punctuation runs exclude \s, and so does GPT-4o's contraction after a letter
# run, an apostrophe and one or two letters; a space is only ever an optional first character, or
# part of a whitespace run), so no match crosses the cut; (2) at the space, a match starts: " " +
# letters is ` ?\p{L}+`, `[^\r\n\p{L}\p{N}]?\p{L}+` (Qwen3.5: with marks), Bloom's ` ?[^...]+`
# (Tekken, GPT-4o: their case-split letter runs) -- only the first regexes of multi-regex sequences
# (punctuation, digits) match nothing there, and leave the text around the cut to the next regex as
# one unmatched piece; (3) none of the patterns looks behind (Tekken's and GPT-4o's look-aheads read
# only the character they are about to take), so the matches after the cut are found alike in the
# whole text and in its tail; (4) the one other look-ahead, `\s+(?!\S)`, could end a match at the end
# of the head differently than in the whole text only if the head ended with whitespace, and it ends
# with a letter (where GPT-4o's optional contraction finds no apostrophe, in the head as in the whole).
CUT = r"(?<=\p{L}) (?=\p{L})"
# DeepSeek LLM's letter runs are its cased letters only (other letters stay in unmatched text, spaces
# and all): its cuts lie between two of those, where the same four steps hold.
CUTS = {"deepseek-llm": f"(?<={_DEEPSEEK_CASED}) (?={_DEEPSEEK_CASED})"}

# Regex sequences per llama.cpp pre-tokenizer type (the order matters: applied left to right).
REGEX_SEQUENCES: dict[str, tuple[str, ...]] = {
    "default": (r"[\p{P}\$\+<=>\^~\|]+", _GPT2, r"\p{N}+", r"[0-9][0-9][0-9]"),
    "gpt2": (_GPT2,),
    "llama3": (_LLAMA3,),
    "qwen2": (_QWEN2,),
    "qwen35": (_QWEN35,),
    # SmolLM & co: every digit is its own piece first, then the GPT-2 pattern on the rest.
    "smollm": (r"\p{N}", _GPT2),
    "falcon": (r"[\p{P}\$\+<=>\^~\|`]+", _GPT2, r"[0-9][0-9][0-9]"),
    "bloom": (_BLOOM,),
    "viking": (_BLOOM, r"\p{N}"),
    "seed-coder": (_SEED_CODER,),
    "bailingmoe": (_BAILINGMOE,),
    "tekken": (_TEKKEN,),
    "gpt4o": (_GPT4O,),
    "deepseek-llm": (r"[\r\n]", _DEEPSEEK_LETTERS, _DEEPSEEK_PUNCT, r"\s+\Z", _CJK, r"\p{N}+"),
    "deepseek-coder": (r"[\r\n]", r"\s?\p{L}+", r"\s?\p{P}+", _CJK, r"\p{N}"),
}

# `tokenizer.ggml.pre` value -> (regex family, clean_spaces, ignore_merges, add_bos default).
# clean_spaces/ignore_merges/add_bos mirror the flags llama.cpp sets for each name (BPE defaults:
# clean_spaces=True, ignore_merges=False, add_bos=False).
_PRE: dict[str, tuple[str, bool, bool, bool]] = {}


def _reg(names: tuple[str, ...], family: str, clean: bool = True, ignore_merges: bool = False,
         add_bos: bool = False) -> None:
    for n in names:
        _PRE[n] = (family, clean, ignore_merges, add_bos)


_reg(("default",), "default")
_reg(("llama3", "llama-v3", "llama-bpe", "falcon3", "falcon-h1", "pixtral", "midm-2.0", "lfm2"),
     "llama3", ignore_merges=True, add_bos=True)
_reg(("dbrx", "smaug-bpe"), "llama3")
_reg(("glm4", "chatglm-bpe"), "llama3")  # same pattern as Llama 3 (bos id cleared: see vocab.py)
_reg(("falcon",), "falcon")
_reg(("mpt", "gpt-2", "phi-2", "jina-es", "jina-de", "gigachat", "jina-v2-es", "jina-v2-de",
      "a.x-4.0", "mellum", "jina-v1-en", "jina-v2-code", "roberta-bpe", "olmo", "jais", "exaone4"),
     "gpt2")
_reg(("trillion", "granite-docling"), "gpt2", clean=False)
_reg(("starcoder", "refact", "codeshell", "minerva-7b", "exaone"), "smollm")
_reg(("command-r", "smollm"), "smollm", clean=False)
_reg(("qwen2", "deepseek-r1-qwen", "kormo", "hunyuan", "grok-2"), "qwen2", clean=False)
_reg(("stablelm2", "megrez"), "qwen2")
_reg(("qwen35",), "qwen35", clean=False)
_reg(("poro-chat",), "bloom", clean=False)
_reg(("bloom", "gpt3-finnish"), "bloom")
_reg(("viking",), "viking", clean=False)
_reg(("seed-coder",), "seed-coder", clean=False)
_reg(("bailingmoe", "bailingmoe2", "llada-moe"), "bailingmoe", clean=False)
_reg(("tekken",), "tekken", clean=False, ignore_merges=True, add_bos=True)
_reg(("gpt-4o", "llama4", "kanana2", "talkie"), "gpt4o", clean=False)
_reg(("deepseek-llm",), "deepseek-llm", clean=False)
_reg(("deepseek-coder",), "deepseek-coder", clean=False)
# Not in llama.cpp's list of names, but the spec calls the GPT-2 family "gpt2".
_reg(("gpt2",), "gpt2")


def pre_flags(pre: str | None) -> tuple[str, bool, bool, bool]:
    """(family, clean_spaces, ignore_merges, add_bos default) for a `tokenizer.ggml.pre` value.

    A missing key means "default", like llama.cpp. An unknown name is an error rather than a silent
    fallback: a wrong pre-tokenizer gives plausible-looking but wrong token ids.
    """
    if pre is None:
        pre = "default"
    try:
        return _PRE[pre]
    except KeyError:
        raise LlamavkError(
            f"unsupported tokenizer.ggml.pre '{pre}' (supported: {', '.join(sorted(_PRE))})"
        ) from None


class PreTokenizer:
    """Splits a text fragment into words with a sequence of regexes (see module docstring)."""

    def __init__(self, family: str):
        import regex     # here: only byte-level BPE vocabularies need it (start-up time of the others)

        self.family = family
        self.patterns = [regex.compile(p) for p in REGEX_SEQUENCES[family]]
        self._cut = regex.compile(CUTS.get(family, CUT))

    def next_cut(self, text: str, start: int) -> int:
        """The first position >= start where `text` can be cut (see CUT; -1: none): split(text) is
        split(text[:cut]) + split(text[cut:])."""
        m = self._cut.search(text, max(start, 1))
        return m.start() if m else -1

    def split(self, text: str) -> list[str]:
        pieces = [text]
        for pat in self.patterns:
            out: list[str] = []
            for piece in pieces:
                start = 0
                for m in pat.finditer(piece):
                    s, e = m.span()
                    if s == e:  # zero-width matches produce no piece (as in llama.cpp)
                        continue
                    if s > start:  # keep the unmatched gap as its own piece
                        out.append(piece[start:s])
                    out.append(piece[s:e])
                    start = e
                if start < len(piece):
                    out.append(piece[start:])
            pieces = out
        return pieces
