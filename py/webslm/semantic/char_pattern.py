"""JSON-schema string constraints (pattern, format, minLength, maxLength) as one automaton over
characters, for json_schema.py's constrained strings.

The pattern subset (anything else raises PatternError, which names what was refused):

  literals            any character; \\ escapes of punctuation (\\. \\- \\[ ...), \\t \\n \\r \\f \\v \\0,
                      \\xHH, \\uHHHH
  classes             [abc] [a-z] [^...], with \\d \\w \\s (and \\D \\W \\S) inside or outside; "."
                      is any character but a line break (\\n \\r U+2028 U+2029), as in ECMA-262
  repeats             ? * + {m} {m,} {m,n} (a lazy "?" after one changes nothing: the whole
                      string must match either way); at most MAX_REPEAT copies
  alternation, groups a|b, (...), (?:...)
  anchors             the whole string must match: a leading ^ and a trailing $ are taken
                      as said; without them the match is still the whole string (a subset
                      of what JSON Schema's unanchored search allows, so the answer is
                      valid either way). ^ or $ anywhere else is refused.
  refused             back-references, lookaround, named groups, \\b \\B \\p \\k \\c, flags.

\\d is [0-9], \\w [A-Za-z0-9_], \\s [ \\t\\n\\r\\f\\v]: the ASCII forms (ECMA-262's \\d and \\w;
Python's re takes more, so what is generated matches in either).

`CharAutomaton(pattern, min_length, max_length)`: a Thompson NFA; a state is
(frozenset of NFA nodes, characters so far), the count capped where it stops mattering.
`step(state, char)` is the next state or None when no string of the language starts with
what has been read (so a state is never a dead end: every state can reach an end);
`accepting(state)`; `may_take(state, low, high)`: whether some character in [low, high] has a
live next state (for a UTF-8 sequence or a \\u escape half read).

Liveness with lengths: for every NFA node, the set of lengths of the paths from it to the
end, as an int bitset over 0..K (K = max_length, or min_length when there is no maximum:
then bit K means "K or more"); a state is live when one of its nodes has a length that
makes the total land in [min_length, max_length].
"""
from __future__ import annotations

MAX_PATTERN_CHARS = 1000
MAX_NODES = 4096             # NFA nodes after {m,n} copies
MAX_REPEAT = 1000            # m and n of {m,n}
MAX_LENGTH_BOUND = 4096      # minLength / maxLength enforced (a larger one is refused)
MAX_CHAR = 0x10FFFF

DIGIT = ((0x30, 0x39),)
WORD = ((0x30, 0x39), (0x41, 0x5A), (0x5F, 0x5F), (0x61, 0x7A))
SPACE = ((0x09, 0x0D), (0x20, 0x20))
LINE_BREAKS = ((0x0A, 0x0A), (0x0D, 0x0D), (0x2028, 0x2029))
SIMPLE_ESCAPES = {"t": 0x09, "n": 0x0A, "r": 0x0D, "f": 0x0C, "v": 0x0B, "0": 0x00}

# format: regular forms, stated in docs/js-api.md. Dates never use February 29 and years are
# 1000-9999 (so every one is a real date); times have no leap second.
_OCTET = r"(?:25[0-5]|2[0-4]\d|1\d\d|[1-9]?\d)"
_DATE = (r"[1-9]\d{3}-(?:(?:0[13578]|1[02])-(?:0[1-9]|[12]\d|3[01])|(?:0[469]|11)-(?:0[1-9]|[12]\d|30)"
         r"|02-(?:0[1-9]|1\d|2[0-8]))")
_TIME = r"(?:[01]\d|2[0-3]):[0-5]\d:[0-5]\d(?:\.\d{1,6})?(?:Z|[+-](?:[01]\d|2[0-3]):[0-5]\d)"
_LABEL = r"[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?"
FORMATS = {
    "date": _DATE,
    "time": _TIME,
    "date-time": _DATE + "T" + _TIME,
    "uuid": r"[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}",
    "email": r"[A-Za-z0-9_%+-]+(?:\.[A-Za-z0-9_%+-]+)*@" + _LABEL + r"(?:\." + _LABEL + r")*\.[A-Za-z]{2,}",
    "ipv4": _OCTET + r"(?:\." + _OCTET + r"){3}",
}


