"""WebLLM-style programs (tests_browser/webllm_programs/: our own, written to WebLLM's documented
API) run unchanged but for their import line, which names web/webllm.mjs instead of
"@mlc-ai/web-llm". Every program makes its own engine with CreateMLCEngine, as WebLLM's
examples do, and asks for a few tokens. Every program runs in two rows, and each test asserts
which engine answered:

- chromium-compat, the GPU row (WebGPU over lavapipe, about 0.7-1.2 s a decode step): the
  import is "webllm.mjs?gpu=force", so the admitted GPU answers. With a plain import the
  engine's own timing would hand every answer to the CPU path here (lavapipe's step is about
  10x the CPU's), as it does for the page, whose GPU tests use ?gpu=force likewise.
- chromium, the CPU path row (SwiftShader): the import is "webllm.mjs?gpu=0", so the CPU path
  answers at once. Plain "webllm.mjs" answers there too, by the engine's own choice
  (SwiftShader's decode step is about 10x slower), but only after admitting the model on
  SwiftShader first: 150 s a CreateMLCEngine on a 2-core machine (26 s before the upload, 52 s
  compiling pipelines, 68 s of kernel self-tests), per program. That choice is checked once, on
  the page, by test_engine_choice_browser.py.

- get_started: CreateMLCEngine with an initProgressCallback ({progress, timeElapsed, text},
  ending at 1), a greedy answer that is CPython's CPU answer token for token, getMessage,
  runtimeStatsText, usage.extra.
- streaming: text parts, stream_options.include_usage (the last chunk has no choices and the
  usage), logprobs with top_logprobs for every token.
- multi_round: the second turn keeps the first in the KV cache; resetChat drops it, and the
  answer stays the same.
- seed_reproduce: the same seed, penalties and logit bias give the same answer (the first of
  n: 2 choices is drawn with the request's seed); the second choice with the next seed; JSON
  mode gives a JSON object (or, cut at max_tokens, a prefix of one).
- json_schema: response_format with a schema, in WebLLM's form ({type: "json_object", schema:
  JSON text}) and OpenAI's ({type: "json_schema", json_schema}): the seeded answer is
  CPython's CPU answer token for token, ends "stop", parses and matches the schema; a schema
  with pattern, minimum and maximum, and a GBNF grammar (grammar mode), answer in their
  languages; a keyword outside the subset, a left-recursive grammar and tools on SmolLM2
  (its template has none) are refused by name.
- abort_reload: interruptGenerate ends a stream "abort"; reload; two requests sent at once are
  answered in order (no "busy"); completions.create on a raw prompt, and with a grammar
  (response_format; a max_tokens below its shortest text refused); an unknown WebLLM model
  id is a clear error.
- simple_chat: a chat UI the program builds in the page (message list, input, send button)
  and removes after; two turns typed and sent by clicking, each streamed into its bubble as
  the deltas arrive: the bubbles show CPython's greedy answers, the second turn reads the
  first from the KV cache.
Each program's wall time is printed and written to tests_browser/results/<row>.json under
"webllm_programs"; no test asserts a time.
"""
from __future__ import annotations

import json
import pathlib
import re

import pytest
from conftest import ROOT, serve

HERE = pathlib.Path(__file__).resolve().parent
PROGRAMS = HERE / "webllm_programs"
TIMEOUT_S = 600
# Per row: the query of the import URL its programs get (web/webllm.mjs reads it: the engine's
# gpu option, which WebLLM's config has no key for), and the engine that must then answer.
IMPORT_QUERY = {"chromium": "?gpu=0", "chromium-compat": "?gpu=force"}
ANSWERS_ON = {"chromium": "cpu", "chromium-compat": "gpu"}

pytestmark = pytest.mark.parametrize("booted", list(IMPORT_QUERY), indirect=True)
# The question most programs ask, with a short system prompt: 24 prompt tokens to read (the
# model's default system prompt makes 37), the slowest part of each program here.
BRIEF = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "What is the capital of France?"}]


@pytest.fixture(scope="module")
def brief_answer() -> dict:
    """The greedy CPU answer's first 4 tokens to BRIEF (token_ids and text), computed here in
    CPython (the worker's sampler and CPU engine are CPython's, bit for bit; every engine must
    agree)."""
    import webslm
    from webslm.cpu import CpuBackend
    from webslm.generate import generate, prompt_ids
    from webslm.semantic.ledger import Ledger
    entry = next(m for m in json.loads((ROOT / serve.MANIFEST).read_text())["models"] if m["default"])
    model = webslm.open_model(ROOT / ".assets/site" / entry["file"])
    ledger = Ledger()
    text = "".join(d.text for d in generate(model, CpuBackend(model), prompt_ids(model, BRIEF),
                                            webslm.SamplerSettings(temperature=0, max_tokens=4), ledger=ledger))
    return {"token_ids": list(ledger.committed_ids), "text": text}


