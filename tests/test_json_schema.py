"""JSON-schema mode (response_format json_schema): the schema compiler's subset and its typed
refusals, the recognizer against an independent validator (tests/json_schemas.py), the token
mask against a brute-force check of every token, and SmolLM2's answers on 13 schemas: every
one ends "stop", parses and validates.

- Recognizer: every valid instance of each schema, written as json.dumps writes it (keys in
  the schema's order, with and without indentation), is accepted, and each of its prefixes
  is live but not complete; whatever the recognizer accepts (valid instances and random
  JSON alike) the validator finds valid.
- Mask: allowed(state) is exactly the tokens whose bytes the recognizer takes from that
  state (plus EOS exactly when the value may end), on SmolLM2's 49152 tokens.
- Settings: the schema is part of the sampler's state hash; the same seed gives the same
  tokens (the GPU path: tests/test_gpu_webllm_fields.py, case json-schema).
"""
from __future__ import annotations

import json
import pathlib

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st
from json_schemas import SCHEMAS, errors

import webslm
from webslm.cpu import CpuBackend
from webslm.generate import generate
from webslm.request import prompt_ids, sampler_settings
from webslm.semantic.json_schema import SchemaError, canonical_schema, compile_schema, schema_mask_for
from webslm.semantic.ledger import Ledger
from webslm.semantic.sampler import Sampler, SamplerError, SamplerSettings

ROOT = pathlib.Path(__file__).resolve().parents[1]
SMOLLM2 = ROOT / ".assets/site/models/smollm2-135m-instruct-q4.slm"
PROPS = settings(max_examples=150, derandomize=True, database=None, deadline=None, print_blob=False)
BY_NAME = {case["name"]: case["schema"] for case in SCHEMAS}


def grammar(schema):
    return compile_schema(canonical_schema(schema))


def accepts(schema, text: str) -> bool:
    g = grammar(schema)
    state = g.advance(g.initial, text.encode())
    return state is not None and g.accepting(state)


# -- instances of a schema (a hypothesis strategy), in the order the recognizer writes keys ---------

def instances(schema, root=None):
    root = schema if root is None else root
    if schema is True or schema == {} or set(schema) <= {"description", "title"}:
        return json_values
    if "$ref" in schema:
        section, name = schema["$ref"][2:].split("/", 1)
        return instances(root[section][name], root)
    if "anyOf" in schema:
        return st.one_of([instances(b, root) for b in schema["anyOf"]])
    if "const" in schema:
        return st.just(schema["const"])
    if "enum" in schema:
        return st.sampled_from(schema["enum"])
    kind = schema.get("type")
    if isinstance(kind, list):
        return st.one_of([instances({**schema, "type": k}, root) for k in kind])
    if kind == "object" and "properties" not in schema:
        return st.dictionaries(st.text(max_size=5), json_values, max_size=3)
    if kind == "object":
        props = schema["properties"]
        required = set(schema.get("required", []))
        return st.fixed_dictionaries({k: instances(v, root) for k, v in props.items() if k in required},
                                     optional={k: instances(v, root) for k, v in props.items() if k not in required}
                                     ).map(lambda d: {k: d[k] for k in props if k in d})
    if kind == "array":
        return st.lists(instances(schema.get("items", {}), root), min_size=schema.get("minItems", 0),
                        max_size=schema.get("maxItems", 4))
    return {"string": st.text(max_size=8), "integer": st.integers(-10**12, 10**12), "null": st.none(),
            "number": st.floats(allow_nan=False, allow_infinity=False) | st.integers(-99, 99),
            "boolean": st.booleans()}[kind]


json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-1000, 1000) | st.text(max_size=6) | st.floats(-1e6, 1e6),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=4), inner, max_size=3),
    max_leaves=8)


@PROPS
@given(st.data(), st.sampled_from(SCHEMAS), st.sampled_from([None, 2]))
def test_every_valid_instance_is_accepted_and_its_prefixes_are_live(data, case, indent):
    schema = case["schema"]
    value = data.draw(instances(schema))
    assert errors(value, schema) == []                     # the strategy makes valid instances
    text = json.dumps(value, indent=indent, ensure_ascii=False)
    g = grammar(schema)
    state = g.initial
    for byte in text.encode():
        state = g.step(state, byte)
        assert state is not None, (text, case["name"])
    assert g.accepting(state), text