class PatternError(ValueError):
    """A pattern outside the subset, or a bound beyond the limits (the message says which)."""


# -- parsing: pattern text -> a tree --------------------------------------------------------------
# ("set", negated, ranges) one character; ("cat", parts); ("alt", parts); ("rep", part, m, n|None)

class _Parser:
    def __init__(self, text: str):
        self.text, self.i = text, 0

    def peek(self) -> str | None:
        return self.text[self.i] if self.i < len(self.text) else None

    def take(self) -> str:
        if self.i >= len(self.text):
            raise PatternError("ends in the middle of an escape or a class")
        ch = self.text[self.i]
        self.i += 1
        return ch

    def alternation(self):
        parts = [self.sequence()]
        while self.peek() == "|":
            self.i += 1
            parts.append(self.sequence())
        return parts[0] if len(parts) == 1 else ("alt", parts)

    def sequence(self):
        parts = []
        while self.peek() not in (None, "|", ")"):
            parts.append(self.repeat(self.atom()))
        return ("cat", parts)

    def repeat(self, atom):
        while True:
            ch = self.peek()
            if ch in ("?", "*", "+"):
                self.i += 1
                low, high = {"?": (0, 1), "*": (0, None), "+": (1, None)}[ch]
            elif ch == "{" and self._is_bounds():
                low, high = self._bounds()
            else:
                return atom
            if self.peek() == "?":                       # lazy: the same strings match in full
                self.i += 1
            if self.peek() in ("?", "*", "+", "{") and not (self.peek() == "{" and not self._is_bounds()):
                raise PatternError(f"a repeat of a repeat at {self.i} (nothing to repeat)")
            atom = ("rep", atom, low, high)

    def _is_bounds(self) -> bool:
        end = self.text.find("}", self.i)
        inside = self.text[self.i + 1:end] if end > 0 else ""
        head, _, tail = inside.partition(",")
        return bool(head.isdigit() and head.isascii() and (tail == "" or (tail.isdigit() and tail.isascii())))

    def _bounds(self) -> tuple[int, int | None]:
        end = self.text.index("}", self.i)
        head, comma, tail = self.text[self.i + 1:end].partition(",")
        self.i = end + 1
        low = int(head)
        high = low if not comma else (int(tail) if tail else None)
        if low > MAX_REPEAT or (high is not None and high > MAX_REPEAT):
            raise PatternError(f"a repeat bound above {MAX_REPEAT}")
        if high is not None and high < low:
            raise PatternError(f"{{{low},{high}}}: the maximum is below the minimum")
        return low, high

    def atom(self):
        ch = self.take()
        if ch == "(":
            if self.peek() == "?":
                if self.text[self.i:self.i + 2] != "?:":
                    raise PatternError(f"(?{self.text[self.i + 1:self.i + 2]}...) at {self.i - 1}: lookaround, "
                                       "named groups and flags are not supported")
                self.i += 2
            inner = self.alternation()
            if self.take() != ")":
                raise PatternError("a group is not closed")
            return inner
        if ch == ")":
            raise PatternError(f"an unmatched ) at {self.i - 1}")
        if ch == "[":
            return self.char_class()
        if ch == ".":
            return ("set", True, LINE_BREAKS)
        if ch in "^$":
            raise PatternError(f"the anchor {ch} at {self.i - 1}: only a leading ^ and a trailing $ are supported")
        if ch in "*+?":
            raise PatternError(f"{ch} at {self.i - 1} has nothing to repeat")
        if ch == "{" and self._is_bounds_at(self.i - 1):
            raise PatternError(f"{{ at {self.i - 1} has nothing to repeat")
        if ch == "\\":
            return self.escape(in_class=False)
        return ("set", False, ((ord(ch), ord(ch)),))

    def _is_bounds_at(self, at: int) -> bool:
        saved, self.i = self.i, at
        try:
            return self._is_bounds()
        finally:
            self.i = saved

    def escape(self, in_class: bool):
        at = self.i - 1
        ch = self.take()
        classes = {"d": DIGIT, "w": WORD, "s": SPACE}
        if ch.lower() in classes:
            return ("set", ch.isupper(), classes[ch.lower()])
        if ch in SIMPLE_ESCAPES:
            if ch == "0" and (self.peek() or "").isdigit():
                raise PatternError(f"\\0 followed by a digit at {at} (an octal escape) is not supported")
            return _char(SIMPLE_ESCAPES[ch])
        if ch in "xu":
            digits = self.text[self.i:self.i + (2 if ch == "x" else 4)]
            if len(digits) != (2 if ch == "x" else 4) or not all(c in "0123456789abcdefABCDEF" for c in digits):
                raise PatternError(f"\\{ch} at {at} needs {2 if ch == 'x' else 4} hex digits")
            self.i += len(digits)
            return _char(int(digits, 16))
        if ch.isascii() and ch.isalnum():
            raise PatternError(f"the escape \\{ch} at {at} is not supported (back-references, \\b, \\p, ... )")
        return _char(ord(ch))                             # an escaped punctuation character

    def char_class(self):
        negated = self.peek() == "^"
        if negated:
            self.i += 1
        ranges: list[tuple[int, int]] = []
        first = True
        while True:
            ch = self.take()
            if ch == "]" and not first:
                break
            first = False
            item = self.escape(in_class=True) if ch == "\\" else _char(ord(ch))
            if item[1] or len(item[2]) != 1 or item[2][0][0] != item[2][0][1]:      # \d \W ... in a class
                if item[1]:
                    ranges.extend(_complement(item[2]))
                else:
                    ranges.extend(item[2])
                continue
            low = item[2][0][0]
            if self.peek() == "-" and self.text[self.i + 1:self.i + 2] not in ("]", ""):
                self.i += 1
                nxt = self.take()
                end = self.escape(in_class=True) if nxt == "\\" else _char(ord(nxt))
                if end[1] or end[2][0][0] != end[2][0][1]:
                    raise PatternError("a class range ends in a class (like a-\\d)")
                high = end[2][0][0]
                if high < low:
                    raise PatternError(f"the class range {chr(low)}-{chr(high)} is out of order")
                ranges.append((low, high))
            else:
                ranges.append((low, low))
        return ("set", negated, tuple(sorted(ranges)))


