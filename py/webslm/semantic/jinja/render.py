"""Evaluation: walks the Node tree over scopes, enforcing the sandbox (attribute/method
whitelists) and the resource bounds (iterations, output and value sizes, work, integer sizes,
time).

Work: everything the renderer does is charged to one budget (Limits.max_work), in units of
roughly 50 ns of CPython: a step the interpreter takes (an operation, a loop iteration, an
item sized or encoded) costs STEP units, and the characters an operation reads or writes
(comparing, searching, concatenating, a string method or filter, formatting, emitting) one
unit per 16. So a template that does a cheap-looking thing 100,000 times over a 4-million-
character string runs out of budget in a fraction of a second instead of holding the worker
for minutes. The wall-time budget (Limits.max_render_seconds) is the backstop for whatever
the work budget prices too low; both raise TemplateLimitError.
"""
from __future__ import annotations

import time
from typing import Any

from .errors import (
    Limits, TemplateError, TemplateLimitError, TemplateRuntimeError, TemplateSecurityError,
)
from .guards import check_format
from .lexer import Source
from .parser import Node
# _Loop and _Method keep their names: they show up in user-visible error messages.
from .values import (
    DICT_METHODS, STR_METHODS, GlobalFunction, Namespace, Undefined, _Loop, _Method,
    check_namespace_name,
)


STEP = 20          # work units for one interpreter-level step; a character costs 1/16


class _Break(Exception):
    pass


class _Continue(Exception):
    pass


class Scope:
    """Jinja scoping: `{% for %}` bodies (each iteration) and `{% generation %}` get a child scope,
    so a `set` inside them does not leak out; `{% if %}` does not create one."""

    __slots__ = ("vars", "parent")

    def __init__(self, parent: "Scope | None", variables: dict | None = None):
        self.vars = {} if variables is None else variables
        self.parent = parent

    def lookup(self, name: str):
        scope = self
        while scope is not None:
            if name in scope.vars:
                return scope.vars[name]
            scope = scope.parent
        return Undefined(f"{name!r} is undefined")


