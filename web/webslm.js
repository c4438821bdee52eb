// webslm's JavaScript API: an engine in a Web Worker (Python in Pyodide, WebGPU when the GPU is
// admitted, numpy on the CPU when it is not) behind OpenAI-shaped chat completions.
// docs/js-api.md is the reference; web/app.mjs (the chat page) uses nothing but this module.
//
//   const engine = await createEngine({ model: "default" });
//   const stream = await engine.chat.completions.create({ messages, stream: true });
//   for await (const chunk of stream) show(chunk.choices[0].delta.content ?? "");
//
// Every URL is relative to this module, which the site serves at its root next to worker/ and
// assets/, so the site works under any path (https://host/, https://host/app/).
import { WorkerClient, WorkerError } from "./worker-client.mjs";
import * as modelCache from "./worker/model-cache.mjs";

// What the user can do about each kind of error: shown under its sentence.
const ADVICE = {
  "worker-failed": "Reload the page. If it keeps failing, this browser may not support WebAssembly in module workers.",
  "fetch-failed": "Check the address and the connection. A model on another site must allow this one to read it (CORS).",
  "bad-artifact": "The file is damaged or is not a webslm model: download it again, or make one with `webslm convert`.",
  "bad-request": "Check the request: roles are system, user or assistant; temperature ≥ 0; 0 < top_p ≤ 1; max_tokens ≥ 1; the conversation must fit the model's context. If the model's chat template failed, pick another model.",
  busy: "Wait for the answer in progress to finish, or stop it.",
  "no-model": "Load a model first.",
  unloaded: "This engine was unloaded: create a new one.",
  failed: "Try again; if it keeps failing, reload the page.",
};

// Why the CPU answers, by the admission (or loss) code, and what the user can do about it:
// added to engine.cpuReason as `advice`.
const CPU_ADVICE = {
  "no-webgpu": "This browser has no WebGPU: a recent Chrome, Edge, Firefox or Safari answers faster on the GPU.",
  "no-adapter": "WebGPU is turned off or finds no usable GPU here: check the browser's GPU settings.",
  "gpu-disabled": "Turn the GPU back on (remove ?gpu=0) to try it.",
  "gpu-slower": "To answer on the GPU anyway, open the page with ?gpu=force (createEngine({gpu: \"force\"}) in the API).",
  "out-of-memory": "The GPU has not enough free memory for this model: close other tabs or apps that use it, or pick a smaller model.",
  "allocation-failed": "The GPU refused the model's buffers: close other tabs or apps that use it, or pick a smaller model.",
  "limit-too-small": "This GPU's limits are too small for this model: a smaller model may fit.",
  "missing-feature": "This GPU lacks a feature the model needs on the GPU.",
  "unsupported-model": "The GPU path does not run this model's architecture yet.",
  "self-test-failed": "This GPU computed a kernel wrongly, so it is not trusted with the model; a driver or browser update may fix it.",
  "self-test-incomplete": "A kernel this model needs has no self-test in this build, so the GPU is not trusted with it: please report it.",
  "pipeline-failed": "This GPU could not compile a kernel; a driver or browser update may fix it.",
  "device-lost": "The GPU was reset (a driver update, too much load, or the system reclaimed it): reload the page to try it again.",
  "readback-failed": "The GPU stopped answering: reload the page to try it again.",
};
const withAdvice = (reason) => (reason ? { ...reason, advice: reason.advice ?? CPU_ADVICE[reason.code] ?? "Reload the page to try the GPU again." } : null);

export class WebSlmError extends Error {
  constructor(code, message, details = null) {
    super(message);
    this.name = "WebSlmError";
    this.code = code;
    this.advice = ADVICE[code] ?? ADVICE.failed;
    this.details = details;
  }
}

// A worker error reply as a WebSlmError: the protocol's codes are the API's, except a
// malformed field, which is the caller's bad request.
function fromWorker(error) {
  if (!(error instanceof WorkerError)) return new WebSlmError("failed", String(error?.message ?? error));
  const code = { "bad-field": "bad-request", "boot-failed": "worker-failed" }[error.code] ?? error.code;
  return new WebSlmError(ADVICE[code] ? code : "failed", error.message, error.details ?? null);
}

