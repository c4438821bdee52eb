"""Streamed tool calls (semantic/tool_stream.py and the worker's deltas): OpenAI's streaming
shape for calls. Whatever way the answer's text is cut into deltas, the pieces streamed are
the same: content joined is the text outside the calls, a call begins with {index, id, type:
"function", function: {name, arguments: ""}} and its arguments fragments joined are JSON text
that parses to the reply's arguments; the reply's tool_calls carry the streamed ids.

- Forced calls stream their arguments as the model writes them (the first fragment comes
  before the call's text has ended); "auto" holds text from a possible "<tool_call>" on and
  decides at the end as without streaming (an invalid call streams as content, unchanged).
- Through the worker's host (tests/test_tool_calls.py's tiny model with a Hermes-style
  template): a forced call's deltas, the reply, and the same seed without streaming agree.
"""
from __future__ import annotations

import json
import random

import pytest
from json_schemas import errors
from test_tool_calls import FAN, LIGHT, TIME, WEATHER, answer, host, tiny_path, with_tool_template  # noqa: F401

import webslm
from webslm.semantic.tool_calls import tool_plan
from webslm.semantic.tool_stream import ToolStream
from webslm.worker.engine_host import _merge


def cuts(text: str, rng: random.Random) -> list[str]:
    """`text` in random pieces (some empty, some one character)."""
    out, i = [], 0
    while i < len(text):
        n = rng.choice([0, 1, 1, 2, 3, 7, 20])
        out.append(text[i:i + n])
        i += n
    return out


def streamed(plan, text: str, rng: random.Random, finish: str = "stop"):
    """(content streamed, {index: [entries]}, calls, content, first args fragment's position)."""
    stream = ToolStream(plan, salt="7:12")
    content, entries, first_fragment_at, fed = "", {}, None, 0
    pieces = []
    for piece in cuts(text, rng):
        fed += len(piece)
        out = stream.feed(piece)
        pieces.append(out)
        if any(e["function"].get("arguments") for p in out for e in p.get("tool_calls", ())) and first_fragment_at is None:
            first_fragment_at = fed
    last, calls, reply_content = stream.end(finish)
    pieces.append(last)
    for out in pieces:
        shown, merged = _merge(out)
        content += shown
        for entry in merged or ():
            entries.setdefault(entry["index"], []).append(entry)
    return content, entries, calls, reply_content, first_fragment_at


def check_calls(entries: dict, calls: list[dict]) -> None:
    assert sorted(entries) == list(range(len(calls)))
    for index, call in enumerate(calls):
        head, *rest = entries[index]
        assert (head["index"], head["id"], head["type"], head["function"]["name"]) == (
            index, call["id"], "function", call["function"]["name"])
        assert all(set(e) == {"index", "function"} and set(e["function"]) == {"arguments"} for e in rest)
        joined = head["function"]["arguments"] + "".join(e["function"]["arguments"] for e in rest)
        assert json.loads(joined) == json.loads(call["function"]["arguments"])


@pytest.fixture(scope="module")
def template(tiny_path):  # noqa: F811
    return with_tool_template(webslm.open_model(tiny_path)).chat_template


FORCED = ['{"name": "get_weather", "arguments": {"city": "Os\\"lo {x}", "unit": "celsius"}}',
          '\n{ "name" : "get_time",\n "arguments": {\n  "zone": "[CET]"\n }\n}']


@pytest.mark.parametrize("n", range(len(FORCED)))
def test_a_forced_call_streams_its_arguments_as_they_are_written(template, n):
    plan = tool_plan(template, [WEATHER, TIME], "required")
    text = FORCED[n]
    for seed in range(30):
        content, entries, calls, reply_content, first_at = streamed(plan, text, random.Random(seed))
        assert content == "" and reply_content is None
        check_calls(entries, calls)
        assert calls == [{**c, "id": calls[0]["id"]} for c in plan.read(text)[1]]
        assert first_at is not None and first_at < len(text)          # before the answer ended


