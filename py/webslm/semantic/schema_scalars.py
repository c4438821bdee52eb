"""Byte-level steps of json_schema.py's constrained scalars: strings read through a
char_pattern.CharAutomaton (pattern, format, minLength, maxLength) and integers held to
[minimum, maximum]. Both refuse a byte as soon as no valid value starts with what has been
read, so the token mask never leads into a dead end.

Strings: the JSON text is decoded as it comes (UTF-8 sequences and the escapes \\" \\\\ \\/ \\b
\\f \\n \\r \\t \\uXXXX) and each character is fed to the automaton. A half-read sequence or
escape is live when some character it could still become is one the automaton takes
(CharAutomaton.may_take over the code points it may still be). Invalid UTF-8 (overlong forms,
surrogates, above U+10FFFF) and \\u escapes of surrogates are refused, so the text decodes to
exactly the characters the automaton read. A string state is (automaton state, pending):
pending () between characters, ("esc",) after a backslash, ("u", value, digits left) in a \\u
escape, ("pair", high surrogate, bytes of "\\u" read) and ("low", high, value, digits left) in
the second half of a surrogate pair (an astral character written as two escapes), ("utf8",
value, bytes left, length) in a UTF-8 sequence.

Integers: a state is (negative, magnitude), magnitude -1 before the first digit. A digit is
taken when some integer that starts with the digits so far (itself or one with more digits)
is in [low, high] (None: unbounded). A magnitude past every finite bound is clamped (to
`clamp`): beyond the bounds only the sign matters, so the states stay few.
"""
from __future__ import annotations

import math

from .char_pattern import FORMATS, CharAutomaton, PatternError
from .sampler import SamplerError

CLOSE = "close"            # string_step: the closing quote, the string is whole


class SchemaError(SamplerError):
    """json_schema.py's refusals (defined here, where the scalar keywords are compiled).
    Codes: "unsupported-schema" (a keyword outside json_schema's subset: `where` is its path),
    "bad-schema" (not a schema, or one no JSON value satisfies: minItems > maxItems, a
    required key not in properties, an empty enum, ...)."""


# -- compiling: a string or integer schema's keywords -------------------------------------------

def count(schema: dict, key: str, default, where: str):
    value = schema.get(key, default)
    if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 0):
        raise SchemaError("bad-schema", f"{where}.{key}", "must be an integer >= 0")
    return value


def string_automaton(schema: dict, where: str):
    """The automaton of a string schema's pattern/format/minLength/maxLength (None: none given)."""
    if not {"minLength", "maxLength", "pattern", "format"} & set(schema):
        return None
    low, high = count(schema, "minLength", 0, where), count(schema, "maxLength", None, where)
    if high is not None and low > high:
        raise SchemaError("bad-schema", f"{where}.minLength", f"{low} is more than maxLength {high}")
    pattern, at = schema.get("pattern"), "pattern"
    if "format" in schema:
        if "pattern" in schema:
            raise SchemaError("unsupported-schema", f"{where}.format", "format and pattern together are not "
                                                                       "supported: give one")
        at = "format"
        if schema["format"] not in FORMATS:
            raise SchemaError("unsupported-schema", f"{where}.format", f"the format {schema['format']!r} is "
                              f"not supported (supported: {', '.join(FORMATS)})"[:300])
        pattern = FORMATS[schema["format"]]
    try:
        automaton = CharAutomaton(pattern, low, high)
    except PatternError as exc:
        code = "bad-schema" if str(exc).startswith("no string") else "unsupported-schema"
        key = at if pattern is not None else "maxLength" if "maxLength" in schema else "minLength"
        raise SchemaError(code, f"{where}.{key}", f"{key} refused: {exc}"[:300]) from None
    return automaton


