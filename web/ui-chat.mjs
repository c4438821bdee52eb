// The conversation: turns in #messages, the composer (Send, Stop, Regenerate, New chat) and
// the keyboard (Enter sends, Shift+Enter is a new line, Esc stops). Every answer goes through
// answer(): the Send button, Regenerate and window.webslm.ask take the same path and leave
// the same DOM. The whole conversation (system prompt, then every turn) is sent each time;
// the engine keeps its KV cache between requests and re-reads only what changed
// (py/webslm/engine/prompt_cache.py). While the prompt is read, the answer's bubble says how
// far it got (followProgress). Answers are shown as Markdown (markdown.mjs), rendered as they
// stream; what the user typed is shown as typed.
import { MarkdownView } from "./markdown.mjs";
import { backendName, backendOf, sentence } from "./ui-engine.mjs";
import { samplingSettings, systemPrompt } from "./ui-settings.mjs";

const $ = (id) => document.getElementById(id);

let getEngine = () => null;
let onAnswer = () => {};
let onSend = () => {};       // a message is about to be sent (the page clears old load errors)
let ready = false;           // a model is loaded and the engine can answer
let waiting = "The engine is starting: Send works once a model is ready.";   // why not ready, in words
const KEYS = "Enter sends · Shift+Enter adds a line · Esc stops the answer";
const turns = [];            // {role, content, item, failed}: the conversation, oldest first
let current = null;          // the answer streaming now: {item, meta, reading, backends, lossNoted, done}

const busy = () => Object.assign(new Error("An answer is already being generated: stop it first."), { code: "busy" });
const notStarted = () => Object.assign(new Error("The engine has not started yet."), { code: "no-engine" });

// The messages of the next request: the system prompt if set, then every turn that holds
// text (a failed answer, or one stopped before its first token, is shown but not sent).
function conversation() {
  const system = systemPrompt();
  const said = turns.filter((t) => !t.failed && t.content !== "").map(({ role, content }) => ({ role, content }));
  return system === null ? said : [{ role: "system", content: system }, ...said];
}

// Send disabled says why, in its tooltip and in the line under the composer (shown on phones too).
function updateControls() {
  $("send").disabled = current !== null || !ready;
  const why = !ready ? waiting : current !== null ? "An answer is being written: Stop (or Esc) ends it." : "";
  $("send").title = why;
  const hint = $("composer-hint");
  hint.textContent = why && !ready ? why : KEYS;
  hint.classList.toggle("why", Boolean(why) && !ready);
  $("stop").disabled = current === null;
  $("regenerate").disabled = current !== null || !ready || turns.length === 0;
  $("new-chat").disabled = turns.length === 0;
  $("empty-state").hidden = turns.length > 0;
}

// value: whether the engine can answer; reason: why not, in words (kept until the next one).
export function setReady(value, reason = null) {
  ready = value;
  if (reason) waiting = reason;
  updateControls();
}

// Follow the newest text unless the reader has scrolled up to read something earlier.
function scrollToEnd(force = false) {
  const scroller = $("scroller");
  const nearEnd = scroller.scrollHeight - scroller.scrollTop - scroller.clientHeight < 120;
  if (force || nearEnd) scroller.scrollTop = scroller.scrollHeight;
}

function addTurn(role, content) {
  const item = Object.assign(document.createElement("li"), { className: `message ${role}` });
  const who = Object.assign(document.createElement("span"), { className: "visually-hidden", textContent: role === "user" ? "You said:" : "The model answered:" });
  // an answer's content is filled by answer(), as Markdown; the user's text is shown as typed
  const text = Object.assign(document.createElement("div"), role === "assistant"
    ? { className: "content markdown" } : { className: "content", textContent: content });
  item.append(who, text);
  const turn = { role, content, item, failed: false };
  turns.push(turn);
  $("messages").append(item);
  updateControls();
  scrollToEnd(true);
  return turn;
}

const rate = (x) => (x >= 10 ? x.toFixed(0) : x >= 1 ? x.toFixed(1) : x.toPrecision(2));   // 0.047, not 0.0
const route = (backends) => backends.map(backendName).join(" → ");   // "GPU", "GPU → CPU"
const streamingMeta = (backends) => (backends.length ? `${route(backends)} · answering…` : "Answering…");

