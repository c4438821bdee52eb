"""The chat page in every browser row, driven as a user drives it, on the built static site
(`serve.py --build`, served by `python -m http.server` behind a switchable proxy: conftest.py).

In order, in each row: the default model answers "What is the capital of France?" with a
streamed answer that names Paris (on the admitted GPU in the GPU rows, whose page is opened
with ?gpu=force (conftest.py), on the CPU path in WebKitGTK); Esc stops an answer mid-way; Regenerate answers the same conversation again; the site's models are listed with
their size, architecture and quantization;
the page in light and dark, desktop and phone width, is photographed (tests_browser/results/
screenshots/; where the CPU path answers, with an answer in Markdown), and so is the start card
while the row booted; a corrupted model file, picked or dropped, is refused with the validator's
error and the model that answered keeps answering; the JS API keeps OpenAI's shapes; and
after unload, a second visit with the network gone opens the page from its service worker,
loads the model from Cache Storage without fetching it, and answers.

The UI is driven through DOM events (input, keydown, click, change, drop), the same in every
driver. Page-ready and first-token times per engine go to tests_browser/results/<row>.json
under "chat". Answers are short where the test allows: SwiftShader (Chromium) takes ~20 s a
token.

The Chromium row skips the checks of the page itself (Esc, Regenerate, the JS API's shapes,
a misfiled cache entry): there each admission costs a minute or more of SwiftShader, and
the same Chromium runs them in the chromium-compat row, on lavapipe, in seconds. It runs
the rest (the exact greedy answer on its engine, the bars, the badge, the screenshots, a
corrupted file, the second visit offline); its engine is also checked by
test_engine_browser.py (cancel, a model switch) and test_kernels_browser.py.
The second visit runs last in each row (conftest.py, last_in_row): it opens the page anew.
"""
from __future__ import annotations

import functools
import json
import pathlib
import re

import pytest
from conftest import GREEDY_MAX_TOKENS, GREEDY_PROMPT as PROMPT   # the cpu_reference fixture's question

ROOT = pathlib.Path(__file__).resolve().parents[1]
LONG_PROMPT = "Write a long story about a dragon who learns to cook."
ANSWER_TIMEOUT_S = 900
# the badge of each GPU row's admitted tier (SwiftShader: subgroups; Dawn GL ES: neither; Firefox: f16)
# The engine badge per row (Chromium's SwiftShader: the CPU, which the engine choice found faster)
ENGINE_BADGE = {"chromium": "CPU", "chromium-compat": "GPU · f32", "firefox": "GPU · f16"}
READY_TIMEOUT_S = 900

# Small helpers the tests' page scripts share: set a control as typing would, press a key,
# read the conversation, wait for a condition.
UI = r"""
const ui = {
  $: (id) => document.getElementById(id),
  set(id, value) {
    const el = ui.$(id);
    el.value = String(value);
    el.dispatchEvent(new Event("input", { bubbles: true }));
    el.dispatchEvent(new Event("change", { bubbles: true }));
  },
  key(target, key, extra = {}) {
    target.dispatchEvent(new KeyboardEvent("keydown", { key, bubbles: true, cancelable: true, ...extra }));
  },
  turns: () => [...document.querySelectorAll("#messages li.message")].map((li) => ({
    role: li.classList.contains("user") ? "user" : "assistant",
    text: li.querySelector(".content")?.textContent ?? "",
    meta: li.querySelector(".meta")?.textContent ?? null,
    finish: li.dataset.finishReason ?? null,
  })),
  lastAssistant: () => [...document.querySelectorAll("#messages li.assistant")].pop() ?? null,
  // what an answer's text looks like on the page: rendered as Markdown (web/markdown.mjs)
  shown: async (text) => (await import("./markdown.mjs")).renderMarkdown(text, document.createElement("div")).textContent,
  until: (check, ms) => new Promise((ok, fail) => {
    const t = setInterval(() => { const v = check(); if (v) { clearInterval(t); ok(v); } }, 20);
    setTimeout(() => { clearInterval(t); fail(new Error("timed out: " + check)); }, ms);
  }),
};
"""


def _page(booted, script: str, timeout_s: float = ANSWER_TIMEOUT_S):
    """Run an async page script with `ui` in scope; return its value."""
    return booted.row.eval(f"(async () => {{ {UI}\n{script} }})()", timeout_s=timeout_s + 30)


