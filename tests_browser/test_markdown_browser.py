"""The chat page's answers as Markdown and its start, in each browser row (the row's booted
page: conftest.py).

- A real answer with a code block: the default model, greedy, asked for a Python one-liner
  "in a code block", answers with a ```python fence (the same text as the CPU-only answer
  computed here in CPython); the page shows it in <pre><code> with its language, exactly
  the fence's code, the rest of the answer as paragraphs with inline code, and the Copy
  button hands exactly that code to the clipboard.
- Hostile Markdown rendered in the live page by web/markdown.mjs (the renderer the answers
  go through): no element it did not make, no handler run, no javascript: link.
- A file that is not a .slm, picked: refused by its name before anything is read, the
  refusal said in the conversation area and the model panel; the next message clears it.
- A model load watched as it happens: the start card in the conversation area shows each
  step, its bar never goes back, Send is disabled with the reason in its title and under
  the composer; when the model is ready the card goes and Send works.

The parser's own tests (hostile inputs, streaming against rendering at once, 10k lines) run
in node: tests/test_markdown.py.
"""
from __future__ import annotations

import json
import pathlib
import re

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
QUESTION = "Show a Python one-liner that reverses a string, in a code block."
MAX_TOKENS = 120
READY_TIMEOUT_S = 900
ANSWER_TIMEOUT_S = 900


@pytest.fixture(scope="module")
def code_answer() -> dict:
    """The greedy CPU-only answer to QUESTION, computed in CPython (every engine in every row
    gives exactly this text: conftest.py's cpu_reference says why), and its first fence."""
    import webslm
    import serve
    from webslm.cpu import CpuBackend
    from webslm.generate import generate, prompt_ids
    entry = next(m for m in json.loads((ROOT / serve.MANIFEST).read_text())["models"] if m["default"])
    model = webslm.open_model(ROOT / ".assets/site" / entry["file"])
    settings = webslm.SamplerSettings(temperature=0, max_tokens=MAX_TOKENS)
    text = "".join(d.text for d in generate(model, CpuBackend(model), prompt_ids(model, QUESTION, chat=True), settings))
    fence = re.search(r"^```(\w*)\n(.*?)\n```$", text, re.S | re.M)
    assert fence, f"the model's answer has no code block any more: {text!r}"
    return {"text": text, "lang": fence.group(1), "code": fence.group(2)}


def _ready(booted) -> None:
    booted.wait_for("window.webslm && window.webslm.ready", timeout_s=READY_TIMEOUT_S)


def _page(booted, script: str, timeout_s: float = 120):
    return booted.row.eval(f"(async () => {{ const $ = (id) => document.getElementById(id);\n{script} }})()", timeout_s=timeout_s + 30)


