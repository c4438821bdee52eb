"""JSON-schema mode's string and integer keywords (pattern, format, minLength, maxLength,
minimum, maximum, exclusiveMinimum, exclusiveMaximum): char_pattern.py's automaton against
Python's `re`, the byte-level recognizer against tests/json_schemas.py's validator, the
typed refusals, the token mask against a brute-force check of every SmolLM2 token, and
SmolLM2's answers to tests/json_schemas.py's KEYWORD_SCHEMAS.

- Automaton: for each pattern, a random string is taken exactly when re.fullmatch (ASCII
  classes) takes it and its length is in bounds; every prefix of a taken string is live.
- Recognizer: random walks that pick any byte the recognizer takes (UTF-8 and escapes
  included) never get stuck (a state always has a next byte or is complete), and every text
  they finish validates; json.dumps's texts of valid values (ASCII-escaped or not) are taken.
- Integers: every integer in a window around the bounds is taken exactly when it is in them.
"""
from __future__ import annotations

import json
import pathlib
import random
import re

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st
from json_schemas import KEYWORD_SCHEMAS, errors

import webslm
from webslm.cpu import CpuBackend
from webslm.generate import generate
from webslm.request import prompt_ids, sampler_settings
from webslm.semantic.char_pattern import CharAutomaton, PatternError
from webslm.semantic.json_schema import SchemaError, canonical_schema, compile_schema, schema_mask_for

ROOT = pathlib.Path(__file__).resolve().parents[1]
SMOLLM2 = ROOT / ".assets/site/models/smollm2-135m-instruct-q4.slm"
PROPS = settings(max_examples=300, derandomize=True, database=None, deadline=None, print_blob=False)
needs_smollm2 = pytest.mark.skipif(not SMOLLM2.is_file(), reason="SmolLM2 is built by set-up (tools/assets.py)")

PATTERNS = [
    (r"^[a-c]{2,4}-\d+$", 0, None), (r"(ab|a)*b?", 0, 5), (r"a(b|c)*d", 3, 6), (r"[^a]x{1,3}", 0, None),
    (r"\w+@\w+\.(com|org)", 0, 20), (r"(?:x|yz){2}[0-9]?", 0, None), (r".*a.*", 2, 4), (r"a{0,2}b{2}c*", 0, 7),
    (r"\s?[\d\-]+", 1, 5), (r"[a\]b]+|\\\.", 0, None), (r"(a|b|)c", 0, None), (r"\x41\u0042+", 0, 4),
]
ALPHABET = "abcdxyz-0159@.\\] \tAB_com"


@PROPS
@given(st.data())
def test_the_automaton_takes_what_re_fullmatch_takes(data):
    pattern, low, high = data.draw(st.sampled_from(PATTERNS))
    auto = CharAutomaton(pattern, low, high)
    regex = re.compile(pattern.lstrip("^").rstrip("$"), re.ASCII)
    text = data.draw(st.text(alphabet=ALPHABET, max_size=9) | st.from_regex(regex, fullmatch=True).filter(
        lambda s: s.isascii() and len(s) < 12))
    state, states = auto.initial, []
    for ch in text:
        state = auto.step(state, ord(ch))
        if state is None:
            break
        states.append(state)
    ok = regex.fullmatch(text) is not None and low <= len(text) <= (high if high is not None else len(text))
    assert (state is not None and auto.accepting(state)) == ok, (pattern, low, high, text)
    if ok:
        assert len(states) == len(text)                     # every prefix was live


def test_patterns_outside_the_subset_are_refused():
    for pattern in ["(?=a)", "(?<n>a)", r"a\1", r"\bword", r"\p{L}", "a^b", "a$b", "(a", "a)", "*a", "a**",
                    "[z-a]", "a{3,1}", "a{2000}", r"\c", "x" * 1001, r"\01"]:
        with pytest.raises(PatternError):
            CharAutomaton(pattern)
    with pytest.raises(PatternError, match="no string"):
        CharAutomaton("a{5}", 0, 3)
    with pytest.raises(PatternError, match="no string"):
        CharAutomaton("(aa)*", 3, 3)                        # lengths 0, 2, 4: none is 3
    with pytest.raises(PatternError, match="4096"):
        CharAutomaton(None, 0, 5000)


