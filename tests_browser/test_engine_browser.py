"""The engine in every browser row, through the page.

GPU rows (Chromium/SwiftShader tier C, Chromium compatibility mode tier A, Firefox tier B;
their page is opened with ?gpu=force, conftest.py: every GPU here is slower than the CPU path,
so by default the CPU would answer, test_engine_choice_browser.py):
the worker's engine runs on the admitted GPU session; the GPU executor agrees with the CPU
oracle (conformance, teacher-forced); a cancel stops an answer at once; a GPU device destroyed in the
middle of a greedy answer (at a seeded random token) hands the answer to the CPU path, which
finishes it with exactly the CPU-only text, and the page's badge turns to CPU in place.
WebKitGTK (no WebGPU): the engine is the CPU path, with its reason. (The exact greedy answer
on each row's engine, through the chat page: test_chat_page.py.)

Measured numbers (GPU and CPU tokens/s, time to first token, the GPU executor's per-step
prepare/run/finish ms, conformance max logit error) are printed (-s) and written to
tests_browser/results/<row>.json under "engine".

Software GPUs are slow here, so every answer is short: a SmolLM2 decode step takes about
1.1-1.5 s on lavapipe (Firefox, Chromium compatibility) and about 20 s on SwiftShader
(Chromium, tier A or C alike), the 37-token chat prompt's prefill 17-28 s. The Chromium
row's engine tests take about 7 minutes, the conformance run most of it.
"""
from __future__ import annotations

import json
import pathlib
import random
import time

import pytest
from conftest import GREEDY_MAX_TOKENS, GREEDY_PROMPT as PROMPT   # the cpu_reference fixture's question

ROOT = pathlib.Path(__file__).resolve().parents[1]
GREEDY = {"temperature": 0, "max_tokens": GREEDY_MAX_TOKENS}
LONG_PROMPT = "Write a long story about a dragon who learns to cook."
CANCEL_SETTINGS = {"temperature": 0, "max_tokens": 40}
CONFORMANCE_TOKENS = 8
# SwiftShader (Chromium tier C) takes ~20 s a full-logits step: there the prompt's logits and
# two decode steps' (the KV cache past the prompt read back); the next tokens' choices on that
# engine are checked exactly by test_chat_page.py's greedy answer, and the logits that far by
# the lavapipe rows here and natively (tests/test_gpu_engine_native.py: 16 positions, tier C).
CONFORMANCE_TOKENS_ON = {"chromium": 3}
LOSS_SEED = 20240611
EXPECTED_TIER = {"chromium": "C", "chromium-compat": "A", "firefox": "B"}
ANSWER_TIMEOUT_S = 900
STEP_TIMEOUT_S = 240            # one step retiring after an abort, with room for a loaded machine


def _record(booted, key: str, value) -> None:
    engine = booted.results.setdefault("engine", {})
    engine[key] = value
    booted.record()


def _admitted(booted) -> dict:
    booted.wait_for("window.webslm && window.webslm.ready", timeout_s=900)
    result = booted.row.eval("window.webslm.admission")
    assert result and "error" not in result, result
    return result


def _gpu_engine(booted) -> dict:
    """The engine on the GPU: a GPU row's engine may have been left on the CPU by an earlier
    test (the Chromium admission fault cases, a device loss); then admit again as the page does."""
    if not booted.row.engine_on_gpu:
        pytest.skip(f"{booted.row.name}: the engine answers on the CPU here (drivers.BrowserRow.engine_on_gpu)")
    _admitted(booted)
    # a step an earlier test's abort left in flight retires first (CancelPending until then)
    booted.wait_for("window.webslm.engine.state !== 'CancelPending'", timeout_s=STEP_TIMEOUT_S)
    engine = booted.request("engine-status")
    if engine["backend"] != "gpu":           # load it again as the page does: from the cache, then admission
        booted.row.eval("window.webslm.loadModel('default').then(() => true)", timeout_s=900)
        engine = booted.request("engine-status")
    assert engine["backend"] == "gpu" and engine["state"] == "GPUReady", engine
    assert engine["tier"] == EXPECTED_TIER[booted.row.name], engine
    booted.wait_for("window.webslm.engine.state === 'GPUReady'", timeout_s=30)
    return engine


def _ask(booted, prompt: str, settings: dict) -> dict:
    """One question in a new chat, sent as the page's Send button sends it."""
    return booted.row.eval(f"(window.webslm.newChat(), window.webslm.ask({json.dumps(prompt)}, {json.dumps(settings)}))",
                           timeout_s=ANSWER_TIMEOUT_S)


def _events_since(booted, count: int) -> list[dict]:
    return booted.row.eval(f"window.webslm.engine.events.slice({count})")


