"""Grammar mode (WebLLM's response_format {type: "grammar", grammar: "<GBNF>"}): a GBNF
grammar compiled to a pushdown recognizer over characters, and a byte-level grammar over it
for token_mask.GrammarMask: every answer is a text of the grammar's language.

The GBNF subset (llama.cpp's notation; anything else is refused with GrammarError
"bad-grammar", naming the line and column, before any generation):

  name ::= body          rules; names are letters, digits, "-" and "_"; `root` is the start.
                         A rule's body runs until the next `name ::=` (it may span lines)
  "text"                 a literal; escapes \\n \\r \\t \\\\ \\" \\xHH \\uHHHH \\UHHHHHHHH
  [a-z0-9_] [^"\\\\]       character classes, with ranges and the same escapes; "." any character
  a b, a | b, ( ... )    sequence, alternation, grouping
  x? x* x+ x{m} x{m,} x{m,n}
  # ...                  a comment to the end of the line

Checked before generation: every rule referred to is defined, `root` exists, no rule is
left-recursive (a rule that can call itself before reading a character: its readings would
never end), every rule can derive some finite text (so no state is a dead end), and the
limits below (the grammar is untrusted input: its size, its rules, the automaton it makes).

The recognizer: each rule is a Thompson NFA whose edges read a character or call a rule. A
stack is a tuple of nodes: the return points of the calls in progress, then the node at hand
(a character node); the empty tuple is "root has ended". A state is a frozenset of stacks
(every live reading of the text so far). A call whose return point has nothing left to
read is not pushed (a tail call), so right recursion (`list ::= item ("," list)?`) keeps the
stack short; a stack deeper than MAX_STACK and readings beyond MAX_STACKS (the ones sorting
last) are dropped, which only narrows what may follow: every text is still in the language,
but a grammar nested that deep may have no way left to end (stated in docs/js-api.md).

`TextGrammar` reads bytes: UTF-8 sequences are decoded as they come (schema_scalars'
utf8_lead/utf8_next: a half-read character is live when some character it may still become
is taken), every character including controls is fed to the recognizer as it is.
"""
from __future__ import annotations

from . import schema_scalars as sc
from .char_pattern import contains, is_empty, overlaps
from .sampler import SamplerError

MAX_GRAMMAR_CHARS = 32768
MAX_RULES = 256
MAX_NODES = 16384            # NFA nodes over all rules, {m,n} copies included
MAX_REPEAT = 256             # m and n of x{m,n}
MAX_STACK = 128              # calls in progress in one reading
MAX_STACKS = 256             # readings kept per state
MAX_STEP_CACHE = 1 << 18
HEX = "0123456789abcdefABCDEF"


class GrammarError(SamplerError):
    """Code "bad-grammar": the grammar is outside the subset, malformed, or over a limit."""


# -- parsing ------------------------------------------------------------------------------------
# Trees: ("set", negated, ranges), ("cat", parts), ("alt", parts), ("rep", part, m, n|None),
# ("ref", name, position)

