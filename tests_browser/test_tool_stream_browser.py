"""Streamed tool calls through web/webslm.js (the page's API, as an app uses it): Chromium,
the CPU path (gpu: false), the dev server. None of this site's models renders tools, so the
test loads bench/synthetic_model.py's tiny model (random weights) with tests/test_tool_calls.py's
Hermes-style template as a Blob; a forced call (tool_choice "required") is constrained to a
valid call whatever the weights say.

Checked: the chunks have OpenAI's shape (chat.completion.chunk; the first tool_calls delta
{index: 0, id, type: "function", function: {name, arguments: ""}}, then {index: 0,
function: {arguments}} fragments; content null on them; the last chunk finish_reason
"tool_calls"); the fragments joined parse to arguments valid for the function's schema; the
same seed without streaming gives the same call with the same id. The wall time is printed,
not asserted."""
from __future__ import annotations

import base64
import importlib.util
import json
import pathlib
import sys
import tempfile

import pytest

import drivers

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))

import slm_surgery as surgery  # noqa: E402
from json_schemas import errors  # noqa: E402
from test_tool_calls import FAN, LIGHT, TOOL_TEMPLATE  # noqa: E402

RUN = """(async () => {
  const { createEngine } = await import(new URL("webslm.js", location.href).href);
  const bytes = Uint8Array.from(atob(%s), (c) => c.charCodeAt(0));
  const started = performance.now();
  const engine = await createEngine({ model: new Blob([bytes]), gpu: false, cache: false });
  const request = { messages: [{ role: "user", content: "Lights?" }], tools: %s, tool_choice: "required",
                    temperature: 1, seed: 11, max_tokens: 1000 };
  const chunks = [];
  for await (const chunk of await engine.chat.completions.create({ ...request, stream: true })) chunks.push(chunk);
  const whole = await engine.chat.completions.create(request);
  await engine.unload();
  return { chunks, whole, seconds: (performance.now() - started) / 1000 };
})()"""


def tool_model() -> bytes:
    spec = importlib.util.spec_from_file_location("synthetic_model", ROOT / "bench/synthetic_model.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    with tempfile.TemporaryDirectory() as tmp:
        module.write_synthetic(f"{tmp}/tiny.slm", "tiny", context_length=2048)
        pieces = surgery.split(pathlib.Path(f"{tmp}/tiny.slm").read_bytes())
    pieces.manifest["chat_template"]["template"] = TOOL_TEMPLATE
    return surgery.join(pieces)


@pytest.mark.skipif(bool(drivers.missing_binaries("chromium")), reason="Chromium not installed (/usr/bin/chromium)")
def test_a_forced_call_streams_in_openais_chunk_shape(app_url):
    row = drivers.launch("chromium")
    try:
        row.open(app_url + "?gpu=0")
        payload = json.dumps(base64.b64encode(tool_model()).decode())
        out = row.eval(RUN % (payload, json.dumps([LIGHT, FAN])), timeout_s=600)
    finally:
        row.close()
    chunks, whole = out["chunks"], out["whole"]
    print(f"chromium: engine, streamed call and the same call without streaming in {out['seconds']:.1f} s")
    assert all(c["object"] == "chat.completion.chunk" for c in chunks)
    deltas = [c["choices"][0]["delta"] for c in chunks if c["choices"]]
    calls = [d for d in deltas if "tool_calls" in d]
    head, *rest = [entry for d in calls for entry in d["tool_calls"]]
    assert head["index"] == 0 and head["type"] == "function" and head["id"].startswith("call_")
    assert head["function"]["name"] in ("set_light", "set_fan")
    assert all(d["content"] is None for d in calls) and all(e["index"] == 0 and "id" not in e for e in rest)
    assert rest, "the arguments came in one piece with the call's start"
    arguments = head["function"]["arguments"] + "".join(e["function"]["arguments"] for e in rest)
    schema = {"set_light": LIGHT, "set_fan": FAN}[head["function"]["name"]]["function"]["parameters"]
    assert errors(json.loads(arguments), schema) == []
    last = [c for c in chunks if c["choices"]][-1]["choices"][0]
    assert last["finish_reason"] == "tool_calls" and last["delta"] == {}
    [call] = whole["choices"][0]["message"]["tool_calls"]
    assert whole["choices"][0]["finish_reason"] == "tool_calls"
    assert call["id"] == head["id"] and call["function"]["name"] == head["function"]["name"]
    assert json.loads(call["function"]["arguments"]) == json.loads(arguments)
