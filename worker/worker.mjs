// The webslm Web Worker (a module worker): boots Pyodide + numpy + webslm, then serves
// the page's requests (worker/protocol.mjs) by calling into the Python package.
//
// Everything is loaded from this site's own origin, relative to this file:
//   ../assets/pyodide/     Pyodide core, its official lock, numpy wheel (sha256-checked by Pyodide)
//   ../assets/manifest.json  names the webslm wheel and its sha256, written at set-up
//   ../assets/wheels/      the webslm wheel (sha256-checked here before it is unpacked)
//   ../assets/kernels/     the CPU path's Wasm kernel, if the site has one (worker/qmatmul.mjs)
import * as bridge from "./bridge.mjs";
import * as modelCache from "./model-cache.mjs";
import * as tuningStore from "./tuning-store.mjs";
import * as verdictStore from "./verdict-store.mjs";
import { loadQmatmul } from "./qmatmul.mjs";
import { ERROR_CODES, ProtocolError, errorReply, event, reply, validate } from "./protocol.mjs";

const ASSETS = new URL("../assets/", import.meta.url);
const SITE = new URL("../", import.meta.url);

async function sha256Hex(buffer) {
  const digest = await crypto.subtle.digest("SHA-256", buffer);
  return [...new Uint8Array(digest)].map((b) => b.toString(16).padStart(2, "0")).join("");
}

async function fetchOk(url) {
  const response = await fetch(url);
  if (!response.ok) throw new Error(`${url.pathname}: HTTP ${response.status}`);
  return response;
}

async function boot() {
  const t0 = performance.now();
  const mark = () => Math.round(performance.now() - t0);
  const manifest = await (await fetchOk(new URL("manifest.json", ASSETS))).json();

  postMessage(event("booting", { stage: "pyodide" }));
  const { loadPyodide } = await import(new URL("pyodide/pyodide.mjs", ASSETS).href);
  const pyodide = await loadPyodide({ indexURL: new URL("pyodide/", ASSETS).href });
  const pyodideMs = mark();

  postMessage(event("booting", { stage: "numpy" }));
  const failures = [];
  await pyodide.loadPackage(["numpy"], { checkIntegrity: true, errorCallback: (m) => failures.push(m), messageCallback: () => {} });
  if (failures.length) throw new Error(`numpy failed to load: ${failures.join("; ")}`);
  const numpyMs = mark();

  const qmatmul = await loadQmatmul(pyodide, manifest, ASSETS);    // before webslm imports it

  postMessage(event("booting", { stage: "webslm" }));
  const wheelUrl = new URL(manifest.webslm.wheel, ASSETS);
  const wheel = await (await fetchOk(wheelUrl)).arrayBuffer();
  const actual = await sha256Hex(wheel);
  if (actual !== manifest.webslm.sha256) {
    throw new Error(`${wheelUrl.pathname}: sha256 ${actual} does not match the manifest's ${manifest.webslm.sha256}`);
  }
  pyodide.unpackArchive(wheel, "wheel");
  pyodide.registerJsModule("webslm_bridge", bridge);
  const api = pyodide.pyimport("webslm.worker_api");
  const webslmMs = mark();

  const boot = { pyodide_ms: pyodideMs, numpy_ms: numpyMs - pyodideMs, webslm_ms: webslmMs - numpyMs, total_ms: webslmMs };
  return { pyodide, api, boot, manifest, qmatmul };
}

const booted = boot();
booted.then(
  ({ boot: timings }) => postMessage(event("ready", { boot: timings })),
  (error) => postMessage(event("boot-failed", { message: String(error?.message ?? error) })),
);