def integer_bounds(kind: str, schema: dict, where: str):
    """[low, high] of an integer schema's minimum/maximum/exclusive* (None: none given); refused on numbers."""
    bounds = [k for k in ("minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum") if k in schema]
    if not bounds:
        return None
    if kind == "number":
        raise SchemaError("unsupported-schema", f"{where}.{bounds[0]}", f"{bounds[0]}: bounds are enforced on "
                          "integers only (give type integer, or leave them out)")
    low = high = None
    for key in bounds:
        value = schema[key]
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
            raise SchemaError("bad-schema", f"{where}.{key}", "must be a finite number")
        if key == "minimum":
            edge = math.ceil(value)
        elif key == "exclusiveMinimum":
            edge = math.floor(value) + 1
        elif key == "maximum":
            edge = math.floor(value)
        else:
            edge = math.ceil(value) - 1
        if key.endswith("inimum"):
            low = edge if low is None else max(low, edge)
        else:
            high = edge if high is None else min(high, edge)
    if low is not None and high is not None and low > high:
        raise SchemaError("bad-schema", f"{where}.{bounds[0]}", f"no integer is in [{low}, {high}]")
    return low, high


# -- strings ------------------------------------------------------------------------------------

_ESCAPES = {ord('"'): 0x22, ord("\\"): 0x5C, ord("/"): 0x2F, ord("b"): 0x08, ord("f"): 0x0C,
            ord("n"): 0x0A, ord("r"): 0x0D, ord("t"): 0x09}
_HEX = {**{ord(c): int(c, 16) for c in "0123456789abcdef"}, **{ord(c): int(c, 16) for c in "ABCDEF"}}
# The code points a UTF-8 sequence of each length may stand for, surrogates left out.
_LEGAL = {1: ((0, 0x7F),), 2: ((0x80, 0x7FF),), 3: ((0x800, 0xD7FF), (0xE000, 0xFFFF)), 4: ((0x10000, 0x10FFFF),)}
_ESCAPED = ((0, 0xD7FF), (0xE000, 0xFFFF))          # what a \uXXXX escape may stand for


def _may_become(auto, state, low: int, high: int, legal) -> bool:
    return any(auto.may_take(state, max(low, a), min(high, b)) for a, b in legal if max(low, a) <= min(high, b))


def string_step(auto, state, pending: tuple, byte: int):
    """The string's (state, pending) after `byte`, CLOSE for its closing quote, or None."""
    if not pending:
        if byte == ord('"'):
            return CLOSE if auto.accepting(state) else None
        if byte == ord("\\"):
            return (state, ("esc",)) if _escape_may_become(auto, state, 0, 0xFFFF) else None
        if byte < 0x20:
            return None                                   # a control character must be escaped
        if byte < 0x80:
            after = auto.step(state, byte)
            return None if after is None else (after, ())
        return utf8_lead(auto, state, byte)
    if pending[0] == "esc":
        if byte == ord("u"):
            return (state, ("u", 0, 4))
        char = _ESCAPES.get(byte)
        after = auto.step(state, char) if char is not None else None
        return None if after is None else (after, ())
    if pending[0] == "u":
        digit = _HEX.get(byte)
        if digit is None:
            return None
        value, left = pending[1] * 16 + digit, pending[2] - 1
        if left == 0:
            if 0xD800 <= value <= 0xDBFF:                 # a high surrogate: its pair's low half follows
                return (state, ("pair", value, 0))
            if 0xDC00 <= value <= 0xDFFF:
                return None
            after = auto.step(state, value)
            return None if after is None else (after, ())
        span = 16 ** left
        return (state, ("u", value, left)) if _escape_may_become(auto, state, value * span,
                                                                 value * span + span - 1) else None
    if pending[0] == "pair":                              # \uD8xx read: "\", "u", then DC00-DFFF
        _, high, read = pending
        if read < 2:
            return (state, ("pair", high, read + 1)) if byte == b"\\u"[read] else None
        digit = _HEX.get(byte)
        return None if digit is None else _low_half(auto, state, high, digit, 3)
    if pending[0] == "low":
        _, high, low, left = pending
        digit = _HEX.get(byte)
        return None if digit is None else _low_half(auto, state, high, low * 16 + digit, left - 1)
    return utf8_next(auto, state, pending, byte)


def utf8_lead(auto, state, byte: int):
    """(state, pending) after the first byte (>= 0x80) of a UTF-8 sequence, or None."""
    length = 2 if 0xC0 <= byte < 0xE0 else 3 if 0xE0 <= byte < 0xF0 else 4 if 0xF0 <= byte < 0xF8 else 0
    if not length:
        return None
    return _utf8(auto, state, byte & (0x7F >> length), length - 1, length)