class _Parser:
    def __init__(self, text: str):
        self.text, self.i = text, 0

    def fail(self, sentence: str, at: int | None = None):
        at = self.i if at is None else at
        line = self.text.count("\n", 0, at) + 1
        column = at - (self.text.rfind("\n", 0, at) + 1) + 1
        raise GrammarError("bad-grammar", "response_format.grammar", f"line {line}, column {column}: {sentence}")

    def blank(self) -> None:
        while self.i < len(self.text):
            ch = self.text[self.i]
            if ch == "#":
                end = self.text.find("\n", self.i)
                self.i = len(self.text) if end < 0 else end
            elif ch in " \t\r\n":
                self.i += 1
            else:
                return

    def name(self) -> str | None:
        start = self.i
        while self.i < len(self.text) and (self.text[self.i].isascii() and (self.text[self.i].isalnum()
                                                                             or self.text[self.i] in "-_")):
            self.i += 1
        return self.text[start:self.i] or None

    def rule_starts_here(self) -> bool:
        saved = self.i
        try:
            if self.name() is None:
                return False
            self.blank()
            return self.text.startswith("::=", self.i)
        finally:
            self.i = saved

    def grammar(self) -> dict:
        rules: dict = {}
        self.blank()
        while self.i < len(self.text):
            at = self.i
            name = self.name()
            if name is None:
                self.fail("expected a rule name")
            self.blank()
            if not self.text.startswith("::=", self.i):
                self.fail(f"expected ::= after the rule name {name!r}")
            self.i += 3
            if name in rules:
                self.fail(f"the rule {name!r} is defined twice", at)
            if len(rules) >= MAX_RULES:
                self.fail(f"more than {MAX_RULES} rules", at)
            rules[name] = self.alternation()
            self.blank()
        return rules

    def alternation(self):
        parts = [self.sequence()]
        while True:
            self.blank()
            if not self.text.startswith("|", self.i):
                return parts[0] if len(parts) == 1 else ("alt", parts)
            self.i += 1
            parts.append(self.sequence())

    def sequence(self):
        parts = []
        while True:
            self.blank()
            if self.i >= len(self.text) or self.text[self.i] in "|)" or self.rule_starts_here():
                return ("cat", parts)
            parts.append(self.repeat(self.atom()))

    def repeat(self, atom):
        while self.i < len(self.text):
            ch = self.text[self.i]
            if ch in "?*+":
                self.i += 1
                atom = ("rep", atom, *{"?": (0, 1), "*": (0, None), "+": (1, None)}[ch])
            elif ch == "{":
                end = self.text.find("}", self.i)
                head, comma, tail = self.text[self.i + 1:end if end > 0 else self.i].partition(",")
                head, tail = head.strip(), tail.strip()
                if end < 0 or not (head.isascii() and head.isdigit()) or (tail and not (tail.isascii() and tail.isdigit())):
                    self.fail("a repeat must be {m}, {m,} or {m,n}")
                low, high = int(head), (int(tail) if tail else None) if comma else int(head)
                if low > MAX_REPEAT or (high is not None and high > MAX_REPEAT):
                    self.fail(f"a repeat bound above {MAX_REPEAT}")
                if high is not None and high < low:
                    self.fail(f"{{{low},{high}}}: the maximum is below the minimum")
                self.i = end + 1
                atom = ("rep", atom, low, high)
            else:
                break
        return atom

    def atom(self):
        at = self.i
        ch = self.text[self.i]
        if ch == '"':
            self.i += 1
            chars = []
            while True:
                if self.i >= len(self.text):
                    self.fail("a literal is not closed", at)
                ch = self.text[self.i]
                if ch == '"':
                    self.i += 1
                    return ("cat", [("set", False, ((c, c),)) for c in chars])
                chars.append(self.char())
        if ch == "[":
            return self.char_class()
        if ch == ".":
            self.i += 1
            return ("set", True, ())                           # any character
        if ch == "(":
            self.i += 1
            inner = self.alternation()
            self.blank()
            if not self.text.startswith(")", self.i):
                self.fail("a group is not closed", at)
            self.i += 1
            return inner
        name = self.name()
        if name is None:
            self.fail(f"unexpected {ch!r}")
        return ("ref", name, at)

    def char(self) -> int:
        """One character of a literal or a class (an escape read whole)."""
        ch = self.text[self.i]
        self.i += 1
        if ch != "\\":
            if ch == "\n":
                self.fail("a line break inside a literal or class (write \\n)", self.i - 1)
            return ord(ch)
        if self.i >= len(self.text):
            self.fail("an escape at the end of the grammar")
        ch = self.text[self.i]
        self.i += 1
        simple = {"n": 10, "r": 13, "t": 9, "\\": 92, '"': 34, "[": 91, "]": 93, "-": 45, "^": 94, "/": 47}
        if ch in simple:
            return simple[ch]
        digits = {"x": 2, "u": 4, "U": 8}.get(ch)
        if digits is None:
            self.fail(f"the escape \\{ch} is not supported", self.i - 2)
        hexes = self.text[self.i:self.i + digits]
        if len(hexes) != digits or not all(c in HEX for c in hexes):
            self.fail(f"\\{ch} needs {digits} hex digits", self.i - 2)
        self.i += digits
        value = int(hexes, 16)
        if value > 0x10FFFF or 0xD800 <= value <= 0xDFFF:
            self.fail(f"\\{ch}{hexes} is not a character", self.i - digits - 2)
        return value

    def char_class(self):
        at = self.i
        self.i += 1
        negated = self.text.startswith("^", self.i)
        self.i += negated
        ranges = []
        while True:
            if self.i >= len(self.text):
                self.fail("a character class is not closed", at)
            if self.text[self.i] == "]":
                self.i += 1
                break
            low = self.char()
            high = low
            if self.text.startswith("-", self.i) and not self.text.startswith("-]", self.i):
                self.i += 1
                if self.i >= len(self.text):
                    self.fail("a character class is not closed", at)
                high = self.char()
                if high < low:
                    self.fail("a class range is out of order", at)
            ranges.append((low, high))
        charset = (negated, tuple(sorted(ranges)))
        if is_empty(charset):
            self.fail("a character class that takes no character", at)
        return ("set", *charset)