// Each handler gets the validated fields and returns a JSON-able result.
const HANDLERS = {
  ping: async () => ({ pong: true }),
  status: async (_, { pyodide, api, boot: timings, manifest, qmatmul }) => ({
    ...JSON.parse(api.status()),
    cpu_kernel_load: qmatmul,
    pyodide: pyodide.version,
    boot: timings,
    manifest_shader_bundle_hash: manifest.webslm.shader_bundle_hash,
    user_agent: navigator.userAgent,
    has_navigator_gpu: Boolean(navigator.gpu),
  }),
  "gpu-probe": async ({ featureLevel, seed }, { api }) => JSON.parse(await api.gpu_probe(featureLevel, seed)),
  "kernel-golden": async ({ featureLevel, size, withModel }, { api, model }) => {
    if (withModel && !model?.model) throw new RequestFailure(ERROR_CODES.failed, "kernel-golden: no model is loaded");
    return JSON.parse(await api.kernel_golden(featureLevel, size, withModel ? model : null));
  },
  // Admission, then the engine for the loaded model (EngineHost.admit, py/webslm/worker/
  // engine_host.py): queued behind an answer in progress, which finishes on the engine it started on.
  // The tuning results kept from earlier visits are merged in first; the cache is kept again
  // when this admission measured something new (worker/tuning-store.mjs). The engine choices
  // kept from earlier visits go to Python too (an adapter found slower than the CPU path
  // there is not admitted again: py/webslm/engine/verdict.py); what Python says to keep is
  // kept (worker/verdict-store.mjs).
  admit: ({ featureLevel, fault, gpu, tuning }, context) => enqueue(context, async () => {
    const { model, api } = context;
    if (!model?.model) throw new RequestFailure(ERROR_CODES.failed, "admit: no model is loaded");
    await context.gpuWarming;                  // a warm-up still running finishes first (prepare-gpu)
    api.merge_tuning_cache(await tuningStore.read());
    const verdicts = await verdictStore.read();
    const progress = throttled((stage, done, total) => postMessage(event("admission-progress", { stage, done, total })));
    // a stage's last progress (the upload's 100 %) is sent before the next stage begins
    const onStage = (stage) => {
      progress.flush();
      postMessage(event("admission-stage", { stage }));
    };
    try {
      const result = JSON.parse(await pythonCall("admit", () => model.admit(featureLevel, fault, navigator.userAgent,
                                                                             onStage, progress, gpu, tuning ?? "auto", verdicts)));
      if (result.tuning_new_entries > 0) result.tuning_kept = await tuningStore.write(api.tuning_cache_text());
      const { verdicts_text: keep, ...answer } = result;
      if (typeof keep === "string") answer.verdicts_kept = await verdictStore.write(keep);
      context.tuningDeferred = result.tuning?.source === "deferred";
      tuneWhenIdle(context);
      return answer;
    } finally {
      progress.flush();
    }
  }),
  "resource-log": async () => {
    const entries = performance.getEntriesByType("resource");
    return { urls: entries.map((e) => e.name),
             entries: entries.map((e) => ({ url: e.name, start_ms: Math.round(e.startTime), end_ms: Math.round(e.responseEnd) })) };
  },
  // Sent beside load-model: it runs while the model downloads and validates, and the next
  // admission waits for it (so the two never use the GPU at once). Its report is the reply.
  "prepare-gpu": ({ featureLevel }, context) => {
    const warming = pythonCall("prepare-gpu", () => context.api.prepare_gpu(featureLevel)).then(JSON.parse);
    context.gpuWarming = warming.catch(() => null);
    return warming;
  },
  "load-model": loadModel,
  "use-cpu": (_, context) => enqueue(context, async () => {
    if (!context.model?.model) throw new RequestFailure(ERROR_CODES.failed, "use-cpu: no model is loaded");
    return JSON.parse(await pythonCall("use-cpu", () => context.model.use_cpu()));
  }),
  // Unload the model; a load in progress is cancelled too (it ends "cancelled" at its next
  // chunk, and never becomes the worker's model).
  unload: async (_, context) => {
    context.loads = (context.loads ?? 0) + 1;
    const model = context.model;
    context.model = null;
    if (model) await dropModel(context, model);
    return { unloaded: Boolean(model) };
  },
  // Forget the conversation the engine's KV cache holds (WebLLM's resetChat): after the
  // answer in progress, if any; the next answer reads its whole prompt.
  "reset-chat": (_, context) => enqueue(context, async () => ({ reset: Boolean(context.model?.reset_chat()) })),
  "sampler-check": async (_, { api }) => JSON.parse(api.sampler_check()),
  generate,
  // Cancel the answer in progress (engine.cancel(): nothing commits once this replies), or
  // one that has not reached the engine yet (queued, or its Python call not yet begun): it
  // sees generation.aborted as it starts. A conformance run is not an answer: not stopped.
  abort: async (_, context) => {
    const generation = context.generation;
    if (!generation) return { aborted: false };
    generation.aborted = true;
    if (!generation.started) return { aborted: true };
    return { aborted: Boolean(context.model?.cancel()) || generation.answering === false };
  },
  // Test hook: destroy the admitted GPU device once the answer in progress (or the next one)
  // has committed afterTokens tokens; the engine continues that answer on the CPU path.
  "lose-device": async ({ afterTokens }, context) => {
    if (!context.model?.model) throw new RequestFailure(ERROR_CODES.failed, "lose-device: no model is loaded");
    return JSON.parse(await pythonCall("lose-device", () => context.api.lose_device(context.model, afterTokens)));
  },
  // Teacher-forced agreement of the GPU executor with the CPU oracle (engine/conformance.py)
  // and the executor's per-step host time; needs the engine idle on the GPU.
  conformance: ({ tokens }, context) => enqueue(context, async () => {
    if (!context.model?.model) throw new RequestFailure(ERROR_CODES.failed, "conformance: no model is loaded");
    if (context.generation) throw new RequestFailure(ERROR_CODES.failed, "conformance: an answer is being generated");
    context.generation = { started: true, aborted: false, conformance: true };
    try {
      return JSON.parse(await pythonCall("conformance", () => context.model.conformance(tokens)));
    } finally {
      context.generation = null;
    }
  }),
  "engine-status": async (_, context) => (context.model?.model
    ? JSON.parse(context.model.engine_status())
    : { state: "Empty", backend: null, cpu_reason: null }),
  "memory-status": async (_, { pyodide, api }) => ({
    ...JSON.parse(api.memory_status()),
    wasm_heap_bytes: pyodide._module.HEAP8.length,      // Wasm memory only grows: its high-water mark
  }),
  "tokenizer-check": async ({ chars }, context) => {
    if (!context.model) throw new RequestFailure(ERROR_CODES.failed, "tokenizer-check: no model is loaded");
    return JSON.parse(context.api.tokenizer_check(context.model, chars));
  },
};