@PROPS
@given(st.data(), st.sampled_from(SCHEMAS))
def test_whatever_is_accepted_is_valid(data, case):
    schema = case["schema"]
    props = list(schema.get("properties", {}))
    value = data.draw(st.one_of(json_values, instances(schema),
                                instances(schema).map(lambda v: _perturb(v, props, data))))
    text = json.dumps(value, ensure_ascii=False)
    if accepts(schema, text):
        assert errors(json.loads(text), schema) == [], (text, case["name"])


def _perturb(value, props, data):
    """A near miss: a key dropped or added, a value replaced, an item more."""
    if isinstance(value, dict):
        if value and data.draw(st.booleans()):
            del value[data.draw(st.sampled_from(sorted(value)))]
        else:
            value[data.draw(st.sampled_from(props + ["extra"]))] = data.draw(json_values)
    elif isinstance(value, list):
        value.append(data.draw(json_values))
    else:
        value = data.draw(json_values)
    return value


@pytest.mark.parametrize("name,text,ok", [
    ("person", '{"name": "Ada", "age": 36}', True),
    ("person", '{"age": 36, "name": "Ada"}', False),          # keys in the schema's order only
    ("person", '{"name": "Ada"}', False),                     # age is required
    ("person", '{"name": "Ada", "age": 36.5}', False),
    ("person", '{"name": "Ada", "age": 36, "x": 1}', False),
    ("person", '{"name": "Ada", "age": 3e2}', False),         # an integer has no exponent
    ("fruits", '["a"]', False), ("fruits", '["a", "b", "c", "d"]', False), ("fruits", '["a","b"]', True),
    ("colour", '"red"', True), ("colour", '"Red"', False), ("colour", '"red" ', False),
    ("answer", "4", True), ("answer", "null", True), ("answer", "4.0", False),
    ("version", '{"api": "v2", "major": 2, "stable": true}', True),
    ("version", '{"api": "v3", "major": 2, "stable": true}', False),
    ("flags", '{"sky_blue": true, "grass_red": false, "note": null}', True),
    ("flags", '{"sky_blue": true, "grass_red": false}', False),
    ("nested", '{"title": "T", "author": {"first": "A", "last": "B"}}', True),
    ("nested", '{"title": "T", "author": {"first": "A"}}', False),
    ("free", '{"any": [1, {"x": null}]}', True), ("free", "[]", False),
    ("point", "[1, -2.5, 3e4]", True), ("point", "[1, 2]", False),
])
def test_hand_picked_texts(name, text, ok):
    assert accepts(BY_NAME[name], text) is ok
    assert (errors(json.loads(text), BY_NAME[name]) == []) or not ok


def test_numbers_and_enums_that_may_end_or_go_on():
    assert accepts({"enum": [1, 12]}, "1") and accepts({"enum": [1, 12]}, "12")
    assert not accepts({"enum": [1, 12]}, "123")
    assert accepts({"type": "array", "items": {"enum": [1, 12]}}, "[1, 12, 1]")
    assert accepts({"type": "number"}, "-0.5e+7") and not accepts({"type": "number"}, "01")
    g = grammar({"type": "integer"})
    state = g.advance(g.initial, b"12")
    assert g.accepting(state) and not g.finished(state)      # EOS or more digits
    state = g.advance(g.initial, b'"')
    assert state is None


@pytest.mark.parametrize("schema,code,where", [
    ({"type": "number", "multipleOf": 3}, "unsupported-schema", "schema.multipleOf"),
    ({"type": "object", "properties": {"a": {"type": "string", "pattern": "(?=x)"}}}, "unsupported-schema",
     "schema.properties.a.pattern"),
    ({"type": "number", "minimum": 0}, "unsupported-schema", "schema.minimum"),
    ({"oneOf": [{"type": "string"}]}, "unsupported-schema", "schema.oneOf"),
    ({"allOf": [{"type": "string"}]}, "unsupported-schema", "schema.allOf"),
    ({"type": "object", "additionalProperties": {"type": "string"}}, "unsupported-schema",
     "schema.additionalProperties"),
    ({"$ref": "#/$defs/a", "$defs": {"a": {"$ref": "#/$defs/a"}}}, "unsupported-schema", "schema.$defs.a.$ref"),
    ({"$ref": "http://example.com/s.json"}, "unsupported-schema", "schema.$ref"),
    ({"type": "array", "minItems": 3, "maxItems": 1}, "bad-schema", "schema.minItems"),
    ({"type": "object", "properties": {}, "required": ["a"]}, "bad-schema", "schema.required"),
    ({"type": "strin"}, "bad-schema", "schema.type"),
    ({"enum": []}, "bad-schema", "schema.enum"),
    ({"type": "string", "enum": [1, 2]}, "bad-schema", "schema.enum"),
    (False, "bad-schema", "schema"),
    ({"anyOf": [{"type": "array", "items": {"anyOf": [{"enum": [i, j]} for j in range(20)]}} for i in range(20)]},
     "bad-schema", "schema"),                               # 400 readings alive at once
    ("{not json", "bad-schema", "schema"),
])
def test_a_schema_outside_the_subset_is_refused_naming_the_keyword(schema, code, where):
    with pytest.raises(SchemaError) as caught:
        canonical_schema(schema)
    assert (caught.value.code, caught.value.where) == (code, where)
    if code == "unsupported-schema":
        assert where.rsplit(".", 1)[-1] in caught.value.sentence