def _ready(booted) -> dict:
    """The page ready to chat; in a GPU row, with the engine on the GPU (an earlier test may have
    left it on the CPU: then the page loads the model again, from its cache, and admits it)."""
    booted.wait_for("window.webslm && window.webslm.ready", timeout_s=READY_TIMEOUT_S)
    if booted.row.engine_on_gpu and booted.row.eval("window.webslm.engine.backend") != "gpu":
        booted.row.eval("window.webslm.loadModel('default').then(() => true)", timeout_s=READY_TIMEOUT_S)
    engine = booted.row.eval("window.webslm.engine")
    expected = "gpu" if booted.row.engine_on_gpu else "cpu"
    if booted.row.expects_webgpu is not None:
        assert engine["backend"] == expected, engine
    return engine


def _page_check(booted) -> None:
    """Skip a check of the page itself in the Chromium row (module docstring: chromium-compat
    runs it in the same Chromium)."""
    if booted.row.name == "chromium":
        pytest.skip("a check of the page, run in chromium-compat (the same Chromium): each answer on "
                    "SwiftShader costs a minute or more")


def _record(booted, key: str, value) -> None:
    booted.results.setdefault("chat", {})[key] = value
    booted.record()


def _default_entry() -> dict:
    manifest = json.loads((ROOT / ".assets/site/manifest.json").read_text())
    return next(m for m in manifest["models"] if m["default"])


# ------------------------------------------------------------------------------ the page

def test_the_last_load_showed_each_phase_to_its_end(booted):
    """The model panel's bars after the page's load: the bytes read (downloaded, or from the
    cache) and validated, and in a GPU row the upload, the pipelines compiled and the kernel
    families self-tested, each bar full, with its numbers. Chromium's SwiftShader page (not
    forced onto the GPU) stops after the upload: admission's step-floor stage found its step
    slower than the CPU path's, and nothing was compiled or tested."""
    _ready(booted)
    bars = _page(booted, """
      return Object.fromEntries(["download", "validate", "upload", "compile", "self-test"].map((phase) => {
        const bar = ui.$("progress-" + phase);
        return [phase, { shown: !bar.closest(".progress-row").hidden, value: bar.value, max: bar.max,
                         numbers: ui.$("progress-" + phase + "-numbers").textContent }];
      }));
    """, timeout_s=30)
    gpu_phases = (["upload", "compile", "self-test"] if booted.row.engine_on_gpu
                  else ["upload"] if booted.row.expects_webgpu is True else [])
    phases = ["download", "validate"] + gpu_phases
    for phase in phases:
        bar = bars[phase]
        assert bar["shown"] and bar["max"] > 0 and bar["value"] == bar["max"] and bar["numbers"], (phase, bar)
    assert bars["download"]["max"] == bars["validate"]["max"] == _default_entry()["bytes"]
    if booted.row.expects_webgpu is False:
        assert not any(bars[p]["shown"] for p in ("upload", "compile", "self-test")), bars
    elif not booted.row.engine_on_gpu:
        admission = _page(booted, "return window.webslm.admission;", timeout_s=30)
        assert admission["stage"] == "step-floor" and admission["code"] == "gpu-slower", admission


def test_the_page_admits_with_tuning_later_and_a_software_adapter_defers_nothing(booted):
    """The page admits with tuning "later" (on a real GPU the unmeasured launch shapes are
    measured once the engine is idle, not while the page waits); the software adapters of these
    rows keep the host's rules at admission, so no retune runs beside the page's requests."""
    if not booted.row.engine_on_gpu:
        pytest.skip("the page answers on the CPU path in this row: no GPU admission whose tuning to check")
    _ready(booted)
    admission = _page(booted, """
      const a = window.webslm.engine.admission;
      return { mode: a?.tuning_mode ?? null, tuning: a?.tuning ?? null, admitted: a?.admitted ?? null };
    """, timeout_s=30)
    _record(booted, "tuning", admission)
    assert admission["admitted"] and admission["mode"] == "later", admission
    assert admission["tuning"]["source"] == "rule", admission