// "7 tokens · 3.9 tokens/s · first token 6.4 s · GPU · stopped"
function metaText(record) {
  const tokens = record.usage?.completion_tokens ?? 0;
  const tps = record.timings.decode_tokens_per_s;
  const ttft = record.timings.page_time_to_first_token_s;
  const parts = [
    `${tokens} token${tokens === 1 ? "" : "s"}`,
    Number.isFinite(tps) && tps > 0 ? `${rate(tps)} tokens/s` : null,
    ttft === null ? "no text" : `first token ${ttft.toFixed(1)} s`,
    route(record.backends ?? []),
    { abort: "stopped", length: "length limit" }[record.finish_reason],
  ];
  return parts.filter(Boolean).join(" · ");
}

function metaTitle(record) {
  const t = record.timings;
  const s = (x) => (Number.isFinite(x) ? `${x.toFixed(2)} s` : "?");
  const prompt = record.usage ? `prompt ${record.usage.prompt_tokens} tokens, ${record.usage.prompt_tokens_details?.cached_tokens ?? 0} kept from before · ` : "";
  return `seed ${record.seed ?? "?"} · ${prompt}prefill ${s(t.prefill_seconds)} · decode ${s(t.decode_seconds)} · total ${s(t.page_total_s)} in the page`;
}

// "Reading the prompt: 120 of 480 tokens" (or, after a GPU loss, the CPU re-reading the
// answer so far), with a bar: shown under the empty bubble until the first text arrives.
function readingText({ phase, done, total, cached }) {
  if (phase === "replay") return `Continuing on the CPU: re-reading ${done} of ${total} tokens`;
  if (cached > 0) return `Reading the prompt: ${done - cached} of ${total - cached} new tokens (${cached} kept from before)`;
  return `Reading the prompt: ${done} of ${total} tokens`;
}

export function followProgress(detail) {
  if (!current || current.first) return;
  let reading = current.reading;
  if (!reading) {
    reading = current.reading = Object.assign(document.createElement("div"), { className: "reading" });
    reading.setAttribute("role", "status");
    reading.append(document.createElement("span"), document.createElement("progress"));
    current.item.insertBefore(reading, current.meta);
  }
  const [label, bar] = reading.children;
  label.textContent = readingText(detail);
  const base = detail.phase === "prefill" ? detail.cached : 0;    // the bar counts what is read now
  bar.max = Math.max(1, detail.total - base);
  bar.value = detail.done - base;
}

function stopReading() {
  current?.reading?.remove();
  if (current) current.reading = null;
}

// One answer to the conversation as it stands, streamed into a new assistant turn.
async function answer(overrides) {
  const engine = getEngine();
  const messages = conversation();
  const settings = samplingSettings(overrides);
  const turn = addTurn("assistant", "");
  const content = turn.item.querySelector(".content");
  const view = new MarkdownView(content);   // the answer's text, rendered as it grows
  const meta = Object.assign(document.createElement("p"), { className: "meta" });
  turn.item.append(meta);
  turn.item.classList.add("streaming");
  const backend = backendOf(engine.state);
  let settle;
  const done = new Promise((resolve) => { settle = resolve; });
  current = { item: turn.item, meta, reading: null, first: false, backends: backend ? [backend] : [], lossNoted: false, done };
  meta.textContent = streamingMeta(current.backends);
  $("chat-status").textContent = "Answering…";
  updateControls();

  const sent = performance.now();
  let first = null;
  let text = "";
  let final = null;   // the last chunk: finish_reason, usage and webslm's numbers
  try {
    const stream = await engine.chat.completions.create({ messages, stream: true, ...settings });
    for await (const chunk of stream) {
      const choice = chunk.choices?.[0];
      const piece = choice?.delta?.content;
      if (piece) {
        if (first === null) {
          current.first = true;
          stopReading();
        }
        first ??= performance.now();
        text += piece;
        view.append(piece);
        scrollToEnd();
      }
      if (choice?.finish_reason) final = chunk;
    }
    view.finish();
    const numbers = final?.webslm ?? {};
    const record = {
      ...numbers,
      text,
      finish_reason: final?.choices[0].finish_reason ?? null,
      usage: final?.usage ?? null,
      backends: numbers.backends ?? current.backends,
      timings: {
        ...numbers.timings,
        page_time_to_first_token_s: first === null ? null : (first - sent) / 1000,
        page_total_s: (performance.now() - sent) / 1000,
      },
      shown_text: content.textContent,
    };
    turn.content = text;
    meta.textContent = metaText(record);
    meta.title = metaTitle(record);
    turn.item.dataset.finishReason = record.finish_reason ?? "";
    $("chat-status").textContent = `Answer finished: ${meta.textContent}.`;
    onAnswer(record);
    return record;
  } catch (error) {
    view.finish();
    turn.failed = true;
    turn.item.classList.add("failed");
    turn.item.dataset.finishReason = "error";
    meta.textContent = `The answer failed: ${[sentence(error.message), error.advice].filter(Boolean).join(" ")}`;
    $("chat-status").textContent = meta.textContent;
    onAnswer({ error: error.message, code: error.code ?? null, text, shown_text: content.textContent });
    throw error;
  } finally {
    turn.item.classList.remove("streaming");
    stopReading();
    current = null;
    settle();
    updateControls();
    // Send and Stop were just disabled or enabled under the user's focus: bring it back to the prompt
    if (document.activeElement === document.body || document.activeElement?.disabled) $("prompt").focus();
  }
}

