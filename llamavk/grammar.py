"""GBNF grammars (llama.cpp's --grammar / --grammar-file): the text generated must stay a prefix of a
string of the grammar's language, and end only where the grammar is complete.

Syntax, as llama.cpp's parser reads it: rules `name ::= alternatives`, one per line (a rule continues
over newlines only inside parentheses or after `|`); alternatives separated by `|`; items are
"literals", [character classes] ([^...] negated, a-z ranges), `.` (any character), rule names and
( groups ), each optionally repeated by `*`, `+`, `?`, `{m}`, `{m,}` or `{m,n}` (a repetition applies to
the whole preceding item: all of a literal); `#` comments; escapes \\n \\r \\t \\\\ \\" \\[ \\] \\- \\xHH
\\uHHHH \\UHHHHHHHH. The start rule is `root`. Token references (`<[id]>`, `<token>`) are not
supported here (a one-line error).

The recognizer is llama.cpp's in kind: a set of stacks, each a path through the rules whose top is
the character class to match next (an empty stack: the grammar is complete). A candidate token's text
(special tokens as their text) is decoded as UTF-8 from where the last token left off: the token is
allowed where some stack takes every code point and, for a trailing incomplete character, where the
top could still match it (llama_grammar_match_partial_char's rule); an end-of-generation token only
where a stack is empty; a token whose text is empty or starts with a zero byte never. Left recursion
(also through rules that can be empty) is refused, as llama.cpp refuses it.

Repetitions become rules of their own (`x*` as r ::= x r | ""); the stacks differ from llama.cpp's
where its expansion differs, the language and so the allowed tokens do not.

Cost: a token's check walks its characters through a cache of (stacks, character) steps; the mask of
every refused token, needed only where the grammar refuses the chain's first draw, refuses whole groups
of tokens by their first character, and is kept per state (see mask()).
"""

from __future__ import annotations

import bisect
import weakref
from dataclasses import dataclass

from .errors import UsageError

MAX_REPETITIONS = 2000     # llama.cpp's MAX_REPETITION_THRESHOLD: {m,n} beyond it is refused


class GrammarError(UsageError):
    pass


@dataclass(frozen=True)
class CharClass:
    """Characters as inclusive code point ranges; negated: every other character; `.` is negated
    with no ranges."""
    ranges: tuple[tuple[int, int], ...]
    negated: bool = False

    def matches(self, c: int) -> bool:
        inside = any(lo <= c <= hi for lo, hi in self.ranges)
        return inside != self.negated

    def matches_partial(self, value: int, n_remain: int) -> bool:
        """Whether an incomplete UTF-8 character (its leading bits `value`, `n_remain` continuation
        bytes to come) could match: a positive class where one of its ranges meets the code points it
        can become, a negated one where none does (llama.cpp's rule, quirks included)."""
        if n_remain < 0 or (n_remain == 1 and value < 2):
            return False
        low = value << (6 * n_remain)
        high = low | ((1 << (6 * n_remain)) - 1)
        if low == 0:
            low = {2: 1 << 11, 3: 1 << 16}.get(n_remain, low)
        if self.negated and not self.ranges:       # `.`
            return True
        hit = any(lo <= high and low <= hi for lo, hi in self.ranges)
        return hit != self.negated


# -- parsing -------------------------------------------------------------------------------------

def _is_word(ch: str) -> bool:
    return ch.isascii() and (ch.isalnum() or ch == "-")


