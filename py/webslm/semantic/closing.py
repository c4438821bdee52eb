"""The shortest way to finish: for a recognizer state of JSON-schema mode (json_schema.py) or
grammar mode (gbnf.py), the fewest bytes that make the text read so far a whole answer (the
schema's JSON value, a text of the grammar's language). token_mask.GrammarMask keeps every
answer closable within its token limit with it (json_grammar.closing is JSON mode's).

The rule: `closing(state)` is the length of a shortest completion, in bytes, over the SAFE
bytes only: the bytes every byte-level vocabulary spells with a token of its own (printable
ASCII, tab, line feed, carriage return, UTF-8 continuation bytes, and the lead bytes of
characters up to plane 3; SmolLM2 lacks single tokens for six control bytes and for C0,
C1, F1, F2, F5-FF). So it is also a number of tokens that surely suffices, and the first
byte of a shortest completion is always a token that lowers it by one: an answer whose
closing() fits its remaining tokens can always go on fitting. A completion that needs an
unsafe byte (a GBNF character class of control characters only, a character above plane 3)
is not counted (a JSON string escapes such characters, so only grammars are affected; a
schema's enum value or key with a character above plane 3 is counted as if it were safe).
Bytes are a loose count of tokens (SmolLM2 spends 2.2-3.1 bytes a token on JSON answers), so the
rule is safe, not tight: docs/js-api.md says what that costs.

JSON text is counted as JSON spells it: in a string, '"' and '\\' and \\b \\f \\n \\r \\t take
two bytes, other control characters six (\\u00XX), characters above plane 3 twelve (a
surrogate pair), others their UTF-8 length. Blanks never help, so they are never counted.

Exactness is tested against a breadth-first search over the safe bytes
(tests/test_closing.py).
"""
from __future__ import annotations

import heapq
import math

from . import json_grammar as jg
from . import schema_scalars as sc
from .char_pattern import overlaps

INF = math.inf
SAFE = frozenset({0x09, 0x0A, 0x0D}) | frozenset(range(0x20, 0xC0)) | frozenset(range(0xC2, 0xF1))
PLANE_4 = 0x40000            # the first character whose UTF-8 lead byte (F1) is not SAFE

# (low, high, bytes) over code points: what a character costs written in a JSON string ...
JSON_COST = ((0x20, 0x21, 1), (0x23, 0x5B, 1), (0x5D, 0x7F, 1), (0x22, 0x22, 2), (0x5C, 0x5C, 2),
             (0x08, 0x0A, 2), (0x0C, 0x0D, 2), (0x80, 0x7FF, 2), (0x800, 0xD7FF, 3), (0xE000, 0xFFFF, 3),
             (0x10000, PLANE_4 - 1, 4), (0x00, 0x07, 6), (0x0B, 0x0B, 6), (0x0E, 0x1F, 6),
             (PLANE_4, 0x10FFFF, 12))
# ... and in a grammar's text (UTF-8; control characters but tab, line feed and carriage return left out)
TEXT_COST = ((0x09, 0x0A, 1), (0x0D, 0x0D, 1), (0x20, 0x7F, 1), (0x80, 0x7FF, 2), (0x800, 0xD7FF, 3),
             (0xE000, 0xFFFF, 3), (0x10000, PLANE_4 - 1, 4))
# the character after a "\" in a JSON string: a short escape, or \uXXXX (a pair above the BMP)
ESCAPED_COST = tuple((c, c, 1) for c in (0x22, 0x5C, 0x2F, 0x08, 0x0C, 0x0A, 0x0D, 0x09)) + (
    (0x00, 0xD7FF, 5), (0xE000, 0xFFFF, 5), (0x10000, 0x10FFFF, 11))


def set_cost(charset, costs) -> float:
    """The fewest bytes a character of `charset` takes under `costs` (INF: none can be written)."""
    return min((cost for low, high, cost in costs if overlaps(charset, low, high)), default=INF)