// The engine's states (py/webslm/engine/states.py) by the backend that answers in them.
const GPU_STATES = new Set(["Probing", "Preparing", "GPUReady", "Generating"]);
const CPU_STATES = new Set(["CPUReady", "CPUGenerating", "CPURebuild", "Lost", "VisibleFailure"]);
const NO_MODEL_STATES = new Set(["Empty", "Destroying", "Unloaded"]);
// Admission reports progress for its three long stages; the API names what the user sees.
const ADMISSION_PHASES = { allocate: "upload", compile: "compile", "self-test": "self-test" };
const REQUEST_FIELDS = new Set(["messages", "stream", "temperature", "top_p", "top_k", "max_tokens", "seed", "stop",
                                "signal", "model", "stream_options", "n", "cache_prompt"]);
const ROLES = new Set(["system", "user", "assistant"]);
const MAX_EVENTS = 500;

export async function createEngine(options = {}) {
  const engine = new Engine(options);
  await engine.booted;
  const model = options.model === undefined ? "default" : options.model;
  if (model !== null) await engine.load(model, { onProgress: options.onProgress });
  return engine;
}

class Engine extends EventTarget {
  #gpu; #featureLevel; #cache; #assets; #onProgress = null; #answer = null; #loading = false; #engineState = "Empty";

  constructor({ gpu = true, featureLevel = "auto", cache = true, workerUrl, assetsUrl, onProgress } = {}) {
    super();
    if (![true, false, "force"].includes(gpu)) throw new WebSlmError("bad-request", 'gpu is true, false or "force".');
    this.#gpu = gpu;
    this.#featureLevel = featureLevel;
    this.#cache = cache;
    this.#assets = new URL(assetsUrl ?? "./assets/", import.meta.url);
    this.backend = null;
    this.tier = null;
    this.features = [];
    this.cpuReason = null;
    this.receipt = null;
    this.receiptText = null;
    this.choice = null;           // the GPU/CPU decode-step timing behind the engine chosen, or null
    this.admission = null;
    this.model = null;
    this.worker = null;
    this.events = [];             // the recent statechange details, each with at_ms
    this.protocol = new WorkerClient(new URL(workerUrl ?? "./worker/worker.mjs", import.meta.url));
    this.chat = { completions: { create: (request) => this.#create(request) } };
    this.models = { list: modelCache.list, remove: modelCache.remove, usage: modelCache.usage };
    this.#listen(onProgress);
    this.booted = this.#boot();
  }

  get state() {
    return this.#loading && this.#engineState === "Empty" ? "Loading" : this.#engineState;
  }

  // What JSON.stringify shows of an engine (the getter and the worker handle are not data).
  toJSON() {
    const { backend, tier, features, cpuReason, choice, receipt, model, worker, events } = this;
    return { state: this.state, backend, tier, features, cpuReason, choice, receipt, model, worker, events };
  }

  // The worker's events, as the API's: progress (boot, download, validation, admission) and
  // every state change of the engine.
  #listen(onProgress) {
    const progress = (detail) => {
      onProgress?.(detail);
      this.#onProgress?.(detail);
      this.dispatchEvent(new CustomEvent("progress", { detail }));
    };
    const on = (name, handler) => this.protocol.addEventListener(name, (e) => handler(e.detail));
    on("booting", ({ stage }) => progress({ phase: "boot", stage, done: null, total: null }));
    on("load-progress", ({ phase, done, total, source }) => progress({ phase, done, total, source }));
    on("admission-stage", ({ stage }) => progress({ phase: "admission", stage, done: null, total: null }));
    on("admission-progress", ({ stage, done, total }) => progress({ phase: ADMISSION_PHASES[stage] ?? stage, done, total }));
    on("engine-state", (change) => this.#changeState(change));
  }

  #changeState({ protocol, id, type, event, ...change }) {
    this.#engineState = change.to;
    // CancelPending keeps the backend it happens on; no model, no backend
    if (GPU_STATES.has(change.to)) this.backend = "gpu";
    else if (CPU_STATES.has(change.to)) this.backend = "cpu";
    else if (NO_MODEL_STATES.has(change.to)) this.backend = null;
    this.cpuReason = withAdvice(change.cpu_reason);
    if (this.backend !== "gpu") {
      this.tier = null;
      this.features = [];
    }
    const detail = { ...change, cpu_reason: this.cpuReason, backend: this.backend, at_ms: Math.round(performance.now()) };
    this.events.push(detail);
    if (this.events.length > MAX_EVENTS) this.events.splice(0, this.events.length - MAX_EVENTS);
    this.dispatchEvent(new CustomEvent("statechange", { detail }));
  }

  async #boot() {
    try {
      await this.protocol.ready;
      this.worker = await this.protocol.request("status");
    } catch (error) {
      throw new WebSlmError("worker-failed", `The engine's worker could not start: ${error.message}`);
    }
  }

