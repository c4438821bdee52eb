"""Errors: the `TemplateError` hierarchy every failure is reported as, and the resource `Limits`."""
from __future__ import annotations

from dataclasses import dataclass


class TemplateError(Exception):
    """Any failure to parse or render a template. `line`/`column` are 1-based when known;
    `construct` names the language construct involved (a tag, filter, test, operator...)."""

    def __init__(self, message: str, *, line: int | None = None, column: int | None = None,
                 construct: str | None = None):
        self.message = message
        self.line = line
        self.column = column
        self.construct = construct
        super().__init__(message)

    def __str__(self) -> str:
        where = f" (line {self.line}, column {self.column})" if self.line is not None else ""
        return f"{self.message}{where}"


class TemplateSyntaxError(TemplateError):
    """Malformed template, or a construct outside the supported subset."""


class TemplateSecurityError(TemplateError):
    """Access to something the sandbox does not expose (dunder attributes, mutating methods...)."""


class TemplateLimitError(TemplateError):
    """A resource bound was exceeded (iterations, output size, value size, depth)."""


class TemplateRuntimeError(TemplateError):
    """Evaluation failed the way Jinja's would (undefined access, type errors, bad unpacking)."""


class TemplateRaisedError(TemplateError):
    """The template called `raise_exception(message)`; `message` is the template's text."""


@dataclass(frozen=True)
class Limits:
    max_source_chars: int = 1_000_000
    max_output_chars: int = 4_000_000      # also the bound on any string/container built
    max_loop_iterations: int = 100_000     # total over one render, nested loops included
    max_range: int = 100_000               # Jinja's sandbox bound on range()
    max_work: int = 5_000_000              # ~50 ns units: 20 a step, 1 per 16 characters (render.py)
    max_render_seconds: float = 1.5        # wall time for one render: the backstop
    max_int_bits: int = 100_000
    max_nesting: int = 40                  # expression and block nesting (Pyodide's stack is small)