def test_every_control_is_labelled_and_reachable_by_keyboard(booted):
    """Every input, select, textarea and button has an accessible name; nothing is taken out of
    the natural tab order or put before it (no positive tabindex); the prompt comes before Send,
    Send before Stop."""
    _ready(booted)
    out = _page(booted, """
      const named = (el) => Boolean((el.labels && el.labels.length && el.labels[0].textContent.trim())
        || el.getAttribute("aria-label") || (el.getAttribute("aria-labelledby") && document.getElementById(el.getAttribute("aria-labelledby"))?.textContent.trim())
        || (el.tagName === "BUTTON" && el.textContent.trim()));
      const controls = [...document.querySelectorAll("input, select, textarea, button")];
      const order = (id) => controls.indexOf(ui.$(id));
      return { unnamed: controls.filter((el) => !named(el)).map((el) => el.outerHTML.slice(0, 80)),
               positive: [...document.querySelectorAll("[tabindex]")].filter((el) => el.tabIndex > 0).map((el) => el.id),
               order: [order("prompt"), order("send"), order("stop")], alert: ui.$("model-error").getAttribute("role"),
               live: ui.$("engine-badge").getAttribute("aria-live") };
    """, timeout_s=30)
    assert out["unnamed"] == [] and out["positive"] == [], out
    assert out["order"] == sorted(out["order"]) and out["order"][0] >= 0, out
    assert out["alert"] == "alert" and out["live"] == "polite"


def _mb(n: int) -> str:
    """web/ui-model.mjs formatBytes for model sizes (all over 1 MB)."""
    return f"{n / 1e9:.2f} GB" if n >= 1e9 else f"{n / 1e6:.1f} MB"


def test_the_page_lists_the_sites_models(booted):
    """"Models on this site": every model of assets/manifest.json (the default, and Gemma 3
    270M where set-up found its GGUF cached), in order, each with its name, size, architecture
    and quantization; the one in use says so and has no Load button, the others have one."""
    _page_check(booted)
    _ready(booted)
    manifest = json.loads((ROOT / ".assets/site/manifest.json").read_text())["models"]
    shown = _page(booted, """
      await ui.until(() => ui.$("site-models").children.length, 30000);
      return [...ui.$("site-models").children].map((li) => ({
        id: li.dataset.id, name: li.querySelector(".cache-name").textContent,
        facts: li.querySelector(".cache-facts").textContent,
        load: li.querySelector("button.use")?.getAttribute("aria-label") ?? null }));
    """, timeout_s=60)
    assert [m["id"] for m in shown] == [m["id"] for m in manifest], shown
    for entry, item in zip(manifest, shown):
        in_use = entry["default"]                  # the page loaded the default model
        facts = [_mb(entry["bytes"]), entry["architecture"], entry["quantization"]]
        facts += ["default"] if entry["default"] else []
        facts += ["in use"] if in_use else []
        assert item["name"] == entry["name"] and item["facts"] == " · ".join(facts), (item, entry)
        assert item["load"] == (None if in_use else f"Load {entry['name']}"), item
    _record(booted, "site_models", [m["id"] for m in shown])


# ------------------------------------------------------------------------------ chatting

