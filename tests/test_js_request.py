"""web/chat-request.mjs (a WebLLM/OpenAI request -> the worker's generation request) and
web/init-progress.mjs (WebLLM's initProgressCallback reports), run in node: every field maps
onto a setting the Python side validates again (tests/test_webllm_request.py), or is refused
with a sentence; progress only moves forward and names what is happening."""
import json
import pathlib
import shutil
import subprocess

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
pytestmark = pytest.mark.skipif(shutil.which("node") is None, reason="Node.js is not installed")

HI = [{"role": "user", "content": "hi"}]


def node(script: str):
    """Run an ES module body in node with checkRequest, BadRequest, fraction, describe, InitProgress
    in scope; its last expression's value (returned by `out`) as JSON."""
    prelude = (f'import {{ checkRequest, BadRequest }} from "{ROOT}/web/chat-request.mjs";\n'
               f'import {{ fraction, describe, InitProgress }} from "{ROOT}/web/init-progress.mjs";\n'
               "const attempt = (f) => { try { return { ok: f() }; } catch (e) {"
               " if (!(e instanceof BadRequest)) throw e; return { error: e.message }; } };\n")
    result = subprocess.run(["node", "--input-type=module", "-e", prelude + script + "\nconsole.log(JSON.stringify(out));"],
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout)


def check(request, kind="chat", defaults=None):
    return node(f"const out = attempt(() => checkRequest({json.dumps(request)}, {json.dumps(kind)}, "
                f"{json.dumps(defaults or {})}));")


def test_the_webllm_fields_become_the_workers_settings():
    got = check({"messages": HI, "temperature": 0.5, "top_p": 0.9, "max_completion_tokens": 7, "seed": 3,
                 "frequency_penalty": 0.5, "presence_penalty": -1, "repetition_penalty": 1.2,
                 "logit_bias": {"42": -100, "7": 2}, "logprobs": True, "top_logprobs": 2, "ignore_eos": True,
                 "stop": "\n", "stream": True, "stream_options": {"include_usage": True},
                 "response_format": {"type": "text"}, "tool_choice": "none", "model": "anything"})["ok"]
    assert got["settings"] == {"temperature": 0.5, "top_p": 0.9, "max_tokens": 7, "frequency_penalty": 0.5,
                               "presence_penalty": -1, "repetition_penalty": 1.2, "logit_bias": {"42": -100, "7": 2},
                               "ignore_eos": True, "logprobs": True, "top_logprobs": 2, "stop": ["\n"]}
    assert (got["seed"], got["stream"], got["includeUsage"], got["n"], got["logprobs"]) == (3, True, True, 1, True)
    assert got["prompt"] == HI


def test_json_mode_becomes_the_samplers_response_format():
    assert check({"messages": HI, "response_format": {"type": "json_object"}})["ok"]["settings"] == {
        "response_format": "json_object"}
    assert check({"messages": HI, "response_format": {"type": "text"}})["ok"]["settings"] == {}


def test_json_schema_and_tools_pass_to_the_worker():
    schema = {"type": "object", "properties": {"a": {"type": "integer"}}}
    openai = {"type": "json_schema", "json_schema": {"name": "a", "strict": True, "schema": schema}}
    assert check({"messages": HI, "response_format": openai})["ok"]["settings"] == {"response_format": openai}
    webllm = {"type": "json_object", "schema": '{"type": "object"}'}
    assert check({"messages": HI, "response_format": webllm})["ok"]["settings"] == {"response_format": webllm}
    grammar = {"type": "grammar", "grammar": 'root ::= "yes" | "no"'}
    assert check({"messages": HI, "response_format": grammar})["ok"]["settings"] == {"response_format": grammar}
    tools = [{"type": "function", "function": {"name": "f", "parameters": schema}}]
    choice = {"type": "function", "function": {"name": "f"}}
    got = check({"messages": HI, "tools": tools, "tool_choice": choice})["ok"]
    assert got["settings"] == {"tools": tools, "tool_choice": choice}
    streamed = check({"messages": HI, "tools": tools, "stream": True})["ok"]      # calls stream as delta.tool_calls
    assert streamed["settings"] == {"tools": tools} and streamed["stream"] is True
    assert check({"messages": HI, "tools": [], "tool_choice": "none"})["ok"]["settings"] == {}
    turn = [*HI, {"role": "assistant", "content": None, "tool_calls": [{"id": "c", "type": "function", "function": {
        "name": "f", "arguments": "{}"}}]}, {"role": "tool", "tool_call_id": "c", "content": "3"}]
    assert check({"messages": turn, "tools": tools})["ok"]["prompt"] == turn


