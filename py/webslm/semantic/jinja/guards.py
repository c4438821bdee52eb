"""Guards for the two operations whose result can be far larger than their inputs, checked
before the result is built: printf-style `%` formatting and JSON encoding.

A guard that runs after the fact is too late: `'%(a)999999999s' % {'a': 1}` allocates a
gigabyte before any size check could see it, and `tojson(separators=(sep, ':'))` repeats a
separator once per item. So:

- `check_format` reads the format string's conversion specifiers, refuses `*` widths and
  widths or precisions over MAX_FORMAT_WIDTH, and bounds the result from above by the
  format's length plus, per specifier, its width, precision and the largest rendering the
  argument it takes could have; over the output bound, it refuses. Every `%` a template can
  reach goes through Renderer.modulo, which calls this: the `%` operator and the `odd`,
  `even` and `divisibleby` tests (which Jinja computes as `value % n`).
- `bounded_json` runs json's pure-Python encoder, which yields the text piece by piece, and
  stops at the output bound; separators and indents are short strings.
"""
from __future__ import annotations

import json
import re
from typing import Any

from .errors import TemplateLimitError

MAX_FORMAT_WIDTH = 1000          # no chat template pads a field wider than this
MAX_SEPARATOR_CHARS = 64         # tojson's separators and indent

# %[(key)][flags][width][.precision][length]type
_SPEC = re.compile(r"%(?:\(([^)]*)\))?[#0\- +]*(\*|\d+)?(?:\.(\*|\d+)?)?[hlL]?(.?)", re.S)


def check_format(renderer, text: str, args: Any) -> None:
    """Raise TemplateLimitError when `text % args` could exceed the output bound."""
    limit = renderer.limits.max_output_chars
    bound, position = len(text), 0
    for count, spec in enumerate(_SPEC.finditer(text), 1):
        if not count & 1023:
            renderer.charge(0, "%", steps=1024)
        key, width, precision, kind = spec.groups()
        if "*" in (width, precision):
            raise TemplateLimitError("a '*' width in %-formatting is not supported", construct="%")
        for number in (width, precision):
            if number and int(number) > MAX_FORMAT_WIDTH:
                raise TemplateLimitError(f"%-formatting width {number[:20]} exceeds {MAX_FORMAT_WIDTH}", construct="%")
        if kind == "%":                                # a literal %, padded to its width
            value = None
        elif key is not None:
            value = args.get(key) if isinstance(args, dict) else None
        elif isinstance(args, tuple):
            value = args[position] if position < len(args) else None
            position += 1
        else:
            value = args
        bound += int(width or 0) + int(precision or 0) + _rendered_bound(renderer, value, kind)
        if bound > limit:
            raise TemplateLimitError("%-formatting result exceeds the size bound", construct="%")


def _rendered_bound(renderer, value: Any, kind: str) -> int:
    """The most characters one %-conversion of `value` can produce (before width/precision)."""
    if isinstance(value, bool) or value is None:
        return 5
    if isinstance(value, int):
        return value.bit_length() // 3 + 2            # decimal digits (octal's are more: // 3)
    if isinstance(value, float):
        return 330                                     # %f of 1e308: 309 digits, sign, point
    if isinstance(value, str):
        return len(value) * (10 if kind in ("r", "a") else 1)   # repr: \U0001xxxx per char at worst
    # a container renders as its repr: escapes included, at most 10 characters per character
    return 10 * renderer.size_of(value, "%")


def bounded_json(renderer, value: Any, *, ensure_ascii: bool = True, indent=None, separators=None,
                 sort_keys: bool = False) -> str:
    """json.dumps(value, ...) with the same output, refused once it exceeds the output bound."""
    renderer.weigh(value, "tojson")
    pieces = [indent] if isinstance(indent, str) else []
    if separators is not None:
        if not (isinstance(separators, (tuple, list)) and len(separators) == 2):
            raise TemplateLimitError("tojson separators must be two strings", construct="tojson")
        pieces += list(separators)
    if isinstance(indent, int) and indent > MAX_SEPARATOR_CHARS:
        raise TemplateLimitError("tojson indent too large", construct="tojson")
    if any(not isinstance(p, str) or len(p) > MAX_SEPARATOR_CHARS for p in pieces):
        raise TemplateLimitError("tojson separators and indent must be short strings", construct="tojson")
    encoder = json.JSONEncoder(ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)
    out, size, limit = [], 0, renderer.limits.max_output_chars
    for piece in encoder.iterencode(value):     # not one-shot: the pure-Python encoder, piece by piece
        size += len(piece)
        if size > limit:
            raise TemplateLimitError("tojson result exceeds the size bound", construct="tojson")
        out.append(piece)
        if not len(out) & 1023:
            renderer.charge(0, "tojson", steps=1024)
    renderer.charge(size, "tojson", steps=len(out) & 1023)
    return "".join(out)