def _in_order(transitions: list[tuple[str, str]], expected: list[tuple[str, str]]) -> bool:
    """Whether `expected` occurs in `transitions` as a subsequence (in order)."""
    it = iter(transitions)
    return all(any(t == e for t in it) for e in expected)


def _answer_numbers(answer: dict) -> dict:
    t = answer["timings"]
    return {"backends": answer["backends"], "completion_tokens": answer["usage"]["completion_tokens"],
            "prompt_tokens": answer["usage"]["prompt_tokens"],
            "decode_tokens_per_s": t["decode_tokens_per_s"], "prefill_seconds": t["prefill_seconds"],
            "time_to_first_token_s": t["time_to_first_token_s"],
            "page_time_to_first_token_s": round(t["page_time_to_first_token_s"], 3),
            "gpu_steps": t.get("gpu_steps")}


# --------------------------------------------------------------------------- every row

def test_the_engine_follows_admission(booted):
    """After the page's admission the engine is on the GPU (GPU rows) or the CPU path with
    the entry point's reason (WebKitGTK), and the page shows the same."""
    admission = _admitted(booted)
    if booted.row.expects_webgpu is True and not booted.row.engine_on_gpu:
        # SwiftShader: admission's step-floor stage bounded its step above the CPU path's and
        # stopped before compiling; the engine keeps the CPU path (what the page shows for it:
        # test_engine_choice_browser.py)
        assert admission["admitted"] is False and admission["stage"] == "step-floor", admission
        engine = booted.request("engine-status")
        assert engine["backend"] == "cpu" and engine["cpu_reason"]["code"] == "gpu-slower", engine
        return
    if booted.row.expects_webgpu is not True:
        engine = booted.request("engine-status")
        assert engine["backend"] == "cpu" and engine["state"] == "CPUReady", engine
        assert engine["cpu_reason"]["code"] == "no-webgpu", engine
        assert admission["engine"]["backend"] == "cpu"
        page = booted.row.eval("window.webslm.engine")
        assert page["state"] == "CPUReady" and page["backend"] == "cpu", page
        assert booted.row.eval("document.getElementById('engine-badge').textContent") == "CPU"
        assert "no-webgpu" in booted.row.eval("document.getElementById('engine-note').textContent")
        return
    engine = _gpu_engine(booted)
    print(f"\n{booted.row.name}: engine {engine}")
    page = booted.row.eval("window.webslm.engine")
    assert page["backend"] == "gpu", page
    transitions = [(e["from"], e["to"]) for e in page["events"]]
    assert ("Preparing", "GPUReady") in transitions, transitions
    assert booted.row.eval("document.getElementById('engine-badge').textContent").startswith("GPU")


def test_cancel_mid_answer_stops_the_stream_at_once(booted):
    """abort while an answer streams: no delta of it arrives after the abort's reply, the
    reply says "abort" with exactly the streamed text, and the engine goes back to ready
    through CancelPending. (The next answer, exact and timed: test_chat_page.py.)"""
    if booted.row.engine_on_gpu:
        _gpu_engine(booted)
    else:
        _admitted(booted)
    backend = booted.request("engine-status")["backend"]
    before = booted.row.eval("window.webslm.engine.events.length")
    outcome = booted.row.eval("""(async () => {
      const w = window.webslm, log = [];
      const onDelta = (e) => log.push({kind: "delta", text: e.detail.text, backend: e.detail.backend});
      w.client.addEventListener("delta", onDelta);
      w.newChat();
      const answer = w.ask(%s, %s);
      await new Promise((ok, fail) => {
        const t = setInterval(() => { if (log.length >= 2) { clearInterval(t); ok(); } }, 10);
        setTimeout(() => { clearInterval(t); fail(new Error("fewer than 2 deltas")); }, %d);
      });
      const ack = await w.client.request("abort");
      log.push({kind: "ack", aborted: ack.aborted});
      const result = await answer;
      log.push({kind: "reply"});
      await new Promise((r) => setTimeout(r, 2000));          // any straggler would arrive by now
      w.client.removeEventListener("delta", onDelta);
      const items = document.querySelectorAll("#messages li.assistant");
      const { renderMarkdown } = await import("./markdown.mjs");      // the page shows answers as Markdown
      return {log, result, shown: items[items.length - 1].querySelector(".content").textContent,
              rendered: renderMarkdown(result.text, document.createElement("div")).textContent};
    })()""" % (json.dumps(LONG_PROMPT), json.dumps(CANCEL_SETTINGS), ANSWER_TIMEOUT_S * 1000),
        timeout_s=ANSWER_TIMEOUT_S + 30)
    log, result = outcome["log"], outcome["result"]
    kinds = [entry["kind"] for entry in log]
    ack = kinds.index("ack")
    assert log[ack]["aborted"] is True, log
    assert "delta" not in kinds[ack:], f"text arrived after the abort's reply: {log}"
    assert result["finish_reason"] == "abort", result
    assert result["backends"] == [backend], result
    streamed = "".join(entry["text"] for entry in log if entry["kind"] == "delta")
    assert result["text"] == streamed and outcome["shown"] == outcome["rendered"]
    assert result["usage"]["completion_tokens"] < CANCEL_SETTINGS["max_tokens"]
    generating = "Generating" if backend == "gpu" else "CPUGenerating"
    ready = "GPUReady" if backend == "gpu" else "CPUReady"
    # The step in flight at the abort cannot be recalled from the GPU: the engine stays
    # CancelPending until it retires (one decode step: ~20 s on SwiftShader), then is ready.
    pending_since = time.perf_counter()
    booted.wait_for(f"window.webslm.engine.state === {json.dumps(ready)}", timeout_s=STEP_TIMEOUT_S)
    pending_s = time.perf_counter() - pending_since
    transitions = [(e["from"], e["to"]) for e in _events_since(booted, before)]
    assert _in_order(transitions, [(ready, generating), (generating, "CancelPending"), ("CancelPending", ready)]), transitions
    _record(booted, "cancel", {"aborted_after_tokens": result["usage"]["completion_tokens"], "backend": backend,
                               "ready_again_after_s": round(pending_s, 2)})
    print(f"\n{booted.row.name}: cancelled after {result['usage']['completion_tokens']} tokens ({backend}); "
          f"ready again {pending_s:.1f} s after the abort's reply (+2 s)")


