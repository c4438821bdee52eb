"""Values: the objects, besides JSON-like data, that a template can see (Undefined, namespace,
loop context, whitelisted bound methods, global functions), and the method whitelists."""
from __future__ import annotations

from typing import Any, Callable

from .errors import TemplateRuntimeError, TemplateSecurityError


class Undefined:
    """Jinja's default Undefined: falsy, renders as '', iterates as empty, equals only itself;
    arithmetic, ordering, attribute access, subscripting and calling raise."""

    __slots__ = ("hint",)

    def __init__(self, hint: str = "value is undefined"):
        self.hint = hint

    def _fail(self, *_args, **_kwargs):
        raise TemplateRuntimeError(self.hint, construct="undefined")

    __add__ = __radd__ = __sub__ = __rsub__ = __mul__ = __rmul__ = _fail
    __truediv__ = __rtruediv__ = __floordiv__ = __rfloordiv__ = __mod__ = __rmod__ = _fail
    __pos__ = __neg__ = __pow__ = __rpow__ = __lt__ = __le__ = __gt__ = __ge__ = _fail
    __int__ = __float__ = __call__ = __getitem__ = _fail

    def __eq__(self, other):
        return type(self) is type(other)

    def __ne__(self, other):
        return not self.__eq__(other)

    def __hash__(self):
        return id(type(self))

    def __str__(self):
        return ""

    def __len__(self):
        return 0

    def __iter__(self):
        return iter(())

    def __bool__(self):
        return False

    def __repr__(self):
        return "Undefined"


class Namespace:
    """`namespace(...)`: the one object a template may mutate (`{% set ns.x = ... %}`)."""

    __slots__ = ("attrs",)

    def __init__(self, attrs: dict):
        for name in attrs:
            check_namespace_name(name)
        self.attrs = dict(attrs)

    def __repr__(self):
        return f"<Namespace {self.attrs!r}>"


def check_namespace_name(name: Any) -> None:
    # transformers' TemplateNamespace refuses underscore names (no CPython internals via namespaces).
    if isinstance(name, str) and name.startswith("_"):
        raise TemplateSecurityError(f"namespace attribute {name!r} starts with an underscore",
                                    construct="namespace")


class GlobalFunction:
    """A function the environment exposes by name (raise_exception, range, namespace...)."""

    __slots__ = ("name", "impl")

    def __init__(self, name: str, impl: Callable[..., Any]):
        self.name = name
        self.impl = impl

    def __repr__(self):  # Jinja would print a function repr with an address: never byte-stable
        raise TemplateRuntimeError(f"cannot render function {self.name!r}", construct="output")


class _Method:
    """A whitelisted method bound to a str or dict value (`.strip()`, `.items()`, `.get()`...)."""

    __slots__ = ("obj", "name")

    def __init__(self, obj: Any, name: str):
        self.obj = obj
        self.name = name

    def __repr__(self):
        raise TemplateRuntimeError(f"cannot render method {self.name!r}", construct="output")


class _Loop:
    """`loop` inside `{% for %}` (non-recursive: depth is always 1)."""

    __slots__ = ("items", "index0")

    def __init__(self, items, index0):
        self.items = items
        self.index0 = index0

    def attribute(self, name: str):
        i, n = self.index0, len(self.items)
        values = {
            "index0": i, "index": i + 1, "revindex0": n - i - 1, "revindex": n - i,
            "first": i == 0, "last": i == n - 1, "length": n, "depth": 1, "depth0": 0,
        }
        if name in values:
            return values[name]
        if name == "previtem":
            return self.items[i - 1] if i > 0 else Undefined("there is no previous item")
        if name == "nextitem":
            return self.items[i + 1] if i + 1 < n else Undefined("there is no next item")
        if name == "cycle":
            return GlobalFunction("loop.cycle", self._cycle)
        return Undefined(f"'LoopContext' has no attribute {name!r}")

    def _cycle(self, *values):
        if not values:
            raise TemplateRuntimeError("no items for cycling given", construct="loop.cycle")
        return values[self.index0 % len(values)]

    def __repr__(self):
        return f"<LoopContext {self.index0 + 1}/{len(self.items)}>"


# Methods the sandbox lets templates call: pure, non-mutating, and unable to amplify size beyond
# what the size checks see (no center/ljust/zfill/expandtabs/format).
STR_METHODS = frozenset({
    "strip", "lstrip", "rstrip", "startswith", "endswith", "upper", "lower", "title", "capitalize",
    "split", "rsplit", "splitlines", "replace", "find", "rfind", "count", "removeprefix",
    "removesuffix", "isdigit", "isalpha", "isalnum", "isspace", "islower", "isupper", "join",
    "partition", "rpartition", "swapcase", "casefold",
})
DICT_METHODS = frozenset({"items", "keys", "values", "get"})