class Renderer:
    def __init__(self, src: Source, limits: Limits, filters: dict, tests: dict):
        self.src = src
        self.limits = limits
        self.filters = filters
        self.tests = tests
        self.out: list[str] = []
        self.out_len = 0
        self.iterations = 0
        self.work = 0
        self.deadline = time.monotonic() + limits.max_render_seconds

    # -- errors and bounds
    def error(self, cls, message: str, node: Node | None, construct: str | None = None) -> TemplateError:
        if node is None:  # located later, by the enclosing eval()
            return cls(message, construct=construct)
        return self.src.error(cls, message, node.pos, construct or node.kind)

    def limit(self, message: str, construct: str) -> TemplateLimitError:
        return TemplateLimitError(message, construct=construct)

    def check_str(self, value: str, construct: str) -> str:
        if len(value) > self.limits.max_output_chars:
            raise self.limit(f"string of {len(value)} chars exceeds the size bound", construct)
        return value

    def charge(self, chars: int, construct: str, steps: int = 1) -> None:
        """`steps` steps of work that read or write `chars` characters (the module docstring)."""
        self.work += steps * STEP + (chars >> 4)
        if self.work > self.limits.max_work:
            raise self.limit("work budget exceeded", construct)
        if time.monotonic() > self.deadline:
            raise self.limit(f"rendering took more than {self.limits.max_render_seconds} s", construct)

    def weigh(self, value: Any, construct: str) -> Any:
        """Bound the rendered size of a built value (returned as it is)."""
        if isinstance(value, str):
            return self.check_str(value, construct)
        if isinstance(value, (list, tuple, dict)):
            self.size_of(value, construct)
        return value

    def size_of(self, value: Any, construct: str) -> int:
        """The rendered size of a value, bounded. Containers can share references, so their
        expanded size is walked (each step charged to the work budget) instead of trusted."""
        if isinstance(value, str):
            return len(self.check_str(value, construct))
        size, stack, steps, bound = 0, [value], 0, self.limits.max_output_chars
        while stack:
            item = stack.pop()
            steps += 1
            if not steps & 1023:                      # work and time, every 1024 items
                self.charge(0, construct, steps=1024)
            if isinstance(item, str):
                size += len(item) + 2
            elif isinstance(item, (list, tuple)):
                size += 2 + 2 * len(item)
                stack.extend(item)
            elif isinstance(item, dict):
                size += 2 + 4 * len(item)
                stack.extend(item.keys())
                stack.extend(item.values())
            else:
                size += 8
            if size > bound:
                raise self.limit("value exceeds the size bound", construct)
        self.charge(0, construct, steps=steps & 1023)
        return size

    def to_str(self, value: Any, construct: str) -> str:
        if isinstance(value, str):
            return value
        if isinstance(value, (list, tuple, dict)):
            self.weigh(value, construct)
        elif isinstance(value, (_Method, GlobalFunction)):
            # Jinja would print a repr with a memory address: never byte-stable, so refuse.
            what = "method" if isinstance(value, _Method) else "function"
            raise TemplateRuntimeError(f"cannot render a {what}", construct=construct)
        text = self.check_str(str(value), construct)
        self.charge(len(text), construct)
        return text

    def tick(self, construct: str) -> None:
        self.iterations += 1
        if self.iterations > self.limits.max_loop_iterations:
            raise self.limit(f"more than {self.limits.max_loop_iterations} loop iterations", construct)
        self.charge(0, construct)

    def modulo(self, left: Any, right: Any) -> Any:
        """`left % right`: the one place a template reaches Python's %-formatting, guarded."""
        if isinstance(left, str):
            check_format(self, left, right)
        return left % right

    def emit(self, text: str) -> None:
        self.charge(len(text), "output")
        self.out_len += len(text)
        if self.out_len > self.limits.max_output_chars:
            raise self.limit(f"output exceeds {self.limits.max_output_chars} chars", "output")
        self.out.append(text)

    # -- statements
    def run(self, body: list[Node], scope: Scope) -> None:
        for node in body:
            kind = node.kind
            if kind == "data":
                self.emit(node.args[0])
            elif kind == "output":
                self.emit(self.to_str(self.eval(node.args[0], scope), "output"))
            elif kind == "if":
                self.run_if(node, scope)
            elif kind == "for":
                self.run_for(node, scope)
            elif kind == "set":
                self.assign(node.args[0], self.eval(node.args[1], scope), scope, node)
            elif kind == "setblock":
                saved, saved_len = self.out, self.out_len
                self.out = []
                try:
                    self.run(node.args[1], scope)
                    text = "".join(self.out)
                finally:
                    self.out, self.out_len = saved, saved_len
                self.assign(node.args[0], text, scope, node)
            elif kind == "scope":
                self.run(node.args[0], Scope(scope))
            elif kind == "break":
                raise _Break
            elif kind == "continue":
                raise _Continue

    def run_if(self, node: Node, scope: Scope) -> None:
        branches, else_body = node.args
        for test, body in branches:
            if bool(self.eval(test, scope)):
                self.run(body, scope)
                return
        self.run(else_body, scope)

    def run_for(self, node: Node, scope: Scope) -> None:
        target, iterable_node, test, body, else_body = node.args
        items = self.sequence(self.eval(iterable_node, scope), iterable_node)
        if test is not None:  # `for x in xs if cond`: loop.* counts only the kept items
            kept = []
            for item in items:
                self.tick("for")
                child = Scope(scope)
                self.assign(target, item, child, node)
                if bool(self.eval(test, child)):
                    kept.append(item)
            items = kept
        for index0 in range(len(items)):
            self.tick("for")
            child = Scope(scope)
            self.assign(target, items[index0], child, node)
            child.vars["loop"] = _Loop(items, index0)
            try:
                self.run(body, child)
            except _Continue:
                continue
            except _Break:
                break
        if len(items) == 0:
            self.run(else_body, Scope(scope))

    def sequence(self, value: Any, node: Node):
        """What a for loop iterates, as an indexable sequence (ranges stay lazy)."""
        if isinstance(value, (list, tuple, str, range)):
            return value
        if isinstance(value, Undefined):
            return ()
        if isinstance(value, dict) or isinstance(value, (type({}.items()), type({}.keys()), type({}.values()))):
            items = list(value)
            self.charge(_chars(items), "for")
            return items
        raise self.error(TemplateRuntimeError, f"{_type_name(value)} object is not iterable", node, "for")

    def assign(self, target: Node, value: Any, scope: Scope, node: Node) -> None:
        if target.kind == "name":
            scope.vars[target.args[0]] = value
        elif target.kind == "tuple":
            names = target.args[0]
            try:
                values = list(self.sequence(value, node))
            except TemplateError:
                raise self.error(TemplateRuntimeError, "cannot unpack a non-iterable value", node,
                                 "unpacking") from None
            if len(values) != len(names):
                raise self.error(TemplateRuntimeError,
                                 f"cannot unpack {len(values)} values into {len(names)} names", node,
                                 "unpacking")
            for name, item in zip(names, values):
                scope.vars[name.args[0]] = item
        else:  # nsref: {% set ns.attr = value %}
            ns = scope.lookup(target.args[0])
            if not isinstance(ns, Namespace):
                raise self.error(TemplateRuntimeError, "cannot assign attribute on non-namespace object",
                                 target, "set")
            check_namespace_name(target.args[1])
            ns.attrs[target.args[1]] = value

    # -- expressions
    def eval(self, node: Node, scope: Scope) -> Any:
        try:
            return getattr(self, "e_" + node.kind)(node, scope)
        except TemplateError as exc:
            if exc.line is None:
                exc.line, exc.column = self.src.where(node.pos)
                exc.construct = exc.construct or node.kind
            raise
        except (_Break, _Continue):
            raise
        except (TypeError, ValueError, ArithmeticError, LookupError, UnicodeError) as exc:
            raise self.error(TemplateRuntimeError, f"{type(exc).__name__}: {exc}", node) from None
        except RecursionError:
            raise self.error(TemplateLimitError, "evaluation nested too deeply", node) from None

    def e_const(self, node, scope):
        return node.args[0]

    def e_name(self, node, scope):
        return scope.lookup(node.args[0])

    def e_tuple(self, node, scope):
        return self.weigh(tuple(self.eval(n, scope) for n in node.args[0]), "tuple")

    def e_list(self, node, scope):
        return self.weigh([self.eval(n, scope) for n in node.args[0]], "list")

    def e_dict(self, node, scope):
        return self.weigh({self.eval(k, scope): self.eval(v, scope) for k, v in node.args[0]}, "dict")

    def e_condexpr(self, node, scope):
        test, then, otherwise = node.args
        if bool(self.eval(test, scope)):
            return self.eval(then, scope)
        if otherwise is None:
            return Undefined("the inline if-expression evaluated to false and no else section was defined")
        return self.eval(otherwise, scope)

    def e_or(self, node, scope):
        left = self.eval(node.args[0], scope)
        return left if bool(left) else self.eval(node.args[1], scope)

    def e_and(self, node, scope):
        left = self.eval(node.args[0], scope)
        return self.eval(node.args[1], scope) if bool(left) else left

    def e_not(self, node, scope):
        return not bool(self.eval(node.args[0], scope))

    def e_neg(self, node, scope):
        return -self.eval(node.args[0], scope)

    def e_pos(self, node, scope):
        return +self.eval(node.args[0], scope)

    def e_compare(self, node, scope):
        left = self.eval(node.args[0], scope)
        for op, right_node in node.args[1]:  # chained like Python: a < b < c
            right = self.eval(right_node, scope)
            self.charge(_chars(left) + _chars(right), op)
            if not _COMPARATORS[op](left, right):
                return False
            left = right
        return True

    def e_concat(self, node, scope):
        text = self.check_str("".join(self.to_str(self.eval(n, scope), "~") for n in node.args[0]), "~")
        self.charge(len(text), "~")
        return text

    def e_binop(self, node, scope):
        op, left_node, right_node = node.args
        left = self.eval(left_node, scope)
        right = self.eval(right_node, scope)
        self.precheck_binop(op, left, right)
        self.charge(_chars(left) + _chars(right), op)
        result = self.modulo(left, right) if op == "%" else _BINOPS[op](left, right)
        self.charge(_chars(result), op)
        return self.weigh(result, op)

    def precheck_binop(self, op: str, left: Any, right: Any) -> None:
        """Refuse operations whose result would be too big to build at all."""
        bits = self.limits.max_int_bits
        if op == "*":
            for seq, count in ((left, right), (right, left)):
                if isinstance(seq, (str, list, tuple)) and isinstance(count, int) and \
                        len(seq) * max(count, 0) > self.limits.max_output_chars:
                    raise self.limit("repetition exceeds the size bound", "*")
            if isinstance(left, int) and isinstance(right, int) and \
                    left.bit_length() + right.bit_length() > bits:
                raise self.limit("integer too large", "*")
        elif op == "**" and isinstance(left, int) and isinstance(right, int) and right > 0 \
                and abs(left) > 1 and right * left.bit_length() > bits:
            raise self.limit("integer too large", "**")

    def e_getattr(self, node, scope):
        return self.getattr(self.eval(node.args[0], scope), node.args[1], node)

    def e_getitem(self, node, scope):
        obj = self.eval(node.args[0], scope)
        key = self.eval(node.args[1], scope)
        if isinstance(obj, Undefined):
            raise self.error(TemplateRuntimeError, obj.hint, node, "subscript")
        if isinstance(key, slice) and not isinstance(obj, (str, list, tuple, range)):
            # Jinja compiles slicing to a plain Python subscript: no Undefined fallback. (Its
            # optimizer can fold a slice of a *literal* non-sequence to Undefined instead; no real
            # template slices a literal number, so that quirk is not reproduced.)
            raise self.error(TemplateRuntimeError, f"{_type_name(obj)} object is not sliceable", node,
                             "subscript")
        if isinstance(obj, (Namespace, _Loop)):
            return self.getattr(obj, key, node) if isinstance(key, str) else Undefined("no such item")
        if isinstance(obj, (str, list, tuple, dict, range)):
            try:
                item = obj[key]
            except (TypeError, LookupError):
                pass
            else:
                if isinstance(key, slice):          # a copy
                    self.charge(_chars(item), "slice")
                return item
            # Jinja falls back to attribute lookup for string keys (so d['items'] can be a method)
            if isinstance(key, str):
                return self.getattr(obj, key, node)
            return Undefined(f"{_type_name(obj)} object has no element {key!r}")
        if isinstance(obj, (_Method, GlobalFunction)):
            raise self.error(TemplateSecurityError, "cannot subscript a callable", node, "subscript")
        return Undefined(f"{_type_name(obj)} object has no element {key!r}")

    def e_slice(self, node, scope):
        return slice(*(None if n is None else self.eval(n, scope) for n in node.args))

    def getattr(self, obj: Any, name: str, node: Node) -> Any:
        if isinstance(obj, Undefined):
            raise self.error(TemplateRuntimeError, obj.hint, node, "attribute")
        if isinstance(obj, Namespace):
            return obj.attrs[name] if name in obj.attrs else Undefined(f"namespace has no attribute {name!r}")
        if isinstance(obj, _Loop):
            return obj.attribute(name)
        if isinstance(obj, dict):
            if name in DICT_METHODS:
                return _Method(obj, name)
            if not hasattr(dict, name):
                return obj[name] if name in obj else Undefined(f"'dict object' has no attribute {name!r}")
            python_type = dict
        elif isinstance(obj, str):
            if name in STR_METHODS:
                return _Method(obj, name)
            python_type = str
        else:
            python_type = type(obj)
        if name.startswith("_"):
            raise self.error(TemplateSecurityError, f"access to attribute {name!r} is not allowed", node, name)
        if hasattr(python_type, name):
            # A real Python attribute Jinja would expose (a mutating method, .real, ...): refuse
            # rather than differ.
            raise self.error(TemplateSecurityError,
                             f"attribute {name!r} of {_type_name(obj)} is not supported", node, name)
        return Undefined(f"{_type_name(obj)} object has no attribute {name!r}")

    def e_call(self, node, scope):
        callee_node, arg_nodes, kwarg_nodes = node.args
        callee = self.eval(callee_node, scope)
        args = [self.eval(n, scope) for n in arg_nodes]
        kwargs = {k: self.eval(n, scope) for k, n in kwarg_nodes}
        if isinstance(callee, _Method):
            return self.call_method(callee, args, kwargs, node)
        if isinstance(callee, GlobalFunction):
            return self.weigh(callee.impl(*args, **kwargs), callee.name)
        if isinstance(callee, Undefined):
            raise self.error(TemplateRuntimeError, callee.hint, node, "call")
        raise self.error(TemplateRuntimeError, f"{_type_name(callee)} object is not callable", node, "call")

    def call_method(self, method: _Method, args: list, kwargs: dict, node: Node) -> Any:
        obj, name = method.obj, method.name
        self.charge(_chars(obj) + sum(map(_chars, args)), name)
        if name == "replace" and len(args) >= 2 and all(isinstance(a, str) for a in args[:2]):
            check_replace(self, obj, args[0], args[1])
        if name == "join" and isinstance(obj, str):
            parts = list(args[0]) if args else []
            self.weigh(parts, "join")
            total = sum(len(p) for p in parts if isinstance(p, str)) + len(obj) * max(len(parts) - 1, 0)
            if total > self.limits.max_output_chars:
                raise self.limit("join result exceeds the size bound", "join")
        if name in ("split", "rsplit", "splitlines") and isinstance(obj, str):
            check_split(self, obj, name, args, kwargs)
        result = getattr(obj, name)(*args, **kwargs)
        self.charge(_chars(result), name)
        return self.weigh(result, name)

    def e_filter(self, node, scope):
        name, value_node, arg_nodes, kwarg_nodes = node.args
        value = self.eval(value_node, scope)
        args = [self.eval(n, scope) for n in arg_nodes]
        kwargs = {k: self.eval(n, scope) for k, n in kwarg_nodes}
        self.charge(_chars(value) + sum(map(_chars, args)), name)
        result = self.filters[name](self, value, *args, **kwargs)
        self.charge(_chars(result), name)
        return self.weigh(result, name)

    def e_test(self, node, scope):
        name, value_node, arg_nodes, kwarg_nodes = node.args
        value = self.eval(value_node, scope)
        args = [self.eval(n, scope) for n in arg_nodes]
        kwargs = {k: self.eval(n, scope) for k, n in kwarg_nodes}
        self.charge(_chars(value) + sum(map(_chars, args)), name)
        if name in _MODULO_TESTS:
            # Jinja computes these as value % n: on a string, that is %-formatting
            divisor, remainder = _MODULO_TESTS[name](value, *args, **kwargs)   # TypeError as Jinja's
            return self.modulo(value, divisor) == remainder
        return bool(self.tests[name](value, *args, **kwargs))