def test_the_default_model_answers_paris_streamed(booted, cpu_reference):
    """Typed and sent with Enter: the answer streams in (its text seen growing), is exactly
    the greedy CPU-only answer computed in CPython (text and token ids), on the row's engine,
    with its tokens/s, time to first token and engine under it."""
    engine = _ready(booted)
    out = _page(booted, """
      window.webslm.newChat();
      ui.set("temperature", 0); ui.set("max-tokens", %d);
      const prompt = ui.$("prompt");
      ui.set("prompt", %s);
      ui.key(prompt, "Enter", { shiftKey: true });                // Shift+Enter: a new line, not a send
      const afterShiftEnter = ui.turns().length;
      const seen = [];                                            // the answer's text as it grows
      const watch = new MutationObserver(() => {
        const text = ui.lastAssistant()?.querySelector(".content")?.textContent;
        if (text && text !== seen.at(-1)) seen.push(text);
      });
      watch.observe(ui.$("messages"), { subtree: true, childList: true, characterData: true });
      ui.key(prompt, "Enter");
      await ui.until(() => ui.$("stop").disabled === false, 30000);
      const whileStreaming = { send: ui.$("send").disabled, stop: ui.$("stop").disabled };
      await ui.until(() => ui.lastAssistant()?.dataset.finishReason, %d);
      watch.disconnect();
      return { afterShiftEnter, seen, whileStreaming, turns: ui.turns(), last: window.webslm.lastAnswer,
               badge: ui.$("engine-badge").textContent, timings: window.webslm.timings,
               after: { send: ui.$("send").disabled, stop: ui.$("stop").disabled, prompt: ui.$("prompt").value } };
    """ % (GREEDY_MAX_TOKENS, json.dumps(PROMPT), ANSWER_TIMEOUT_S * 1000))
    last, turns = out["last"], out["turns"]
    print(f"\n{booted.row.name}: {last['text']!r} {last['backends']} seen {len(out['seen'])} states | {turns[-1]['meta']}")
    assert out["afterShiftEnter"] == 0, "Shift+Enter sent the message"
    assert [t["role"] for t in turns] == ["user", "assistant"] and turns[0]["text"] == PROMPT
    assert "Paris" in last["text"] and last["finish_reason"] == "stop", last
    assert last["text"] == cpu_reference["text"] and last["token_ids"] == cpu_reference["token_ids"], (last, cpu_reference)
    assert turns[1]["text"] == last["text"] == out["seen"][-1] and turns[1]["finish"] == "stop"
    assert len(out["seen"]) >= 2 and all(b.startswith(a) for a, b in zip(out["seen"], out["seen"][1:])), out["seen"]
    assert out["whileStreaming"] == {"send": True, "stop": False}
    assert out["after"] == {"send": False, "stop": True, "prompt": ""}
    assert last["backends"] == [engine["backend"]]
    meta = turns[1]["meta"]
    assert "tokens/s" in meta and "first token" in meta and engine["backend"].upper() in meta, meta
    assert out["badge"].startswith("GPU") if engine["backend"] == "gpu" else out["badge"] == "CPU"
    t = last["timings"]
    if engine["backend"] == "gpu":    # one GPU decode step per committed token (the last one chose EOS)
        assert t["gpu_steps"]["decode_steps"] == last["usage"]["completion_tokens"], t
    _record(booted, f"{engine['backend']}_answer", {
        "badge": out["badge"], "page_ready_s": round(out["timings"]["page_ready_s"], 2),
        "page_time_to_first_token_s": round(t["page_time_to_first_token_s"], 3),
        "time_to_first_token_s": t["time_to_first_token_s"], "prefill_seconds": t["prefill_seconds"],
        "decode_tokens_per_s": t["decode_tokens_per_s"], "prompt_tokens": last["usage"]["prompt_tokens"],
        "completion_tokens": last["usage"]["completion_tokens"], "gpu_steps": t.get("gpu_steps")})


def test_escape_stops_an_answer_mid_way(booted):
    _page_check(booted)
    _ready(booted)
    out = _page(booted, """
      window.webslm.newChat();
      ui.set("temperature", 0); ui.set("max-tokens", 40);
      ui.set("prompt", %s);
      ui.key(ui.$("prompt"), "Enter");
      await ui.until(() => ui.lastAssistant()?.querySelector(".content")?.textContent, %d);
      ui.key(document.activeElement ?? document.body, "Escape");
      await ui.until(() => ui.lastAssistant()?.dataset.finishReason, %d);
      return { turns: ui.turns(), last: window.webslm.lastAnswer, send: ui.$("send").disabled,
               shown: await ui.shown(window.webslm.lastAnswer.text) };
    """ % (json.dumps(LONG_PROMPT), ANSWER_TIMEOUT_S * 1000, ANSWER_TIMEOUT_S * 1000))
    last, turns = out["last"], out["turns"]
    assert last["finish_reason"] == "abort", last
    assert turns[-1]["finish"] == "abort" and "stopped" in turns[-1]["meta"], turns[-1]
    assert 1 <= last["usage"]["completion_tokens"] < 40
    assert turns[-1]["text"] == out["shown"] and last["text"]
    assert out["send"] is False
    print(f"\n{booted.row.name}: stopped after {last['usage']['completion_tokens']} tokens: {last['text']!r}")


def test_regenerate_answers_the_same_conversation_again(booted):
    """After the stopped answer: Regenerate replaces it with a new one (a fresh seed, the
    sampling controls as set), the conversation otherwise unchanged."""
    _page_check(booted)
    _ready(booted)
    out = _page(booted, """
      const before = ui.turns();
      const previous = window.webslm.lastAnswer;
      ui.set("temperature", 0.8); ui.set("max-tokens", 2); ui.set("seed", "");
      ui.$("regenerate").click();
      await ui.until(() => window.webslm.lastAnswer !== previous && ui.lastAssistant()?.dataset.finishReason, %d);
      return { before, after: ui.turns(), previous, last: window.webslm.lastAnswer, shown: await ui.shown(window.webslm.lastAnswer.text) };
    """ % (ANSWER_TIMEOUT_S * 1000))
    before, after, last = out["before"], out["after"], out["last"]
    assert [t["role"] for t in before] == [t["role"] for t in after] == ["user", "assistant"], (before, after)
    assert after[0]["text"] == before[0]["text"] == LONG_PROMPT
    assert last["finish_reason"] in ("length", "stop") and after[1]["finish"] == last["finish_reason"]
    assert 1 <= last["usage"]["completion_tokens"] <= 2
    assert after[1]["text"] == out["shown"]
    assert last["seed"] != out["previous"].get("seed"), "an empty seed box means a fresh seed"