def test_an_answer_with_a_code_block_is_shown_as_code_with_a_copy_button(booted, code_answer):
    _ready(booted)
    out = _page(booted, """
      window.webslm.newChat();
      $("temperature").value = "0"; $("max-tokens").value = "%d"; $("seed").value = "";
      const prompt = $("prompt");
      prompt.value = %s;
      prompt.dispatchEvent(new KeyboardEvent("keydown", { key: "Enter", bubbles: true, cancelable: true }));
      const item = await new Promise((ok, fail) => {
        const t = setInterval(() => { const li = [...document.querySelectorAll("#messages li.assistant")].pop();
                                      if (li?.dataset.finishReason) { clearInterval(t); ok(li); } }, 50);
        setTimeout(() => { clearInterval(t); fail(new Error("no answer")); }, %d);
      });
      const content = item.querySelector(".content");
      const codes = [...content.querySelectorAll("pre > code")];
      const shown = content.textContent;                      // before Copy says "Copied"
      const copied = [];
      Object.defineProperty(navigator, "clipboard", { configurable: true, value: { writeText: async (t) => { copied.push(t); } } });
      const button = content.querySelector(".code-block button.copy");
      button.click();
      await new Promise((r) => setTimeout(r, 100));
      const { renderMarkdown } = await import("./markdown.mjs");
      const record = window.webslm.lastAnswer;
      $("temperature").value = ""; $("max-tokens").value = "";
      return {
        record: { text: record.text, finish: record.finish_reason, backends: record.backends },
        codes: codes.map((c) => c.textContent), langs: [...content.querySelectorAll(".code-lang")].map((l) => l.textContent),
        font: getComputedStyle(codes[0]).fontFamily, whiteSpace: getComputedStyle(codes[0].parentElement).whiteSpace,
        inline: [...content.querySelectorAll("p > code")].map((c) => c.textContent),
        copied, label: button.textContent, buttonName: button.getAttribute("aria-label"),
        shown, rendered: renderMarkdown(record.text, document.createElement("div")).textContent,
        backticks: [...content.querySelectorAll("p")].some((p) => p.textContent.includes("```")),
      };
    """ % (MAX_TOKENS, json.dumps(QUESTION), ANSWER_TIMEOUT_S * 1000), timeout_s=ANSWER_TIMEOUT_S)
    print(f"\n{booted.row.name}: {out['record']} code {out['codes']} copied {out['copied']}")
    assert out["record"]["text"] == code_answer["text"] and out["record"]["finish"] == "stop", (out["record"], code_answer)
    assert out["codes"][0] == code_answer["code"] and out["langs"][0] == code_answer["lang"] == "python", out
    assert "mono" in out["font"].lower() and out["whiteSpace"] == "pre", out
    assert not out["backticks"], "a fence was shown as backticks in a paragraph"
    assert "[::-1]" in out["inline"], out["inline"]                     # `[::-1]` in the text after the block
    assert out["copied"] == [code_answer["code"]] and out["label"] == "Copied", out
    assert out["buttonName"] == "Copy the python code"
    assert out["shown"] == out["rendered"], "the page shows the answer's text rendered once, nothing more or less"


HOSTILE = """<script>window.__pwned = "script"</script>
<img src="x" onerror="window.__pwned = 'img'">
[click](javascript:window.__pwned='link') [data](data:text/html,<script>parent.__pwned=1</script>)
![x](javascript:window.__pwned='image') <javascript:window.__pwned='auto'>
| <b onmouseover="window.__pwned='table'">h</b> |
|---|
| <iframe src="javascript:parent.__pwned='iframe'"></iframe> |
```"><img src=x onerror="window.__pwned='fence'">
<svg onload="window.__pwned='svg'"></svg>
```
[fine](https://example.com/ok)"""


def test_hostile_markdown_in_the_page_stays_text(booted):
    """markdown.mjs in the live page, its output attached to the document: nothing the model
    wrote runs or loads, the only link is the https one, the markup is there as characters."""
    _ready(booted)
    out = _page(booted, """
      window.__pwned = null;
      const { MarkdownView } = await import("./markdown.mjs");
      const box = document.createElement("div");
      box.className = "content markdown";
      document.getElementById("messages").append(box);
      const view = new MarkdownView(box);
      const text = %s;
      for (let i = 0; i < text.length; i += 5) view.append(text.slice(i, i + 5));     // streamed, as answers are
      view.finish();
      await new Promise((r) => setTimeout(r, 500));            // an image error or a frame would have fired by now
      const tags = [...new Set([...box.querySelectorAll("*")].map((e) => e.localName))].sort();
      const handlers = [...box.querySelectorAll("*")].flatMap((e) => [...e.attributes].map((a) => a.name)).filter((n) => n.startsWith("on"));
      const links = [...box.querySelectorAll("a")].map((a) => [a.href, a.rel, a.target]);
      const shown = box.textContent;
      box.remove();
      return { pwned: window.__pwned, tags, handlers, links, shown };
    """ % json.dumps(HOSTILE))
    assert out["pwned"] is None, out
    assert out["handlers"] == [] and not {"script", "img", "iframe", "svg", "b"} & set(out["tags"]), out
    assert out["links"] == [["https://example.com/ok", "noopener noreferrer", "_blank"]], out["links"]
    for markup in ('<script>window.__pwned = "script"</script>', "<img src=\"x\" onerror=", "<svg onload=", "<iframe src="):
        assert markup in out["shown"], markup


