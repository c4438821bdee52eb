"""The engine choice kept across visits (worker/verdict-store.mjs, py/webslm/engine/verdict.py).

- Chromium (SwiftShader, where the GPU loses to the CPU path by 10-90x): with a kept record
  saying this adapter was slower, the page opened again goes to the CPU path at once (no GPU
  admission: the engine's first state after Empty is CPUReady), shows why and offers "Measure
  the GPU again", and a second reload still finds the record.
- chromium-compat (GL ES over lavapipe, admitted in seconds): "Measure the GPU again" admits
  and times the GPU although a verdict was kept, and what it finds replaces the record.

The record is seeded, not produced: producing it costs a whole SwiftShader admission (minutes),
which test_engine_choice_browser.py's first test pays on the row's first page anyway (the
record that page keeps is what test_markdown_browser.py's later load in this row meets). Its
key is computed here in CPython from what the worker reports (gpu-probe's adapter, the status's
user agent and shader bundle), so a worker that keyed it differently fails this test.

Cost (this machine, 2026-12-03): the Chromium test about 20 s (a gpu-probe and two page loads
on the CPU path, ready in 6.5 and 7.2 s); the chromium-compat one about 25 s (a gpu-probe, a
page load on the CPU path, the admission and timing the button starts: 5.7 s, and the row's
page opened again with ?gpu=force). Each runs last in its row. The Chromium one leaves the
row's page on the CPU path by a kept verdict; it puts back the store it found, and where there
was none (this file run alone, the row's first page not yet measured) it leaves the seeded
record, which says what that measurement would have kept. The chromium-compat one puts back the
store it found and the row's page as it was (?gpu=force).
"""
from __future__ import annotations

import json

import pytest

from webslm.engine import verdict
from webslm.engine.choice import Choice
from webslm.webgpu.interface import AdapterSummary

STORE_URL = "new URL('/.webslm-verdict/verdicts.json', location.origin).href"
READ = f"caches.open('webslm-verdict-v1').then((c) => c.match({STORE_URL})).then((r) => r ? r.text() : null)"
WRITE = f"caches.open('webslm-verdict-v1').then((c) => c.put({STORE_URL}, new Response(%s))).then(() => true)"
DELETE = f"caches.open('webslm-verdict-v1').then((c) => c.delete({STORE_URL}))"
READY_TIMEOUT_S = 600


def _key(booted) -> str:
    """The store's key for this row's adapter, browser, default model and shader bundle, from
    what the worker reports (gpu-probe runs choose_adapter as admission does)."""
    status = booted.request("status")
    probe = booted.request("gpu-probe", {"featureLevel": "auto", "seed": 0}, timeout_s=300)
    assert probe["adapter"], probe
    entry = next(m for m in booted.row.eval("fetch('assets/manifest.json').then((r) => r.json())")["models"] if m["default"])
    return verdict.record_key(AdapterSummary(**probe["adapter"]), status["user_agent"], entry["artifact_sha256"],
                              status["shader_bundle_hash"])


def _seed(booted, key: str) -> None:
    """A kept verdict for `key`, made by verdict.py as a measurement would: 15 s against 250 ms."""
    seeded = verdict.updated(None, key, Choice("cpu", gpu_step_s=15.0, cpu_step_s=0.25, gpu_steps_timed=1,
                                               fallback_adapter=True))
    assert booted.row.eval(WRITE % json.dumps(seeded))


def _visit(booted, label: str, query: str | None = None) -> dict:
    """Open the page again (the row's URL, or with `query`), wait until it can answer; what it shows."""
    booted.reload(label, query)
    booted.wait_for("window.webslm && window.webslm.ready", timeout_s=READY_TIMEOUT_S)
    return booted.row.eval("""(() => {
      const $ = (id) => document.getElementById(id);
      const engine = window.webslm.engine;
      return { engine: JSON.parse(JSON.stringify(engine)), admission: window.webslm.admission,
               transitions: engine.events.map((e) => [e.from, e.to]),
               page_ready_s: window.webslm.timings.page_ready_s,
               badge: $("engine-badge").textContent, note: $("engine-note").textContent,
               admission_line: $("admission-state").textContent, measure_hidden: $("measure-gpu").hidden };
    })()""")