AUTO = [
    ('Let me check.\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Oslo", "unit": "celsius"}}\n'
     '</tool_call>\n<tool_call>\n{"name": "get_time", "arguments": {"zone": "CET"}}\n</tool_call>', True),
    ("Paris is sunny, <tool is not a tag> and <tool_cal neither.", False),
    ('Maybe <tool_call>{"name": "unknown", "arguments": {}}</tool_call> then.', False),
    ('<tool_call>{"name": "get_time", "arguments": {"zone"', False),
]


@pytest.mark.parametrize("n", range(len(AUTO)))
def test_auto_streams_content_and_decides_calls_as_without_streaming(template, n):
    plan = tool_plan(template, [WEATHER, TIME], "auto")
    text, makes_calls = AUTO[n]
    read = plan.read(text)
    assert (read is not None) == makes_calls
    for seed in range(30):
        content, entries, calls, reply_content, _ = streamed(plan, text, random.Random(seed))
        if not makes_calls:
            assert calls is None and entries == {} and content == text and reply_content == text
            continue
        assert "<tool" not in content and content.strip() == read[0] == reply_content
        check_calls(entries, calls)
        assert [c["function"] for c in calls] == [c["function"] for c in read[1]]


def test_a_call_cut_short_streams_as_content_in_auto_and_as_no_call_when_forced(template):
    auto = tool_plan(template, [WEATHER], "auto")
    content, entries, calls, _, _ = streamed(auto, AUTO[0][0], random.Random(1), finish="length")
    assert calls is None and entries == {} and content == AUTO[0][0]
    forced = tool_plan(template, [WEATHER], "required")
    _, _, calls, reply_content, _ = streamed(forced, FORCED[0][:30], random.Random(1), finish="length")
    assert calls is None and reply_content == FORCED[0][:30]


def test_the_bare_json_format_holds_an_answer_that_begins_with_a_brace():
    from webslm.semantic.tool_calls import ToolPlan, check_tools
    functions, _ = check_tools([WEATHER], "auto")
    plan = ToolPlan(tuple(functions), "auto", "json")
    call = '{"name": "get_weather", "parameters": {"city": "Rome", "unit": "celsius"}}'
    content, entries, calls, _, _ = streamed(plan, call, random.Random(3))
    assert content == "" and calls[0]["function"]["name"] == "get_weather"
    check_calls(entries, calls)
    content, entries, calls, _, _ = streamed(plan, "Rome is warm.", random.Random(3))
    assert content == "Rome is warm." and calls is None


@pytest.mark.parametrize("choice", ["required", {"type": "function", "function": {"name": "set_light"}}])
def test_the_worker_streams_a_forced_call_in_openais_shape(run, host, choice):  # noqa: F811
    for seed in range(3):
        deltas = []
        request = {"messages": [{"role": "user", "content": "Lights?"}], "settings": {
            "tools": [LIGHT, FAN], "tool_choice": choice, "temperature": 1.0, "seed": seed, "max_tokens": 1000}}
        reply = json.loads(run(host.generate(json.dumps(request), lambda d, into=deltas: into.append(json.loads(d)))))
        assert reply["finish_reason"] == "tool_calls" and reply["content"] is None
        assert "".join(d["text"] for d in deltas) == ""
        entries = {}
        for d in deltas:
            for entry in d.get("tool_calls", ()):
                entries.setdefault(entry["index"], []).append(entry)
        check_calls(entries, reply["tool_calls"])
        [call] = reply["tool_calls"]
        schema = {"set_light": LIGHT, "set_fan": FAN}[call["function"]["name"]]["function"]["parameters"]
        assert errors(json.loads(call["function"]["arguments"]), schema) == []
        assert len(entries[0]) >= 2                  # the arguments came in fragments, not at the end only
        again = answer(run, host, messages=request["messages"], **request["settings"])
        assert again["tool_calls"] == reply["tool_calls"]      # the same seed: the same call, the same id
