"""The OpenAI/WebLLM sampling fields on the real GPU executor (wgpu-native; lavapipe here):
a seeded answer with penalties, logit_bias or logprobs is the CPU oracle's, token for token,
whatever the engine asked the GPU to read back for them (engine.want_for: candidates for
lowering biases and positive penalties, the full row for a raising bias, logprobs or JSON
(schema) mode's token mask)."""
from __future__ import annotations

import dataclasses
import math

import pytest

from webslm.engine import Engine, State
from webslm.engine.engine import want_for
from webslm.semantic.sampler import Sampler, SamplerSettings
from test_gpu_engine_native import (  # noqa: F401 - the fixtures, shared
    MAX_TOKENS, cpu_answer, gpu_answer, ids, model, path, policy)

pytestmark = pytest.mark.usefixtures("self_test_once")

SEEDED = SamplerSettings(temperature=0.8, top_k=20, seed=2024, max_tokens=MAX_TOKENS)
GREEDY = dataclasses.replace(SEEDED, temperature=0.0)
# JSON-schema mode's case: a schema with a choice at every turn (keys, numbers, an array's length)
SCHEMA = {"type": "object", "properties": {"n": {"type": "integer"}, "flags": {"type": "array", "items": {
    "type": "boolean"}, "maxItems": 3}, "tag": {"enum": ["a", "bc"]}}, "required": ["n", "flags"]}


# The string and integer keywords (char_pattern.py, schema_scalars.py), and grammar mode (gbnf.py)
KEYWORDS = {"type": "object", "properties": {"code": {"type": "string", "pattern": "^[a-z]{2,3}-[0-9]+$", "maxLength": 6},
                                             "n": {"type": "integer", "minimum": -20, "maximum": 300}},
            "required": ["code", "n"]}
GRAMMAR = 'root ::= item ("," item){0,3}\nitem ::= [a-z]{1,4} | "(" root ")"'


def fields_for(name: str, seeded: tuple[int, ...], greedy: tuple[int, ...]) -> tuple[SamplerSettings, str]:
    """The settings of case `name` (biases aimed at tokens the plain answers choose, so that
    they change something) and what the engine must read back for them."""
    if name == "penalties":
        return dataclasses.replace(SEEDED, frequency_penalty=0.8, presence_penalty=0.4, penalty_window=0), "top-k"
    if name == "lowering-bias":
        first, second, third = sorted(set(seeded))[:3]
        return dataclasses.replace(SEEDED, logit_bias={first: -math.inf, second: -100.0, third: -2.0}), "top-k"
    if name == "raising-bias":
        return dataclasses.replace(SEEDED, logit_bias={11: 100.0}), "full"
    if name == "logprobs":
        return dataclasses.replace(SEEDED, logprobs=True, top_logprobs=3), "full"
    if name == "json-object":
        return dataclasses.replace(SEEDED, response_format="json_object"), "full"
    # the schemas' shortest texts are 18 and 21 bytes: room for them (answer.check_room), and
    # little more, so the closing within the limit is part of what the GPU must match
    if name == "json-schema":
        return dataclasses.replace(SEEDED, response_format="json_schema", json_schema=SCHEMA, max_tokens=24), "full"
    if name == "json-schema-keywords":
        return dataclasses.replace(SEEDED, response_format="json_schema", json_schema=KEYWORDS, max_tokens=24), "full"
    if name == "grammar":
        return dataclasses.replace(SEEDED, response_format="grammar", grammar=GRAMMAR), "full"
    if name == "greedy-banned":
        return dataclasses.replace(GREEDY, logit_bias={greedy[0]: -100.0}), "top-k"
    raise ValueError(name)


@pytest.mark.parametrize("name", ["penalties", "lowering-bias", "raising-bias", "logprobs", "greedy-banned",
                                  "json-object", "json-schema", "json-schema-keywords", "grammar"])
def test_a_seeded_answer_with_the_fields_is_the_cpu_oracles(native_gpu, model, ids, run, policy, name):  # noqa: F811
    plain = {"seeded": cpu_answer(model, ids, SEEDED), "greedy": cpu_answer(model, ids, GREEDY)}
    settings, readback = fields_for(name, plain["seeded"], plain["greedy"])
    assert want_for(Sampler(settings, model.architecture.vocab, history=ids)).kind == readback
    engine = Engine(model, gpu=native_gpu, policy=policy)
    assert run(engine.load()) is State.GPU_READY
    try:
        deltas, got = run(gpu_answer(engine, ids, settings))
    finally:
        run(engine.unload())
    assert got == cpu_answer(model, ids, settings)
    if name != "logprobs":                         # the field changed the answer (logprobs only report)
        assert got != plain["greedy" if settings.greedy else "seeded"]
    if settings.logprobs:
        entries = [e for d in deltas if d.logprobs for e in d.logprobs]
        assert len(entries) == len(got) and all(len(e["top_logprobs"]) == 3 for e in entries)