def test_the_request_forms_and_the_state_hash(fixture_slm_path):
    model = webslm.open_model(fixture_slm_path)
    schema = BY_NAME["person"]
    openai = sampler_settings(model, {"response_format": {"type": "json_schema", "json_schema": {
        "name": "person", "strict": True, "schema": schema}}})
    webllm = sampler_settings(model, {"response_format": {"type": "json_object", "schema": json.dumps(schema)}})
    assert openai == webllm and openai.response_format == "json_schema"
    assert json.loads(openai.json_schema) == schema and list(json.loads(openai.json_schema)["properties"]) == ["name", "age"]
    other = sampler_settings(model, {"response_format": {"type": "json_schema", "json_schema": {
        "name": "x", "schema": BY_NAME["fruits"]}}})
    vocab = model.architecture.vocab
    hashes = {Sampler(s, vocab).state_hash() for s in (openai, other, sampler_settings(model, {
        "response_format": {"type": "json_object"}}))}
    assert len(hashes) == 3                                  # the schema is part of the state
    with pytest.raises(SchemaError, match="uniqueItems"):      # refused as the request is read
        sampler_settings(model, {"response_format": {"type": "json_schema", "json_schema": {
            "name": "x", "schema": {"type": "array", "uniqueItems": True}}}})
    with pytest.raises(SamplerError, match="not a field"):
        sampler_settings(model, {"response_format": {"type": "json_schema", "json_schema": {
            "schema": schema, "shape": 1}}})
    with pytest.raises(SamplerError, match="needs response_format"):
        SamplerSettings(json_schema="{}")


# -- the mask on SmolLM2's vocabulary --------------------------------------------------------------

needs_smollm2 = pytest.mark.skipif(not SMOLLM2.is_file(), reason="SmolLM2 is built by set-up (tools/assets.py)")


@needs_smollm2
def test_the_mask_is_exactly_the_tokens_the_recognizer_accepts():
    model = webslm.open_model(SMOLLM2)
    tokenizer, vocab = model.tokenizer, model.architecture.vocab
    eos = list(model.manifest.tokenizer["eos_ids"])
    cases = [("person", b""), ("person", b'{"na'), ("person", b'{"name": "A'), ("person", b'{"name": "Ada", '),
             ("person", b'{"name": "Ada", "age": 3'), ("team", b'{"team": "x", "members": [{"name": "a", "age": 1}'),
             ("answer", b"4"), ("colour", b'"re'), ("point", b"[1, 2, 3"), ("free", b'{"a": ['),
             ("free", b'{"a": ["x'), ("free", b'{"k')]
    for name, prefix in cases:
        mask = schema_mask_for(tokenizer, vocab, eos, canonical_schema(BY_NAME[name]))
        g = mask.grammar
        state = mask.advance(mask.initial, prefix)
        expected = np.zeros(vocab, dtype=bool)
        for token in range(len(tokenizer.tokens)):
            raw = tokenizer.piece_bytes(token)
            if raw and token not in tokenizer.special_ids and mask.advance(state, raw) is not None:
                expected[token] = True
        expected[eos] = g.accepting(state)
        got = mask.allowed(state)
        assert np.array_equal(got, expected), (name, prefix)
        assert np.array_equal(mask.allowed(state), got)               # cached, the same
        assert got.any()


# -- answers -----------------------------------------------------------------------------------------