# -- compiling: rules -> NFAs --------------------------------------------------------------------

class Grammar:
    """The pushdown recognizer over characters (module docstring): `initial`, `step(state,
    char)`, `accepting`, `may_take(state, low, high)`, as char_pattern.CharAutomaton."""

    def __init__(self, text: str):
        if not isinstance(text, str) or not text.strip():
            raise GrammarError("bad-grammar", "response_format.grammar", "must be a non-empty string")
        if len(text) > MAX_GRAMMAR_CHARS:
            raise GrammarError("bad-grammar", "response_format.grammar", f"is longer than {MAX_GRAMMAR_CHARS} characters")
        self._parser = _Parser(text)
        trees = self._parser.grammar()
        if "root" not in trees:
            raise GrammarError("bad-grammar", "response_format.grammar", "has no rule named root")
        self.names = list(trees)
        self.sets: list = []            # per node: its character set, or None
        self.calls: list = []           # per node: the rule it calls (an index), or None
        self.edges: list[list[int]] = []
        self.rule_of_end: dict[int, int] = {}
        self.starts, self.ends = [], []
        for index, name in enumerate(self.names):
            start, end = self._build(trees[name])
            self.starts.append(start)
            self.ends.append(end)
            self.rule_of_end[end] = index
        self._check()
        self._tail = self._tails()
        self._steps: dict = {}
        self.initial = self._settle([(self.starts[self.names.index("root")],)])

    def _node(self, charset=None, call=None) -> int:
        if len(self.sets) >= MAX_NODES:
            raise GrammarError("bad-grammar", "response_format.grammar",
                               f"compiles to more than {MAX_NODES} automaton nodes (large repeats?)")
        self.sets.append(charset)
        self.calls.append(call)
        self.edges.append([])
        return len(self.sets) - 1

    def _build(self, tree) -> tuple[int, int]:
        kind = tree[0]
        if kind == "set":
            node, end = self._node(charset=(tree[1], tree[2])), self._node()
            self.edges[node].append(end)
            return node, end
        if kind == "ref":
            if tree[1] not in self.names:
                self._parser.fail(f"the rule {tree[1]!r} is not defined", tree[2])
            node, end = self._node(call=self.names.index(tree[1])), self._node()
            self.edges[node].append(end)
            return node, end
        if kind == "cat":
            start = end = self._node()
            for part in tree[1]:
                s, e = self._build(part)
                self.edges[end].append(s)
                end = e
            return start, end
        if kind == "alt":
            start, end = self._node(), self._node()
            for part in tree[1]:
                s, e = self._build(part)
                self.edges[start].append(s)
                self.edges[e].append(end)
            return start, end
        _, part, low, high = tree                            # rep
        start = end = self._node()
        for _ in range(low):
            s, e = self._build(part)
            self.edges[end].append(s)
            end = e
        final = self._node()
        if high is None:
            s, e = self._build(part)
            self.edges[end] += [s, final]
            self.edges[e] += [s, final]
            return start, final
        for _ in range(high - low):
            self.edges[end].append(final)
            s, e = self._build(part)
            self.edges[end].append(s)
            end = e
        self.edges[end].append(final)
        return start, final

    # -- checks before any generation ------------------------------------------------------------

    def _reaches_end(self, rule: int, passable) -> bool:
        """Whether the rule's end is reachable from its start through nodes `passable` lets by."""
        seen, todo = {self.starts[rule]}, [self.starts[rule]]
        while todo:
            node = todo.pop()
            if node == self.ends[rule]:
                return True
            if passable(node):
                for nxt in self.edges[node]:
                    if nxt not in seen:
                        seen.add(nxt)
                        todo.append(nxt)
        return False

    def _check(self) -> None:
        rules = range(len(self.names))
        productive: set[int] = set()
        nullable: set[int] = set()
        changed = True
        while changed:
            changed = False
            for r in rules:
                if r not in productive and self._reaches_end(r, lambda n: self.calls[n] is None or self.calls[n] in productive):
                    productive.add(r)
                    changed = True
                if r not in nullable and self._reaches_end(r, lambda n: self.sets[n] is None and (
                        self.calls[n] is None or self.calls[n] in nullable)):
                    nullable.add(r)
                    changed = True
        for r in rules:
            if r not in productive:
                raise GrammarError("bad-grammar", "response_format.grammar",
                                   f"the rule {self.names[r]!r} derives no finite text (it never ends)")
        # left calls: the rules a rule may call before reading a character
        left = {r: self._left_calls(r, nullable) for r in rules}
        for r in rules:
            seen, todo = set(), list(left[r])
            while todo:
                q = todo.pop()
                if q == r:
                    raise GrammarError("bad-grammar", "response_format.grammar",
                                       f"the rule {self.names[r]!r} is left-recursive (it can call itself "
                                       "before reading a character): write the repeat with * or + instead")
                if q not in seen:
                    seen.add(q)
                    todo.extend(left[q])

    def _left_calls(self, rule: int, nullable: set) -> set[int]:
        out, seen, todo = set(), {self.starts[rule]}, [self.starts[rule]]
        while todo:
            node = todo.pop()
            if self.sets[node] is not None:
                continue
            if self.calls[node] is not None:
                out.add(self.calls[node])
                if self.calls[node] not in nullable:
                    continue
            for nxt in self.edges[node]:
                if nxt not in seen:
                    seen.add(nxt)
                    todo.append(nxt)
        return out

    def _tails(self) -> list[bool]:
        """Per node: whether nothing is left to read from it to its rule's end (epsilon only)."""
        tail = [n in self.rule_of_end for n in range(len(self.sets))]
        changed = True
        while changed:
            changed = False
            for n in range(len(self.sets)):
                if not tail[n] and self.sets[n] is None and self.calls[n] is None and self.edges[n] \
                        and all(tail[t] for t in self.edges[n]):
                    tail[n] = changed = True
        return tail

    # -- the recognizer ------------------------------------------------------------------------

    def _settle(self, stacks) -> frozenset | None:
        """Every stack reachable without reading, stopped at character nodes (or () at the end)."""
        out, seen, todo = set(), set(stacks), list(stacks)
        while todo:
            stack = todo.pop()
            node = stack[-1]
            if self.sets[node] is not None:
                out.add(stack)
                continue
            if self.calls[node] is not None:
                back = self.edges[node][0]
                pushed = stack[:-1] + ((back,) if not self._tail[back] else ()) + (self.starts[self.calls[node]],)
                nexts = [pushed] if len(pushed) <= MAX_STACK else []
            elif node in self.rule_of_end and len(stack) > 1:
                nexts = [stack[:-1]]
            elif node in self.rule_of_end:
                out.add(())
                nexts = []
            else:
                nexts = [stack[:-1] + (t,) for t in self.edges[node]]
            for nxt in nexts:
                if nxt not in seen:
                    seen.add(nxt)
                    todo.append(nxt)
        if len(out) > MAX_STACKS:
            out = set(sorted(out)[:MAX_STACKS])
        return frozenset(out) if out else None

    def step(self, state: frozenset, char: int) -> frozenset | None:
        key = (state, char)
        after = self._steps.get(key, False)
        if after is False:
            moved = [stack[:-1] + (self.edges[stack[-1]][0],) for stack in state
                     if stack and contains(self.sets[stack[-1]], char)]
            after = self._settle(moved) if moved else None
            if len(self._steps) >= MAX_STEP_CACHE:
                self._steps.clear()
            self._steps[key] = after
        return after

    def accepting(self, state: frozenset) -> bool:
        return () in state

    def may_take(self, state: frozenset, low: int, high: int) -> bool:
        return any(stack and overlaps(self.sets[stack[-1]], low, high) for stack in state)


