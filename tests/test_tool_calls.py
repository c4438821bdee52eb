"""Function calling (tools / tool_choice; semantic/tool_calls.py, worker/requests.py): checked
before any work, rendered through the chat template, a forced call constrained to the
function's schema, the answer read back into tool_calls with finish_reason "tool_calls".

None of this site's models has a chat template that shows tools (SmolLM2's, Gemma 3's and the
fixtures' do not): they get "tools-unsupported". The tests give a model TOOL_TEMPLATE, a
ChatML template written here in the Hermes style that Qwen2.5's template follows (tools in
<tools></tools> in the system turn, calls in <tool_call></tool_call>, results in
<tool_response></tool_response>), so the whole path runs: on a tiny synthetic model through
the worker's host (random weights: the constraint does all the work), and on SmolLM2's real
weights through the CPU generation loop.
"""
from __future__ import annotations

import json
import pathlib

import pytest
from json_schemas import errors

import webslm
from webslm import worker_api
from webslm.cpu import CpuBackend
from webslm.generate import generate
from webslm.semantic.chat_template import ChatTemplate
from webslm.semantic.tool_calls import ToolError, check_tools, tool_format, tool_plan
from webslm.worker.requests import RequestError, generation_plan
from test_worker_host import load

ROOT = pathlib.Path(__file__).resolve().parents[1]
SMOLLM2 = ROOT / ".assets/site/models/smollm2-135m-instruct-q4.slm"

TOOL_TEMPLATE = (
    "{%- if tools -%}"
    "{{- '<|im_start|>system\\n' }}"
    "{{- messages[0].content if messages[0].role == 'system' else 'You are a helpful assistant.' }}"
    "{{- '\\n\\nYou can call functions. Their signatures are in <tools></tools>:\\n<tools>' }}"
    "{%- for tool in tools %}{{- '\\n' }}{{- tool | tojson }}{%- endfor %}"
    "{{- '\\n</tools>\\nTo call one, answer with <tool_call>\\n{\"name\": <name>, \"arguments\": <object>}\\n"
    "</tool_call><|im_end|>\\n' }}"
    "{%- elif messages[0].role == 'system' -%}"
    "{{- '<|im_start|>system\\n' + messages[0].content + '<|im_end|>\\n' }}"
    "{%- endif -%}"
    "{%- for message in messages -%}"
    "{%- if message.role == 'system' -%}"
    "{%- elif message.role == 'tool' -%}"
    "{{- '<|im_start|>user\\n<tool_response>\\n' + message.content + '\\n</tool_response><|im_end|>\\n' }}"
    "{%- elif message.tool_calls -%}"
    "{{- '<|im_start|>assistant' }}"
    "{%- for call in message.tool_calls -%}"
    "{{- '\\n<tool_call>\\n{\"name\": \"' + call.function.name + '\", \"arguments\": ' }}"
    "{{- call.function.arguments | tojson }}{{- '}\\n</tool_call>' }}"
    "{%- endfor -%}"
    "{{- '<|im_end|>\\n' }}"
    "{%- else -%}"
    "{{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>\\n' }}"
    "{%- endif -%}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{- '<|im_start|>assistant\\n' }}{%- endif -%}"
)

WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "The current weather in a city.",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"},
                                                    "unit": {"enum": ["celsius", "fahrenheit"]}},
                   "required": ["city", "unit"], "additionalProperties": False}}}
TIME = {"type": "function", "function": {
    "name": "get_time", "description": "The time now in a time zone.",
    "parameters": {"type": "object", "properties": {"zone": {"type": "string"}}, "required": ["zone"]}}}
ASK = [{"role": "user", "content": "What is the weather in Paris?"}]


def with_tool_template(model):
    model.chat_template = ChatTemplate(TOOL_TEMPLATE, bos_token=None, eos_token="<|im_end|>")
    return model


