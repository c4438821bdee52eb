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
import { WorkerClient } from "./worker-client.mjs";
import { WebSlmError, fromWorker, withAdvice } from "./errors.mjs";
import * as modelCache from "./worker/model-cache.mjs";
import { BadRequest, DEFAULTABLE, checkRequest } from "./chat-request.mjs";
import { InitProgress } from "./init-progress.mjs";
import { Answer, combineChoices, usage } from "./answer.mjs";

export { WebSlmError };

// The engine's states (py/webslm/engine/states.py) by the backend that answers in them.
const GPU_STATES = new Set(["Probing", "Preparing", "GPUReady", "Generating"]);
const CPU_STATES = new Set(["CPUReady", "CPUGenerating", "CPURebuild", "Lost", "VisibleFailure"]);
const NO_MODEL_STATES = new Set(["Empty", "Destroying", "Unloaded"]);
// Admission reports progress for its three long stages; the API names what the user sees.
const ADMISSION_PHASES = { allocate: "upload", "step-floor": "floor", compile: "compile", "self-test": "self-test" };
const MAX_EVENTS = 500;
// WebLLM's ids of the models this site serves in its own format (the same weights, converted
// to .slm by webslm: assets/manifest.json has the quantization).
const WEBLLM_MODEL_IDS = {
  "SmolLM2-135M-Instruct-q0f16-MLC": "smollm2-135m-instruct-q4",
  "SmolLM2-135M-Instruct-q0f32-MLC": "smollm2-135m-instruct-q4",
};
const randomSeed = () => crypto.getRandomValues(new Uint32Array(1))[0];

export async function createEngine(options = {}) {
  const engine = new Engine(options);
  const model = options.model === undefined ? "default" : options.model;
  if (model !== null) await engine.load(model, { onProgress: options.onProgress });   // read while the worker boots
  await engine.booted;
  return engine;
}

export class Engine extends EventTarget {
  #gpu; #featureLevel; #cache; #assets; #onProgress = null; #answer = null; #loading = false; #engineState = "Empty";
  #turn = Promise.resolve();   // the end of the last request taken: requests are answered in arrival order
  #last = null;                // the last answer started (getMessage, runtimeStatsText)
  #loads = 0;                  // unload() moves it on: a load in progress then ends "cancelled"
  #defaults = {};              // request fields every request gets unless it sets them (reload's chatOpts)
  #init;                       // WebLLM's initProgressCallback, fed from the progress events
  #reloadable; #appModels; #workerUrl; #onProgressOption; #workerEnded = false;
  #gpuWarming = null;          // the worker's prepare-gpu request, sent once per worker

