"""JSON mode (response_format json_object): the recognizer against Python's json module, the
token mask against a brute-force check of every token, and answers that always parse.

- Recognizer (semantic/json_grammar.py): a text is accepted whole exactly when json.loads
  reads it as an object (within the recognizer's whitespace and depth bounds); every prefix
  of such a text is a live state; hand-picked near misses are refused at the right byte.
- Mask: allowed(state) is exactly the set of tokens whose bytes the recognizer accepts from
  that state (plus EOS exactly when the object is complete), on the fixture's tokenizer and
  SmolLM2's (when set-up built it).
- Answers: 50 seeded answers of the fixture model (random weights: the mask does all the
  work) are always a prefix the recognizer accepts, and every one that ends "stop" parses as
  a JSON object; SmolLM2 asked for JSON answers with objects that parse.
- The token limit: closing() (the fewest bytes that finish the object) falls by one along
  every byte of a JSON text and is 0 at its end (its exactness: tests/test_closing.py); 50
  random-weight answers with small max_tokens (3 to 32) are all whole objects, cut by the
  limit or not; max_tokens 1 (no room for "{}") is refused up front.
"""
from __future__ import annotations

import json
import math
import pathlib

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

import webslm
from webslm.cpu import CpuBackend
from webslm.generate import generate
from webslm.request import prompt_ids, sampler_settings
from webslm.semantic.json_grammar import DONE, INITIAL, MAX_DEPTH, advance, closing, json_mask_for, step
from webslm.semantic.sampler import Sampler, SamplerError, SamplerSettings

ROOT = pathlib.Path(__file__).resolve().parents[1]
SMOLLM2 = ROOT / ".assets/site/models/smollm2-135m-instruct-q4.slm"
PROPS = settings(max_examples=300, derandomize=True, database=None, deadline=None, print_blob=False)


def accepts(text: str | bytes) -> bool:
    data = text.encode() if isinstance(text, str) else text
    state = advance(INITIAL, data)
    return state is not None and state[1] == DONE


def python_accepts(text: str) -> bool:
    def refuse(name):
        raise ValueError(name)
    try:
        return isinstance(json.loads(text, parse_constant=refuse), dict)
    except ValueError:
        return False


json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-10**20, 10**20) | st.text(max_size=8)
    | st.floats(allow_nan=False, allow_infinity=False),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=6), inner, max_size=4),
    max_leaves=12)


@PROPS
@given(st.dictionaries(st.text(max_size=6), json_values, max_size=5), st.sampled_from([None, 2]),
       st.booleans())
def test_every_serialized_object_and_every_prefix_of_it_is_accepted(obj, indent, ascii_only):
    text = json.dumps(obj, indent=indent, ensure_ascii=ascii_only)
    assert accepts(text)
    data = text.encode()
    state = INITIAL
    for byte in data[:-1]:
        state = advance(state, bytes([byte]))
        assert state is not None and state[1] != DONE


ALPHABET = list('{}[]",:0123456789-+.eE \n\tabcdeflnrstu\\/') + ["true", "null", '"a"', "1.5e3"]


@PROPS
@given(st.lists(st.sampled_from(ALPHABET), min_size=1, max_size=24))
def test_the_recognizer_agrees_with_json_loads_on_near_json(pieces):
    text = "".join(pieces)
    assert accepts(text) == python_accepts(text), text


@pytest.mark.parametrize("text", [
    "[1, 2]", '"a"', "1", "{", '{"a"}', '{"a":}', '{"a": 1,}', '{"a": 01}', '{"a": 1.}', '{"a": -}',
    '{"a": .5}', '{"a": 1e}', '{"a": tru}', '{"a": True}', '{"a": "\x01"}', '{"a": "\\x"}',
    '{"a": "\\u12G4"}', '{a: 1}', "{'a': 1}", '{"a": 1} {}', '{"a": NaN}', '{"a" 1}', '{"a": [1,]}',
])
def test_near_misses_are_refused(text):
    assert not accepts(text) and not python_accepts(text)


def test_the_bounds_on_blanks_and_depth():
    assert accepts("{" + " " * 24 + "}") and not accepts("{" + " " * 25 + "}")
    deep = '{"a": ' + "[" * (MAX_DEPTH - 1) + "]" * (MAX_DEPTH - 1) + "}"
    assert accepts(deep) and not accepts('{"a": ' + "[" * MAX_DEPTH + "]" * MAX_DEPTH + "}")
    assert accepts('{"\\u00e9\\n": "é\\"x", "b": [true, false, null, -0.5e-7, {}]}')


# -- the mask -----------------------------------------------------------------------------------------

PREFIXES = [b"", b" ", b"{", b'{"', b'{"a', b'{"a\\', b'{"a\\u00', b'{"a"', b'{"a":', b'{"a": -', b'{"a": 0',
            b'{"a": 12', b'{"a": 1.5e', b'{"a": t', b'{"a": [', b'{"a": [1', b'{"a": [1,', b'{"a": {}',
            b'{"a": "\xc3', b'{"a": 1}']


def brute_force(mask, tokenizer, state) -> np.ndarray:
    expected = np.zeros(mask.vocab, dtype=bool)
    if state[1] == DONE:
        expected[list(mask._eos.nonzero()[0])] = True
        return expected
    for token in range(min(mask.vocab, len(tokenizer.tokens))):
        raw = tokenizer.piece_bytes(token)
        if raw and token not in tokenizer.special_ids and advance(state, raw) is not None:
            expected[token] = True
    return expected


def models(fixture_slm_path):
    yield webslm.open_model(fixture_slm_path)
    if SMOLLM2.is_file():
        yield webslm.open_model(SMOLLM2)