@pytest.fixture(scope="module")
def tiny_path(tmp_path_factory):
    """bench/synthetic_model.py's tiny shape with room for a prompt that lists tools (the
    fixture model's context holds 64 tokens)."""
    import importlib.util
    spec = importlib.util.spec_from_file_location("synthetic_model", ROOT / "bench/synthetic_model.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    path = tmp_path_factory.mktemp("tools") / "tiny.slm"
    module.write_synthetic(path, "tiny", context_length=2048)
    return path


@pytest.fixture
def host(tiny_path):
    loader, _ = load(tiny_path.read_bytes())
    host = worker_api.engine_host(loader, lambda event: None)
    with_tool_template(host.semantic_model())
    return host


def answer(run, host, messages=ASK, **settings):
    reply = run(host.generate(json.dumps({"messages": messages, "settings": settings}), lambda d: None))
    return json.loads(reply)


# -- checking ---------------------------------------------------------------------------------------

@pytest.mark.parametrize("tools,choice,code,where", [
    ("get_weather", None, "bad-tools", "tools"),
    ([{"type": "retrieval"}], None, "bad-tools", "tools[0]"),
    ([{"type": "function", "function": {"name": "a b"}}], None, "bad-tools", "tools[0].function.name"),
    ([WEATHER, WEATHER], None, "bad-tools", "tools[1].function.name"),
    ([{"type": "function", "function": {"name": "f", "parameters": {"type": "object", "properties": {
        "q": {"type": "string", "format": "uri"}}}}}], None, "bad-tool-schema", "tools[0].function.parameters.properties.q.format"),
    ([{"type": "function", "function": {"name": "f", "strict": True, "examples": []}}], None, "bad-tools",
     "tools[0].function.examples"),
    ([WEATHER], "get_time", "bad-tools", "tool_choice"),
    ([WEATHER], {"type": "function", "function": {"name": "get_time"}}, "bad-tools", "tool_choice.function.name"),
    ([], "required", "bad-tools", "tool_choice"),
])
def test_bad_tools_are_refused_before_any_work(tools, choice, code, where):
    with pytest.raises(ToolError) as caught:
        check_tools(tools, choice)
    assert (caught.value.code, caught.value.where) == (code, where)


def test_the_choices():
    assert check_tools([WEATHER], None)[1] == "auto"
    assert check_tools(None, None) == ([], "none")
    assert check_tools([WEATHER, TIME], {"type": "function", "function": {"name": "get_time"}})[1] == "get_time"
    assert check_tools([WEATHER], "required")[1] == "required"


def test_a_template_without_tools_is_a_typed_error(tiny_path):
    model = webslm.open_model(tiny_path)               # the fixture's plain ChatML template
    assert tool_format(model.chat_template) is None
    with pytest.raises(RequestError) as caught:
        generation_plan(model, {"messages": ASK, "settings": {"tools": [WEATHER]}})
    assert caught.value.code == "tools-unsupported" and "no tool support" in caught.value.sentence
    assert tool_format(with_tool_template(model).chat_template) == "hermes"


@pytest.mark.skipif(not SMOLLM2.is_file(), reason="SmolLM2 is built by set-up (tools/assets.py)")
def test_smollm2s_own_template_has_no_tool_support():
    assert tool_format(webslm.open_model(SMOLLM2).chat_template) is None


# -- rendering --------------------------------------------------------------------------------------

def test_the_tools_are_rendered_and_a_forced_call_is_opened_in_the_prompt(tiny_path):
    model = with_tool_template(webslm.open_model(tiny_path))
    decode = model.tokenizer.decode
    auto = generation_plan(model, {"messages": ASK, "settings": {"tools": [WEATHER, TIME]}})
    text = decode(auto.ids)
    assert '"name": "get_weather"' in text and '"name": "get_time"' in text and text.endswith("<|im_start|>assistant\n")
    assert auto.settings.response_format == "text" and auto.tools.choice == "auto"
    forced = generation_plan(model, {"messages": ASK, "settings": {
        "tools": [WEATHER, TIME], "tool_choice": {"type": "function", "function": {"name": "get_weather"}}}})
    assert decode(forced.ids) == text + "<tool_call>\n"
    schema = json.loads(forced.settings.json_schema)
    assert forced.settings.response_format == "json_schema"
    assert schema["properties"]["name"] == {"const": "get_weather"}
    none = generation_plan(model, {"messages": ASK, "settings": {"tools": [WEATHER], "tool_choice": "none"}})
    assert "get_weather" not in decode(none.ids) and none.tools.read('<tool_call>{"name": "get_weather"}') is None
    with pytest.raises(RequestError, match="forced tool call"):
        generation_plan(model, {"messages": ASK, "settings": {"tools": [WEATHER], "tool_choice": "required",
                                                              "response_format": {"type": "json_object"}}})


def test_a_conversation_with_a_call_and_its_result(tiny_path):
    model = with_tool_template(webslm.open_model(tiny_path))
    messages = ASK + [
        {"role": "assistant", "content": None, "tool_calls": [{"id": "call_1", "type": "function", "function": {
            "name": "get_weather", "arguments": '{"city": "Paris", "unit": "celsius"}'}}]},
        {"role": "tool", "tool_call_id": "call_1", "content": '{"temperature": 21}'}]
    plan = generation_plan(model, {"messages": messages, "settings": {"tools": [WEATHER]}})
    text = model.tokenizer.decode(plan.ids)
    assert ('<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris", "unit": "celsius"}}\n</tool_call>'
            in text)
    assert '<tool_response>\n{"temperature": 21}\n</tool_response>' in text
    with pytest.raises(RequestError, match="need the request's tools"):
        generation_plan(model, {"messages": messages, "settings": {}})
    bad = [dict(messages[1], tool_calls=[{"type": "function", "function": {"name": "f", "arguments": "{x"}}]), ]
    with pytest.raises(RequestError, match="not JSON"):
        generation_plan(model, {"messages": ASK + bad, "settings": {"tools": [WEATHER]}})


# -- reading the answer -----------------------------------------------------------------------------

def test_calls_are_read_from_a_free_answer(tiny_path):
    model = with_tool_template(webslm.open_model(tiny_path))
    plan = tool_plan(model.chat_template, [WEATHER, TIME], None)
    content, calls = plan.read('Let me check.\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Oslo", '
                               '"unit": "celsius"}}\n</tool_call>\n<tool_call>\n{"name": "get_time", "arguments": '
                               '{"zone": "CET"}}\n</tool_call>')
    assert content == "Let me check."
    assert [c["function"]["name"] for c in calls] == ["get_weather", "get_time"]
    assert json.loads(calls[0]["function"]["arguments"]) == {"city": "Oslo", "unit": "celsius"}
    assert calls[0]["type"] == "function" and calls[0]["id"] != calls[1]["id"]
    assert plan.read("Paris is sunny.") is None
    assert plan.read('<tool_call>{"name": "unknown", "arguments": {}}</tool_call>') is None
    assert plan.read('<tool_call>{"name": "get_time", "arguments": {"zone"</tool_call>') is None


# Functions whose calls have a bounded length (no free strings or numbers to run on; blank runs
# are at most 24 bytes): random weights always finish them within max_tokens 1000.
LIGHT = {"type": "function", "function": {"name": "set_light", "parameters": {
    "type": "object", "properties": {"room": {"enum": ["kitchen", "hall"]}, "on": {"type": "boolean"}},
    "required": ["room", "on"], "additionalProperties": False}}}
FAN = {"type": "function", "function": {"name": "set_fan", "parameters": {
    "type": "object", "properties": {"speed": {"enum": [0, 1, 2]}}, "required": ["speed"]}}}


@pytest.mark.parametrize("choice", [{"type": "function", "function": {"name": "set_fan"}}, "required"])
def test_a_forced_call_on_random_weights_is_a_valid_call(run, host, choice):
    names = set()
    for seed in range(4):
        reply = answer(run, host, tools=[LIGHT, FAN], tool_choice=choice, temperature=1.0, seed=seed, max_tokens=1000)
        assert reply["finish_reason"] == "tool_calls" and reply["content"] is None, reply["text"]
        [call] = reply["tool_calls"]
        name, arguments = call["function"]["name"], json.loads(call["function"]["arguments"])
        schema = {"set_light": LIGHT, "set_fan": FAN}[name]["function"]["parameters"]
        assert errors(arguments, schema) == [], reply["text"]
        names.add(name)
    assert names == {"set_fan"} if choice != "required" else names <= {"set_fan", "set_light"}


def test_auto_and_none_answer_in_text(run, host):
    reply = answer(run, host, tools=[WEATHER], temperature=0, max_tokens=8)
    assert reply["finish_reason"] in ("stop", "length") and reply["tool_calls"] is None
    assert reply["content"] == reply["text"]


@pytest.mark.skipif(not SMOLLM2.is_file(), reason="SmolLM2 is built by set-up (tools/assets.py)")
def test_smollm2_makes_a_valid_forced_call():
    # max_tokens 64: room for the longer call's shortest text in bytes (61; the closing rule
    # counts bytes), else the mask steers to the shorter get_time call
    model = with_tool_template(webslm.open_model(SMOLLM2))
    plan = generation_plan(model, {"messages": ASK, "settings": {
        "tools": [WEATHER, TIME], "tool_choice": "required", "temperature": 0, "max_tokens": 64}})
    deltas = list(generate(model, CpuBackend(model), plan.ids, plan.settings))
    text = "".join(d.text for d in deltas)
    assert deltas[-1].finish_reason == "stop", text
    content, [call] = plan.tools.read(text)
    print(text)
    assert content is None and call["function"]["name"] == "get_weather"
    arguments = json.loads(call["function"]["arguments"])
    assert errors(arguments, WEATHER["function"]["parameters"]) == [] and "Paris" in arguments["city"]