@pytest.fixture(scope="module")
def brief_reference(brief_answer) -> list[int]:
    return brief_answer["token_ids"]


def answered_on(booted, reply: dict) -> None:
    """The row's engine answered all of `reply` (a completion, or a stream's final chunk)."""
    assert reply["webslm"]["backends"] == [ANSWERS_ON[booted.row.name]], reply["webslm"]

RUN = """(async () => {
  const source = %s.replace('"@mlc-ai/web-llm"', JSON.stringify(new URL(%s, location.href).href));
  const url = URL.createObjectURL(new Blob([source], { type: "text/javascript" }));
  const started = performance.now();
  try {
    const module = await import(url);
    return { results: module.results, seconds: (performance.now() - started) / 1000 };
  } finally {
    URL.revokeObjectURL(url);
  }
})()"""


def run_program(booted, name: str) -> dict:
    """Run program `name` with its import naming webllm.mjs plus the row's IMPORT_QUERY: its
    exported results."""
    source = (PROGRAMS / f"{name}.mjs").read_text()
    assert source.count('from "@mlc-ai/web-llm"') == 1          # the one line the test changes
    module = "webllm.mjs" + IMPORT_QUERY[booted.row.name]
    booted.wait_for("window.webslm && window.webslm.ready", timeout_s=900)
    out = booted.row.eval(RUN % (json.dumps(source), json.dumps(module)), timeout_s=TIMEOUT_S)
    print(f"\n{booted.row.name}: {name} ran in {out['seconds']:.1f} s")
    booted.results.setdefault("webllm_programs", {})[name] = {"seconds": round(out["seconds"], 1)}
    booted.record()
    return out["results"]


def test_get_started(booted, brief_reference):
    r = run_program(booted, "get_started")
    progress = r["progress"]
    print(f"{booted.row.name}: CreateMLCEngine's load (after the worker's boot) took {progress[-1]['timeElapsed']:.1f} s; "
          f"{progress[-1]['text']}")
    # where the load's time went: when each step of it (the text before its ":") began
    began = {}
    for p in progress:
        began.setdefault(p["text"].split(":")[0].split(" (")[0], round(p["timeElapsed"], 1))
    print(f"{booted.row.name}: the load's steps began at (s): {began}")
    booted.results["webllm_programs"]["get_started"].update(load_s=round(progress[-1]["timeElapsed"], 1), steps_began_s=began)
    booted.record()
    assert progress and progress[-1]["progress"] == 1 and progress[-1]["text"].startswith("Finish loading")
    values = [p["progress"] for p in progress]
    assert values == sorted(values) and all(0 <= v <= 1 for v in values)
    assert all(isinstance(p["text"], str) and p["text"] and p["timeElapsed"] >= 0 for p in progress)
    if ANSWERS_ON[booted.row.name] == "gpu":
        assert progress[-1]["text"].startswith("Finish loading on WebGPU")
    else:                                              # ?gpu=0: the GPU not tried
        assert progress[-1]["text"].startswith("Finish loading on the CPU path (the GPU was turned off"), progress[-1]
    reply = r["reply"]
    answered_on(booted, reply)
    assert reply["object"] == "chat.completion" and reply["choices"][0]["finish_reason"] == "length"
    assert reply["webslm"]["token_ids"] == brief_reference
    assert reply["choices"][0]["message"]["content"] == r["message"] != ""
    usage = reply["usage"]
    assert usage["completion_tokens"] == 4 and usage["total_tokens"] == usage["prompt_tokens"] + 4
    assert set(usage["extra"]) >= {"prefill_tokens_per_s", "decode_tokens_per_s", "e2e_latency_s",
                                   "time_to_first_token_s", "time_per_output_token_s"}
    assert usage["extra"]["decode_tokens_per_s"] > 0
    assert r["stats"].startswith("prefill: ") and " tokens/sec, decode: " in r["stats"]