class _Parser:
    def __init__(self, text: str):
        self.s = text
        self.names: dict[str, int] = {}        # rule name -> id (referenced or defined)
        self.rules: dict[int, list[tuple]] = {}  # id -> alternatives (tuples of elements)
        self.generated = 0

    def fail(self, what: str, pos: int):
        line = self.s.count("\n", 0, pos) + 1
        near = self.s[pos:pos + 20].split("\n")[0]
        raise GrammarError(f"grammar: {what} at line {line}" + (f" near {near!r}" if near else ""))

    def symbol(self, name: str) -> int:
        return self.names.setdefault(name, len(self.names))

    def new_rule(self, base: str) -> int:
        self.generated += 1
        return self.symbol(f"{base}_{len(self.names)}_{self.generated}")

    def space(self, pos: int, newline_ok: bool) -> int:
        s = self.s
        while pos < len(s) and (s[pos] in " \t#" or (newline_ok and s[pos] in "\r\n")):
            if s[pos] == "#":
                while pos < len(s) and s[pos] not in "\r\n":
                    pos += 1
            else:
                pos += 1
        return pos

    def name(self, pos: int) -> int:
        end = pos
        while end < len(self.s) and _is_word(self.s[end]):
            end += 1
        if end == pos:
            self.fail("expected a rule name", pos)
        return end

    def char(self, pos: int) -> tuple[int, int]:
        s = self.s
        if pos >= len(s):
            self.fail("unexpected end of the grammar", pos)
        if s[pos] != "\\":
            return ord(s[pos]), pos + 1
        if pos + 1 >= len(s):
            self.fail("unexpected end of the grammar", pos)
        esc = s[pos + 1]
        if esc in "xuU":
            n = {"x": 2, "u": 4, "U": 8}[esc]
            digits = s[pos + 2:pos + 2 + n]
            if len(digits) != n or any(d not in "0123456789abcdefABCDEF" for d in digits):
                self.fail(f"expected {n} hex digits", pos)
            return int(digits, 16), pos + 2 + n
        simple = {"t": 9, "r": 13, "n": 10, "\\": 92, '"': 34, "[": 91, "]": 93, "-": 45}
        if esc not in simple:
            self.fail("unknown escape", pos)
        return simple[esc], pos + 2

    def parse(self) -> tuple[list[list[tuple]], int, dict[str, int]]:
        pos = self.space(0, True)
        while pos < len(self.s):
            end = self.name(pos)
            name = self.s[pos:end]
            rule_id = self.symbol(name)
            pos = self.space(end, False)
            if not self.s.startswith("::=", pos):
                self.fail("expected ::=", pos)
            pos = self.alternates(self.space(pos + 3, True), rule_id, name, nested=False)
            if pos < len(self.s) and self.s[pos] not in "\r\n":
                self.fail("expected the end of the rule", pos)
            pos = self.space(pos, True)
        if "root" not in self.names:
            raise GrammarError("grammar: no root rule")
        for name, rule_id in self.names.items():
            if rule_id not in self.rules:
                raise GrammarError(f"grammar: rule {name} is used but never defined")
        rules = [self.rules[i] for i in range(len(self.names))]
        return rules, self.names["root"], self.names

    def alternates(self, pos: int, rule_id: int, name: str, nested: bool) -> int:
        alts = []
        seq, pos = self.sequence(pos, name, nested)
        alts.append(seq)
        while pos < len(self.s) and self.s[pos] == "|":
            seq, pos = self.sequence(self.space(pos + 1, True), name, nested)
            alts.append(seq)
        self.rules[rule_id] = alts
        return pos

    def sequence(self, pos: int, name: str, nested: bool) -> tuple[tuple, int]:
        s = self.s
        items: list[list] = []               # each item: its elements (a literal: one per character)
        while pos < len(s):
            ch = s[pos]
            if ch == '"':
                pos += 1
                item = []
                while pos < len(s) and s[pos] != '"':
                    c, pos = self.char(pos)
                    item.append(CharClass(((c, c),)))
                if pos >= len(s):
                    self.fail("unterminated literal", pos)
                items.append(item)
                pos = self.space(pos + 1, nested)
            elif ch == "[":
                pos += 1
                negated = pos < len(s) and s[pos] == "^"
                pos += negated
                ranges = []
                while pos < len(s) and s[pos] != "]":
                    lo, pos = self.char(pos)
                    hi = lo
                    if pos + 1 < len(s) and s[pos] == "-" and s[pos + 1] != "]":
                        hi, pos = self.char(pos + 1)
                    ranges.append((lo, hi))
                if pos >= len(s):
                    self.fail("unterminated character class", pos)
                items.append([CharClass(tuple(ranges), negated)])
                pos = self.space(pos + 1, nested)
            elif _is_word(ch):
                end = self.name(pos)
                items.append([self.symbol(s[pos:end])])
                pos = self.space(end, nested)
            elif ch == "(":
                sub = self.new_rule(name)
                pos = self.alternates(self.space(pos + 1, True), sub, name, nested=True)
                if pos >= len(s) or s[pos] != ")":
                    self.fail("expected )", pos)
                items.append([sub])
                pos = self.space(pos + 1, nested)
            elif ch == ".":
                items.append([CharClass((), True)])
                pos = self.space(pos + 1, nested)
            elif ch in "*+?{":
                if not items:
                    self.fail(f"nothing before {ch} to repeat", pos)
                if ch == "{":
                    pos = self.space(pos + 1, nested)
                    lo_end = self.int_end(pos)
                    lo = int(s[pos:lo_end])
                    pos = self.space(lo_end, nested)
                    hi: int | None = lo
                    if pos < len(s) and s[pos] == ",":
                        pos = self.space(pos + 1, nested)
                        hi = None
                        if pos < len(s) and s[pos].isdigit():
                            hi_end = self.int_end(pos)
                            hi = int(s[pos:hi_end])
                            pos = self.space(hi_end, nested)
                    if pos >= len(s) or s[pos] != "}":
                        self.fail("expected }", pos)
                    if hi is not None and hi < lo:
                        self.fail("a repetition's maximum is below its minimum", pos)
                    if max(lo, hi or 0) > MAX_REPETITIONS:
                        self.fail(f"more than {MAX_REPETITIONS} repetitions", pos)
                else:
                    lo, hi = {"*": (0, None), "+": (1, None), "?": (0, 1)}[ch]
                items[-1] = self.repeat(items[-1], lo, hi, name)
                pos = self.space(pos + 1, nested)
            elif ch == "<" or (ch == "!" and s.startswith("<", pos + 1)):
                self.fail("token references are not supported", pos)
            else:
                break
        return tuple(e for item in items for e in item), pos

    def int_end(self, pos: int) -> int:
        end = pos
        while end < len(self.s) and self.s[end].isdigit():
            end += 1
        if end == pos:
            self.fail("expected an integer", pos)
        return end

    def repeat(self, item: list, lo: int, hi: int | None, name: str) -> list:
        """The elements of `item` repeated lo..hi times (hi None: no limit)."""
        out = list(item) * lo
        if hi is None:
            star = self.new_rule(name)                   # star ::= item star | ""
            self.rules[star] = [tuple(item) + (star,), ()]
            return out + [star]
        tail: tuple = ()
        for _ in range(hi - lo):                         # opt ::= item opt' | ""  (nested, unambiguous)
            opt = self.new_rule(name)
            self.rules[opt] = [tuple(item) + tail, ()]
            tail = (opt,)
        return out + list(tail)


