"""Stop that stops, progress while a prompt is read, and a second turn that re-reads only
itself, in every browser row, on whichever engine the row's page chose (GPU rows: the
admitted GPU; WebKitGTK: the CPU path).

- The page's Stop during the prefill of a long question: the bubble showed "Reading the
  prompt: n of N tokens"; after the click no text arrives (no delta event at all: the
  answer never got past the prompt), the answer ends "abort", the reading line is gone.
- The API's AbortSignal during the decode: no chunk with text after abort(); the stream's
  last chunk says "abort".
- Two turns through the API: the second keeps the first's prompt and answer in the KV cache
  (usage.prompt_tokens_details.cached_tokens), its progress events run from the kept count
  to the whole prompt, and its greedy answer is CPython's CPU answer to the same
  conversation, token for token.
The time from Stop (or abort()) to the answer's end is printed and written to
tests_browser/results/<row>.json under "stop"; no test asserts a time.
"""
from __future__ import annotations

import functools
import json
import time

import pytest
from app_session import WAITED_ON
from conftest import GREEDY_MAX_TOKENS, GREEDY_PROMPT, ROOT, serve

ANSWER_TIMEOUT_S = 900
READY_STATES = ["GPUReady", "CPUReady"]
SETTLE_TIMEOUT_S = 300     # a step that a Stop left retiring: seconds on lavapipe
MIRROR_TIMEOUT_S = 30      # the page hears of a state change as soon as the worker makes it
# About 150 tokens with the default system prompt: several GPU prefill chunks, tens of seconds
# of CPU prefill in Pyodide here.
LONG_QUESTION = ("Remember this list: " + ", ".join(f"parcel {i} goes to room {100 + 7 * i}" for i in range(12))
                 + ". Which room gets parcel 5?")
STORY = "Write a long story about a dragon who learns to cook."
SECOND_QUESTION = "And of Italy?"
SECOND_MAX_TOKENS = 6

UNTIL = """const until = (f, ms) => new Promise((ok, fail) => {
  const t = setInterval(() => { const v = f(); if (v) { clearInterval(t); ok(v); } }, 10);
  setTimeout(() => { clearInterval(t); fail(new Error("timed out")); }, ms); });
const sleep = (ms) => new Promise((r) => setTimeout(r, ms));"""


def _ready(booted) -> str:
    """Wait until the page can answer and no answer or retiring step is left: the worker's
    engine says so (engine-status), and then the page's mirror of its state (engine.state,
    moved by the engine's state events) says so too; the backend. A step left retiring by a
    Stop takes seconds on lavapipe, so either wait failing means a stuck engine or a page that
    missed a state change; the error gives both views and the page's last state changes."""
    booted.wait_for("window.webslm && window.webslm.ready", timeout_s=900)
    deadline = time.monotonic() + SETTLE_TIMEOUT_S
    while (status := booted.request("engine-status"))["state"] not in READY_STATES:
        if time.monotonic() > deadline:
            raise AssertionError(f"the worker's engine is not ready {SETTLE_TIMEOUT_S} s on: {status}; "
                                 f"the page: {booted.row.eval(WAITED_ON)}")
        time.sleep(0.2)
    booted.wait_for(f"{json.dumps(READY_STATES)}.includes(window.webslm.engine.state)", timeout_s=MIRROR_TIMEOUT_S)
    return status["backend"]


def _record(booted, key: str, value) -> None:
    booted.results.setdefault("stop", {})[key] = value
    booted.record()