def test_streaming_with_the_usage_chunk_and_logprobs(booted, brief_reference):
    r = run_program(booted, "streaming")
    answered_on(booted, r["final"])
    assert r["final"]["webslm"]["token_ids"] == brief_reference
    assert r["text"] == r["message"] != ""
    assert r["finishReasons"] == ["length"] and r["chunksWithoutChoices"] == 1
    assert r["usage"]["completion_tokens"] == 4 and "extra" in r["usage"]
    assert len(r["logprobs"]) == 4
    for entry in r["logprobs"]:
        assert entry["logprob"] <= 0 and len(entry["top_logprobs"]) == 2
        assert entry["logprob"] <= entry["top_logprobs"][0]["logprob"] + 1e-9      # greedy: the top token
        assert bytes(entry["bytes"]).decode("utf-8", "replace") == entry["token"]
    assert b"".join(bytes(e["bytes"]) for e in r["logprobs"]).decode() == r["text"]     # the greedy tokens, in order


def test_multi_round(booted):
    r = run_program(booted, "multi_round")
    first, second, after = r["first"], r["second"], r["afterReset"]
    for reply in (first, second, after):
        answered_on(booted, reply)
    assert first["choices"][0]["message"]["content"]
    assert second["usage"]["prompt_tokens_details"]["cached_tokens"] > first["usage"]["prompt_tokens"] // 2
    assert after["usage"]["prompt_tokens_details"]["cached_tokens"] == 0          # resetChat
    assert after["webslm"]["token_ids"] == second["webslm"]["token_ids"]


def test_seed_reproduce(booted):
    r = run_program(booted, "seed_reproduce")
    a, both = r["a"], r["both"]
    answered_on(booted, a)
    assert a["webslm"]["seed"] == 42 and 28 not in a["webslm"]["token_ids"]        # logit_bias -100
    assert [c["index"] for c in both["choices"]] == [0, 1]
    choices = both["webslm"]["choices"]
    assert [c["seed"] for c in choices] == [42, 43]
    assert choices[0]["token_ids"] == a["webslm"]["token_ids"]                     # the same seed, the same answer
    assert both["choices"][0]["message"]["content"] == a["choices"][0]["message"]["content"]
    assert both["usage"]["completion_tokens"] == sum(c["usage"]["completion_tokens"] for c in choices)
    answer = r["json"]["choices"][0]
    text = answer["message"]["content"]
    print(f"{booted.row.name}: JSON mode answered {text!r} ({answer['finish_reason']})")
    if answer["finish_reason"] == "stop":
        assert isinstance(json.loads(text), dict), text
    else:                                                  # cut at max_tokens: a prefix of one
        from webslm.semantic.json_grammar import INITIAL, advance
        assert answer["finish_reason"] == "length" and advance(INITIAL, text.encode()) is not None, text


def test_abort_and_reload(booted, brief_reference):
    r = run_program(booted, "abort_reload")
    assert r["finishReason"] == "abort" and r["pieces"] >= 1
    first, second = r["first"], r["second"]
    answered_on(booted, second)                                   # after reload
    assert first["webslm"]["token_ids"] == brief_reference[:1]        # answered in order, the second after
    assert second["webslm"]["token_ids"] == brief_reference[:2]       # the first (its prompt cached by it)
    assert second["usage"]["prompt_tokens_details"]["cached_tokens"] > 0
    raw = r["raw"]
    assert raw["object"] == "text_completion" and raw["usage"]["completion_tokens"] == 1
    assert raw["usage"]["prompt_tokens"] == 5 and raw["choices"][0]["text"]     # no chat template
    held = r["rawGrammar"]["choices"][0]
    assert held["text"] in (" Paris.", " Lyon.", " Nice.") and held["finish_reason"] == "stop", held
    assert r["tooShort"]["code"] == "bad-request" and "max_tokens" in r["tooShort"]["message"], r["tooShort"]
    unknown = r["unknownModel"]
    assert unknown["code"] == "unknown-model" and "Llama-3.1-8B-Instruct-q4f32_1-MLC" in unknown["message"]


# json_schema.mjs's request, for the CPython reference
COLOUR_SCHEMA = {"type": "object", "properties": {"colour": {"enum": ["red", "green", "blue"]},
                                                  "primary": {"type": "boolean"}},
                 "required": ["colour", "primary"], "additionalProperties": False}
COLOUR = [{"role": "system", "content": "Answer in JSON."}, {"role": "user", "content": "Name a primary colour."}]