class RequestFailure extends Error {
  constructor(code, message, details) {
    super(message);
    this.code = code;
    this.details = details;
  }
}

// Python errors as replies: a bad request (RequestError) is "bad-field", a request the worker
// cannot serve now (WorkerRequestFailed) or any other exception is "failed"; the message is
// the exception's last line, not the traceback.
async function pythonCall(what, call) {
  try {
    return await call();
  } catch (error) {
    if (error instanceof RequestFailure || error?.type === undefined) throw error;
    const code = error.type === "RequestError" ? ERROR_CODES.badField : ERROR_CODES.failed;
    throw new RequestFailure(code, `${what}: ${lastLine(error.message)}`);
  }
}

// Requests that use or replace the engine (admit, generate, conformance, a model switch's
// release) run one after another, in arrival order; abort, lose-device and status do not wait.
// A request arriving while the idle-time tuning runs stops it at its next checkpoint.
function enqueue(context, task) {
  if (context.tuning) context.model?.stop_tuning();
  const run = (context.queue ?? Promise.resolve()).then(task);
  context.queue = run.catch(() => {});
  return run;
}

// The tuning admission left for later (AdmissionPolicy.tune_later: a first visit on this GPU
// is not kept waiting for it), measured when the engine has nothing else queued, after the
// admission and after each answer while it is still to do; any request stops it (enqueue) and
// it is tried again when that one is done. New results are kept (worker/tuning-store.mjs).
function tuneWhenIdle(context) {
  if (!context.tuningDeferred || context.tuningQueued) return;
  context.tuningQueued = true;
  enqueue(context, async () => {
    context.tuningQueued = false;
    const model = context.model;
    if (!model?.model || !context.tuningDeferred) return;
    context.tuning = true;
    try {
      const result = JSON.parse(await pythonCall("tune", () => model.tune_later()));
      context.tuningDeferred = result.deferred;
      if (result.tuning_new_entries > 0) await tuningStore.write(context.api.tuning_cache_text());
    } catch {
      context.tuningDeferred = false;           // the engine reported what happened (engine-state)
    } finally {
      context.tuning = false;
    }
  });
}

const engineEvent = (json) => {
  const { event: kind, ...data } = JSON.parse(json);
  postMessage(event(kind === "state" ? "engine-state" : `engine-${kind}`, data));
};