def _type_name(value: Any) -> str:
    return f"'{type(value).__name__}'"


def _chars(value: Any) -> int:
    """What an operation on `value` reads, in characters, for the work budget; an item of a
    container (compared, copied, searched) costs about what 16 characters do."""
    if isinstance(value, str):
        return len(value)
    return 16 * len(value) if isinstance(value, (list, tuple, dict)) else 0


# The tests Jinja defines as `value % n == r`, with their signatures: (n, r).
_MODULO_TESTS = {"odd": lambda value: (2, 1), "even": lambda value: (2, 0),
                 "divisibleby": lambda value, num: (num, 0)}


def check_replace(r: Renderer, text: str, old: str, new: str) -> None:
    occurrences = text.count(old) if old else len(text) + 1
    if len(text) + occurrences * len(new) > r.limits.max_output_chars:
        raise r.limit("replace result exceeds the size bound", "replace")


def check_split(r: Renderer, text: str, name: str, args: list, kwargs: dict) -> None:
    """Refuse a split whose list would exceed the size bound before building it: each piece
    costs its characters plus 4 (weigh's measure), and a 4-million-character string cut at
    every character would otherwise build millions of strings first."""
    sep = args[0] if args and isinstance(args[0], str) else kwargs.get("sep")
    maxsplit = args[1] if len(args) > 1 else kwargs.get("maxsplit", -1)
    if name == "splitlines":
        pieces = len(text) + 1
    elif isinstance(sep, str) and sep:
        pieces = text.count(sep) + 1
    else:
        pieces = (len(text) + 1) // 2 + 1           # whitespace runs: at most every other character
    if isinstance(maxsplit, int) and maxsplit >= 0:
        pieces = min(pieces, maxsplit + 1)
    if len(text) + 4 * pieces + 2 > r.limits.max_output_chars:
        raise r.limit("split result exceeds the size bound", name)


_COMPARATORS = {
    "==": lambda a, b: a == b, "!=": lambda a, b: a != b, "<": lambda a, b: a < b,
    "<=": lambda a, b: a <= b, ">": lambda a, b: a > b, ">=": lambda a, b: a >= b,
    "in": lambda a, b: a in b, "not in": lambda a, b: a not in b,
}
_BINOPS = {
    "+": lambda a, b: a + b, "-": lambda a, b: a - b, "*": lambda a, b: a * b,
    "/": lambda a, b: a / b, "//": lambda a, b: a // b, "%": lambda a, b: a % b,
    "**": lambda a, b: a ** b,
}