def walk(grammar, rng: random.Random, limit: int = 400) -> bytes:
    """A random text the recognizer takes whole: any byte it takes, ending when it may."""
    state, out = grammar.initial, bytearray()
    choices = list(range(0x20, 0x7F)) + [0x0A, 0xC3, 0xA9, 0xE2, 0x82, 0xAC, 0xF0, 0x9F, 0x98, 0x80, 0xED, 0xA0]
    while not grammar.finished(state):
        if grammar.accepting(state) and rng.random() < 0.2:
            break
        taken = [b for b in choices if grammar.step(state, b) is not None]
        if not taken:                                       # only bytes outside `choices` go on
            taken = [b for b in range(256) if grammar.step(state, b) is not None]
        assert taken or grammar.accepting(state), f"stuck after {bytes(out)!r}"
        if not taken:
            break
        closers = [b for b in taken if b in b'"]},']
        byte = rng.choice(closers) if closers and len(out) > limit else rng.choice(taken)
        out.append(byte)
        state = grammar.step(state, byte)
    assert grammar.accepting(state)
    return bytes(out)


FORMAT_SCHEMAS = [{"type": "string", "format": f} for f in ("date", "time", "date-time", "uuid", "email", "ipv4")]
WALKED = [case["schema"] for case in KEYWORD_SCHEMAS] + FORMAT_SCHEMAS + [
    {"type": "string", "minLength": 3, "maxLength": 5},
    {"type": "array", "items": {"type": "integer", "minimum": -3, "exclusiveMaximum": 12}, "maxItems": 6},
    {"anyOf": [{"type": "string", "pattern": "^[0-9]{3}$"}, {"type": "string", "maxLength": 2}]},
    {"type": "integer", "minimum": 100}, {"type": "integer", "maximum": -7}]


@pytest.mark.parametrize("n", range(len(WALKED)))
def test_random_walks_never_get_stuck_and_always_validate(n):
    schema = WALKED[n]
    grammar = compile_schema(canonical_schema(schema))
    rng = random.Random(n)
    for _ in range(40):
        text = walk(grammar, rng)
        value = json.loads(text.decode("utf-8"))            # strict UTF-8: no replacement character
        assert errors(value, schema) == [], (schema, text)


VALID = [
    ({"type": "string", "format": "date"}, ["2024-02-28", "1999-12-31", "1000-01-01", "2023-04-30"]),
    ({"type": "string", "format": "time"}, ["23:59:59Z", "00:00:00.123456+05:30", "12:30:00-01:00"]),
    ({"type": "string", "format": "date-time"}, ["2026-12-02T14:00:00Z", "2001-06-15T08:09:10.5+02:00"]),
    ({"type": "string", "format": "uuid"}, ["123e4567-e89b-12d3-a456-426614174000", "ABCDEF01-2345-6789-abcd-ef0123456789"]),
    ({"type": "string", "format": "email"}, ["ada@example.org", "a.b+c@mail.ex-ample.co"]),
    ({"type": "string", "format": "ipv4"}, ["0.0.0.0", "192.168.1.254", "255.255.255.255"]),
    ({"type": "string", "minLength": 2, "maxLength": 3}, ["hé", "\"\\/", "日本語", "a\n", "\U0001F600x"]),
    ({"type": "string", "pattern": "^[a-z]+$"}, ["abc", "z"]),
]
INVALID = [
    ({"type": "string", "format": "date"}, ["2024-02-30", "2023-02-29", "2024-13-01", "2024-1-01"]),
    ({"type": "string", "format": "time"}, ["24:00:00Z", "12:60:00Z", "12:00:00", "12:00:60Z"]),
    ({"type": "string", "format": "uuid"}, ["123e4567e89b12d3a456426614174000", "123e4567-e89b-12d3-a456-42661417400g"]),
    ({"type": "string", "format": "email"}, ["ada", "ada@org", "@example.org"]),
    ({"type": "string", "format": "ipv4"}, ["256.1.1.1", "01.2.3.4", "1.2.3", "1.2.3.4.5"]),
    ({"type": "string", "minLength": 2, "maxLength": 3}, ["a", "abcd", "日本語x"]),
    ({"type": "string", "pattern": "^[a-z]+$"}, ["", "aB", "a1"]),
]


