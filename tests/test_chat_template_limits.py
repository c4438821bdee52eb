"""webslm.semantic.chat_template at the edge of its subset: typed errors, positions, the sandbox
and resource bounds (the templates' outputs against jinja2 and transformers are
tests/test_chat_template.py)."""
from __future__ import annotations

import time

import pytest

from test_chat_template import MISTRAL
from webslm.semantic.chat_template import (
    ChatTemplate, TemplateError, TemplateLimitError, TemplateRaisedError, TemplateSecurityError,
    TemplateSyntaxError,
)


def test_raise_exception_is_typed():
    with pytest.raises(TemplateRaisedError) as info:
        ChatTemplate(MISTRAL, "<s>", "</s>").render([{"role": "assistant", "content": "x"}])
    assert info.value.message == "Conversation roles must alternate user/assistant/user/assistant/..."
    assert info.value.line == 1 and info.value.construct


@pytest.mark.parametrize("source", [
    "{{ ''.__class__ }}", "{{ ''.__class__.__mro__[1].__subclasses__() }}",
    "{{ messages.__len__() }}", "{{ raise_exception.__globals__ }}", "{{ namespace.__init__ }}",
    "{% for m in messages %}{{ m.__class__ }}{% endfor %}",
])
def test_dunder_attributes_rejected_at_parse(source):
    with pytest.raises(TemplateSecurityError):
        ChatTemplate(source, None, None)


@pytest.mark.parametrize("source", [
    "{{ ''['__class__'] }}", "{{ messages['__class__'] }}", "{{ messages.pop() }}",
    "{{ messages.append(1) }}", "{{ 'x'.format(1) }}", "{{ {}.update({'a': 1}) }}",
    "{{ 'x'['_private'] }}", "{% set ns = namespace(_x=1) %}",
    "{% set ns = namespace() %}{% set ns._x = 1 %}", "{{ (1).real }}",
])
def test_unsafe_access_rejected_at_render(source):
    template = ChatTemplate(source, None, None)
    with pytest.raises(TemplateSecurityError):
        template.render([{"role": "user", "content": "x"}])


@pytest.mark.parametrize("source, limit", [
    ("{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}", "for"),
    ("{% for i in range(10 ** 9) %}{% endfor %}", "range"),
    ("{% for i in range(100000) %}{{ 'xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx' }}{% endfor %}", "output"),
    ("{{ 'x' * 10 ** 9 }}", "*"),
    ("{{ 2 ** 1000000 }}", "**"),
    ("{{ '%*d' % (10 ** 9, 1) }}", "%"),
    ("{{ ('ab' * 1000).replace('', 'x' * 10000) }}", "replace"),
    ("{% set ns = namespace(x=[1]) %}{% for i in range(64) %}{% set ns.x = [ns.x, ns.x] %}{% endfor %}", "list"),
])
def test_resource_bounds(source, limit):
    template = ChatTemplate(source, None, None)
    start = time.perf_counter()
    with pytest.raises(TemplateLimitError) as info:
        template.render([])
    assert time.perf_counter() - start < 10
    assert info.value.construct == limit


def test_deep_nesting_is_bounded_at_parse():
    with pytest.raises(TemplateLimitError):
        ChatTemplate("{{ " + "(" * 500 + "1" + ")" * 500 + " }}", None, None)
    with pytest.raises(TemplateLimitError):
        ChatTemplate("{% if true %}" * 200 + "{% endif %}" * 200, None, None)


@pytest.mark.parametrize("source, line, column, construct", [
    ("hello\n  {{ x | shell }}", 2, 10, "shell"),
    ("{{ x is frobnicated }}", 1, 9, "frobnicated"),
    ("{% macro m() %}{% endmacro %}", 1, 4, "macro"),
    ("line\n\n{% include 'other.jinja' %}", 3, 4, "include"),
    ("{% extends 'base' %}", 1, 4, "extends"),
    ("{% for x in xs recursive %}{% endfor %}", 1, 16, "recursive"),
    ("{{ f(*args) }}", 1, 6, "call"),
    ("{% if x %}never closed", 1, 23, "endif"),
    ("{{ 'unterminated }}", 1, 4, "lexer"),
    ("{% break %}", 1, 4, "break"),
])
def test_outside_the_subset_fails_at_parse_with_position(source, line, column, construct):
    with pytest.raises(TemplateSyntaxError) as info:
        ChatTemplate(source, None, None)
    assert (info.value.line, info.value.column, info.value.construct) == (line, column, construct)
    assert f"line {line}, column {column}" in str(info.value)


def test_undefined_semantics():
    t = ChatTemplate("{{ u }}|{{ u is defined }}|{{ u | length }}|{{ u ~ 'x' }}|{{ not u }}|{{ u == u }}", None, None)
    assert t.render([]) == "|False|0|x|True|True"
    with pytest.raises(TemplateError):
        ChatTemplate("{{ u.attr }}", None, None).render([])
    with pytest.raises(TemplateError):
        ChatTemplate("{{ u + 1 }}", None, None).render([])