def _check_left_recursion(rules: list[list[tuple]], names: dict[str, int]) -> None:
    nullable = [False] * len(rules)
    changed = True
    while changed:
        changed = False
        for i, alts in enumerate(rules):
            if not nullable[i] and any(all(isinstance(e, int) and nullable[e] for e in alt) for alt in alts):
                nullable[i] = changed = True
    state = [0] * len(rules)                   # 0 unvisited, 1 in progress, 2 done
    by_id = {v: k for k, v in names.items()}

    def visit(i: int) -> None:
        state[i] = 1
        for alt in rules[i]:
            for e in alt:
                if not isinstance(e, int):
                    break
                if state[e] == 1:
                    # (generated rules are named after the rule they come from, then "_")
                    raise GrammarError(f"grammar: left recursion through rule {by_id[e].split('_')[0]}")
                if state[e] == 0:
                    visit(e)
                if not nullable[e]:
                    break
        state[i] = 2

    for i in range(len(rules)):
        if state[i] == 0:
            visit(i)


# -- recognizing ---------------------------------------------------------------------------------

class Grammar:
    """A parsed grammar: every rule's alternatives as sequences (seqs, alt_ids), each a tuple of
    CharClass / rule ids."""

    def __init__(self, text: str):
        rules, self.root, names = _Parser(text).parse()
        try:
            _check_left_recursion(rules, names)
        except RecursionError:
            raise GrammarError("grammar: rules nested too deeply without a character between them") from None
        # every alternative as a sequence id; a stack frame is (sequence id, index)
        self.seqs: list[tuple] = []
        self.alt_ids: list[list[int]] = []
        for alts in rules:
            ids = []
            for alt in alts:
                ids.append(len(self.seqs))
                self.seqs.append(alt)
            self.alt_ids.append(ids)

    def _expand(self, rule: int, rest: tuple, out: set) -> None:
        for sid in self.alt_ids[rule]:
            if self.seqs[sid]:
                self._advance(rest + ((sid, 0),), out)
            else:
                self._advance(rest, out)

    def _advance(self, stack: tuple, out: set) -> None:
        """The stacks `stack` leads to with a character class (or nothing: complete) on top."""
        if not stack:
            out.add(stack)
            return
        sid, i = stack[-1]
        elem = self.seqs[sid][i]
        if isinstance(elem, int):
            rest = stack[:-1] + (((sid, i + 1),) if i + 1 < len(self.seqs[sid]) else ())
            self._expand(elem, rest, out)
        else:
            out.add(stack)

    def initial(self) -> frozenset:
        out: set = set()
        try:
            self._expand(self.root, (), out)
        except RecursionError:
            raise GrammarError("grammar: rules nested too deeply without a character between them") from None
        return frozenset(out)

    def step(self, stacks: frozenset, c: int) -> frozenset:
        """The stacks after one more character."""
        out: set = set()
        try:
            for stack in stacks:
                if not stack:
                    continue
                sid, i = stack[-1]
                if self.seqs[sid][i].matches(c):
                    self._advance(stack[:-1] + (((sid, i + 1),) if i + 1 < len(self.seqs[sid]) else ()), out)
        except RecursionError:
            raise GrammarError("grammar: rules nested too deeply without a character between them") from None
        return frozenset(out)

    def accepts(self, text: str, complete: bool = True) -> bool:
        """Whether `text` is in the language (complete) or a prefix of a string in it."""
        stacks = self.initial()
        for ch in text:
            stacks = self.step(stacks, ord(ch))
            if not stacks:
                return False
        return () in stacks if complete else True


