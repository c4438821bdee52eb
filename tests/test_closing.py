"""Closing within max_tokens (semantic/closing.py, token_mask.GrammarMask.allowed_within), for
JSON-schema and grammar modes as for JSON mode:

- closing(state) is exact: on random walks and on the prefixes of valid texts it equals a
  breadth-first search for the nearest accepting state over closing.SAFE bytes (up to a
  depth; beyond it, the search finds nothing nearer).
- Seeded SmolLM2 answers on the CPU path with small max_tokens, over schemas (required
  fields, nested objects, arrays with minItems, enums, patterns, strings with minLength) and
  grammars (a recursive one among them): every answer parses and validates, cut by the
  limit or not; the limit does some of the closing.
- A limit below the shortest valid answer is refused up front with a typed error
  (SamplerError "out-of-range" on max_tokens), in Python and through the worker's request.
"""
from __future__ import annotations

import json
import pathlib
import random
import re

import pytest
from json_schemas import errors
from test_grammar_mode import ARITHMETIC, REGULAR, in_arithmetic

import webslm
from webslm.answer import check_room
from webslm.cpu import CpuBackend
from webslm.generate import generate
from webslm.request import prompt_ids, sampler_settings
from webslm.semantic import json_grammar as jg
from webslm.semantic.closing import SAFE
from webslm.semantic.gbnf import compile_grammar
from webslm.semantic.json_schema import canonical_schema, compile_schema
from webslm.semantic.sampler import SamplerError
from webslm.worker.requests import RequestError, generation_plan

ROOT = pathlib.Path(__file__).resolve().parents[1]
SMOLLM2 = ROOT / ".assets/site/models/smollm2-135m-instruct-q4.slm"
needs_smollm2 = pytest.mark.skipif(not SMOLLM2.is_file(), reason="SmolLM2 is built by set-up (tools/assets.py)")

# (name, schema, a valid instance, its shortest valid text's length in bytes)
SCHEMAS = [
    ("required", {"type": "object", "properties": {"name": {"type": "string"}, "age": {"type": "integer"},
                                                   "note": {"type": "string"}},
                  "required": ["name", "age"], "additionalProperties": False},
     {"name": "Ann", "age": 31}, len('{"name":"","age":0}')),
    ("nested", {"type": "object", "properties": {"book": {"type": "object", "properties": {
        "title": {"type": "string"}, "author": {"type": "object", "properties": {"last": {"type": "string"}},
                                                "required": ["last"]}}, "required": ["title", "author"]}},
        "required": ["book"]},
     {"book": {"title": "Emma", "author": {"last": "Austen"}}}, len('{"book":{"title":"","author":{"last":""}}}')),
    ("min-items", {"type": "object", "properties": {"tags": {"type": "array", "items": {"type": "string"},
                                                             "minItems": 3, "maxItems": 5}},
                   "required": ["tags"]},
     {"tags": ["a", "b", "c"]}, len('{"tags":["","",""]}')),
    ("enums", {"type": "object", "properties": {"colour": {"enum": ["red", "green", "blue"]},
                                                "size": {"enum": [1, 22, "large"]}},
               "required": ["colour", "size"]},
     {"colour": "green", "size": 22}, len('{"colour":"red","size":1}')),
    ("pattern", {"type": "object", "properties": {"code": {"type": "string", "pattern": "^[A-Z]{3}-[0-9]{2,4}$"},
                                                  "day": {"type": "string", "format": "date"}},
                 "required": ["code", "day"]},
     {"code": "ABC-123", "day": "2024-05-06"}, len('{"code":"AAA-00","day":"1000-01-01"}')),
    ("min-length", {"type": "object", "properties": {"summary": {"type": "string", "minLength": 12, "maxLength": 40},
                                                     "rating": {"type": "integer", "minimum": 100, "maximum": 999}},
                    "required": ["summary", "rating"]},
     {"summary": "a short line", "rating": 150}, len('{"summary":"123456789012","rating":100}')),
    ("array-of-objects", {"type": "array", "minItems": 2, "items": {
        "type": "object", "properties": {"x": {"type": "integer"}, "ok": {"type": "boolean"}}, "required": ["x", "ok"]}},
     [{"x": 1, "ok": True}, {"x": -5, "ok": False}], len('[{"x":0,"ok":true},{"x":0,"ok":true}]')),
]
GRAMMARS = [(name, text, lambda out, p=pattern: re.fullmatch(p, out) is not None) for name, text, pattern in REGULAR
            if name in ("answer", "list", "kv", "csv")] + [("arithmetic", ARITHMETIC, in_arithmetic)]


def nearest_end(grammar, state, depth: int):
    """Breadth-first: the fewest SAFE bytes to an accepting state, or None beyond `depth`."""
    if grammar.accepting(state):
        return 0
    seen, frontier = {state}, [state]
    for distance in range(1, depth + 1):
        after = []
        for s in frontier:
            for byte in SAFE:
                nxt = grammar.step(s, byte)
                if nxt is None or nxt in seen:
                    continue
                if grammar.accepting(nxt):
                    return distance
                seen.add(nxt)
                after.append(nxt)
        frontier = after
    return None


def walk_states(grammar, rng: random.Random, steps: int):
    """The states of a random walk over the SAFE bytes the grammar takes."""
    state, out = grammar.initial, [grammar.initial]
    ascii_bytes = [b for b in sorted(SAFE) if b < 0x80]
    for _ in range(steps):
        options = [b for b in ascii_bytes if grammar.step(state, b) is not None]
        if not options:
            break
        state = grammar.step(state, rng.choice(options))
        out.append(state)
    return out