@pytest.mark.parametrize("schema,values", VALID)
def test_valid_strings_are_taken_in_every_json_spelling(schema, values):
    grammar = compile_schema(canonical_schema(schema))
    for value in values:
        assert errors(value, schema) == []
        for ascii_only in (False, True):
            state = grammar.advance(grammar.initial, json.dumps(value, ensure_ascii=ascii_only).encode())
            assert state is not None and grammar.accepting(state), (schema, value, ascii_only)


@pytest.mark.parametrize("schema,values", INVALID)
def test_invalid_strings_are_refused(schema, values):
    grammar = compile_schema(canonical_schema(schema))
    for value in values:
        assert errors(value, schema) != [], value             # the oracle agrees they are invalid
        state = grammar.advance(grammar.initial, json.dumps(value).encode())
        assert state is None or not grammar.accepting(state), (schema, value)


def test_invalid_utf8_and_surrogates_are_refused_in_a_constrained_string():
    grammar = compile_schema(canonical_schema({"type": "string", "maxLength": 4}))
    for raw in [b'"\xc0\x80', b'"\xed\xa0\x80', b'"\xf4\x90', b'"\xe0\x80', b'"\\udc00', b'"\\ud800x',
                b'"\\ud800\\u0041', b'"\x80', b'"\x1f']:
        assert grammar.advance(grammar.initial, raw) is None, raw
    assert grammar.advance(grammar.initial, b'"\\u00e9\xe2\x82\xac') is not None
    state = grammar.advance(grammar.initial, b'"\\ud83d\\ude00"')                   # a pair: one character
    assert state is not None and grammar.accepting(state)


BOUNDS = [(-5, 120), (0, None), (None, -7), (3, 3), (-1000, -990), (10, 99), (None, None), (-2, 2), (7, 1234)]


@pytest.mark.parametrize("low,high", BOUNDS)
def test_integers_are_taken_exactly_inside_their_bounds(low, high):
    schema = {"type": "integer", **({"minimum": low} if low is not None else {}),
              **({"maximum": high} if high is not None else {})}
    grammar = compile_schema(canonical_schema(schema))
    for value in list(range(-1100, 1300)) + [10**12, -10**12, 123456789012345678901234567890]:
        text = str(value).encode()
        state = grammar.advance(grammar.initial, text)
        inside = (low is None or value >= low) and (high is None or value <= high)
        assert (state is not None and grammar.accepting(state)) == inside, (low, high, value)
        if inside:                                          # each prefix live: no dead end on the way
            assert all(grammar.advance(grammar.initial, text[:k]) is not None for k in range(1, len(text)))
    state = grammar.advance(grammar.initial, b"-0")
    assert (state is not None and grammar.accepting(state)) == ((low is None or low <= 0) and (high is None or high >= 0))


def test_exclusive_and_fractional_bounds():
    g = compile_schema(canonical_schema({"type": "integer", "exclusiveMinimum": 0, "exclusiveMaximum": 100,
                                         "maximum": 50.5, "minimum": -3.5}))
    taken = [v for v in range(-10, 120) if (s := g.advance(g.initial, str(v).encode())) is not None and g.accepting(s)]
    assert taken == list(range(1, 51))