def test_the_mask_is_exactly_the_tokens_the_recognizer_accepts(fixture_slm_path):
    for model in models(fixture_slm_path):
        eos = list(model.manifest.tokenizer["eos_ids"])
        mask = json_mask_for(model.tokenizer, model.architecture.vocab, eos)
        for prefix in PREFIXES:
            state = advance(INITIAL, prefix)
            got = mask.allowed(state)
            assert np.array_equal(got, brute_force(mask, model.tokenizer, state)), (model, prefix)
            assert got[eos].all() == (state[1] == DONE) and got.any()
        assert json_mask_for(model.tokenizer, model.architecture.vocab, eos) is json_mask_for(
            model.tokenizer, model.architecture.vocab, eos)                       # made once per tokenizer


def test_the_sampler_never_chooses_a_masked_token():
    s = SamplerSettings(temperature=1.0, response_format="json_object", seed=4)
    logits = np.linspace(5, -5, 10).astype(np.float32)
    allowed = np.zeros(10, dtype=bool)
    allowed[[3, 7]] = True
    sampler = Sampler(s, 10)
    assert {Sampler(s, 10, position=p).choose(logits, p, allowed) for p in range(100)} == {3, 7}
    assert sampler.needs_full_logits(9)
    with pytest.raises(SamplerError):                  # JSON mode without its mask is a bug
        sampler.choose(logits, 0)
    logprob, top = Sampler(replace_logprobs(s), 10).logprobs(logits, 3, 5, allowed)
    assert [t for t, _ in top] == [3, 7] and math.exp(logprob) + math.exp(top[1][1]) == pytest.approx(1.0)


def replace_logprobs(s):
    from dataclasses import replace
    return replace(s, logprobs=True, top_logprobs=5)


# -- answers ------------------------------------------------------------------------------------------

def json_answer(model, backend, messages, **settings):
    s = sampler_settings(model, {"response_format": {"type": "json_object"}, **settings})
    deltas = list(generate(model, backend, prompt_ids(model, messages), s))
    return "".join(d.text for d in deltas), deltas[-1].finish_reason


def test_fifty_answers_of_a_random_model_are_json_objects_or_prefixes_of_one(fixture_slm_path):
    model = webslm.open_model(fixture_slm_path)
    backend = CpuBackend(model)
    finished = 0
    for n in range(50):
        text, reason = json_answer(model, backend, [{"role": "user", "content": f"Answer in JSON ({n})."}],
                                   temperature=1.0, seed=n, max_tokens=48)
        raw = text.encode()
        assert advance(INITIAL, raw) is not None or "\ufffd" in text, text      # replacement chars: bytes cut
        if reason == "stop":
            finished += 1
            assert python_accepts(text), text
        else:
            assert reason == "length"
    assert finished >= 5                     # the test sees real endings, not only cut-off answers


@settings(max_examples=300, derandomize=True, database=None, deadline=None, print_blob=False)
@given(st.recursive(st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False, allow_infinity=False)
                    | st.text(max_size=6), lambda inner: st.lists(inner, max_size=3)
                    | st.dictionaries(st.text(max_size=4), inner, max_size=3), max_leaves=8),
       st.booleans())
def test_closing_falls_by_at_most_one_a_byte_of_a_json_text(value, ascii_only):
    text = json.dumps({"v": value}, ensure_ascii=ascii_only).encode()
    state = INITIAL
    for byte in text:
        after = step(state, byte)
        assert closing(state) - closing(after) <= 1 and closing(after) >= 0, (text, byte)
        state = after
    assert closing(state) == 0 and state[1] == DONE


def test_answers_cut_by_a_small_token_limit_are_still_whole_objects(fixture_slm_path):
    model = webslm.open_model(fixture_slm_path)
    backend = CpuBackend(model)
    cut = 0
    for n in range(50):
        text, reason = json_answer(model, backend, [{"role": "user", "content": f"JSON {n}"}],
                                   temperature=1.0, seed=100 + n, max_tokens=3 + n % 30)
        assert python_accepts(text), (n, reason, text)
        cut += reason == "length"
    assert cut >= 10                          # the limit did the closing, not only the model
    with pytest.raises(SamplerError, match="takes 2 tokens"):
        json_answer(model, backend, [{"role": "user", "content": "JSON"}], max_tokens=1)


@pytest.mark.skipif(not SMOLLM2.is_file(), reason="SmolLM2 is built by set-up (tools/assets.py)")
def test_smollm2_answers_in_json_when_asked():
    model = webslm.open_model(SMOLLM2)
    backend = CpuBackend(model)
    for question in ("Return JSON with keys city and country for Paris.", "List three fruits as JSON."):
        text, reason = json_answer(model, backend, [{"role": "system", "content": "Answer in JSON."},
                                                    {"role": "user", "content": question}],
                                   temperature=0.7, seed=1, max_tokens=48)
        assert reason == "stop" and isinstance(json.loads(text), dict), text


def test_json_mode_is_refused_with_ignore_eos_and_a_bad_grammar_is_refused(fixture_slm_path):
    model = webslm.open_model(fixture_slm_path)
    with pytest.raises(SamplerError, match="JSON mode"):
        sampler_settings(model, {"response_format": {"type": "json_object"}, "ignore_eos": True})
    with pytest.raises(SamplerError, match="the rule 'x' is not defined"):
        sampler_settings(model, {"response_format": {"type": "grammar", "grammar": "root ::= x"}})
    with pytest.raises(SamplerError, match="needs a schema"):
        sampler_settings(model, {"response_format": "json_schema"})
    # WebLLM's {type: json_object, schema} is JSON-schema mode (tests/test_json_schema.py)
    assert sampler_settings(model, {"response_format": {"type": "json_object", "schema": "{}"}}).json_schema == "{}"