# --------------------------------------------------------------------------- GPU rows

def test_gpu_conformance_with_the_cpu_oracle(booted):
    """SmolLM2, 8 teacher-forced positions (3 on SwiftShader): top-1 agreement everywhere except
    where the oracle's top-2 margin is under the tolerance; max logit error and per-step host time."""
    _gpu_engine(booted)
    tokens = CONFORMANCE_TOKENS_ON.get(booted.row.name, CONFORMANCE_TOKENS)
    report = booted.request("conformance", {"tokens": tokens}, timeout_s=ANSWER_TIMEOUT_S)
    steps = report["gpu_steps"]
    summary = {"tier": report["tier"], "positions": report["positions"], "top1_agreement": report["top1_agreement"],
               "disagreements": report["disagreements"], "max_abs_logit_error": report["max_abs_logit_error"],
               "margin_tolerance": report["margin_tolerance"], "passed": report["passed"],
               "min_margin": min(p["margin"] for p in report["per_position"]),
               "seconds": report["seconds"], "per_step_ms_full_logits": steps}
    _record(booted, "conformance", summary)
    print(f"\n{booted.row.name}: conformance {json.dumps(summary)}")
    assert report["positions"] == tokens
    assert report["prompt"] == PROMPT
    assert all(d["margin"] < report["margin_tolerance"] for d in report["disagreements"]), report["disagreements"]
    assert report["passed"], report
    assert report["max_abs_logit_error"] < 1.0, report["max_abs_logit_error"]
    assert steps["decode_steps"] == tokens - 1
    assert all(steps[k] is not None and steps[k] >= 0 for k in ("prepare_ms", "run_ms", "finish_ms")), steps
    assert booted.request("engine-status")["state"] == "GPUReady"