def decode_utf8(data: bytes, value: int, n_remain: int) -> tuple[list[int], int, int]:
    """Code points of `data` continuing an incomplete character (value, n_remain), as llama.cpp's
    decode_utf8: (code points, value, n_remain) with n_remain -1 for an invalid sequence (whose code
    points are then none)."""
    lead = (1, 1, 1, 1, 1, 1, 1, 1, 0, 0, 0, 0, 2, 2, 3, 4)
    out: list[int] = []
    pos = 0
    started = n_remain > 0
    while pos < len(data) and n_remain > 0:
        b = data[pos]
        if b >> 6 != 2:
            return [], 0, -1
        value = (value << 6) + (b & 0x3F)
        pos += 1
        n_remain -= 1
    if started and n_remain == 0:
        out.append(value)
    while pos < len(data):
        b = data[pos]
        n_remain = lead[b >> 4] - 1
        if n_remain < 0:
            return [], 0, -1
        value = b & ((1 << (7 - n_remain)) - 1)
        pos += 1
        while pos < len(data) and n_remain > 0:
            value = (value << 6) + (data[pos] & 0x3F)
            pos += 1
            n_remain -= 1
        if n_remain == 0:
            out.append(value)
    return out, value, n_remain


_SORTED_TEXTS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def _sorted_texts(tokenizer, n_vocab: int) -> tuple[list[tuple], list[int], list[int]]:
    """A vocabulary's texts of whole characters as code point tuples, sorted (a trie in a list:
    the tokens that share a prefix are neighbours), their token ids in that order, and the ids of the
    other tokens (end of generation, empty or zero-led texts, an invalid or incomplete character);
    computed once per tokenizer."""
    index = _SORTED_TEXTS.get(tokenizer)
    if index is None:
        entries, rest = [], []
        for t in range(n_vocab):
            piece = tokenizer.token_to_piece(t)
            cps, _, n_remain = decode_utf8(piece, 0, 0) if piece and piece[0] != 0 else ([], 0, -1)
            if cps and n_remain == 0 and not tokenizer.is_eog(t):
                entries.append((tuple(cps), t))
            else:
                rest.append(t)
        entries.sort()
        index = _SORTED_TEXTS[tokenizer] = ([k for k, _ in entries], [t for _, t in entries], rest)
    return index