def schema_answer(model, backend, case, seed, max_tokens=96):
    s = sampler_settings(model, {"response_format": {"type": "json_schema", "json_schema": {
        "name": case["name"], "schema": case["schema"]}}, "temperature": 0.7, "seed": seed, "max_tokens": max_tokens})
    ids = prompt_ids(model, [{"role": "system", "content": "Answer with JSON only."},
                             {"role": "user", "content": case["prompt"]}])
    ledger = Ledger()
    deltas = list(generate(model, backend, ids, s, ledger=ledger))
    return "".join(d.text for d in deltas), deltas[-1].finish_reason, list(ledger.committed_ids)


@pytest.fixture(scope="module")
def smollm2():
    model = webslm.open_model(SMOLLM2)
    return model, CpuBackend(model)


@needs_smollm2
@pytest.mark.parametrize("n", range(len(SCHEMAS)), ids=[case["name"] for case in SCHEMAS])
def test_smollm2_answers_every_schema_with_valid_json(smollm2, n):
    model, backend = smollm2
    case = SCHEMAS[n]
    text, reason, _ = schema_answer(model, backend, case, seed=n)
    print(f"{case['name']}: {text!r} ({reason})")
    assert reason == "stop", (case["name"], text)
    assert errors(json.loads(text), case["schema"]) == [], (case["name"], text)


@needs_smollm2
def test_the_same_seed_gives_the_same_tokens():
    model = webslm.open_model(SMOLLM2)
    case = next(c for c in SCHEMAS if c["name"] == "sentiment")
    first = schema_answer(model, CpuBackend(model), case, seed=7, max_tokens=24)
    again = schema_answer(model, CpuBackend(model), case, seed=7, max_tokens=24)
    assert first == again


# -- fifty answers of random weights -----------------------------------------------------------------
# Schemas whose texts have a bounded length (no free strings or numbers; blank runs are at most
# 24 bytes), so that random weights always finish them: an answer that does not end "stop" within
# max_tokens would be a bug, not bad luck.
BOUNDED = [
    {"enum": ["yes", "no", "maybe"]},
    {"type": "array", "items": {"type": "boolean"}, "minItems": 1, "maxItems": 3},
    {"type": "object", "properties": {"ok": {"type": "boolean"}, "level": {"enum": [1, 2, 3]},
                                      "tags": {"type": "array", "items": {"enum": ["a", "b"]}, "maxItems": 2}},
     "required": ["ok"], "additionalProperties": False},
    {"anyOf": [{"type": "object", "properties": {"kind": {"const": "a"}, "x": {"type": "boolean"}},
                "required": ["kind", "x"], "additionalProperties": False},
               {"type": "object", "properties": {"kind": {"const": "b"}, "y": {"enum": [1, 12, None]}},
                "required": ["kind", "y"], "additionalProperties": False}]},
    {"type": "object", "properties": {"inner": {"type": "object", "properties": {"on": {"type": ["boolean", "null"]}},
                                                "required": ["on"], "additionalProperties": False}},
     "required": ["inner"], "additionalProperties": False},
]


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory):
    """bench/synthetic_model.py's tiny shape (random weights) with room for long answers."""
    import importlib.util
    spec = importlib.util.spec_from_file_location("synthetic_model", ROOT / "bench/synthetic_model.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    path = tmp_path_factory.mktemp("schema") / "tiny.slm"
    module.write_synthetic(path, "tiny", context_length=1024)
    model = webslm.open_model(path)
    return model, CpuBackend(model)


def test_fifty_answers_of_random_weights_all_end_and_validate(tiny_model):
    model, backend = tiny_model
    kinds = set()
    for n in range(50):
        schema = BOUNDED[n % len(BOUNDED)]
        s = sampler_settings(model, {"response_format": {"type": "json_schema", "json_schema": {"name": "b", "schema": schema}},
                                     "temperature": 1.0, "seed": n, "max_tokens": 900})
        deltas = list(generate(model, backend, prompt_ids(model, [{"role": "user", "content": f"JSON {n}"}]), s))
        text = "".join(d.text for d in deltas)
        assert deltas[-1].finish_reason == "stop", (n, text)
        value = json.loads(text)
        assert errors(value, schema) == [], (n, text)
        if isinstance(value, dict) and "kind" in value:
            kinds.add(value["kind"])
    assert kinds == {"a", "b"}                     # both anyOf branches were taken