@pytest.mark.last_in_row          # it leaves the row's page on the CPU path by a kept verdict
def test_a_kept_verdict_sends_the_next_visit_to_the_cpu_path_at_once(booted):
    if booted.row.name != "chromium":
        pytest.skip("SwiftShader's row: its GPU is the one the CPU path beats by most; the store is the same code in every row")
    key = _key(booted)
    found = booted.row.eval(READ)
    try:
        _seed(booted, key)                   # SwiftShader is a fallback adapter, as the seeded record says
        seen = [_visit(booted, "verdict"), _visit(booted, "verdict-again")]      # the record survives a reload
        for page in seen:
            engine, admission = page["engine"], page["admission"]
            assert engine["backend"] == "cpu" and engine["state"] == "CPUReady", engine
            assert page["transitions"] == [["Empty", "CPUReady"]], page["transitions"]   # no Probing: no admission
            assert admission["remembered"] is True and admission["admitted"] is False and admission["stages"] == []
            reason = engine["cpuReason"]
            assert reason["code"] == "gpu-slower-remembered" and reason["measured_on"] == verdict.today(), reason
            assert reason["sentence"].startswith(f"on an earlier visit ({verdict.today()}) this GPU (a software renderer) "
                                                 "answered 60x slower than the CPU path"), reason
            assert engine["choice"]["remembered_on"] == verdict.today() and engine["choice"]["gpu_steps_timed"] == 0
            # what the user sees: CPU, why, and the way to time the GPU again
            assert page["badge"] == "CPU" and page["note"].startswith("On an earlier visit ("), page["note"]
            assert "Measure the GPU again" in page["note"] and page["measure_hidden"] is False, page
            assert page["admission_line"].startswith("The GPU was not tried: on an earlier visit"), page["admission_line"]
            assert "verdicts_kept" not in admission                   # nothing measured: nothing rewritten
        assert key in verdict.parse(booted.row.eval(READ))
        booted.record(verdict={"page_ready_s": [round(p["page_ready_s"], 2) for p in seen],
                               "boot": [booted.results["boot_verdict"], booted.results["boot_verdict-again"]]})
        print(f"\n{booted.row.name}: page ready with a kept verdict in {[round(p['page_ready_s'], 1) for p in seen]} s")
    finally:
        booted.row.eval(WRITE % json.dumps(found) if found is not None else "true")


@pytest.mark.last_in_row          # it opens the page without ?gpu=force, then again with it
def test_measure_the_gpu_again_times_it_afresh_and_replaces_the_kept_verdict(booted):
    """The page's "Measure the GPU again" (engine.measureGpu(): admit with gpu "remeasure"):
    the model is admitted and timed although a verdict was kept, and what the timing finds
    replaces it. In chromium-compat, whose GPU (GL ES over lavapipe) is admitted in seconds."""
    if booted.row.name != "chromium-compat":
        pytest.skip("lavapipe's row: an admission in seconds (SwiftShader's takes minutes)")
    key = _key(booted)
    found = booted.row.eval(READ)
    try:
        _seed(booted, key)
        before = _visit(booted, "verdict-remeasure", query="")                 # the default: the verdict decides
        assert before["engine"]["cpuReason"]["code"] == "gpu-slower-remembered" and before["measure_hidden"] is False, before
        after = booted.row.eval("""(async () => {
          document.getElementById("measure-gpu").click();
          await new Promise((done) => { const t = setInterval(() => {
            const a = window.webslm.admission;
            if (a && !a.remembered && window.webslm.ready) { clearInterval(t); done(); } }, 50); });
          return { engine: JSON.parse(JSON.stringify(window.webslm.engine)), admission: window.webslm.admission,
                   measure_hidden: document.getElementById("measure-gpu").hidden };
        })()""", timeout_s=READY_TIMEOUT_S)
        engine, admission, choice = after["engine"], after["admission"], after["engine"]["choice"]
        assert admission["admitted"] is True and admission["stages"][-1] == "publish", admission
        assert choice["gpu_steps_timed"] >= 1 and choice["remembered_on"] is None, choice     # timed now
        assert admission["verdicts_kept"] is True and after["measure_hidden"] is True, after
        kept = verdict.parse(booted.row.eval(READ))
        if engine["backend"] == "cpu":         # what this measurement found replaces the seeded record
            assert engine["cpuReason"]["code"] == "gpu-slower", engine
            assert kept[key]["day"] == verdict.today() and kept[key]["gpu_step_ms"] != 15000.0, kept
        else:                                  # a GPU that now wins clears it
            assert key not in kept, kept
        booted.record(verdict_remeasure={"backend": engine["backend"], "choice": choice,
                                         "admission_seconds": admission["seconds"]})
    finally:
        booted.row.eval(WRITE % json.dumps(found) if found is not None else DELETE)
        booted.reload("after-verdict")                                          # the row's page again (?gpu=force)
        booted.wait_for("window.webslm && window.webslm.ready", timeout_s=READY_TIMEOUT_S)