@pytest.mark.parametrize("schema,code,where", [
    ({"type": "string", "pattern": "a(?!b)"}, "unsupported-schema", "schema.pattern"),
    ({"type": "string", "format": "uri"}, "unsupported-schema", "schema.format"),
    ({"type": "string", "format": "date", "pattern": "x"}, "unsupported-schema", "schema.format"),
    ({"type": "string", "minLength": 4, "maxLength": 3}, "bad-schema", "schema.minLength"),
    ({"type": "string", "maxLength": -1}, "bad-schema", "schema.maxLength"),
    ({"type": "string", "maxLength": 100000}, "unsupported-schema", "schema.maxLength"),
    ({"type": "string", "pattern": "[0-9]{4}", "maxLength": 3}, "bad-schema", "schema.pattern"),
    ({"type": "number", "maximum": 3}, "unsupported-schema", "schema.maximum"),
    ({"type": "integer", "minimum": 5, "maximum": 4}, "bad-schema", "schema.minimum"),
    ({"type": "integer", "exclusiveMinimum": 1, "exclusiveMaximum": 2}, "bad-schema", "schema.exclusiveMinimum"),
    ({"type": "integer", "minimum": "1"}, "bad-schema", "schema.minimum"),
    ({"type": "integer", "multipleOf": 2}, "unsupported-schema", "schema.multipleOf"),
    ({"type": "object", "properties": {"d": {"type": "string", "pattern": "\\1"}}}, "unsupported-schema",
     "schema.properties.d.pattern"),
])
def test_keywords_outside_the_subset_are_refused_naming_the_path(schema, code, where):
    with pytest.raises(SchemaError) as caught:
        canonical_schema(schema)
    assert (caught.value.code, caught.value.where) == (code, where)


@needs_smollm2
def test_the_mask_is_exactly_the_tokens_the_recognizer_accepts():
    model = webslm.open_model(SMOLLM2)
    tokenizer, vocab = model.tokenizer, model.architecture.vocab
    eos = list(model.manifest.tokenizer["eos_ids"])
    by_name = {case["name"]: case["schema"] for case in KEYWORD_SCHEMAS}
    cases = [("signup", b'{"name": "A'), ("signup", b'{"name": "Ada", "born": "18'), ("signup", b'{"name": "Ada", '
             b'"born": "1815-12-10", "email": "ada@ex'), ("signup", b'{"name": "Ada", "born": "1815-12-10", '
             b'"email": "a@b.org", "age": 1'), ("sku", b'{"code": "AB-'), ("tags", b'["ab-'),
             ("score", b'{"score": -'), ("server", b'{"id": "123e4567-')]
    for name, prefix in cases:
        mask = schema_mask_for(tokenizer, vocab, eos, canonical_schema(by_name[name]))
        state = mask.advance(mask.initial, prefix)
        assert state is not None, prefix
        expected = np.zeros(vocab, dtype=bool)
        for token in range(len(tokenizer.tokens)):
            raw = tokenizer.piece_bytes(token)
            if raw and token not in tokenizer.special_ids and mask.advance(state, raw) is not None:
                expected[token] = True
        expected[eos] = mask.grammar.accepting(state)
        got = mask.allowed(state)
        assert np.array_equal(got, expected), (name, prefix)
        assert got.any()


@pytest.fixture(scope="module")
def smollm2():
    model = webslm.open_model(SMOLLM2)
    return model, CpuBackend(model)


@needs_smollm2
@pytest.mark.parametrize("n", range(len(KEYWORD_SCHEMAS)), ids=[case["name"] for case in KEYWORD_SCHEMAS])
def test_smollm2_answers_every_keyword_schema_with_valid_json(smollm2, n):
    model, backend = smollm2
    case = KEYWORD_SCHEMAS[n]
    s = sampler_settings(model, {"response_format": {"type": "json_schema", "json_schema": {
        "name": case["name"], "schema": case["schema"]}}, "temperature": 0.7, "seed": n, "max_tokens": 160})
    ids = prompt_ids(model, [{"role": "system", "content": "Answer with JSON only."},
                             {"role": "user", "content": case["prompt"]}])
    deltas = list(generate(model, backend, ids, s))
    text = "".join(d.text for d in deltas)
    print(f"{case['name']}: {text!r} ({deltas[-1].finish_reason})")
    assert deltas[-1].finish_reason == "stop", (case["name"], text)
    assert errors(json.loads(text), case["schema"]) == [], (case["name"], text)