def _legal(low: int, high: int, cost: int) -> tuple:
    """`costs` for a character known to lie in [low, high], surrogates left out, each `cost` bytes."""
    parts = ((max(low, a), min(high, b), cost) for a, b in ((0, 0xD7FF), (0xE000, 0x10FFFF)))
    return tuple(p for p in parts if p[0] <= p[1])


# -- strings read by a char_pattern.CharAutomaton (pattern, format, minLength, maxLength) ---------

def automaton_closing(auto, state, first=None) -> float:
    """The fewest bytes that bring `auto` from `state` (nodes, count) to an accepting state,
    the characters costed by JSON_COST; `first`: the cost options of the first character
    instead (a character half written). Dijkstra over (node, count) pairs."""
    nodes, count = state
    key = (nodes, count, first)
    memo = auto.__dict__.setdefault("_closings", {})
    if key in memo:
        return memo[key]
    costs = auto.__dict__.setdefault("_json_costs", {})

    def moves(node, count, options):
        charset = auto.sets[node]
        if charset is None:
            return [(0, nxt, count) for nxt in auto.edges[node]]
        if options is JSON_COST:
            cost = costs.get(node)
            if cost is None:
                cost = costs[node] = set_cost(charset, JSON_COST)
        else:
            cost = set_cost(charset, options)
        after = count + 1 if auto.max is not None else min(count + 1, auto.cap)
        if cost == INF or (auto.max is not None and after > auto.max):
            return []
        return [(cost, auto.edges[node][0], after)]

    heap, best = [], {}
    for node in nodes:
        if first is None:
            heap.append((0, node, count))
        else:                                    # nodes are closed: only their characters move
            heap += [(c, n, k) for c, n, k in moves(node, count, first) if auto.sets[node] is not None]
    heapq.heapify(heap)
    result = INF
    while heap:
        cost, node, k = heapq.heappop(heap)
        if best.get((node, k), INF) <= cost:
            continue
        best[(node, k)] = cost
        if node == auto.end and k >= auto.min:
            result = cost
            break
        for step, nxt, after in moves(node, k, JSON_COST):
            if cost + step < best.get((nxt, after), INF):
                heapq.heappush(heap, (cost + step, nxt, after))
    if len(memo) > 4096:
        memo.clear()
    memo[key] = result
    return result


def pattern_string_closing(auto, state, pending: tuple) -> float:
    """A PATTERN string's remaining bytes, its closing quote included (schema_scalars' pending forms)."""
    if not pending:
        return automaton_closing(auto, state) + 1
    kind = pending[0]
    if kind == "esc":
        first = ESCAPED_COST
    elif kind == "u":
        _, value, left = pending
        span = 16 ** left
        low, high = value * span, value * span + span - 1
        first = _legal(low, min(high, 0xD7FF), left) + _legal(max(low, 0xE000), high, left)
        top, bottom = max(low, 0xD800), min(high, 0xDBFF)
        if top <= bottom:                        # a high surrogate: its pair's 6 bytes follow
            first += ((sc._astral(top, 0xDC00), sc._astral(bottom, 0xDFFF), left + 6),)
    elif kind == "pair":
        _, high, read = pending
        first = ((sc._astral(high, 0xDC00), sc._astral(high, 0xDFFF), 6 - read),)
    elif kind == "low":
        _, high, low, left = pending
        span = 16 ** left
        a, b = max(low * span, 0xDC00), min(low * span + span - 1, 0xDFFF)
        first = ((sc._astral(high, a), sc._astral(high, b), left),)
    else:                                        # ("utf8", value, bytes left, length)
        _, value, left, _length = pending
        span = 64 ** left
        first = _legal(value * span, value * span + span - 1, left)
    return automaton_closing(auto, state, first) + 1


# -- integers in [low, high] ----------------------------------------------------------------------