  constructor({ gpu = true, featureLevel = "auto", cache = true, workerUrl, assetsUrl, onProgress,
                initProgressCallback = null, unloadKeepsWorker = false, appModels = [] } = {}) {
    super();
    if (![true, false, "force"].includes(gpu)) throw new WebSlmError("bad-request", 'gpu is true, false or "force".');
    this.#gpu = gpu;
    this.#featureLevel = featureLevel;
    this.#cache = cache;
    this.#reloadable = unloadKeepsWorker;
    this.#appModels = appModels;
    this.#init = new InitProgress(initProgressCallback);
    this.#assets = new URL(assetsUrl ?? "./assets/", import.meta.url);
    this.backend = null;
    this.tier = null;
    this.features = [];
    this.cpuReason = null;
    this.receipt = null;
    this.receiptText = null;
    this.choice = null;           // the GPU/CPU decode-step timing behind the engine chosen, or null
    this.admission = null;
    this.gpuWarmUp = null;        // the GPU warm-up's report (prepare-gpu), once it is in
    this.model = null;
    this.worker = null;
    this.events = [];             // the recent statechange details, each with at_ms
    this.#workerUrl = new URL(workerUrl ?? "./worker/worker.mjs", import.meta.url);
    this.#onProgressOption = onProgress;
    this.chat = { completions: { create: (request) => this.#create(request, "chat") } };
    this.completions = { create: (request) => this.#create(request, "completion") };
    this.models = { list: modelCache.list, remove: modelCache.remove, usage: modelCache.usage,
                    available: async () => (await this.#manifest()).models.map((m) => ({
                      id: m.id, name: m.name, file: m.file, bytes: m.bytes, default: Boolean(m.default),
                      architecture: m.architecture ?? null, quantization: m.quantization ?? null,
                      artifact_sha256: m.artifact_sha256 })) };
    this.#startWorker();
  }

  // The engine's worker (Pyodide, the model, the GPU device), and its boot.
  #startWorker() {
    this.protocol = new WorkerClient(this.#workerUrl);
    this.#listen(this.#onProgressOption);
    this.booted = this.#boot();
    this.#workerEnded = false;
    this.#gpuWarming = null;
  }

  get state() {
    return this.#loading && this.#engineState === "Empty" ? "Loading" : this.#engineState;
  }

  // What JSON.stringify shows of an engine (the getter and the worker handle are not data).
  toJSON() {
    const { backend, tier, features, cpuReason, choice, receipt, model, worker, events, gpuWarmUp } = this;
    return { state: this.state, backend, tier, features, cpuReason, choice, receipt, model, worker, events, gpuWarmUp };
  }

  // The worker's events, as the API's: progress (boot, download, validation, admission) and
  // every state change of the engine.
  #listen(onProgress) {
    const progress = (detail) => {
      onProgress?.(detail);
      this.#onProgress?.(detail);
      this.#init.report(detail);
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

  // Load a model ("default", one of this site's model ids, a URL, a File or Blob), then admit
  // it on the GPU (or place it on the CPU path when gpu is false). If the model cannot be
  // loaded, the one loaded before stays loaded and answering. unload() meanwhile cancels it:
  // it rejects with code "cancelled".
  async load(source = "default", { onProgress } = {}) {
    this.#usable();
    if (this.#workerEnded) this.#startWorker();      // a reloadable engine after unload()
    const booted = this.booted;      // not waited for yet: the worker reads the model while it boots
    const load = this.#loads;
    const cancelled = () => new WebSlmError("cancelled", "The load was cancelled by unload().");
    this.#onProgress = onProgress ?? null;
    this.#loading = true;
    this.#init.start();
    // the GPU's first-use costs paid while the model loads; admission waits for them (admission/warm_up.py)
    if (this.#gpu && !this.#gpuWarming) {
      this.#gpuWarming = this.protocol.request("prepare-gpu", { featureLevel: this.#featureLevel })
        .then((report) => { this.gpuWarmUp = report; }, () => {});
    }
    try {
      const request = await this.#loadRequest(source);
      if (this.#loads !== load) throw cancelled();
      const loading = this.protocol.request("load-model", request);
      loading.catch(() => {});                       // (its failure is taken below, after the boot's)
      await booted;                                  // a worker that did not boot: worker-failed
      try {
        this.model = await loading;
      } catch (error) {
        throw this.#loads !== load ? cancelled() : fromWorker(error);
      }
      if (this.#loads !== load) throw cancelled();
      await this.#admit();
      if (this.#loads !== load) throw cancelled();
      this.#init.finish(this.backend === "gpu" ? `Finish loading on WebGPU (tier ${this.tier})`
                                                : `Finish loading on the CPU path (${this.cpuReason?.sentence ?? "no GPU"})`);
      return this.model;
    } finally {
      if (this.#loads === load) {
        this.#loading = false;
        this.#onProgress = null;
      }
    }
  }

  // WebLLM's reload(modelId, chatOpts): load a model (an id, a URL, a File, as load() takes);
  // chatOpts' sampling fields become every request's defaults.
  async reload(model, chatOpts = undefined) {
    this.#usable();
    const defaults = {};
    for (const [key, value] of Object.entries(chatOpts ?? {})) {
      if (!DEFAULTABLE.includes(key)) {
        throw new WebSlmError("bad-request", `chatOpts.${key} is not supported: chatOpts may set ${DEFAULTABLE.join(", ")}.`);
      }
      defaults[key] = value;
    }
    try {
      checkRequest({ messages: [{ role: "user", content: "-" }] }, "chat", defaults);
    } catch (error) {
      throw error instanceof BadRequest ? new WebSlmError("bad-request", `chatOpts: ${error.message}`) : error;
    }
    const loaded = await this.load(model);
    this.#defaults = defaults;
    return loaded;
  }

  async #loadRequest(source) {
    const cache = this.#cache;
    if (typeof source === "string" && source !== "default") source = await this.#resolveModelId(source);
    if (source === "default" || source?.entry) {
      const entry = source.entry ?? await this.#defaultModel();
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

  async #manifest() {
    try {
      const response = await fetch(new URL("manifest.json", this.#assets));
      if (!response.ok) throw new Error(`HTTP ${response.status}`);
      const manifest = await response.json();
      return { ...manifest, models: manifest.models ?? [] };
    } catch (error) {
      throw new WebSlmError("fetch-failed", `This site's model list could not be read (${error.message}).`);
    }
  }

  async #defaultModel() {
    const entry = (await this.#manifest()).models.find((m) => m.default);
    if (!entry) throw new WebSlmError("no-model", "This site has no default model.");
    return entry;
  }

  // A string that is not "default": one of this site's model ids or names (or WebLLM's id
  // for one of them), a model of the engine's appConfig, else a URL when it looks like one
  // (a "/", a scheme, or a .slm name). Anything else is an id this site does not have: a clear
  // error, not a fetch of a relative URL.
  async #resolveModelId(text) {
    const app = this.#appModels.find((m) => m.model_id === text);
    if (app) return app.url;
    if (/[/:]/.test(text) || text.endsWith(".slm")) return text;
    const models = (await this.#manifest()).models;
    const wanted = WEBLLM_MODEL_IDS[text] ?? text;
    const entry = models.find((m) => m.id === wanted || m.name === wanted);
    if (entry) return { entry };
    const ids = models.map((m) => m.id).join(", ") || "none";
    throw new WebSlmError("unknown-model", `"${text.slice(0, 80)}" is not a model this site has (it has: ${ids}). A WebLLM model id names MLC weights, which webslm does not load; give one of these ids, the URL of a .slm file, or a File.`);
  }

  // Time the GPU against the CPU path again for the loaded model, whatever an earlier visit
  // found (a GPU found slower there is not admitted again: cpuReason.code
  // "gpu-slower-remembered"). The model is admitted anew, the faster engine kept, and the
  // outcome replaces the one kept for this browser's GPU. Progress and statechange events
  // come as for a load; minutes on a software GPU.
  async measureGpu() {
    this.#usable();
    if (!this.model) throw new WebSlmError("no-model", "Load a model first.");
    if (this.#gpu === false) throw new WebSlmError("bad-request", "This engine was created with gpu: false: there is no GPU to measure.");
    this.#loading = true;
    try {
      await this.#admit("remeasure");
    } finally {
      this.#loading = false;
    }
  }

  // GPU admission of the loaded model: the worker proves on this GPU that the model fits and
  // computes correctly, or the engine answers on the CPU path with the reason. An admitted GPU
  // is then timed against the CPU path and kept only if it is not slower (gpu: "force" keeps
  // it untimed): engine.choice has the numbers. Where an earlier visit found this GPU slower,
  // the worker goes to the CPU path without admitting it (result.remembered). Tuning "later":
  // the launch shapes a real GPU has not measured before are measured once the engine is idle,
  // not while the page waits (a software adapter keeps the host's rules at once).
  async #admit(mode = this.#gpu === "force" ? "force" : "measure") {
    let result;
    try {
      result = this.#gpu
        ? await this.protocol.request("admit", { featureLevel: this.#featureLevel, fault: null, gpu: mode,
                                                 tuning: "later" })
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

  // One request: checked at once, then answered when the requests before it are (in arrival
  // order, one at a time, never refused as busy). n > 1: its choices one after another.
  async #create(request, kind) {
    this.#usable();
    let checked;
    try {
      checked = checkRequest(request, kind, this.#defaults);
    } catch (error) {
      throw error instanceof BadRequest ? new WebSlmError("bad-request", error.message) : error;
    }
    if (!this.model) throw new WebSlmError("no-model", "No model is loaded.");
    const before = this.#turn;
    let release;
    this.#turn = new Promise((resolve) => { release = resolve; });
    await before;
    let first;
    try {
      this.#usable();
      if (!this.model) throw new WebSlmError("no-model", "No model is loaded.");
      const seed = checked.seed ?? randomSeed();             // unset: a fresh one, reported back
      first = this.#start(checked, kind, seed, 0);
      if (checked.stream) return first.chunks();
      const choices = [await first.completion()];
      while (choices.length < checked.n && choices.at(-1).choices[0].finish_reason !== "abort") {
        choices.push(await this.#start(checked, kind, seed + choices.length, choices.length).completion());
      }
      return combineChoices(choices);
    } finally {
      if (first && checked.stream) first.done.finally(release);   // the stream's turn ends with it
      else release();
    }
  }

  #start({ prompt, settings, signal, logprobs, includeUsage }, kind, seed, index) {
    const started = this.protocol.start("generate", { messages: prompt, settings: { ...settings, seed } });
    const answer = new Answer(this, started, { seed, kind, index, logprobs, includeUsage });
    this.#answer = this.#last = answer;
    answer.done.finally(() => { if (this.#answer === answer) this.#answer = null; });
    if (signal) {
      if (signal.aborted) this.abort();
      else signal.addEventListener("abort", () => { if (this.#answer === answer) this.abort(); }, { once: true });
    }
    return answer;
  }

  // WebLLM's names for the same calls.
  chatCompletion(request) {
    return this.#create(request, "chat");
  }

  completion(request) {
    return this.#create(request, "completion");
  }

  // The text of the answer in progress, or of the last one.
  async getMessage() {
    return this.#last ? this.#last.reply?.text ?? this.#last.text : "";
  }

  // Stop the answer in progress (as abort(), without waiting): it ends with finish_reason "abort".
  interruptGenerate() {
    this.abort().catch(() => {});
  }

  // Forget the conversation the KV cache holds: the next answer reads its whole prompt
  // (requests carry the whole conversation, so nothing else is kept). keepStats: keep the
  // last answer's numbers for runtimeStatsText().
  async resetChat(keepStats = false) {
    this.#usable();
    if (this.model) await this.protocol.request("reset-chat").catch((error) => { throw fromWorker(error); });
    if (!keepStats) this.#last = null;
  }

  // WebLLM's one-line summary of the last answer's speed.
  async runtimeStatsText() {
    const extra = this.#last?.reply ? usage(this.#last.reply).extra : null;
    if (!extra) return "prefill: 0.0000 tokens/sec, decode: 0.0000 tokens/sec";
    return `prefill: ${extra.prefill_tokens_per_s.toFixed(4)} tokens/sec, decode: ${extra.decode_tokens_per_s.toFixed(4)} tokens/sec`;
  }

  // WebLLM's initProgressCallback: ({progress 0..1, timeElapsed seconds, text}) during a load.
  setInitProgressCallback(callback) {
    this.#init.callback = callback ?? null;
  }

  getInitProgressCallback() {
    return this.#init.callback;
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

  // Cancel any answer and any load in progress (it rejects with code "cancelled"), free the
  // model with its GPU buffers and device, and end the worker (its memory goes with it). An
  // engine made by CreateMLCEngine stays usable, as WebLLM's does: reload() starts a new worker.
  async unload() {
    if (this.#engineState === "Unloaded" || this.#workerEnded) return;
    this.#loads += 1;
    this.#loading = false;
    await this.abort().catch(() => {});
    await this.protocol.request("unload").catch(() => {});
    this.protocol.terminate("the engine was unloaded");
    this.#workerEnded = true;
    this.model = null;
    const from = this.#engineState;
    this.#changeState({ from, to: this.#reloadable ? "Empty" : "Unloaded", reason: "unload" });
  }
}

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