// Load a model: open its bytes (the cache, the picked file or the network), stream them
// through the Python validator while they arrive, and only when the whole file is valid make
// it the worker's model (the previous one is unloaded then, not before: a bad file leaves the
// model that answered answering). A model from the network or a file is then cached by its
// sha256; a cached one that fails validation, or is not the model it is filed as, is removed
// and downloaded again.
async function loadModel({ source, name, cache }, context, _id, { started, url, sha256, opening }) {
  const load = context.loads ?? 0;                    // an unload moves it on: this load is cancelled
  const cancelled = () => (context.loads ?? 0) !== load;
  let opened = await opening;                         // (startLoad began it before the boot)
  let host, model;
  try {
    ({ host, model } = await validateStream(opened, context, cancelled));
    if (opened.from === "cache" && sha256 && model.artifact_sha256 !== sha256) {
      host.destroy();                                 // a valid model, filed under another's sha256
      throw badArtifact({ code: "unexpected-model", where: "cache", sentence: "the cached file is not the model it is filed as" });
    }
  } catch (error) {
    if (opened.from !== "cache" || error.code !== ERROR_CODES.badArtifact) throw error;
    await modelCache.remove(opened.sha256);           // a damaged or misfiled cache entry: never again
    if (!url) throw error;
    opened = startReading(await openModel(source, url, sha256, { lookup: false, keep: cache }));
    ({ host, model } = await validateStream(opened, context, cancelled));
  }
  try {
    if (sha256 && model.artifact_sha256 !== sha256) {
      throw new RequestFailure(ERROR_CODES.badArtifact, `the model's sha256 ${model.artifact_sha256} is not the expected ${sha256}`,
        { code: "unexpected-model", where: "artifact", sentence: "the file is a valid model, but not the one that was asked for" });
    }
    const label = name ?? opened.name ?? model.artifact_sha256.slice(0, 12);
    let cached = opened.from === "cache";
    if (cache && !cached) {
      const blob = opened.from === "file" ? source.file : new Blob(opened.chunks);
      cached = await modelCache.store({ sha256: model.artifact_sha256, name: label, url: url?.href }, blob);
    }
    opened.chunks = null;
    if (cancelled()) throw cancelledLoad();
    // The previous model's engine is unloaded (its answer, if any, cancelled at once) and its
    // GPU buffers and device destroyed now, not at GC.
    const previous = context.model;
    context.model = host;
    if (previous) await dropModel(context, previous);
    return { ...model, name: label, source: opened.from, cached, url: url?.href ?? null,
             total_seconds: Math.round(performance.now() - started) / 1000 };
  } catch (error) {
    if (context.model !== host) host.destroy();
    throw error;
  }
}

// What load-model does before Python is up: the model is opened (the cache, the file or the
// network) and read into memory from then on, so a first visit's download runs beside
// Pyodide's boot; validation (Python) starts once the worker has booted. A bad URL or a
// failed download is the request's error, given after the boot.
function startLoad({ source, sha256, cache }) {
  const started = performance.now();
  const url = source.url === undefined ? null : modelUrl(source.url);
  if (source.cached) sha256 = source.cached;
  const opening = openModel(source, url, sha256, { lookup: cache, keep: cache }).then(startReading);
  opening.catch(() => {});                             // (awaited by loadModel, after the boot)
  return { started, url, sha256, opening };
}

// http(s) only, relative to the site. Another origin is the user's explicit choice (the URL
// box, ?model=): it is fetched under CORS and validated like any other file.
function modelUrl(text) {
  let target;
  try {
    target = new URL(text, SITE);
  } catch {
    throw new RequestFailure(ERROR_CODES.badField, `load-model: ${JSON.stringify(text.slice(0, 80))} is not a URL`);
  }
  if (target.protocol !== "https:" && target.protocol !== "http:") {
    throw new RequestFailure(ERROR_CODES.badField, `load-model: only http and https URLs can be loaded, not ${target.protocol}`);
  }
  return target;
}