  #usable() {
    if (this.#engineState === "Unloaded") throw new WebSlmError("unloaded", "This engine was unloaded.");
  }

  // Load a model ("default", a URL, a File or Blob), then admit it on the GPU (or place it on
  // the CPU path when gpu is false). If the model cannot be loaded, the one loaded before
  // stays loaded and answering.
  async load(source = "default", { onProgress } = {}) {
    this.#usable();
    await this.booted;
    this.#onProgress = onProgress ?? null;
    this.#loading = true;
    try {
      const request = await this.#loadRequest(source);
      try {
        this.model = await this.protocol.request("load-model", request);
      } catch (error) {
        throw fromWorker(error);
      }
      await this.#admit();
      return this.model;
    } finally {
      this.#loading = false;
      this.#onProgress = null;
    }
  }

  async #loadRequest(source) {
    const cache = this.#cache;
    if (source === "default") {
      const entry = await this.#defaultModel();
      return { source: { url: new URL(entry.file, this.#assets).href }, sha256: entry.artifact_sha256, name: entry.name, cache };
    }
    if (typeof source === "string") {
      let url;
      try {
        url = new URL(source, globalThis.location?.href);
      } catch {
        throw new WebSlmError("bad-request", `${JSON.stringify(source.slice(0, 80))} is not a URL.`);
      }
      return { source: { url: url.href }, sha256: null, name: null, cache };
    }
    if (source instanceof Blob) return { source: { file: source }, sha256: null, name: source.name ?? null, cache };
    if (typeof source?.sha256 === "string") return { source: { cached: source.sha256 }, sha256: null, name: null, cache };
    throw new WebSlmError("bad-request", "A model is \"default\", a URL, a File, or {sha256} of a cached one.");
  }

  async #defaultModel() {
    let manifest;
    try {
      const response = await fetch(new URL("manifest.json", this.#assets));
      if (!response.ok) throw new Error(`HTTP ${response.status}`);
      manifest = await response.json();
    } catch (error) {
      throw new WebSlmError("fetch-failed", `This site's model list could not be read (${error.message}).`);
    }
    const entry = (manifest.models ?? []).find((m) => m.default);
    if (!entry) throw new WebSlmError("no-model", "This site has no default model.");
    return entry;
  }

  // GPU admission of the loaded model: the worker proves on this GPU that the model fits and
  // computes correctly, or the engine answers on the CPU path with the reason. An admitted GPU
  // is then timed against the CPU path and kept only if it is not slower (gpu: "force" keeps
  // it untimed): engine.choice has the numbers.
  async #admit() {
    let result;
    try {
      result = this.#gpu
        ? await this.protocol.request("admit", { featureLevel: this.#featureLevel, fault: null,
                                                 gpu: this.#gpu === "force" ? "force" : "measure" })
        : { admitted: false, ...(await this.protocol.request("use-cpu")) };
    } catch (error) {
      throw fromWorker(error);
    }
    this.admission = result;
    this.receipt = result.receipt ?? null;
    this.receiptText = result.receipt_text ?? null;
    const onGpu = result.admitted && result.engine?.backend === "gpu";
    this.tier = onGpu ? result.tier : null;
    this.features = onGpu ? result.features : [];
    this.choice = result.engine?.choice ?? null;
    if (result.engine) this.cpuReason = withAdvice(result.engine.cpu_reason);
    this.dispatchEvent(new CustomEvent("admission", { detail: result }));
  }

  // ------------------------------------------------------------------ chat completions

  async #create(request) {
    this.#usable();
    const { messages, settings, stream, signal } = checkRequest(request);
    if (!this.model) throw new WebSlmError("no-model", "No model is loaded.");
    if (this.#answer) throw new WebSlmError("busy", "An answer is already being generated.");
    const answer = new Answer(this, this.protocol.start("generate", { messages, settings }), settings.seed);
    this.#answer = answer;
    answer.done.finally(() => { if (this.#answer === answer) this.#answer = null; });
    if (signal) {
      if (signal.aborted) this.abort();
      else signal.addEventListener("abort", () => { if (this.#answer === answer) this.abort(); }, { once: true });
    }
    if (stream) return answer.chunks();
    return answer.completion();
  }

  // Stop the answer in progress: it ends with finish_reason "abort"; nothing of it follows.
  // The answer stops taking text at once (what the worker sent before it read the abort is
  // dropped), then the worker cancels it (at its next turn of the event loop).
  async abort() {
    if (!this.#answer) return false;
    this.#answer.stop();
    const { aborted } = await this.protocol.request("abort");
    return aborted;
  }

  // Cancel any answer, free the model with its GPU buffers and device, and end the worker.
  async unload() {
    if (this.#engineState === "Unloaded") return;
    await this.abort().catch(() => {});
    await this.protocol.request("unload").catch(() => {});
    this.protocol.worker.terminate();
    const from = this.#engineState;
    this.model = null;
    this.#changeState({ from, to: "Unloaded", reason: "unload" });
  }
}

// Request fields -> {messages, settings (the worker's names), stream, signal}, or a
// bad-request error before anything reaches the worker.
function checkRequest(request) {
  const bad = (sentence) => new WebSlmError("bad-request", sentence);
  if (request === null || typeof request !== "object") throw bad("A request is an object with messages.");
  for (const key of Object.keys(request)) if (!REQUEST_FIELDS.has(key)) throw bad(`Unknown request field "${key}".`);
  const { messages, stream = false, temperature, top_p, top_k, max_tokens, seed, stop, signal, n = 1, cache_prompt } = request;
  if (n !== 1) throw bad("Only n = 1 is supported.");
  if (!Array.isArray(messages) || messages.length < 1 || messages.length > 256) throw bad("messages must be a list of 1 to 256 messages.");
  messages.forEach((m, i) => {
    if (!m || !ROLES.has(m.role) || typeof m.content !== "string") throw bad(`messages[${i}] must be {role: system, user or assistant, content: a string}.`);
  });
  const number = (name, value, ok) => {
    if (value === undefined || value === null) return undefined;
    if (typeof value !== "number" || !Number.isFinite(value) || !ok(value)) throw bad(`${name} is out of range (${value}).`);
    return value;
  };
  const settings = {};
  const put = (name, value) => { if (value !== undefined) settings[name] = value; };
  put("temperature", number("temperature", temperature, (v) => v >= 0));
  put("top_p", number("top_p", top_p, (v) => v > 0 && v <= 1));
  put("top_k", number("top_k", top_k, (v) => Number.isInteger(v) && v >= 0));
  put("max_tokens", number("max_tokens", max_tokens, (v) => Number.isInteger(v) && v >= 1));
  const chosenSeed = number("seed", seed, (v) => Number.isInteger(v) && v >= 0 && v < 2 ** 32);
  settings.seed = chosenSeed ?? crypto.getRandomValues(new Uint32Array(1))[0];   // unset: a fresh one, reported back
  if (stop !== undefined && stop !== null) {
    const stops = typeof stop === "string" ? [stop] : stop;
    if (!Array.isArray(stops) || stops.length > 4 || !stops.every((s) => typeof s === "string" && s.length > 0)) {
      throw bad("stop must be a string or a list of at most 4 non-empty strings.");
    }
    settings.stop = stops;
  }
  if (cache_prompt !== undefined) {
    if (typeof cache_prompt !== "boolean") throw bad("cache_prompt must be true or false.");
    settings.cache_prompt = cache_prompt;
  }
  return { messages: messages.map(({ role, content }) => ({ role, content })), settings, stream: Boolean(stream), signal };
}

// One answer in flight: the worker's delta events for its request become chunks, its reply
// the final chunk (finish_reason, usage, and webslm's own numbers); its prefill-progress
// events become the engine's progress events (phase "prefill" or "replay"). After stop()
// no more text is taken: the answer then ends "abort" if any arrived.
class Answer {
  constructor(engine, { id, result }, seed) {
    this.engine = engine;
    this.id = `chatcmpl-${id}-${Date.now().toString(36)}`;
    this.created = Math.floor(Date.now() / 1000);
    this.modelName = engine.model?.name ?? "webslm";
    this.seed = seed;
    this.queue = [];                  // chunks not yet taken by the reader
    this.wake = null;
    this.finished = false;
    this.failure = null;
    this.first = true;
    this.stopped = false;             // stop() was called: text that arrives is dropped
    this.dropped = false;             // ... and some was
    this.text = "";                   // the text handed out
    const onDelta = ({ detail }) => {
      if (detail.request !== id) return;
      if (this.stopped) {
        this.dropped = true;
        return;
      }
      const delta = this.first ? { role: "assistant", content: detail.text } : { content: detail.text };
      this.first = false;
      this.text += detail.text;
      this.#push(this.#chunk(delta, null));
    };
    const onProgress = ({ detail: { protocol, id: _, type, event, request, ...progress } }) => {
      if (request !== id || this.stopped) return;
      engine.dispatchEvent(new CustomEvent("progress", { detail: { ...progress, request: this.id } }));
    };
    engine.protocol.addEventListener("delta", onDelta);
    engine.protocol.addEventListener("prefill-progress", onProgress);
    this.done = result.then(
      (reply) => {
        this.reply = this.dropped ? { ...reply, text: this.text, finish_reason: "abort" } : reply;
        this.#push({ ...this.#chunk({}, this.reply.finish_reason), usage: usage(reply), webslm: this.#extras(reply) });
      },
      (error) => { this.failure = fromWorker(error); },
    ).finally(() => {
      engine.protocol.removeEventListener("delta", onDelta);
      engine.protocol.removeEventListener("prefill-progress", onProgress);
      this.finished = true;
      this.wake?.();
    });
  }

  stop() {
    this.stopped = true;
  }

  #chunk(delta, finishReason) {
    return { id: this.id, object: "chat.completion.chunk", created: this.created, model: this.modelName,
             choices: [{ index: 0, delta, finish_reason: finishReason }] };
  }

  #extras({ text, finish_reason, usage: _, ...rest }) {
    return { ...rest, seed: this.seed };
  }

  #push(chunk) {
    this.queue.push(chunk);
    this.wake?.();
  }

  // An async iterable of chunks; leaving the loop early aborts the answer.
  chunks() {
    const next = async () => {
      for (;;) {
        if (this.queue.length) return { value: this.queue.shift(), done: false };
        if (this.failure) throw this.failure;
        if (this.finished) return { value: undefined, done: true };
        await new Promise((resolve) => { this.wake = resolve; });
        this.wake = null;
      }
    };
    const stop = async () => {
      if (!this.finished) await this.engine.abort().catch(() => {});
      await this.done;
      this.queue.length = 0;
      return { value: undefined, done: true };
    };
    return { [Symbol.asyncIterator]: () => ({ next, return: stop }) };
  }

  async completion() {
    await this.done;
    if (this.failure) throw this.failure;
    const reply = this.reply;
    return { id: this.id, object: "chat.completion", created: this.created, model: this.modelName,
             choices: [{ index: 0, message: { role: "assistant", content: reply.text }, finish_reason: reply.finish_reason }],
             usage: usage(reply), webslm: this.#extras(reply) };
  }
}

const usage = ({ usage: u }) => ({ prompt_tokens: u.prompt_tokens, completion_tokens: u.completion_tokens,
                                   total_tokens: u.prompt_tokens + u.completion_tokens,
                                   prompt_tokens_details: { cached_tokens: u.prompt_tokens_details?.cached_tokens ?? 0 } });

// Offline use: a service worker (web/sw.js) keeps a copy of the page, the worker, Pyodide and
// the wheels, so that after one visit the site opens without a network (models are kept in
// Cache Storage by the worker itself). {ok, reason}.
export async function registerOfflineSupport() {
  if (!("serviceWorker" in navigator)) return { ok: false, reason: "this browser has no service workers here" };
  try {
    await navigator.serviceWorker.register(new URL("./sw.js", import.meta.url), { scope: "./", type: "classic" });
    await navigator.serviceWorker.ready;
    return { ok: true, reason: null };
  } catch (error) {
    return { ok: false, reason: String(error?.message ?? error) };
  }
}