def check_exact(grammar, states, depth: int = 5) -> int:
    checked = 0
    for state in states:
        need = grammar.closing(state)
        found = nearest_end(grammar, state, depth)
        if need <= depth:
            assert found == need, (state, need, found)
            checked += 1
        else:
            assert found is None, (state, need, found)
    return checked


@pytest.mark.parametrize("name,schema,instance,shortest", SCHEMAS, ids=[s[0] for s in SCHEMAS])
def test_schema_closing_is_the_shortest_completion(name, schema, instance, shortest):
    grammar = compile_schema(canonical_schema(schema))
    assert grammar.closing(grammar.initial) == shortest
    text = json.dumps(instance).encode()
    prefixes = [grammar.advance(grammar.initial, text[:i]) for i in range(len(text) + 1)]
    assert all(p is not None for p in prefixes) and grammar.closing(prefixes[-1]) == 0
    # along a valid text closing() falls by at most one a byte, and is exact where small
    assert all(a - b <= 1 for a, b in zip(map(grammar.closing, prefixes), map(grammar.closing, prefixes[1:])))
    rng = random.Random(name)
    assert check_exact(grammar, prefixes[-12:] + walk_states(grammar, rng, 40)[-10:]) >= 5


@pytest.mark.parametrize("name,text,ok", GRAMMARS, ids=[g[0] for g in GRAMMARS])
def test_grammar_closing_is_the_shortest_completion(name, text, ok):
    grammar = compile_grammar(text)
    rng = random.Random(name)
    states = []
    for _ in range(6):
        states += walk_states(grammar, rng, rng.randrange(1, 30))
    assert check_exact(grammar, states) >= 5


def test_json_object_closing_is_the_shortest_completion():
    text = b'{"a": [1, {"b": "c\\u00e9"}, -2.5e3, true], "d": {}}'
    states = [jg.advance(jg.INITIAL, text[:i]) for i in range(len(text) + 1)]
    assert check_exact(jg.ObjectGrammar, states, depth=4) >= 10


# -- answers cut by a small max_tokens ------------------------------------------------------------

def answer(model, backend, request: dict, question: str):
    s = sampler_settings(model, request)
    deltas = list(generate(model, backend, prompt_ids(model, [{"role": "user", "content": question}]), s))
    return "".join(d.text for d in deltas), deltas[-1].finish_reason


@needs_smollm2
def test_smollm2_schema_answers_under_small_limits_always_validate():
    model = webslm.open_model(SMOLLM2)
    backend = CpuBackend(model)
    cut = 0
    for n, (name, schema, _, shortest) in enumerate(SCHEMAS):
        limit = shortest + (1 if n % 2 else 8)         # just above the bound, and a little more
        text, reason = answer(model, backend, {"response_format": {"type": "json_schema", "json_schema": {
            "name": name, "schema": schema}}, "temperature": 1.0, "seed": n, "max_tokens": limit},
            f"Answer with JSON for a {name} record.")
        assert errors(json.loads(text), schema) == [], (name, limit, text)
        assert len(text.encode()) >= shortest
        cut += reason == "length"
    # the limit did the closing, not only the model: seeded, so the same 2 of the 7 each run
    # (counted in bytes, the limits leave SmolLM2 room to end most answers itself)
    assert cut >= 2


@needs_smollm2
def test_smollm2_grammar_answers_under_small_limits_are_in_the_language():
    model = webslm.open_model(SMOLLM2)
    backend = CpuBackend(model)
    cut = 0
    for n, (name, text, ok) in enumerate(GRAMMARS):
        grammar = compile_grammar(text)
        limit = int(grammar.closing(grammar.initial)) + (1 if n % 2 else 6)
        out, reason = answer(model, backend, {"response_format": {"type": "grammar", "grammar": text},
                                              "temperature": 1.0, "seed": n, "max_tokens": limit},
                             "Write (1+2)*3 and more of the same." if name == "arithmetic" else f"Write a {name}.")
        assert ok(out), (name, limit, out, reason)
        cut += reason == "length"
    assert cut >= 2


@needs_smollm2
def test_a_limit_below_the_shortest_answer_is_refused_up_front():
    model = webslm.open_model(SMOLLM2)
    ids = prompt_ids(model, [{"role": "user", "content": "JSON please"}])
    for form, shortest in [({"type": "json_object"}, 2),
                           ({"type": "json_schema", "json_schema": {"name": "x", "schema": SCHEMAS[0][1]}}, SCHEMAS[0][3]),
                           ({"type": "grammar", "grammar": ARITHMETIC}, 1),
                           ({"type": "grammar", "grammar": REGULAR[0][1]}, len("The answer is 1."))]:
        check_room(model, ids, sampler_settings(model, {"response_format": form, "max_tokens": shortest}))
        too_few = sampler_settings(model, {"response_format": form, "max_tokens": shortest - 1}) if shortest > 1 else None
        if too_few is None:
            continue
        with pytest.raises(SamplerError, match=f"takes {shortest} tokens") as refused:
            check_room(model, ids, too_few)
        assert refused.value.code == "out-of-range" and refused.value.where == "max_tokens"
        with pytest.raises(SamplerError, match="out-of-range|takes"):
            list(generate(model, CpuBackend(model), ids, too_few))
        with pytest.raises(RequestError) as worker:
            generation_plan(model, {"messages": [{"role": "user", "content": "hi"}],
                                    "settings": {"response_format": form, "max_tokens": shortest - 1}})
        assert worker.value.code == "out-of-range" and worker.value.where == "max_tokens"
