"""Hostile chat templates: each ends in a TemplateError, refused by a size or work bound
before it allocates or computes much, and every other failure is a TemplateError too.

A model file carries its own template and a `?model=` link is enough to deliver one, so
these are templates an attacker writes: %-formatting that pads to a gigabyte, tojson with
kilobyte separators, a cheap string operation repeated 100,000 times over 4 million
characters. No test here times anything: each asserts that the deterministic work or size
bound refused the template (not the wall-time backstop, which has its own test), and that
the traced memory stayed small. bench/probe_hostile.py times the same templates.
"""
from __future__ import annotations

import json
import tracemalloc

import pytest

from webslm.semantic.chat_template import ChatTemplate, Limits, TemplateError, TemplateLimitError, TemplateRuntimeError
from webslm.semantic.jinja import Template

MESSAGES = [{"role": "user", "content": "hi"}]
BIG = "{% set s = 'a' * 3999999 %}"

HOSTILE = {
    "%-mapping width": "{{ '%(a)999999999s' % {'a': 1} }}",
    "%-width through `is odd`": "{{ '%1900000000d' is odd }}",
    "%-width through divisibleby": "{{ '%1900000000d' is divisibleby 3 }}",
    "%-width through divisibleby(num=)": "{{ '%1900000000d' is divisibleby(num=3) }}",
    "%-star width": "{{ '%*d' % (999999999, 1) }}",
    "%-literal % padded": "{{ ('%999%' * 100000) % () }}",
    "%-repeated specifier": "{{ ('%(a)999s' * 300000) % {'a': 1} }}",
    "%-repeated argument": "{% set a = 'x' * 3000000 %}{{ '%(a)s%(a)s' % {'a': a} }}",
    "%-precision": "{{ '%.999999999f' % 1.0 }}",
    "%-repr of a long string": "{% set a = '\\x01' * 1000000 %}{{ '%r' % a }}",
    "tojson separators": "{{ range(100000)|list|tojson(separators=('x' * 20000, ':')) }}",
    "tojson short separators, many items": "{{ range(100000)|list|tojson(separators=('x' * 60, ':')) }}",
    "tojson deep indent": "{% set ns = namespace(v=range(30000)|list) %}{% for i in range(39) %}"
                          "{% set ns.v = [ns.v] %}{% endfor %}{{ ns.v|tojson(indent=64) }}",
    "replace in a loop": BIG + "{% for i in range(100000) %}{% set t = s.replace('a', 'b') %}{% endfor %}",
    "count in a loop": BIG + "{% for i in range(100000) %}{{ s.count('b') and '' }}{% endfor %}",
    "in in a loop": BIG + "{% for i in range(100000) %}{% if 'b' in s %}x{% endif %}{% endfor %}",
    "upper in a loop": BIG + "{% for i in range(100000) %}{% set t = s|upper %}{% endfor %}",
    "concat in a loop": "{% set s = 'a' * 3000000 %}{% for i in range(100000) %}{% set t = s ~ '' %}{% endfor %}",
    "compare in a loop": BIG + "{% set u = 'a' * 3999999 %}{% for i in range(100000) %}"
                         "{% if s == u %}{% endif %}{% endfor %}",
    "growing string": "{% set ns = namespace(s='') %}{% for i in range(100000) %}{% set ns.s = ns.s ~ 'abcdefgh' * 5 %}"
                      "{% endfor %}",
    "split into millions": "{{ ((' a' * 1999999).split())|length }}",
    "splitlines into millions": "{{ ('\\n' * 3999999).splitlines()|length }}",
    "tojson in a loop": "{% set v = range(10000)|list %}{% for i in range(100000) %}{% set t = v|tojson %}{% endfor %}",
}


def refusal(source: str, limits: Limits | None = None) -> tuple[TemplateError, int]:
    """The TemplateError the template ends in, and the traced peak while it ran."""
    tracemalloc.start()
    try:
        ChatTemplate(source, limits=limits or Limits()).render(MESSAGES)
    except TemplateError as exc:
        return exc, tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    raise AssertionError("the template rendered")


@pytest.mark.parametrize("name", HOSTILE)
def test_a_hostile_template_is_refused_by_a_bound_with_little_memory(name):
    # the wall-time backstop set far away: what refuses the template must be deterministic
    error, peak = refusal(HOSTILE[name], Limits(max_render_seconds=3600))
    assert isinstance(error, TemplateLimitError), error
    assert "took more than" not in str(error), error
    assert peak < 80 << 20, f"traced peak {peak >> 20} MiB"