def int_closing(low, high, state: tuple) -> float:
    """The fewest digits that make the integer read so far (schema_scalars' state) one in [low, high]."""
    negative, magnitude = state
    if magnitude < 0:
        return 1 + min((int_closing(low, high, (negative, d)) for d in range(10)
                        if sc.reachable(negative, d, low, high)), default=INF)
    for k in range(0, 400):
        if k and magnitude == 0:
            break
        first, last = magnitude * 10 ** k, magnitude * 10 ** k + 10 ** k - 1
        a, b = (-last, -first) if negative else (first, last)
        if (low is None or b >= low) and (high is None or a <= high):
            return k
    return INF


# -- JSON-schema mode -----------------------------------------------------------------------------

class SchemaClosing:
    """closing() of a json_schema.SchemaGrammar's states: per stack, the sum of what each frame
    still needs (its value's end, then its container's required rest); per state, the least."""

    def __init__(self, grammar):
        from . import json_schema as js
        self.js, self.grammar, self.nodes = js, grammar, grammar.nodes
        self._minimal: dict[int, float] = {}
        self._rests: dict[int, list[float]] = {}
        self._memo: dict = {}

    def __call__(self, state: frozenset) -> float:
        got = self._memo.get(state)
        if got is None:
            got = min(sum(self.frame(f) for f in stack) for stack in state)
            if len(self._memo) > 1 << 16:
                self._memo.clear()
            self._memo[state] = got
        return got

    def minimal(self, node_id: int) -> float:
        """The fewest bytes of a whole value of the node."""
        got = self._minimal.get(node_id)
        if got is not None:
            return got
        js, node = self.js, self.nodes[node_id]
        kind = node[0]
        if kind == js.ANY:
            got = 1                                          # 0
        elif kind in (js.ANY_OBJECT, js.STRING):
            got = 2                                          # {} ""
        elif kind == js.PATTERN:
            got = 1 + pattern_string_closing(node[1], node[1].initial, ())
        elif kind == js.NUMBER:
            got = 1
        elif kind == js.RANGE:
            got = 1 + min(int_closing(node[1], node[2], s) for s in
                          (sc.int_start(node[1], node[2], b) for b in b"-0123456789") if s is not None)
        elif kind == js.LITERALS:
            got = min(len(lit) for lit in node[1])
        elif kind == js.OBJECT:
            got = 1 + self.object_rest(node_id, js.OPEN, 0, None)
        elif kind == js.ARRAY:
            got = 1 + self.array_rest(node_id, js.OPEN, 0)
        else:                                                # UNION
            got = min(self.minimal(b) for b in node[1])
        self._minimal[node_id] = got
        return got

    def _after(self, node_id: int) -> list[float]:
        """Per next property i: the bytes of ',"key":value' for every required property from i on."""
        rests = self._rests.get(node_id)
        if rests is None:
            _, keys, values, required = self.nodes[node_id]
            rests = [0] * (len(keys) + 1)
            for j in range(len(keys) - 1, -1, -1):
                rests[j] = rests[j + 1] + (1 + len(keys[j]) + 1 + self.minimal(values[j]) if required[j] else 0)
            self._rests[node_id] = rests
        return rests

    def object_rest(self, node_id: int, phase: int, nxt: int, extra) -> float:
        """An object's bytes still to come after its '{', in `phase` (the value being read, if any, not counted)."""
        js = self.js
        _, keys, values, _ = self.nodes[node_id]
        rests = self._after(node_id)
        if phase == js.OPEN:
            return (rests[0] - 1 if rests[0] else 0) + 1
        if phase in (js.AFTER, js.INSIDE):
            return rests[nxt] + 1
        if phase == js.COLON:
            return 1 + self.minimal(values[extra]) + rests[extra + 1] + 1
        read = extra if phase == js.KEY else b""             # KEY_NEXT: a key must come
        choices = self.grammar._keys_from[node_id][nxt]
        return min((len(keys[j]) - len(read) + 1 + self.minimal(values[j]) + rests[j + 1] + 1
                    for j in choices if len(keys[j]) > len(read) and keys[j].startswith(read)), default=INF)

    def array_rest(self, node_id: int, phase: int, count: int) -> float:
        js = self.js
        _, item, low, _ = self.nodes[node_id]
        one = self.minimal(item)
        if phase == js.OPEN:
            return (low * one + low - 1 if low else 0) + 1
        if phase == js.AFTER:
            return max(low - count, 0) * (1 + one) + 1
        if phase == js.NEXT:
            return one + max(low - count - 1, 0) * (1 + one) + 1
        return max(low - count - 1, 0) * (1 + one) + 1     # INSIDE: the item's rest is its own frame's

    def frame(self, frame: tuple) -> float:
        js = self.js
        kind = frame[0]
        if kind == js.VALUE:
            return self.minimal(frame[1])
        if kind == js.STR:
            return 1 if frame[1] == 0 else 2 if frame[1] == 1 else frame[1]      # hex: sub - 1 digits, then '"'
        if kind == js.PSTR:
            return pattern_string_closing(self.nodes[frame[1]][1], frame[2], frame[3])
        if kind == js.INT:
            _, low, high = self.nodes[frame[1]]
            return int_closing(low, high, frame[2])
        if kind == js.LIT:
            read = frame[2]
            return min(len(lit) - len(read) for lit in self.nodes[frame[1]][1] if lit.startswith(read))
        if kind == js.NUM:
            return 0 if frame[2] in jg.NUMBER_ENDS else 1
        if kind == js.ANYV:
            return jg.closing(frame[1])
        if kind == js.OBJ:
            _, node_id, nxt, phase, _, extra = frame
            return self.object_rest(node_id, phase, nxt, extra)
        _, node_id, count, phase, _ = frame                  # ARR
        return self.array_rest(node_id, phase, count)