def test_json_schema(booted):
    import webslm
    from webslm.cpu import CpuBackend
    from webslm.generate import generate, prompt_ids
    from webslm.request import sampler_settings
    from webslm.semantic.ledger import Ledger
    r = run_program(booted, "json_schema")
    entry = next(m for m in json.loads((ROOT / serve.MANIFEST).read_text())["models"] if m["default"])
    model = webslm.open_model(ROOT / ".assets/site" / entry["file"])
    settings = sampler_settings(model, {"response_format": {"type": "json_schema", "json_schema": {
        "name": "colour", "schema": COLOUR_SCHEMA}}, "temperature": 0.7, "seed": 11, "max_tokens": 40})
    ledger = Ledger()
    for _ in generate(model, CpuBackend(model), prompt_ids(model, COLOUR), settings, ledger=ledger):
        pass
    for reply in (r["asWebllm"], r["asOpenai"]):
        answered_on(booted, reply)
        choice = reply["choices"][0]
        text = choice["message"]["content"]
        print(f"{booted.row.name}: JSON-schema mode answered {text!r} ({choice['finish_reason']}, "
              f"{reply['webslm']['backends']})")
        assert choice["finish_reason"] == "stop" and reply["webslm"]["token_ids"] == list(ledger.committed_ids)
        value = json.loads(text)
        assert list(value) == ["colour", "primary"] and value["colour"] in ("red", "green", "blue")
        assert isinstance(value["primary"], bool)
    reply = r["withKeywords"]["choices"][0]
    print(f"{booted.row.name}: pattern/minimum/maximum answered {reply['message']['content']!r}")
    value = json.loads(reply["message"]["content"])
    assert reply["finish_reason"] == "stop" and re.fullmatch(r"#[0-9a-f]{6}", value["hex"])
    assert isinstance(value["brightness"], int) and 0 <= value["brightness"] <= 100
    reply = r["asGrammar"]["choices"][0]
    print(f"{booted.row.name}: grammar mode answered {reply['message']['content']!r}")
    assert reply["finish_reason"] == "stop" and reply["message"]["content"] in ("yes.", "no.")
    assert r["unsupported"]["code"] == "bad-request" and "'uniqueItems' is not supported" in r["unsupported"]["message"]
    assert r["badGrammar"]["code"] == "bad-request" and "left-recursive" in r["badGrammar"]["message"]
    assert r["tools"]["code"] == "bad-request" and "no tool support" in r["tools"]["message"]


def test_simple_chat(booted, brief_answer):
    r = run_program(booted, "simple_chat")
    assert r["containerGone"]                              # the page is left as it was
    first, second = r["turns"]
    rendered = r["rendered"]
    assert [b["className"] for b in rendered] == ["message user", "message assistant"] * 2
    assert [b["text"] for b in rendered[::2]] == ["What is the capital of France?", "And of Italy?"]
    for bubble, turn in zip(rendered[1::2], r["turns"]):
        print(f"{booted.row.name}: simple chat answered {bubble['text']!r} in {turn['textChunks']} chunks")
        answered_on(booted, turn["final"])
        # what the bubble shows, streamed in piece by piece, is the whole answer (getMessage)
        assert bubble["text"] == turn["message"] != "" and turn["textChunks"] >= 1
        assert turn["usage"]["completion_tokens"] == len(turn["final"]["webslm"]["token_ids"])
    assert rendered[1]["text"] == brief_answer["text"]                    # the first turn is BRIEF
    assert first["final"]["webslm"]["token_ids"] == brief_answer["token_ids"]
    # the conversation grew by each answer, and the second turn read the first from the KV cache
    assert [m["role"] for m in r["messages"]] == ["system", "user", "assistant", "user", "assistant"]
    assert r["messages"][2]["content"] == rendered[1]["text"]
    assert second["usage"]["prompt_tokens"] > first["usage"]["prompt_tokens"]
    assert second["usage"]["prompt_tokens_details"]["cached_tokens"] > first["usage"]["prompt_tokens"] // 2


def test_an_unknown_gpu_query_fails_the_import(booted):
    """webllm.mjs?gpu= takes force, 0 or 1: any other value fails the import, saying so,
    rather than being taken for the default."""
    booted.wait_for("window.webslm && window.webslm.ready", timeout_s=900)
    error = booted.row.eval("""import(new URL("webllm.mjs?gpu=fast", location.href).href)
      .then(() => null, (e) => ({ name: e.name, code: e.code, message: e.message }))""", timeout_s=60)
    assert error is not None and error["code"] == "bad-request" and "gpu=fast" in error["message"], error
