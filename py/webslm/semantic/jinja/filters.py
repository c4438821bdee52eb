"""Filters and tests (Jinja's semantics; each filter takes the renderer first for size bounds),
and the built-in globals' implementations (range, namespace)."""
from __future__ import annotations

import numbers
import re
from typing import Any, Callable

from .errors import Limits, TemplateLimitError
from .guards import bounded_json
from .render import Renderer, check_replace
from .values import Namespace, Undefined


def _soft_str(r: Renderer, value: Any) -> str:
    return r.to_str(value, "filter")


_WORD_BEGINNING = re.compile(r"([-\s({\[<]+)")


def _f_default(r, value, default_value="", boolean=False):
    if isinstance(value, Undefined) or (boolean and not value):
        return default_value
    return value


def _f_length(r, value):
    return len(value)


def _f_first(r, value):
    for item in value:
        return item
    return Undefined("no first item, sequence was empty")


def _f_last(r, value):
    if isinstance(value, Undefined):
        return Undefined("no last item, sequence was empty")
    for item in reversed(value):
        return item
    return Undefined("no last item, sequence was empty")


def _f_join(r, value, d="", attribute=None):
    items = list(value)
    if attribute is not None:
        items = [r.getattr(item, attribute, None) for item in items]
    parts = [r.to_str(item, "join") for item in items]
    sep = r.to_str(d, "join")
    if sum(map(len, parts)) + len(sep) * max(len(parts) - 1, 0) > r.limits.max_output_chars:
        raise r.limit("join result exceeds the size bound", "join")
    return sep.join(parts)


def _f_replace(r, value, old, new, count=None):
    text, old, new = _soft_str(r, value), _soft_str(r, old), _soft_str(r, new)
    check_replace(r, text, old, new)
    return text.replace(old, new, -1 if count is None else count)


def _f_int(r, value, default=0, base=10):
    try:
        if isinstance(value, str):
            return int(value, base)
        return int(value)
    except (TypeError, ValueError):
        try:  # Jinja's quirk so that "42.23"|int gives 42
            return int(float(value))
        except (TypeError, ValueError, OverflowError):
            return default


def _f_float(r, value, default=0.0):
    try:
        return float(value)
    except (TypeError, ValueError):
        return default


def _f_items(r, value):
    if isinstance(value, Undefined):
        return []
    if not isinstance(value, dict):
        raise TypeError("can only get item pairs from a mapping")
    return list(value.items())


def _f_list(r, value):
    if isinstance(value, range) and len(value) > r.limits.max_range:
        raise r.limit("range too large", "list")
    return list(value)


def _f_tojson_jinja(r, value, indent=None):
    # Jinja's own tojson (HTML-safe escapes); chat_template.py installs transformers' variant.
    text = bounded_json(r, value, indent=indent, sort_keys=True)
    if len(text) + 5 * sum(map(text.count, "<>&'")) > r.limits.max_output_chars:     # each escape: 6 chars
        raise r.limit("tojson result exceeds the size bound", "tojson")
    return (text.replace("<", "\\u003c").replace(">", "\\u003e").replace("&", "\\u0026")
            .replace("'", "\\u0027"))


FILTERS: dict[str, Callable[..., Any]] = {
    "trim": lambda r, value, chars=None: _soft_str(r, value).strip(chars),
    "length": _f_length,
    "count": _f_length,
    "default": _f_default,
    "d": _f_default,
    "upper": lambda r, value: _soft_str(r, value).upper(),
    "lower": lambda r, value: _soft_str(r, value).lower(),
    "capitalize": lambda r, value: _soft_str(r, value).capitalize(),
    "title": lambda r, value: "".join(  # Jinja's do_title: capitalise after spaces/brackets/dashes
        item[0].upper() + item[1:].lower() for item in _WORD_BEGINNING.split(_soft_str(r, value)) if item),
    "first": _f_first,
    "last": _f_last,
    "join": _f_join,
    "string": lambda r, value: _soft_str(r, value),
    "replace": _f_replace,
    "int": _f_int,
    "float": _f_float,
    "abs": lambda r, value: abs(value),
    "items": _f_items,
    "list": _f_list,
    "tojson": _f_tojson_jinja,
}


def _is_sequence(value) -> bool:
    try:
        len(value)
        value.__getitem__  # noqa: B018 -- Jinja's own check
    except Exception:  # noqa: BLE001 -- as Jinja: whatever len() raises means no
        return False
    return True


def _is_iterable(value) -> bool:
    try:
        iter(value)
    except TypeError:
        return False
    return True


def _by_the_renderer(*_args, **_kwargs):
    raise AssertionError("odd, even and divisibleby are evaluated by Renderer.e_test")


TESTS: dict[str, Callable[..., bool]] = {
    "defined": lambda v: not isinstance(v, Undefined),
    "undefined": lambda v: isinstance(v, Undefined),
    "none": lambda v: v is None,
    "string": lambda v: isinstance(v, str),
    "mapping": lambda v: isinstance(v, dict),
    "number": lambda v: isinstance(v, numbers.Number),
    "integer": lambda v: isinstance(v, int) and v is not True and v is not False,
    "float": lambda v: isinstance(v, float),
    "boolean": lambda v: v is True or v is False,
    "true": lambda v: v is True,
    "false": lambda v: v is False,
    "sequence": _is_sequence,
    "iterable": _is_iterable,
    # `value % n == r`: Renderer.e_test evaluates these through its guarded modulo
    "odd": _by_the_renderer,
    "even": _by_the_renderer,
    "divisibleby": _by_the_renderer,
    "lower": lambda v: str(v).islower(),
    "upper": lambda v: str(v).isupper(),
    "in": lambda v, seq: v in seq,
    "eq": lambda a, b: a == b, "equalto": lambda a, b: a == b, "==": lambda a, b: a == b,
    "ne": lambda a, b: a != b, "!=": lambda a, b: a != b,
    "lt": lambda a, b: a < b, "lessthan": lambda a, b: a < b, "<": lambda a, b: a < b,
    "le": lambda a, b: a <= b, "<=": lambda a, b: a <= b,
    "gt": lambda a, b: a > b, "greaterthan": lambda a, b: a > b, ">": lambda a, b: a > b,
    "ge": lambda a, b: a >= b, ">=": lambda a, b: a >= b,
}


def _safe_range(limits: Limits):
    def impl(*args):
        rng = range(*args)
        if len(rng) > limits.max_range:
            raise TemplateLimitError(f"range of {len(rng)} items exceeds {limits.max_range}",
                                     construct="range")
        return rng
    return impl


def make_namespace(*args, **kwargs) -> Namespace:
    return Namespace(dict(*args, **kwargs))