# -- grammar mode ---------------------------------------------------------------------------------

class GrammarClosing:
    """closing() of a gbnf.TextGrammar's states. Per NFA node, `dist`: the fewest bytes from it
    to its rule's end (a character costs TEXT_COST, a call its rule's shortest text), found by
    relaxing every node until nothing changes. A stack (return points, then the character
    node at hand) needs the sum of its nodes' distances; a state the least over its stacks.
    Calls a shortest completion makes are assumed to fit in MAX_STACK (a grammar nested that
    deep may have no way left to end, as gbnf.py says)."""

    def __init__(self, grammar):
        self.grammar = g = grammar
        count = len(g.sets)
        self.char_cost = [set_cost(s, TEXT_COST) if s is not None else 0 for s in g.sets]
        dist = [INF] * count
        for end in g.ends:
            dist[end] = 0
        changed = True
        while changed:
            changed = False
            for node in range(count - 1, -1, -1):
                if node in g.rule_of_end:
                    continue
                if g.sets[node] is not None:
                    best = self.char_cost[node] + dist[g.edges[node][0]]
                elif g.calls[node] is not None:
                    best = dist[g.starts[g.calls[node]]] + dist[g.edges[node][0]]
                else:
                    best = min((dist[n] for n in g.edges[node]), default=INF)
                if best < dist[node]:
                    dist[node], changed = best, True
        self.dist = dist
        self._memo: dict = {}

    def __call__(self, state) -> float:
        got = self._memo.get(state)
        if got is None:
            got = self._closing(*state)
            if len(self._memo) > 1 << 16:
                self._memo.clear()
            self._memo[state] = got
        return got

    def _closing(self, stacks: frozenset, pending: tuple) -> float:
        g, dist = self.grammar, self.dist
        if not pending:
            return min(sum(dist[n] for n in stack) for stack in stacks)
        _, value, left, _length = pending                    # a UTF-8 character half read
        span = 64 ** left
        first = _legal(value * span, value * span + span - 1, left)
        best = INF
        for stack in stacks:
            if stack and set_cost(g.sets[stack[-1]], first) < INF:
                best = min(best, left + dist[g.edges[stack[-1]][0]] + sum(dist[n] for n in stack[:-1]))
        return best