def test_a_file_not_named_slm_is_refused_where_the_user_looks_and_cleared_by_the_next_message(booted):
    _ready(booted)
    out = _page(booted, """
      window.webslm.newChat();
      const before = window.webslm.engine.model.artifact_sha256;
      const transfer = new DataTransfer();
      transfer.items.add(new File([new Uint8Array(4096).fill(7)], "holiday photo.png", { type: "image/png" }));
      const loads = [];
      const onProgress = (e) => loads.push(e.detail.phase);
      window.webslm.engine.addEventListener("progress", onProgress);
      $("model-file").files = transfer.files;
      $("model-file").dispatchEvent(new Event("change", { bubbles: true }));
      await new Promise((r) => setTimeout(r, 300));
      window.webslm.engine.removeEventListener("progress", onProgress);
      const refused = { card: !$("start").hidden, title: $("start-title").textContent, error: $("start-error").textContent,
                        panel: $("model-error").textContent, loads, same: window.webslm.engine.model.artifact_sha256 === before,
                        ready: window.webslm.ready };
      $("max-tokens").value = "1";
      await window.webslm.ask("Hi");
      $("max-tokens").value = "";
      return { refused, after: { card: !$("start").hidden, panel: $("model-error").textContent } };
    """, timeout_s=ANSWER_TIMEOUT_S)
    refused = out["refused"]
    assert refused["card"] and refused["title"] == "The model did not load", refused
    assert refused["error"].startswith('"holiday photo.png" is not a .slm file'), refused
    assert refused["panel"] == refused["error"] and refused["loads"] == [], refused    # nothing was read
    assert refused["same"] and refused["ready"], refused
    assert out["after"] == {"card": False, "panel": ""}, out["after"]


@pytest.mark.last_in_row(1)      # it loads the model again as the page's default does (from the cache)
def test_a_load_shows_its_steps_in_the_conversation_and_send_says_why_it_waits(booted):
    _ready(booted)
    out = _page(booted, """
      const seen = [];            // each change of the card: what it says, the bar, Send
      const look = () => {
        const s = { now: $("start-now").textContent, bar: $("start-bar").value, hidden: $("start").hidden,
                    send: $("send").disabled, why: $("send").title, hint: $("composer-hint").textContent,
                    steps: [...$("start-steps").children].map((li) => [li.querySelector(".step-name").textContent, li.className]) };
        const last = seen.at(-1);
        if (!last || last.now !== s.now || last.bar !== s.bar || last.hidden !== s.hidden || last.steps.length !== s.steps.length) seen.push(s);
      };
      const watch = new MutationObserver(look);
      watch.observe($("start"), { subtree: true, childList: true, characterData: true, attributes: true });
      const loaded = window.webslm.loadModel("default");
      look();
      await loaded;
      look();
      watch.disconnect();
      return { seen, engine: window.webslm.engine.backend, final: { hidden: $("start").hidden, send: $("send").disabled, why: $("send").title,
               hint: $("composer-hint").textContent } };
    """, timeout_s=READY_TIMEOUT_S)
    seen, final = out["seen"], out["final"]
    loading = [s for s in seen if not s["hidden"]]
    names = [name for name, _ in loading[-1]["steps"]]
    print(f"\n{booted.row.name}: {len(seen)} states; steps {names}; bar {[round(s['bar'], 2) for s in loading][:: max(1, len(loading) // 12)]}")
    assert loading and all(s["send"] and "loading" in s["why"] and s["hint"] == s["why"] for s in loading), loading[:3]
    bars = [s["bar"] for s in loading]
    assert bars == sorted(bars) and bars[-1] > 0.5, bars                       # it moves, never back
    assert names[:2] == ["Reading the model from the cache", "Checking the model"], names
    gpu_steps = ["Uploading the weights to the GPU", "Compiling GPU pipelines", "Testing the GPU's kernels against the CPU"]
    if booted.row.engine_on_gpu:
        assert [n for n in names if n in gpu_steps] == gpu_steps, names
    elif booted.row.expects_webgpu:
        # Chromium (SwiftShader): the page's first load found the GPU slower than the CPU path
        # and kept that verdict (py/webslm/engine/verdict.py), so this load is not admitted again
        assert not set(names) & set(gpu_steps) and out["engine"] == "cpu", names
    assert any(re.search(r"\d+ of \d+", s["now"]) or "MB" in s["now"] for s in loading), [s["now"] for s in loading]
    assert final == {"hidden": True, "send": False, "why": "", "hint": final["hint"]} and "Enter sends" in final["hint"], final