def test_the_pages_stop_ends_a_prompt_being_read_with_no_text(booted):
    backend = _ready(booted)
    out = booted.row.eval("""(async () => {
      %s
      const w = window.webslm, log = [], t0 = performance.now();
      const at = () => Math.round(performance.now() - t0);
      const onDelta = (e) => log.push({kind: "delta", at: at(), text: e.detail.text});
      const onProgress = (e) => log.push({kind: "progress", at: at(), done: e.detail.done, total: e.detail.total});
      w.client.addEventListener("delta", onDelta);
      w.client.addEventListener("prefill-progress", onProgress);
      await w.newChat();
      const answer = w.ask(%s, {temperature: 0, max_tokens: 8});
      const reading = await until(() => document.querySelector("#messages li.assistant.streaming .reading"), 120000);
      const readingText = reading.textContent;
      log.push({kind: "stop", at: at()});
      document.getElementById("stop").click();
      const result = await answer;
      log.push({kind: "ended", at: at()});
      await sleep(1500);                                   // a straggler would arrive by now
      w.client.removeEventListener("delta", onDelta);
      w.client.removeEventListener("prefill-progress", onProgress);
      const items = document.querySelectorAll("#messages li.assistant"), last = items[items.length - 1];
      return {log, result, readingText, shown: last.querySelector(".content").textContent,
              readingLeft: Boolean(last.querySelector(".reading")), finish: last.dataset.finishReason};
    })()""" % (UNTIL, json.dumps(LONG_QUESTION)), timeout_s=ANSWER_TIMEOUT_S)
    log, result = out["log"], out["result"]
    kinds = [e["kind"] for e in log]
    stop, ended = kinds.index("stop"), kinds.index("ended")
    latency_ms = log[ended]["at"] - log[stop]["at"]
    progress = [e for e in log if e["kind"] == "progress"]
    print(f"\n{booted.row.name} ({backend}): Stop in the prefill -> answer ended in {latency_ms} ms; "
          f"{out['readingText']!r}; progress {[(e['done'], e['total']) for e in progress]}")
    _record(booted, "prefill", {"backend": backend, "stop_to_end_ms": latency_ms, "reading": out["readingText"],
                                "prompt_tokens": result["usage"]["prompt_tokens"]})
    assert out["readingText"].startswith("Reading the prompt:"), out["readingText"]
    assert "delta" not in kinds, f"text arrived: {log}"
    assert result["finish_reason"] == "abort" and out["finish"] == "abort", result
    assert out["shown"] == "" and not out["readingLeft"]
    assert result["usage"]["completion_tokens"] == 0
    assert progress and progress[0]["total"] == result["usage"]["prompt_tokens"]
    assert all(e["done"] < e["total"] for e in progress), progress      # it never finished the prompt
    _ready(booted)                                        # and the engine comes back to ready


def test_the_apis_abort_signal_mid_answer_lets_no_text_through(booted):
    backend = _ready(booted)
    out = booted.row.eval("""(async () => {
      const w = window.webslm, engine = w.engine, ctrl = new AbortController(), log = [], raw = [];
      const t0 = performance.now(), at = () => Math.round(performance.now() - t0);
      const onDelta = (e) => raw.push(at());
      w.client.addEventListener("delta", onDelta);
      const stream = await engine.chat.completions.create({messages: [{role: "user", content: %s}], stream: true,
                                                           temperature: 0, max_tokens: 40, signal: ctrl.signal});
      let texts = 0, abortedAt = null;
      for await (const chunk of stream) {
        const c = chunk.choices[0];
        log.push({at: at(), content: c.delta.content ?? null, finish: c.finish_reason});
        if (c.delta.content && ++texts === 2) { abortedAt = at(); ctrl.abort(); }
      }
      const endedAt = at();
      await new Promise((r) => setTimeout(r, 1500));
      w.client.removeEventListener("delta", onDelta);
      return {log, abortedAt, endedAt, rawAfter: raw.filter((t) => t >= abortedAt).length};
    })()""" % json.dumps(STORY), timeout_s=ANSWER_TIMEOUT_S)
    log, aborted = out["log"], out["abortedAt"]
    latency_ms = out["endedAt"] - aborted
    print(f"\n{booted.row.name} ({backend}): abort() mid-answer -> stream ended in {latency_ms} ms; "
          f"{out['rawAfter']} delta event(s) the worker had sent meanwhile were dropped")
    _record(booted, "decode", {"backend": backend, "abort_to_end_ms": latency_ms, "deltas_dropped": out["rawAfter"]})
    assert aborted is not None, log
    after = [e for e in log if e["at"] >= aborted][1:]            # what came after the chunk that triggered it
    assert [e for e in after if e["content"]] == [], f"text after abort(): {log}"
    assert log[-1]["finish"] == "abort", log
    _ready(booted)


@pytest.fixture(scope="module")
def two_turn_reference() -> dict:
    """CPython's greedy CPU answers to the two-turn conversation, and its prompts' ids."""
    return _two_turn_reference()