def utf8_next(auto, state, pending: tuple, byte: int):
    """(state, pending) after a continuation byte of the ("utf8", ...) sequence `pending`."""
    _, value, left, length = pending
    if not 0x80 <= byte < 0xC0:
        return None
    return _utf8(auto, state, value * 64 + (byte & 0x3F), left - 1, length)


def _astral(high: int, low: int) -> int:
    return 0x10000 + ((high - 0xD800) << 10) + (low - 0xDC00)


def _low_half(auto, state, high: int, low: int, left: int):
    """After the digits so far of a surrogate pair's low half (`left` digits to come)."""
    span = 16 ** left
    first, last = max(low * span, 0xDC00), min(low * span + span - 1, 0xDFFF)
    if first > last:
        return None
    if left == 0:
        after = auto.step(state, _astral(high, low))
        return None if after is None else (after, ())
    return (state, ("low", high, low, left)) if auto.may_take(state, _astral(high, first), _astral(high, last)) else None


def _escape_may_become(auto, state, low: int, high: int) -> bool:
    """Whether a \\u escape whose value lies in [low, high] can still be a character the
    automaton takes (a high surrogate stands for the astral characters its pair may make)."""
    if _may_become(auto, state, low, high, _ESCAPED):
        return True
    first, last = max(low, 0xD800), min(high, 0xDBFF)
    return first <= last and auto.may_take(state, _astral(first, 0xDC00), _astral(last, 0xDFFF))


def _utf8(auto, state, value: int, left: int, length: int):
    span = 64 ** left
    if left == 0:
        if not any(a <= value <= b for a, b in _LEGAL[length]):
            return None
        after = auto.step(state, value)
        return None if after is None else (after, ())
    if not _may_become(auto, state, value * span, value * span + span - 1, _LEGAL[length]):
        return None
    return (state, ("utf8", value, left, length))


# -- integers in [low, high] --------------------------------------------------------------------

def clamp(low: int | None, high: int | None) -> int:
    """A magnitude past every finite bound: all larger ones behave as it does."""
    return 10 * max([abs(b) for b in (low, high) if b is not None], default=0) + 10


def _inside(value: int, low, high) -> bool:
    return (low is None or value >= low) and (high is None or value <= high)


def reachable(negative: bool, magnitude: int, low, high) -> bool:
    """Whether an integer in [low, high] starts with the sign and digits read so far."""
    if magnitude < 0:
        return any(reachable(negative, d, low, high) for d in range(10))
    if _inside(-magnitude if negative else magnitude, low, high):
        return True
    if magnitude == 0:                                    # "0" and "-0" take no more digits
        return False
    # More digits move the value away from zero: [m*10^k, m*10^k + 10^k - 1] in magnitude.
    far = high if not negative else (None if low is None else -low)
    if far is None:
        return True                                       # the value can grow past the near bound
    span = 10
    while magnitude * span <= far:
        first, last = magnitude * span, magnitude * span + span - 1
        values = (-last, -first) if negative else (first, last)
        if (low is None or values[1] >= low) and (high is None or values[0] <= high):
            return True
        span *= 10
    return False


def int_start(low, high, byte: int):
    """The (negative, magnitude) state after an integer's first byte, or None."""
    if byte == ord("-"):
        state = (True, -1)
    elif 0x30 <= byte <= 0x39:
        state = (False, byte - 0x30)
    else:
        return None
    return state if reachable(*state, low, high) else None


def int_step(low, high, state: tuple, byte: int):
    negative, magnitude = state
    if not 0x30 <= byte <= 0x39 or magnitude == 0:
        return None
    magnitude = byte - 0x30 if magnitude < 0 else min(magnitude * 10 + byte - 0x30, clamp(low, high))
    return (negative, magnitude) if reachable(negative, magnitude, low, high) else None


def int_may_end(low, high, state: tuple) -> bool:
    negative, magnitude = state
    return magnitude >= 0 and _inside(-magnitude if negative else magnitude, low, high)