// {from: "cache" | "file" | "network", body (a ReadableStream), total, exact, name, sha256, chunks}.
// exact: total is the file's real size (a File, a cached Blob, or this site's own uncompressed
// response); the validator then refuses a header that claims another size before allocating.
// Another server's Content-Length is only its word: there the validator's buffer grows as
// bytes arrive, so a small file that claims gigabytes costs what arrived.
// lookup: try the cache first; keep: keep the downloaded chunks, to cache them once valid.
async function openModel(source, url, sha256, { lookup, keep }) {
  if (source.file) {
    return { from: "file", body: source.file.stream(), total: source.file.size, exact: true, name: source.file.name || null };
  }
  if (source.cached) {
    const hit = await modelCache.lookup({ sha256: source.cached });
    if (!hit) throw new RequestFailure(ERROR_CODES.failed, `load-model: no model with sha256 ${source.cached} is cached`);
    return { from: "cache", body: hit.body, total: hit.bytes, exact: true, name: hit.name || null, sha256: hit.sha256 };
  }
  const fileName = decodeURIComponent(url.pathname.split("/").pop() || "") || null;
  if (lookup) {
    const hit = await modelCache.lookup({ sha256, url: url.href });
    if (hit) return { from: "cache", body: hit.body, total: hit.bytes, exact: true, name: hit.name || fileName, sha256: hit.sha256 };
  }
  let response;
  try {
    response = await fetch(url);
  } catch (error) {
    throw new RequestFailure(ERROR_CODES.fetchFailed, `the download of ${url.href} failed (${error.message}): the network is down, or the server does not allow this site to read it (CORS)`);
  }
  if (!response.ok) throw new RequestFailure(ERROR_CODES.fetchFailed, `the download of ${url.href} failed: HTTP ${response.status}`);
  const total = Number(response.headers.get("content-length")) || null;
  const identity = (response.headers.get("content-encoding") ?? "identity") === "identity";
  const exact = total !== null && identity && url.origin === SITE.origin;
  // The downloaded chunks are kept for the cache (stored as one Blob once the file is valid).
  return { from: "network", body: response.body, total, exact, name: fileName, chunks: keep ? [] : null };
}

// The validator is fed at most this much at a time, so that its progress (and the page's
// messages) move every few milliseconds whatever size of chunks the stream hands over.
const FEED_BYTES = 1 << 20;

// Reading runs ahead of validation (a pump fills a queue while Python validates what has
// arrived), so the two progress bars show each. The pump: opened.body read into opened.queue
// as fast as it arrives, whether or not anyone validates yet (download progress events as it
// goes). opened.ended / opened.failure say how it finished; opened.wake(), when set, is
// called at each chunk and at the end.
function startReading(opened) {
  const reader = opened.body.getReader();
  opened.reader = reader;
  opened.progress = throttled((phase, done) => postMessage(event("load-progress", { phase, done, total: opened.total, source: opened.from })));
  opened.queue = [];
  opened.ended = false;
  opened.failure = null;
  opened.wake = null;
  let received = 0;
  opened.pump = (async () => {
    for (;;) {
      const { done, value } = await reader.read();
      if (done) break;
      opened.queue.push(value);
      opened.chunks?.push(value);
      received += value.byteLength;
      opened.progress("download", received);
      opened.wake?.();
    }
  })().then(() => { opened.ended = true; }, (error) => { opened.failure = error; }).finally(() => opened.wake?.());
  return opened;
}

// Validate what the pump (startReading) has read, and the rest as it arrives, in a new
// ModelLoader (py/webslm/worker/loader.py); once the whole file is valid, {host: the
// EngineHost for it, model: its summary}.
async function validateStream(opened, context, cancelled) {
  const loader = context.api.ModelLoader(opened.exact && opened.total > 0 ? opened.total : null);
  const { queue, progress, reader } = opened;
  let validated = 0;
  try {
    let yielded = performance.now();
    for (;;) {
      if (queue.length) {
        let chunk = queue.shift();
        if (chunk.byteLength > FEED_BYTES) {             // a Blob's stream may hand over many MB at once
          queue.unshift(chunk.subarray(FEED_BYTES));
          chunk = chunk.subarray(0, FEED_BYTES);
        }
        if (cancelled()) throw cancelledLoad();
        const rejected = loader.feed(chunk);
        if (rejected) throw badArtifact(JSON.parse(rejected));
        validated += chunk.byteLength;
        progress("validate", validated);
        if (performance.now() - yielded > 50) {         // let the pump and the page's messages run
          await new Promise((resolve) => setTimeout(resolve, 0));
          yielded = performance.now();
        }
      } else if (opened.failure) {
        throw new RequestFailure(ERROR_CODES.fetchFailed, `the model could not be read to the end: ${opened.failure.message ?? opened.failure}`);
      } else if (opened.ended) {
        break;
      } else {
        await new Promise((resolve) => { opened.wake = resolve; });
        opened.wake = null;
      }
    }
    const outcome = JSON.parse(loader.finish());
    if (outcome.error) throw badArtifact(outcome.error);
    progress.flush();
    return { host: context.api.engine_host(loader, engineEvent), model: outcome.model };
  } catch (error) {
    reader.cancel().catch(() => {});                    // no point reading the rest of a bad file
    await opened.pump;
    throw error;
  } finally {
    loader.destroy();                                   // the host keeps the validated model
  }
}