@functools.cache
def _two_turn_reference() -> dict:
    """Computed once a session: pytest runs this module once per browser row, and a
    module-scoped fixture would be computed again in each."""
    from webslm.cpu import CpuBackend
    from webslm.generate import generate
    from webslm.semantic.ledger import Ledger
    import webslm
    entry = next(m for m in json.loads((ROOT / serve.MANIFEST).read_text())["models"] if m["default"])
    model = webslm.open_model(ROOT / ".assets/site" / entry["file"])
    messages, out = [{"role": "user", "content": GREEDY_PROMPT}], []
    for question, max_tokens in ((None, GREEDY_MAX_TOKENS), (SECOND_QUESTION, SECOND_MAX_TOKENS)):
        if question:
            messages += [{"role": "assistant", "content": out[-1]["text"]}, {"role": "user", "content": question}]
        ids = model.tokenizer.encode(model.chat_template.render(messages, add_generation_prompt=True), add_special=False)
        ledger = Ledger()
        deltas = list(generate(model, CpuBackend(model), ids, webslm.SamplerSettings(temperature=0, max_tokens=max_tokens),
                               ledger=ledger))
        out.append({"ids": ids, "text": "".join(d.text for d in deltas), "token_ids": list(ledger.committed_ids),
                    "finish": deltas[-1].finish_reason})
    return {"turns": out}


def test_a_second_turn_reads_only_itself_and_answers_as_the_cpu(booted, two_turn_reference):
    backend = _ready(booted)
    first, second = two_turn_reference["turns"]
    out = booted.row.eval("""(async () => {
      const engine = window.webslm.engine, progress = [];
      const onProgress = (e) => { if (e.detail.phase === "prefill") progress.push(e.detail); };
      engine.addEventListener("progress", onProgress);
      const ask = (messages, max_tokens) => engine.chat.completions.create({messages, temperature: 0, max_tokens});
      const one = await ask([{role: "user", content: %s}], %d);
      const firstProgress = progress.splice(0);
      const messages = [{role: "user", content: %s}, {role: "assistant", content: one.choices[0].message.content},
                        {role: "user", content: %s}];
      const two = await ask(messages, %d);
      engine.removeEventListener("progress", onProgress);
      return {one, two, firstProgress, progress: progress.filter((p) => p.request === two.id)};
    })()""" % (json.dumps(GREEDY_PROMPT), GREEDY_MAX_TOKENS, json.dumps(GREEDY_PROMPT),
               json.dumps(SECOND_QUESTION), SECOND_MAX_TOKENS), timeout_s=2 * ANSWER_TIMEOUT_S)
    one, two, progress = out["one"], out["two"], out["progress"]
    cached = two["usage"]["prompt_tokens_details"]["cached_tokens"]
    t1, t2 = one["webslm"]["timings"], two["webslm"]["timings"]
    cached_first = one["usage"]["prompt_tokens_details"]["cached_tokens"]     # the system prompt, from the test before
    print(f"\n{booted.row.name} ({backend}): turn 1 {one['usage']['prompt_tokens']} prompt tokens, {cached_first} kept, first token "
          f"{t1['time_to_first_token_s']} s; turn 2 {two['usage']['prompt_tokens']} tokens, {cached} kept, "
          f"first token {t2['time_to_first_token_s']} s; progress {[(p['done'], p['total']) for p in progress]}")
    _record(booted, "turns", {"backend": backend, "turn1_prompt_tokens": one["usage"]["prompt_tokens"],
                              "turn1_cached_tokens": cached_first,
                              "turn1_first_token_s": t1["time_to_first_token_s"],
                              "turn2_prompt_tokens": two["usage"]["prompt_tokens"], "turn2_cached_tokens": cached,
                              "turn2_first_token_s": t2["time_to_first_token_s"]})
    assert one["choices"][0]["message"]["content"] == first["text"] and first["finish"] == "stop"
    assert two["webslm"]["token_ids"] == second["token_ids"], (two["webslm"]["token_ids"], second["token_ids"])
    assert two["usage"]["prompt_tokens"] == len(second["ids"])
    # the first turn's prompt and every answer token were in the cache: all of it is kept
    assert cached == len(first["ids"]) + len(first["token_ids"]), (cached, len(first["ids"]), len(first["token_ids"]))
    done = [p["done"] for p in progress]
    assert progress and progress[0]["cached"] == cached and done[0] == cached
    assert done == sorted(done) and done[-1] == progress[-1]["total"] == len(second["ids"])
    assert two["webslm"]["backends"] == [backend]