MARKDOWN_PROMPT = "Write a Python function that adds two numbers."     # SmolLM2 answers with a code block
MARKDOWN_TOKENS = 28                                                   # enough for the block to close


def test_screenshots_light_and_dark_desktop_and_phone(booted):
    """The page with a conversation in it, in both themes at both widths: saved, nothing wider
    than the screen, the themes really differ, the prompt and Send reachable on a phone. Where
    the CPU path answers (quick here), the conversation ends with an answer in Markdown: a
    fenced code block, rendered as one."""
    engine = _ready(booted)
    if engine["backend"] == "cpu":
        rendered = _page(booted, """
          window.webslm.newChat();
          ui.set("temperature", 0); ui.set("max-tokens", %d);
          ui.set("prompt", %s);
          ui.$("send").click();
          await ui.until(() => ui.lastAssistant()?.dataset.finishReason, %d);
          const content = ui.lastAssistant().querySelector(".content");
          return { text: window.webslm.lastAnswer.text, code: content.querySelector("pre code")?.textContent ?? null };
        """ % (MARKDOWN_TOKENS, json.dumps(MARKDOWN_PROMPT), ANSWER_TIMEOUT_S * 1000))
        assert rendered["text"].startswith("```python") and rendered["code"], rendered
        assert rendered["code"].startswith("def ") and "```" not in rendered["code"], rendered
    shots = {}
    try:
        for width, height, size in ((1280, 900, "desktop"), (390, 844, "phone")):
            booted.row.set_viewport(width, height)
            for theme in ("light", "dark"):
                look = _page(booted, """
                  ui.set("theme", %s);
                  await new Promise((r) => setTimeout(r, 400));          // the layout's transitions (0.2 s) end
                  await new Promise((r) => requestAnimationFrame(() => requestAnimationFrame(r)));
                  const box = (id) => { const r = ui.$(id).getBoundingClientRect(); return [r.left, r.right, r.width]; };
                  return { theme: document.documentElement.dataset.theme ?? null,
                           background: getComputedStyle(document.body).backgroundColor,
                           overflow: document.documentElement.scrollWidth - document.documentElement.clientWidth,
                           width: document.documentElement.clientWidth, prompt: box("prompt"), send: box("send"),
                           badge: box("engine-badge"), badge_text: ui.$("engine-badge").textContent };
                """ % json.dumps(theme), timeout_s=30)
                name = f"{size}-{theme}"
                shots[name] = {"path": str(booted.screenshot(name)), **look}
    finally:
        booted.row.set_viewport(1280, 900)
        _page(booted, 'ui.set("theme", "system"); return true;', timeout_s=30)
    _record(booted, "screenshots", {k: v["path"] for k, v in shots.items()})
    print(f"\n{booted.row.name}: " + ", ".join(v["path"] for v in shots.values()))
    for name, look in shots.items():
        assert look["theme"] == name.split("-")[1], look
        assert look["badge_text"] == ENGINE_BADGE.get(booted.row.name, look["badge_text"]), look
        assert look["overflow"] <= 1, f"{name}: the page is {look['overflow']} px wider than the window"
        for part in ("prompt", "send", "badge"):
            left, right, width = look[part]
            assert width > 0 and left >= 0 and right <= look["width"] + 1, (name, part, look[part])

    def luminance(css: str) -> float:          # "rgb(247, 248, 249)"
        r, g, b = (float(x) for x in re.findall(r"[\d.]+", css)[:3])
        return 0.2126 * r + 0.7152 * g + 0.0722 * b
    for size in ("desktop", "phone"):
        assert luminance(shots[f"{size}-light"]["background"]) > luminance(shots[f"{size}-dark"]["background"]) + 100


# ------------------------------------------------------------------------------ models