def test_text_parts_pass_as_parts_and_a_raw_prompt_as_a_string():
    parts = [{"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]}]
    assert check({"messages": parts})["ok"]["prompt"] == parts
    assert check({"prompt": "Once upon", "max_tokens": 3}, "completion")["ok"]["prompt"] == "Once upon"


def test_a_raw_completion_takes_a_grammar_or_json_mode():
    grammar = {"type": "grammar", "grammar": 'root ::= " a" | " an"'}
    got = check({"prompt": "Once upon", "response_format": grammar, "max_tokens": 4}, "completion")["ok"]
    assert got["settings"] == {"max_tokens": 4, "response_format": grammar} and got["prompt"] == "Once upon"
    assert check({"prompt": "x", "response_format": {"type": "json_object"}}, "completion")["ok"]["settings"] == {
        "response_format": "json_object"}
    assert "must be the grammar's GBNF text" in check({"prompt": "x", "response_format": {"type": "grammar"}},
                                                     "completion")["error"]


def test_defaults_apply_unless_the_request_sets_the_field():
    got = check({"messages": HI, "temperature": 0.1}, defaults={"temperature": 0.9, "top_p": 0.5})["ok"]
    assert got["settings"]["temperature"] == 0.1 and got["settings"]["top_p"] == 0.5


@pytest.mark.parametrize("request_, kind, message", [
    ({"messages": HI, "beam": 2}, "chat", 'Unknown request field "beam"'),
    ({"prompt": "x"}, "chat", 'Unknown request field "prompt"'),
    ({"messages": HI}, "completion", 'Unknown request field "messages"'),
    ({"messages": HI, "n": 2, "stream": True}, "chat", "without streaming"),
    ({"messages": HI, "n": 17}, "chat", "n must be"),
    ({"messages": HI, "stream_options": {"include_usage": True}}, "chat", "only for streaming"),
    ({"messages": HI, "stream": True, "stream_options": {"include_usage": 1}}, "chat", "include_usage must be"),
    ({"messages": HI, "frequency_penalty": 2.5}, "chat", "frequency_penalty must be in [-2, 2]"),
    ({"messages": HI, "repetition_penalty": 0}, "chat", "repetition_penalty must be > 0"),
    ({"messages": HI, "logit_bias": {"a": 1}}, "chat", "is not a token id"),
    ({"messages": HI, "logit_bias": {"1": 101}}, "chat", "in [-100, 100]"),
    ({"messages": HI, "top_logprobs": 2}, "chat", "needs logprobs"),
    ({"messages": HI, "logprobs": True, "top_logprobs": 21}, "chat", "top_logprobs must be"),
    ({"messages": HI, "max_tokens": 5, "max_completion_tokens": 6}, "chat", "disagree"),
    ({"messages": HI, "ignore_eos": "yes"}, "chat", "ignore_eos must be"),
    ({"messages": HI, "response_format": {"type": "json_schema", "json_schema": {}}}, "chat", "must be {name, schema}"),
    ({"messages": HI, "response_format": {"type": "json_schema", "schema": {}}}, "chat", "response_format.schema is not"),
    ({"messages": HI, "response_format": {"type": "json_object", "schema": 3}}, "chat", "response_format.schema must"),
    ({"messages": HI, "response_format": {"type": "grammar", "grammar": " "}}, "chat", "must be the grammar's GBNF text"),
    ({"messages": HI, "response_format": {"type": "grammar", "grammar": "root ::= [a]", "schema": "{}"}}, "chat",
     "response_format.schema is not"),
    ({"messages": HI, "response_format": {"type": "json_object"}, "ignore_eos": True}, "chat", "JSON mode"),
    ({"messages": HI, "response_format": {"type": "xml"}}, "chat", "response_format must be"),
    ({"messages": HI, "tools": {"f": 1}}, "chat", "tools must be a list"),
    ({"messages": HI, "tools": [{"type": "function", "function": {"name": "f"}}], "tool_choice": "required",
      "response_format": {"type": "json_object"}}, "chat", "forced tool call"),
    ({"messages": HI, "tools": [{"type": "retrieval"}]}, "chat", "tools[0] must be"),
    ({"messages": HI, "tool_choice": "sometimes"}, "chat", "tool_choice must be"),
    ({"messages": HI, "tool_choice": "required"}, "chat", "no tools"),
    ({"messages": [{"role": "tool", "content": "1", "tool_call_id": "0"}]}, "chat", "need the request's tools"),
    ({"messages": [{"role": "user", "content": "hi", "name": "ann"}]}, "chat", 'unknown field "name"'),
    ({"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}]}, "chat",
     "only text parts"),
    ({"messages": [{"role": "user", "content": []}]}, "chat", "a list of text parts"),
    ({"prompt": ["a", "b"]}, "completion", "a list of prompts is not supported"),
    ({"prompt": "a", "echo": True}, "completion", "echo is not supported"),
    ({"prompt": "a", "suffix": "z"}, "completion", "suffix is not supported"),
])
def test_a_field_that_cannot_be_served_is_refused_with_a_reason(request_, kind, message):
    assert message in check(request_, kind)["error"]


def test_init_progress_moves_forward_through_the_stages_to_one():
    reports = node("""
      const seen = [];
      const init = new InitProgress((r) => seen.push(r));
      init.start();
      for (const e of [{phase: "download", done: 0, total: 100e6, source: "network"},
                       {phase: "download", done: 50e6, total: 100e6, source: "network"},
                       {phase: "validate", done: 100e6, total: 100e6},
                       {phase: "download", done: 10e6, total: 100e6, source: "network"},
                       {phase: "admission", stage: "adapter"},
                       {phase: "compile", done: 3, total: 12},
                       {phase: "self-test", done: 12, total: 12},
                       {phase: "prefill", done: 1, total: 2}]) init.report(e);
      init.finish("Finish loading on WebGPU (tier C)");
      const out = seen;""")
    progress = [r["progress"] for r in reports]
    assert progress == sorted(progress) and progress[-1] == 1 and len(reports) == 8   # prefill is not a load's
    assert progress[1] > progress[0] and all(0 <= p <= 1 for p in progress)
    assert reports[1]["text"] == "Downloading the model: 50.0 MB of 100.0 MB"
    assert reports[5]["text"] == "Compiling GPU pipelines: 3 of 12"
    assert reports[-1]["text"] == "Finish loading on WebGPU (tier C)"
    assert all(r["timeElapsed"] >= 0 for r in reports)