class GrammarState:
    """A grammar during generation: its stacks and the incomplete character the text ends in."""

    def __init__(self, grammar: Grammar, tokenizer):
        self.g = grammar
        self.tokenizer = tokenizer
        self.stacks = grammar.initial()
        self.partial = (0, 0)
        self._step_cache: dict = {}
        self._masks: dict = {}         # (stacks, partial) -> refused ids: states recur (inside a string)

    def _step(self, stacks: frozenset, c: int) -> frozenset:
        key = (stacks, c)
        hit = self._step_cache.get(key)
        if hit is None:
            if len(self._step_cache) > 200_000:
                self._step_cache.clear()
            hit = self._step_cache[key] = self.g.step(stacks, c)
        return hit

    def _after(self, piece: bytes) -> tuple[frozenset, int, int] | None:
        """The stacks and partial character after a token's bytes; None where they reject it."""
        cps, value, n_remain = decode_utf8(piece, *self.partial)
        if n_remain < 0:
            return None
        stacks = self.stacks
        for c in cps:
            stacks = self._step(stacks, c)
            if not stacks:
                return None
        if n_remain > 0 and not any(s and self.g.seqs[s[-1][0]][s[-1][1]].matches_partial(value, n_remain)
                                    for s in stacks):
            return None
        return stacks, value, n_remain

    def allows(self, token: int) -> bool:
        if self.tokenizer.is_eog(token):
            return () in self.stacks
        piece = self.tokenizer.token_to_piece(token)
        if not piece or piece[0] == 0:
            return False
        return self._after(piece) is not None

    def _walk(self, keys, ids, lo: int, hi: int, depth: int, stacks: frozenset, refused: list) -> None:
        """Tokens lo..hi of the sorted texts share their first `depth` characters, after which the
        stacks are `stacks` (not empty): those that end there are allowed; the rest go on by their next
        character, a character no stack takes refusing all of its tokens at once."""
        i = lo
        while i < hi and len(keys[i]) == depth:       # the shorter keys sort first
            i += 1
        while i < hi:
            c = keys[i][depth]
            j = bisect.bisect_left(keys, keys[i][:depth] + (c + 1,), i, hi)
            after = self._step(stacks, c)
            if after:
                self._walk(keys, ids, i, j, depth + 1, after, refused)
            else:
                refused.extend(ids[i:j])
            i = j

    def mask(self, n_vocab: int) -> list[int]:
        """Every token id the grammar refuses here. Without a pending character, the tokens are
        walked as a trie of their texts (_sorted_texts): a prefix no stack takes refuses every token
        that starts with it at once."""
        key = (self.stacks, self.partial)
        refused = self._masks.get(key)
        if refused is None:
            if len(self._masks) > 64:
                self._masks.clear()
            if self.partial[1] > 0:
                refused = [t for t in range(n_vocab) if not self.allows(t)]
            else:
                keys, ids, rest = _sorted_texts(self.tokenizer, n_vocab)
                refused = [t for t in rest if not self.allows(t)]
                self._walk(keys, ids, 0, len(keys), 0, self.stacks, refused)
            self._masks[key] = refused
        return refused

    def accept(self, token: int) -> None:
        if self.tokenizer.is_eog(token):
            return
        after = self._after(self.tokenizer.token_to_piece(token))
        if after is None:            # llama.cpp throws here: the sampler never picks such a token
            raise GrammarError("grammar: the token taken does not continue the grammar")
        self.stacks, value, n_remain = after
        self.partial = (value, n_remain)