@functools.cache
def test_the_start_was_photographed_while_the_page_booted(booted):
    """The start card with its steps and bar (web/ui-start.mjs), photographed in both themes
    at both widths while the row's first boot ran (app_session.BootedRow._photograph_start)."""
    shots = booted.results.get("start_screenshots")
    assert shots and set(shots) == {"desktop-light", "desktop-dark", "phone-light", "phone-dark"}, shots
    for name, shot in shots.items():
        assert shot["card"] and shot["theme"] == name.split("-")[1], (name, shot)
        assert pathlib.Path(shot["path"]).is_file(), shot
    _record(booted, "start_screenshots", {name: shot["step"] for name, shot in shots.items()})


def _corrupted(offset: int, length: int | None) -> dict:
    """What the validator says of the default model with the byte at `offset` flipped and the
    file cut to `length` bytes: the error the page must show (the same in every row: computed
    once a session). The worker knows a picked or dropped file's size, so it gives it to the
    validator (a cut file is refused at its header)."""
    from webslm.artifact import ArtifactError, Validator
    data = (ROOT / ".assets/site" / _default_entry()["file"]).read_bytes()
    bad = bytearray(data if length is None else data[:length])
    bad[offset] ^= 0xFF
    validator = Validator(expected_bytes=len(bad))
    try:
        validator.feed(bad)
        validator.finish()
    except ArtifactError as exc:
        return {"code": exc.code, "where": exc.where, "sentence": exc.sentence}
    raise AssertionError("the corrupted file validated")