// The engine changed state: while an answer streams, its meta follows which engine is
// answering, and a GPU lost mid-answer gets a note in the same bubble.
export function followEngine(detail) {
  if (!current) return;
  const backend = backendOf(detail.to);
  if (backend && backend !== current.backends.at(-1)) current.backends.push(backend);
  current.meta.textContent = streamingMeta(current.backends);
  if (detail.to === "Lost" && !current.lossNoted) {
    current.lossNoted = true;
    const note = Object.assign(document.createElement("p"), { className: "turn-note", textContent: "The GPU was lost: this answer continues on the CPU." });
    current.item.insertBefore(note, current.meta);
  }
}

export function send(text, overrides = {}) {
  if (current) return Promise.reject(busy());
  if (!getEngine()) return Promise.reject(notStarted());
  onSend();
  addTurn("user", text);
  return answer(overrides);
}

// Answer the same conversation again, without its last answer (a new seed when the seed box is empty).
export function regenerate() {
  if (current) return Promise.reject(busy());
  if (!getEngine()) return Promise.reject(notStarted());
  if (turns.at(-1)?.role === "assistant") turns.pop().item.remove();
  if (turns.length === 0) return Promise.reject(new Error("Nothing to regenerate: send a message first."));
  return answer({});
}

export function stop() {
  // the answer itself ends with finish_reason "abort"; a failed abort request changes nothing
  if (current) Promise.resolve(getEngine()?.abort()).catch(() => {});
}

// Stop the answer in progress, if any, and wait until it has ended.
export async function stopAndWait() {
  if (!current) return;
  const { done } = current;
  stop();
  await done;
}

// A new conversation; the system prompt and the sampling settings stay as they are. With no
// answer streaming it is cleared at once (window.webslm.newChat(); ask(…) relies on that).
function clearConversation() {
  turns.length = 0;
  $("messages").replaceChildren();
  $("chat-status").textContent = "New conversation.";
  updateControls();
  $("prompt").focus();
}

export function newChat() {
  if (current) return stopAndWait().then(clearConversation);
  clearConversation();
  return Promise.resolve();
}

export function wireChat(options) {
  ({ getEngine, onAnswer, onSend = () => {} } = options);
  const prompt = $("prompt");
  const ignore = () => {};   // the failure is already shown under the answer
  $("composer").addEventListener("submit", (e) => {
    e.preventDefault();
    const text = prompt.value.trim();
    if (!text || current || !ready) return;
    prompt.value = "";
    send(text).catch(ignore);
  });
  prompt.addEventListener("keydown", (e) => {
    // isComposing: Enter that confirms an IME composition must not send
    if (e.key === "Enter" && !e.shiftKey && !e.isComposing) {
      e.preventDefault();
      $("composer").requestSubmit();
    }
  });
  $("stop").addEventListener("click", stop);
  $("regenerate").addEventListener("click", () => regenerate().catch(ignore));
  $("new-chat").addEventListener("click", () => newChat());
  // Esc anywhere stops the answer (the drawer on phones takes Esc first, to close itself)
  document.addEventListener("keydown", (e) => {
    if (e.key === "Escape" && !e.defaultPrevented && current) {
      e.preventDefault();
      stop();
    }
  });
  updateControls();
}