class TextGrammar:
    """token_mask's grammar: the Grammar read byte by byte (UTF-8 decoded as it comes)."""

    def __init__(self, grammar: Grammar):
        self.grammar = grammar
        self.initial = (grammar.initial, ())
        self._steps: dict = {}
        self._interned: dict = {}
        self._closing = None

    def step(self, state, byte: int):
        key = (state, byte)
        after = self._steps.get(key, False)
        if after is False:
            chars, pending = state
            if pending:
                after = sc.utf8_next(self.grammar, chars, pending, byte)
            elif byte < 0x80:
                moved = self.grammar.step(chars, byte)
                after = None if moved is None else (moved, ())
            else:
                after = sc.utf8_lead(self.grammar, chars, byte)
            if len(self._steps) >= MAX_STEP_CACHE:
                self._steps.clear()
                self._interned.clear()
            if after is not None:       # one object per state: the mask's closing() memo goes by identity
                after = self._interned.setdefault(after, after)
            self._steps[key] = after
        return after

    def accepting(self, state) -> bool:
        return not state[1] and self.grammar.accepting(state[0])

    def finished(self, state) -> bool:
        return not state[1] and state[0] == frozenset({()})

    def in_string(self, state) -> bool:
        return False

    def closing(self, state) -> float:
        """The fewest bytes that finish a text of the language from `state` (closing.py states the rule)."""
        if self._closing is None:
            from .closing import GrammarClosing
            self._closing = GrammarClosing(self.grammar)
        return self._closing(state)

    def advance(self, state, data: bytes):
        for byte in data:
            state = self.step(state, byte)
            if state is None:
                return None
        return state


_COMPILED: dict = {}
MAX_COMPILED = 16


def compile_grammar(text: str) -> TextGrammar:
    """The TextGrammar of a GBNF text (GrammarError if it is refused); the 16 used last are kept."""
    grammar = _COMPILED.pop(text, None) or TextGrammar(Grammar(text))
    _COMPILED[text] = grammar
    while len(_COMPILED) > MAX_COMPILED:
        _COMPILED.pop(next(iter(_COMPILED)))
    return grammar


MAX_GRAMMAR_MASKS = 8


def grammar_mask_for(tokenizer, vocab: int, eos_ids, text: str):
    """The GrammarMask of a grammar on this tokenizer, kept while among the 8 used last."""
    from .token_mask import kept_mask
    return kept_mask(tokenizer, "grammar", text, vocab, eos_ids, compile_grammar, MAX_GRAMMAR_MASKS)