@pytest.mark.last_in_row          # the engine stays on the CPU after a loss
def test_device_loss_mid_answer_continues_on_the_cpu(booted, cpu_reference):
    """lose-device destroys the admitted GPU device after a seeded random number of committed
    tokens: the engine goes Lost -> CPURebuild -> CPUGenerating, the same answer continues
    (no restart) to exactly the CPU-only text, and the badge shows CPU with the reason."""
    _gpu_engine(booted)
    n = len(cpu_reference["token_ids"])
    after = random.Random(f"{LOSS_SEED}:{booted.row.name}").randint(1, n - 2)
    before_events = booted.row.eval("window.webslm.engine.events.length")
    armed = booted.request("lose-device", {"afterTokens": after})
    assert armed == {"armed": True, "after_tokens": after, "state": "GPUReady"}, armed
    outcome = booted.row.eval("""(async () => {
      const w = window.webslm, deltas = [], badges = [];
      const badge = () => document.getElementById("engine-badge").textContent;
      const onDelta = (e) => deltas.push({text: e.detail.text, backend: e.detail.backend, badge: badge()});
      w.client.addEventListener("delta", onDelta);
      try {
        w.newChat();
        const answer = await w.ask(%s, %s);
        return {answer, deltas};
      } finally {
        w.client.removeEventListener("delta", onDelta);
      }
    })()""" % (json.dumps(PROMPT), json.dumps(GREEDY)), timeout_s=ANSWER_TIMEOUT_S)
    answer, deltas = outcome["answer"], outcome["deltas"]
    print(f"\n{booted.row.name}: device destroyed after {after} tokens (seed {LOSS_SEED}): "
          f"{answer['text']!r} {[d['backend'] for d in deltas]}")
    assert answer["device_destroyed_after"] == after, answer
    assert answer["backends"] == ["gpu", "cpu"], answer
    assert answer["finish_reason"] == "stop"
    assert answer["text"] == cpu_reference["text"] and "Paris" in answer["text"], (answer["text"], cpu_reference)
    assert answer["token_ids"] == cpu_reference["token_ids"]
    assert [d["backend"] for d in deltas] == ["gpu"] * after + ["cpu"] * (len(deltas) - after)
    assert "".join(d["text"] for d in deltas) == answer["text"] == answer["shown_text"]
    # the transition, in order, and the page followed it in place: one answer, badge now CPU
    transitions = [(e["from"], e["to"]) for e in _events_since(booted, before_events)]
    assert _in_order(transitions, [("GPUReady", "Generating"), ("Generating", "Lost"), ("Lost", "CPURebuild"),
                                   ("CPURebuild", "CPUGenerating"), ("CPUGenerating", "CPUReady")]), transitions
    assert booted.row.eval("document.querySelectorAll('#messages li.assistant').length") == 1   # one answer, continued
    assert deltas[0]["badge"].startswith("GPU") and deltas[-1]["badge"] == "CPU", deltas
    assert booted.row.eval("document.getElementById('engine-badge').textContent") == "CPU"
    assert "lost" in booted.row.eval("document.getElementById('engine-note').textContent")
    engine = booted.request("engine-status")
    assert engine["backend"] == "cpu" and engine["cpu_reason"]["reason"] == "GPU lost", engine
    lost = next(e for e in _events_since(booted, before_events) if e["to"] == "Lost")
    assert lost["code"] in ("device-lost", "readback-failed"), lost
    # the CPU-only answer in this browser (the engine stays on the CPU after a loss)
    cpu = _ask(booted, PROMPT, GREEDY)
    assert cpu["backends"] == ["cpu"] and cpu["text"] == answer["text"], cpu
    _record(booted, "device_loss", {"seed": LOSS_SEED, "after_tokens": after, "lost_code": lost["code"],
                                    "answer": _answer_numbers(answer)})
    _record(booted, "cpu_answer", _answer_numbers(cpu))
    print(f"{booted.row.name}: CPU answer after the loss {json.dumps(_answer_numbers(cpu))}")


# --------------------------------------------------------------------------- model switch

def test_model_switch_unloads_the_engine(booted):
    """Loading a model (here the same one again) unloads the engine first: on the GPU its
    executor is released (every buffer and the device destroyed), the state ends Empty; the
    page admits anew, as after its own load."""
    if booted.row.engine_on_gpu:
        _gpu_engine(booted)
    else:
        _admitted(booted)
    engine = booted.request("engine-status")
    memory_before = booted.request("memory-status")
    entry = next(m for m in json.loads((ROOT / ".assets/site/manifest.json").read_text())["models"] if m["default"])
    booted.row.eval("(() => { window.__released = []; window.webslm.client.addEventListener('engine-released', (e) => window.__released.push(e.detail)); return true; })()")
    before = booted.row.eval("window.webslm.engine.events.length")
    model = booted.request("load-model", {"source": {"url": f"assets/{entry['file']}"}, "sha256": entry["artifact_sha256"],
                                          "name": None, "cache": True}, timeout_s=600)
    assert model["artifact_sha256"] == entry["artifact_sha256"]
    transitions = [(e["from"], e["to"]) for e in _events_since(booted, before)]
    ready = "GPUReady" if engine["backend"] == "gpu" else "CPUReady"
    assert transitions == [(ready, "Destroying"), ("Destroying", "Empty")], transitions
    released = booted.row.eval("window.__released")
    assert [(r["backend"], r["reason"]) for r in released] == ([("gpu", "unload")] if engine["backend"] == "gpu" else [])
    assert booted.request("engine-status")["state"] == "Empty"
    # admit again, as the page does after loading a model
    gpu = "force" if booted.row.engine_on_gpu else "measure"      # as the row's page does
    result = booted.request("admit", {"featureLevel": "auto", "fault": None, "gpu": gpu}, timeout_s=900)
    assert result["engine"]["backend"] == engine["backend"], result["engine"]
    booted.wait_for(f"window.webslm.engine.state === {json.dumps(ready)}", timeout_s=30)
    # nothing of the first engine is left: one admitted device (none on the CPU), holding the
    # same buffers as before the switch (bench/soak_browser.py repeats this 20 times)
    memory = booted.request("memory-status")
    assert memory["gpu"] == memory_before["gpu"], (memory_before, memory)
    assert memory["gpu"]["devices"] == (1 if engine["backend"] == "gpu" else 0), memory
    _record(booted, "model_switch_memory", {"before": memory_before, "after": memory})