def test_a_corrupted_model_is_refused_and_the_loaded_one_keeps_answering(booted):
    engine = _ready(booted)
    entry = _default_entry()
    cases = {"picked": (entry["bytes"] // 2, None), "dropped": (200_000, 4_000_000)}   # a flipped byte; a flipped byte in a cut file
    expected = {how: _corrupted(*case) for how, case in cases.items()}
    shown = {}
    for how, (offset, length) in cases.items():
        shown[how] = _page(booted, """
          const bytes = new Uint8Array(await (await fetch("assets/" + %s)).arrayBuffer()).slice(0, %s ?? undefined);
          bytes[%d] ^= 0xff;
          const file = new File([bytes], "corrupted.slm");
          const transfer = new DataTransfer();
          transfer.items.add(file);
          const previous = window.webslm.model;
          const phases = new Set();
          const onProgress = (e) => phases.add(e.detail.phase + ":" + e.detail.source);
          window.webslm.engine.addEventListener("progress", onProgress);
          if (%s === "picked") {
            ui.$("model-file").files = transfer.files;
            ui.$("model-file").dispatchEvent(new Event("change", { bubbles: true }));
          } else {
            document.body.dispatchEvent(new DragEvent("drop", { dataTransfer: transfer, bubbles: true, cancelable: true }));
          }
          await ui.until(() => ui.$("model-error").textContent.trim(), 300000);
          await ui.until(() => ["GPUReady", "CPUReady"].includes(window.webslm.engine.state), 60000);
          window.webslm.engine.removeEventListener("progress", onProgress);
          return { error: ui.$("model-error").textContent, phases: [...phases], role: ui.$("model-error").getAttribute("role"),
                   model: window.webslm.engine.model.artifact_sha256, state: window.webslm.engine.state,
                   backend: window.webslm.engine.backend, same: window.webslm.model === previous };
        """ % (json.dumps(entry["file"]), json.dumps(length), offset, json.dumps(how)), timeout_s=400)
    print(f"\n{booted.row.name}: " + " | ".join(f"{how}: {s['error']}" for how, s in shown.items()))
    for how, page in shown.items():
        said = expected[how]
        assert f"({said['code']} at {said['where']})" in page["error"], (said, page)
        assert said["sentence"].lower() in page["error"].lower(), (said, page)     # the page capitalizes it
        assert page["role"] == "alert"
        assert page["model"] == entry["artifact_sha256"] and page["backend"] == engine["backend"], page
    # the picked file was refused half-way, validated as it was read; the cut one at its manifest
    assert {"download:file", "validate:file"} <= set(shown["picked"]["phases"]), shown["picked"]["phases"]


def test_a_url_that_cannot_be_downloaded_is_explained(booted):
    """The URL box with an address the server does not have: the page says it could not be
    downloaded (HTTP 404) and what to do; the loaded model keeps answering."""
    engine = _ready(booted)
    out = _page(booted, """
      ui.set("model-url", "assets/models/no-such-model.slm");
      ui.$("url-form").requestSubmit();
      await ui.until(() => ui.$("model-error").textContent.trim(), 60000);
      await ui.until(() => ["GPUReady", "CPUReady"].includes(window.webslm.engine.state), 60000);
      return { error: ui.$("model-error").textContent, model: window.webslm.engine.model.artifact_sha256,
               backend: window.webslm.engine.backend };
    """, timeout_s=120)
    assert "HTTP 404" in out["error"] and "Check the address" in out["error"], out
    assert out["model"] == _default_entry()["artifact_sha256"] and out["backend"] == engine["backend"], out


def test_the_js_api_keeps_openai_shapes(booted):
    """web/webslm.js as a developer calls it: typed errors before any work, chunks of
    chat.completion.chunk with a final finish_reason and usage, leaving the loop early aborts
    the answer, a request sent meanwhile waits its turn (no "busy") and is answered after it,
    a non-streaming chat.completion, statechange events."""
    _page_check(booted)
    engine = _ready(booted)
    out = _page(booted, """
      const e = window.webslm.engine;
      const errors = {};
      const grab = (p) => p.then(() => null, (x) => ({ name: x.name, code: x.code, advice: x.advice, message: x.message }));
      errors.temperature = await grab(e.chat.completions.create({ messages: [{ role: "user", content: "x" }], temperature: -1 }));
      errors.role = await grab(e.chat.completions.create({ messages: [{ role: "root", content: "x" }] }));
      errors.field = await grab(e.chat.completions.create({ messages: [{ role: "user", content: "x" }], best_of: 2 }));
      const states = [];
      const onState = (ev) => states.push([ev.detail.from, ev.detail.to]);
      e.addEventListener("statechange", onState);
      const stream = await e.chat.completions.create({ messages: [{ role: "user", content: %s }], stream: true, temperature: 0, max_tokens: 40 });
      const queued = e.chat.completions.create({ messages: [{ role: "user", content: "x" }], max_tokens: 1, seed: 5 });
      const chunks = [];
      for await (const chunk of stream) { chunks.push(chunk); if (chunk.choices[0].delta.content) break; }
      const waited = await queued;
      await ui.until(() => ["GPUReady", "CPUReady"].includes(e.state), 60000);
      const whole = await e.chat.completions.create({ messages: [{ role: "user", content: "Name a color." }], max_tokens: 1, seed: 3 });
      e.removeEventListener("statechange", onState);
      return { errors, chunks, whole, waited, states, state: e.state, features: e.features, admitted: e.admission.features ?? [] };
    """ % json.dumps(LONG_PROMPT))
    errors, chunks, whole = out["errors"], out["chunks"], out["whole"]
    for name in ("temperature", "role", "field"):
        assert errors[name]["name"] == "WebSlmError" and errors[name]["code"] == "bad-request", errors
        assert errors[name]["advice"], errors
    waited = out["waited"]
    assert waited["object"] == "chat.completion" and waited["usage"]["completion_tokens"] <= 1, waited
    assert chunks[0]["object"] == "chat.completion.chunk" and chunks[0]["id"].startswith("chatcmpl-")
    assert chunks[-1]["choices"][0]["delta"]["role"] == "assistant" and chunks[-1]["choices"][0]["delta"]["content"]
    assert all(c["choices"][0]["finish_reason"] is None for c in chunks)
    assert whole["object"] == "chat.completion" and whole["choices"][0]["message"]["role"] == "assistant"
    assert whole["choices"][0]["finish_reason"] == "length" and whole["usage"]["completion_tokens"] == 1
    assert whole["usage"]["total_tokens"] == whole["usage"]["prompt_tokens"] + 1
    assert whole["webslm"]["backends"] == [engine["backend"]] and whole["webslm"]["seed"] == 3
    if engine["backend"] == "gpu":       # a cancel (CancelPending) does not lose what was admitted
        assert out["features"] == out["admitted"], out
    generating = "Generating" if engine["backend"] == "gpu" else "CPUGenerating"
    assert ("CancelPending", "GPUReady" if engine["backend"] == "gpu" else "CPUReady") in [tuple(s) for s in out["states"]], out["states"]
    assert [tuple(s) for s in out["states"]].count(tuple([("GPUReady" if engine["backend"] == "gpu" else "CPUReady"), generating])) == 3


def test_a_misfiled_cache_entry_is_removed_and_the_model_downloaded_again(booted, tmp_path):
    """Cache Storage is not trusted: a valid model (the tiny fixture) filed under the default
    model's sha256 is validated, found to be another model, removed, and the default model is
    downloaded again and cached in its place."""
    _page_check(booted)
    import base64

    from webslm.fixture import make_fixture
    engine = _ready(booted)
    entry = _default_entry()
    fixture = tmp_path / "fixture.slm"
    make_fixture(fixture)
    out = _page(booted, """
      const cache = await import("./worker/model-cache.mjs");
      const bytes = Uint8Array.from(atob(%s), (c) => c.charCodeAt(0));
      await cache.store({ sha256: %s, name: "misfiled" }, new Blob([bytes]));
      const before = (await cache.list()).find((m) => m.sha256 === %s);
      const model = await window.webslm.loadModel("default");
      const after = (await cache.list()).find((m) => m.sha256 === %s);
      return { before, after, source: model.source, sha: model.artifact_sha256, backend: window.webslm.engine.backend };
    """ % (json.dumps(base64.b64encode(fixture.read_bytes()).decode()), json.dumps(entry["artifact_sha256"]),
           json.dumps(entry["artifact_sha256"]), json.dumps(entry["artifact_sha256"])))
    assert out["before"]["bytes"] == fixture.stat().st_size and out["before"]["name"] == "misfiled", out
    assert out["source"] == "network" and out["sha"] == entry["artifact_sha256"], out
    assert out["after"]["bytes"] == entry["bytes"] and out["after"]["name"] != "misfiled", out
    assert out["backend"] == engine["backend"], out


@pytest.mark.last_in_row(2)       # the page is opened again: after the tests that need the first one's engine
def test_after_unload_a_second_visit_offline_loads_the_model_from_cache_and_answers(booted):
    """unload() frees the engine (state Unloaded, answers refused). Then, with the server
    unreachable (the proxy refuses every connection), the page opened again opens from its
    service worker's copy, the worker boots Pyodide from it, the default model comes from Cache
    Storage without a request for the .slm (by the page or its worker), and the engine answers:
    on the GPU in the GPU rows (their ?gpu=force, admitted anew), on the CPU path elsewhere
    (opened with ?gpu=0 there: admission is not what this checks, and on SwiftShader it takes
    half a minute). One visit checks both the model's cache and the offline copy: each page
    opened costs a Pyodide boot and a model validation."""
    booted.wait_for("window.webslm && window.webslm.ready", timeout_s=READY_TIMEOUT_S)
    booted.wait_for("navigator.serviceWorker && navigator.serviceWorker.controller", timeout_s=60)
    unloaded = _page(booted, """
      const e = window.webslm.engine;
      await e.unload();
      const refused = await e.chat.completions.create({ messages: [{ role: "user", content: "x" }] }).then(() => null, (x) => x.code);
      return { state: e.state, refused, cached: (await e.models.list()).map((m) => m.sha256), usage: await e.models.usage() };
    """, timeout_s=60)
    entry = _default_entry()
    assert unloaded["state"] == "Unloaded" and unloaded["refused"] == "unloaded", unloaded
    assert entry["artifact_sha256"] in unloaded["cached"], unloaded
    assert unloaded["usage"]["models_bytes"] >= entry["bytes"]
    booted.row.clear_requests()
    booted.proxy.offline = True
    try:
        booted.reload("offline", None if booted.row.engine_on_gpu else "?gpu=0")
        engine = _ready(booted)
        answer = booted.row.eval("window.webslm.newChat(), window.webslm.ask(%s, {temperature: 0, max_tokens: 1})"
                                 % json.dumps(PROMPT), timeout_s=ANSWER_TIMEOUT_S)
    finally:
        booted.proxy.offline = False
    model = engine["model"]
    worker_urls = booted.request("resource-log")["urls"]
    seen = booted.row.requests() or []
    assert model["source"] == "cache" and model["artifact_sha256"] == entry["artifact_sha256"], model
    assert [u for u in [*worker_urls, *seen] if u.endswith(".slm")] == [], "the model was fetched"
    assert "cache" in booted.row.eval("document.getElementById('model-state').textContent").lower()
    assert engine["backend"] == ("gpu" if booted.row.engine_on_gpu else "cpu"), engine
    assert answer["usage"]["completion_tokens"] >= 1 and answer["backends"] == [engine["backend"]], answer
    page_ready_s = booted.row.eval("window.webslm.timings.page_ready_s")
    _record(booted, "second_visit", {"page_ready_s": page_ready_s, "model_total_seconds": model["total_seconds"],
                                     "validation_seconds": model["validation_seconds"]})
    _record(booted, "offline", {"page_ready_s": page_ready_s, "backend": engine["backend"]})
