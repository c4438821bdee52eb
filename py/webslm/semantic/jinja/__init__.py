"""A sandboxed evaluator for the subset of Jinja2 that chat templates use, in pure stdlib Python.

Why it exists: the browser runtime (Pyodide, stdlib + numpy) has no jinja2, and chat templates come
from model artifacts, i.e. they are untrusted input. So this module does not compile templates to
Python (Jinja does); it lexes, parses into a small tree and walks that tree, over a closed value
domain: JSON-like data (str, int, float, bool, None, list, tuple, dict), `Undefined`, and a handful
of objects defined here (loop context, namespace, whitelisted bound methods, global functions).
Nothing reaches Python's `getattr`, so there is no path to `__class__`, `__globals__` and friends.

Faithfulness: the lexer is a port of Jinja 3.1's rules with `trim_blocks=True, lstrip_blocks=True`
(the configuration transformers uses), including `-`/`+` whitespace control, the trailing-newline
drop, newline normalisation, and Python-style string escapes. The parser follows Jinja's grammar and
operator precedence (e.g. `**` is left-associative, filters bind tighter than `+`, `a if b` without
`else` gives Undefined). Values follow Jinja's default `Undefined`. Where our result could silently
differ from Jinja's, we raise `TemplateError` instead (e.g. rendering a bound method).

Outside the subset (rejected at parse time with line/column): macros, call/filter blocks, include,
import, extends, blocks, `with`, `do`, recursive loops, `*args`/`**kwargs` in calls, unknown filters
and tests. Resource use is bounded: loop iterations, output size, sizes of built values, integer
sizes, nesting depth, work (every operation and the characters it touches) and wall time per
render; what could amplify (%-formatting, tojson, split) is checked before its result is built.

Pipeline: source -> tokens -> AST -> rendering.
- `lexer`: normalises the source and cuts it into data/tag tokens (whitespace control applied here);
- `parser`: builds a tree of `Node`s, rejecting unsupported constructs, unknown filters/tests and
  dunder attributes up front;
- `render`: walks the tree over `Scope`s, calling filters/tests/globals as it goes;
- `values`, `filters`, `errors`: the closed value domain, the built-in filters/tests/globals,
  the error hierarchy and `Limits`;
- `guards`: the checks run before %-formatting and JSON encoding build their results.
Security model in short: nothing is compiled; attribute and method access go through explicit
whitelists (Python's `getattr` only ever sees a whitelisted method name); every loop, output, built
value, integer and nesting level is charged against `Limits`; where we cannot reproduce Jinja
exactly, we raise `TemplateError`.
"""
from __future__ import annotations

from typing import Any, Callable

from .errors import (
    Limits, TemplateError, TemplateLimitError, TemplateRaisedError, TemplateRuntimeError,
    TemplateSecurityError, TemplateSyntaxError,
)
# _safe_range keeps its name: it shows up in user-visible error messages (bad keyword arguments).
from .filters import FILTERS, TESTS, _safe_range, make_namespace
from .lexer import Source, normalise, tokenize
from .parser import Parser
from .render import Renderer, Scope
from .values import GlobalFunction, Namespace, Undefined

__all__ = [
    "Limits", "Template", "Undefined", "Namespace", "GlobalFunction",
    "TemplateError", "TemplateSyntaxError", "TemplateSecurityError", "TemplateLimitError",
    "TemplateRuntimeError", "TemplateRaisedError", "FILTERS", "TESTS",
]


# Public entry point


class Template:
    """A parsed template. `filters`/`globals` extend or override the built-ins (that is how
    chat_template.py installs transformers' environment)."""

    def __init__(self, source: str, *, filters: dict[str, Callable[..., Any]] | None = None,
                 globals: dict[str, Any] | None = None, limits: Limits = Limits()):
        if not isinstance(source, str):
            raise TemplateSyntaxError("template source must be a str")
        if len(source) > limits.max_source_chars:
            raise TemplateLimitError(f"template source exceeds {limits.max_source_chars} chars",
                                     construct="source")
        self.limits = limits
        self.filters = {**FILTERS, **(filters or {})}
        self.tests = dict(TESTS)
        self.globals = {"range": GlobalFunction("range", _safe_range(limits)),
                        "namespace": GlobalFunction("namespace", make_namespace)}
        self.globals.update(globals or {})
        self._src = Source(normalise(source))
        try:
            parser = Parser(self._src, tokenize(self._src), self.filters, self.tests, limits)
            self._body = parser.parse()
        except TemplateError:
            raise
        except (RecursionError, MemoryError):
            raise TemplateLimitError("template nested too deeply or too large to parse", construct="source") from None
        except Exception as exc:    # noqa: BLE001 - every failure is a TemplateError
            raise TemplateSyntaxError(f"cannot parse the template ({type(exc).__name__}: {exc})"[:300]) from None

    def render(self, context: dict[str, Any]) -> str:
        """The rendered text; any failure is a TemplateError (limits: TemplateLimitError)."""
        renderer = Renderer(self._src, self.limits, self.filters, self.tests)
        root = Scope(Scope(None, dict(self.globals)), dict(context))
        try:
            renderer.run(self._body, root)
        except TemplateError:
            raise
        except RecursionError:
            raise TemplateLimitError("rendering nested too deeply", construct="nesting") from None
        except MemoryError:
            raise TemplateLimitError("rendering ran out of memory", construct="output") from None
        except Exception as exc:    # noqa: BLE001 - a break outside a loop, an error no check named
            raise TemplateRuntimeError(f"rendering failed ({type(exc).__name__}: {exc})"[:300]) from None
        return "".join(renderer.out)