def test_the_wall_time_budget_refuses_what_the_work_budget_prices_too_low():
    limits = Limits(max_render_seconds=0.0, max_work=10**12)      # already past when it starts
    error, _ = refusal("{% for i in range(10) %}x{% endfor %}", limits)
    assert isinstance(error, TemplateLimitError) and "took more than 0.0 s" in str(error)


@pytest.mark.parametrize("source, expected", [
    ("{{ '%5s|%-4d|%.3f|%x|%%' % ('ab', 7, 3.14159, 255) }}", "   ab|7   |3.142|ff|%"),
    ("{{ '%(name)s is %(age)d' % {'name': 'Ann', 'age': 30} }}", "Ann is 30"),
    ("{{ '%s' % 'x' * 3 }}", "xxx"),
    ("{{ 3 is odd }} {{ 4 is even }} {{ 9 is divisibleby 3 }} {{ 10 is divisibleby(num=4) }}", "True True True False"),
    ("{{ '%d' is odd }}", "False"),          # as Jinja: '%d' % 2 == '2', which is not 1
    ("{{ [1, 'a', none]|tojson }}", '[1, "a", null]'),
    ("{{ {'b': 1, 'a': [2]}|tojson(indent=2, separators=(',', ': ')) }}", '{\n  "b": 1,\n  "a": [\n    2\n  ]\n}'),
])
def test_what_the_guards_let_through_renders_as_python_and_jinja_do(source, expected):
    assert ChatTemplate(source).render(MESSAGES) == expected


def test_tojson_gives_json_dumps_text_for_what_it_allows():
    value = {"tools": [{"name": "f", "args": {"x": 1.5, "y": [True, None, "é\n"]}}], "n": -3}
    template = "{{ v|tojson(indent=ind, separators=sep, sort_keys=sk, ensure_ascii=asc) }}"
    for ind in (None, 2, "\t"):
        for sep in (None, (",", ":"), (", ", ": ")):
            for sk in (False, True):
                for asc in (False, True):
                    got = ChatTemplate(template).render(MESSAGES, v=value, ind=ind, sep=sep, sk=sk, asc=asc)
                    assert got == json.dumps(value, indent=ind, separators=sep, sort_keys=sk, ensure_ascii=asc)


def test_a_modulo_test_called_wrongly_is_a_template_error():
    with pytest.raises(TemplateRuntimeError):
        ChatTemplate("{{ 'abc' is odd }}").render(MESSAGES)        # not all arguments converted
    with pytest.raises(TemplateRuntimeError):
        ChatTemplate("{{ 3 is divisibleby }}").render(MESSAGES)    # num is missing


def test_any_other_failure_is_a_template_error():
    def broken(renderer, value):
        raise AttributeError("a filter's own bug")
    template = Template("{{ 1|broken }}", filters={"broken": broken})
    with pytest.raises(TemplateRuntimeError, match="AttributeError"):
        template.render({})


HOSTILE_MORE = {
    "slice copies in a loop": BIG + "{% for i in range(100000) %}{% set t = s[1:] %}{% endfor %}",
    "in over a big list, in a loop": "{% set v = range(100000)|list %}{% for i in range(100000) %}"
                                    "{% if -1 in v %}{% endif %}{% endfor %}",
}


@pytest.mark.parametrize("name", HOSTILE_MORE)
def test_copies_and_scans_are_charged_too(name):
    error, peak = refusal(HOSTILE_MORE[name], Limits(max_render_seconds=3600))
    assert isinstance(error, TemplateLimitError) and "took more than" not in str(error), error


def test_iterating_a_big_mapping_is_charged():
    big = {str(i): i for i in range(100_000)}          # e.g. a request's tools, as a mapping
    template = Template("{% for i in range(100000) %}{% for k in d %}{% break %}{% endfor %}{% endfor %}",
                        limits=Limits(max_render_seconds=3600))
    with pytest.raises(TemplateLimitError, match="work budget"):
        template.render({"d": big})


def test_a_long_legitimate_conversation_fits_the_budgets():
    """The budgets are for hostile templates: the corpus templates render a conversation of
    256 messages and 3.8 million characters (close to the output bound) within them."""
    from test_chat_template import SPECIAL, TEMPLATES
    messages = [{"role": ("user", "assistant")[n % 2], "content": f"message {n}: " + "word " * 2900}
                for n in range(256)]
    for name, source in TEMPLATES.items():
        if name == "features":          # the coverage template, not a model's
            continue
        text = ChatTemplate(source, *SPECIAL[name], limits=Limits(max_render_seconds=3600)).render(messages)
        assert len(text) > 3_700_000, name