const cancelledLoad = () => new RequestFailure(ERROR_CODES.cancelled, "load-model: cancelled by unload");
const badArtifact = (artifact) => new RequestFailure(ERROR_CODES.badArtifact, `${artifact.code} at ${artifact.where}: ${artifact.sentence}`, artifact);

// At most one message per key (a phase, a stage) every 100 ms, and the last one always: when
// another key's message goes (a phase ends where the next begins), or at flush(). Without
// that, a phase's last value waited for the flush at the end of the whole admission, and its
// bar stood still short of its end through compilation and self-tests.
function throttled(post) {
  const last = new Map();
  const pending = new Map();
  const send = (key, ...values) => {
    if (performance.now() - (last.get(key) ?? 0) < 100) {
      pending.set(key, values);
      return;
    }
    for (const [other, held] of pending) if (other !== key) post(other, ...held);
    for (const other of [...pending.keys()]) if (other !== key) pending.delete(other);
    last.set(key, performance.now());
    pending.delete(key);
    post(key, ...values);
  };
  send.flush = () => {
    for (const [key, values] of pending) post(key, ...values);
    pending.clear();
  };
  return send;
}

// Unload a model the worker held: its answer cancelled, then (after any queued engine work)
// its engine, GPU buffers and device released, and its memory freed.
async function dropModel(context, model) {
  model.cancel();
  await enqueue(context, () => model.release()).finally(() => model.destroy());
}

// One answer through the engine (EngineHost.generate, py/webslm/worker/engine_host.py): prefill-progress
// events while the prompt is read, a delta event per committed piece of text, the engine's
// state changes as engine-state events, the result when it ends ("stop", "length" or
// "abort"). One answer at a time.
//
// Stop: an abort message is read whenever Python gives the event loop a turn, which it does
// between GPU prefill chunks, while it waits for the GPU, and every 50 ms of CPU work
// (py/webslm/backends/cpu_path.py). A SharedArrayBuffer interrupt would need the page to be
// cross-origin isolated (COOP/COEP headers), which a plain static host does not send.
// messages: the chat, or a string: a raw prompt (completions.create), encoded without the chat template.
async function generate({ messages, settings }, context, requestId) {
  if (!context.model?.model) throw new RequestFailure(ERROR_CODES.failed, "generate: no model is loaded");
  if (context.generation) throw new RequestFailure(ERROR_CODES.failed, "generate: an answer is already being generated");
  const generation = { started: false, aborted: false, answering: false };
  context.generation = generation;
  try {
    return await enqueue(context, async () => {
      generation.started = true;
      if (generation.aborted) return { text: "", finish_reason: "abort", backend: null };
      const model = context.model;
      const onDelta = (json) => postMessage(event("delta", { request: requestId, ...JSON.parse(json) }));
      const onProgress = (json) => postMessage(event("prefill-progress", { request: requestId, ...JSON.parse(json) }));
      const stopped = () => {                           // asked by Python just before the engine's answer begins
        generation.answering = !generation.aborted;
        return generation.aborted;
      };
      return JSON.parse(await pythonCall("generate", () => model.generate(JSON.stringify({ messages, settings }), onDelta, onProgress, stopped)));
    });
  } finally {
    if (context.generation === generation) context.generation = null;
    tuneWhenIdle(context);
  }
}

const lastLine = (message) => String(message).trim().split("\n").pop();

async function handle(message) {
  let request;
  try {
    request = validate(message);
  } catch (error) {
    if (error instanceof ProtocolError) return errorReply(error.id, error.code, error.message);
    throw error;
  }
  let context, early = null;
  try {
    if (request.type === "load-model") early = startLoad(request.fields);    // the download beside the boot
    context = await booted;
  } catch (error) {
    early?.opening.then((opened) => opened.reader.cancel()).catch(() => {});
    if (error instanceof RequestFailure) return errorReply(request.id, error.code, error.message, error.details);
    if (request.type === "ping") return reply(request.id, "ping", { pong: true, booted: false });
    return errorReply(request.id, ERROR_CODES.bootFailed, String(error?.message ?? error));
  }
  try {
    return reply(request.id, request.type, await HANDLERS[request.type](request.fields, context, request.id, early));
  } catch (error) {
    if (error instanceof RequestFailure) return errorReply(request.id, error.code, error.message, error.details);
    return errorReply(request.id, ERROR_CODES.failed, String(error?.message ?? error));
  }
}

self.onmessage = async ({ data }) => postMessage(await handle(data));
self.onmessageerror = () => postMessage(errorReply(null, ERROR_CODES.badMessage, "message could not be deserialized"));