def _char(code: int):
    return ("set", False, ((code, code),))


def _complement(ranges) -> list[tuple[int, int]]:
    out, start = [], 0
    for low, high in sorted(ranges):
        if low > start:
            out.append((start, low - 1))
        start = max(start, high + 1)
    if start <= MAX_CHAR:
        out.append((start, MAX_CHAR))
    return out


def parse(pattern: str):
    """The pattern's tree (PatternError outside the subset)."""
    if not isinstance(pattern, str):
        raise PatternError("must be a string")
    if len(pattern) > MAX_PATTERN_CHARS:
        raise PatternError(f"is longer than {MAX_PATTERN_CHARS} characters")
    body = pattern[1:] if pattern.startswith("^") else pattern
    if body.endswith("$") and not _escaped_at(body, len(body) - 1):
        body = body[:-1]
    parser = _Parser(body)
    tree = parser.alternation()
    if parser.i != len(body):
        raise PatternError(f"an unmatched ) at {parser.i}")
    return tree


def _escaped_at(text: str, i: int) -> bool:
    slashes = 0
    while i - 1 - slashes >= 0 and text[i - 1 - slashes] == "\\":
        slashes += 1
    return slashes % 2 == 1


# -- the NFA ------------------------------------------------------------------------------------

class CharAutomaton:
    """The strings of a pattern (or any string) with a length in [min_length, max_length]."""

    def __init__(self, pattern: str | None, min_length: int = 0, max_length: int | None = None):
        if min_length > MAX_LENGTH_BOUND or (max_length is not None and max_length > MAX_LENGTH_BOUND):
            raise PatternError(f"minLength and maxLength above {MAX_LENGTH_BOUND} are not supported")
        self.min, self.max = min_length, max_length
        self.sets: list[tuple | None] = []          # per node: its character set (None: epsilon node)
        self.edges: list[list[int]] = []
        tree = parse(pattern) if pattern is not None else ("rep", ("set", True, ()), 0, None)
        start, self.end = self._build(tree)
        self.cap = max_length if max_length is not None else min_length
        self._lengths = self._path_lengths()
        self._steps: dict = {}
        first = self._closure({start})
        self.initial = (first, 0)
        if not self._live(first, 0):
            raise PatternError("no string satisfies the pattern and the length bounds together")

    def _node(self, charset=None) -> int:
        if len(self.sets) >= MAX_NODES:
            raise PatternError(f"compiles to more than {MAX_NODES} automaton nodes (large repeats)")
        self.sets.append(charset)
        self.edges.append([])
        return len(self.sets) - 1

    def _build(self, tree) -> tuple[int, int]:
        kind = tree[0]
        if kind == "set":
            node, end = self._node((tree[1], tree[2])), self._node()
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
        _, part, low, high = tree                         # rep
        start = end = self._node()
        for _ in range(low):
            s, e = self._build(part)
            self.edges[end].append(s)
            end = e
        if high is None:
            s, e = self._build(part)
            self.edges[end].append(s)
            self.edges[e].append(s)
            self.edges[e].append(self._node())
            out = self.edges[e][-1]
            self.edges[end].append(out)
            return start, out
        final = self._node()
        for _ in range(high - low):                        # each optional copy may end the repeat
            self.edges[end].append(final)
            s, e = self._build(part)
            self.edges[end].append(s)
            end = e
        self.edges[end].append(final)
        return start, final

    def _closure(self, nodes) -> frozenset:
        seen, todo = set(nodes), list(nodes)
        while todo:
            node = todo.pop()
            if self.sets[node] is None:
                for nxt in self.edges[node]:
                    if nxt not in seen:
                        seen.add(nxt)
                        todo.append(nxt)
        return frozenset(seen)

    def _shift(self, bits: int) -> int:
        """The lengths one character longer, over 0..cap (saturating at cap without a maximum)."""
        full = (1 << (self.cap + 1)) - 1
        out = (bits << 1) & full
        if self.max is None and bits >> self.cap & 1:
            out |= 1 << self.cap
        return out

    def _path_lengths(self) -> list[int]:
        lengths = [0] * len(self.sets)
        lengths[self.end] = 1
        changed = True
        while changed:
            changed = False
            for node in range(len(self.sets) - 1, -1, -1):
                bits = lengths[node]
                for nxt in self.edges[node]:
                    bits |= self._shift(lengths[nxt]) if self.sets[node] is not None else lengths[nxt]
                if self.sets[node] is not None and is_empty(self.sets[node]):
                    bits = lengths[node]
                if bits != lengths[node]:
                    lengths[node], changed = bits, True
        return lengths

    def _window(self, count: int) -> int:
        """The bits of the path lengths that would end inside [min, max] from `count` characters."""
        low = max(self.min - count, 0)
        high = self.cap if self.max is None else self.max - count
        if high < low:
            return 0
        return ((1 << (high + 1)) - 1) & ~((1 << low) - 1)

    def _live(self, nodes: frozenset, count: int) -> bool:
        window = self._window(count)
        return any(self._lengths[n] & window for n in nodes)

    def step(self, state, char: int):
        key = (state, char)
        after = self._steps.get(key, False)
        if after is False:
            nodes, count = state
            targets = {self.edges[n][0] for n in nodes if self.sets[n] is not None and contains(self.sets[n], char)}
            count = count + 1 if self.max is not None else min(count + 1, self.cap)
            after = None
            if targets:
                closed = self._closure(targets)
                if self._live(closed, count):
                    after = (closed, count)
            self._steps[key] = after
        return after

    def accepting(self, state) -> bool:
        nodes, count = state
        return self.end in nodes and count >= self.min and (self.max is None or count <= self.max)

    def may_take(self, state, low: int, high: int) -> bool:
        """Whether some character in [low, high] leads to a live state."""
        nodes, count = state
        count = count + 1 if self.max is not None else min(count + 1, self.cap)
        window = self._window(count)
        return any(self.sets[n] is not None and overlaps(self.sets[n], low, high)
                   and self._lengths[self.edges[n][0]] & window for n in nodes)


def contains(charset, char: int) -> bool:
    negated, ranges = charset
    return any(low <= char <= high for low, high in ranges) != negated


def overlaps(charset, low: int, high: int) -> bool:
    negated, ranges = charset
    if not negated:
        return any(a <= high and low <= b for a, b in ranges)
    return any(a <= high and low <= b for a, b in _complement(ranges))


def is_empty(charset) -> bool:
    negated, ranges = charset
    return not ranges if not negated else not _complement(ranges)
