// The webslm Web Worker (a module worker): boots Pyodide + numpy + webslm, then serves
// the page's requests (worker/protocol.mjs) by calling into the Python package.
//
// Everything is loaded from this site's own origin, relative to this file:
//   ../assets/pyodide/     Pyodide core, its official lock, numpy wheel (sha256-checked by Pyodide)
//   ../assets/manifest.json  names the webslm wheel and its sha256, written at set-up
//   ../assets/wheels/      the webslm wheel (sha256-checked here before it is unpacked)
import * as bridge from "./bridge.mjs";
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
  return { pyodide, api, boot, manifest };
}

const booted = boot();
booted.then(
  ({ boot: timings }) => postMessage(event("ready", { boot: timings })),
  (error) => postMessage(event("boot-failed", { message: String(error?.message ?? error) })),
);

// Each handler gets the validated fields and returns a JSON-able result.
const HANDLERS = {
  ping: async () => ({ pong: true }),
  status: async (_, { pyodide, api, boot: timings, manifest }) => ({
    ...JSON.parse(api.status()),
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
  // Admission, then the engine for the loaded model (webslm.worker_api.admit): queued behind
  // an answer in progress, which finishes on the engine it started on.
  admit: ({ featureLevel, fault }, context) => enqueue(context, async () => {
    const { api, model } = context;
    if (!model?.model) throw new RequestFailure(ERROR_CODES.failed, "admit: no model is loaded");
    const onStage = (stage) => postMessage(event("admission-stage", { stage }));
    return JSON.parse(await pythonCall("admit", () => api.admit(model, featureLevel, fault, navigator.userAgent, onStage)));
  }),
  "resource-log": async () => ({ urls: performance.getEntriesByType("resource").map((e) => e.name) }),
  "load-model": loadModel,
  "sampler-check": async (_, { api }) => JSON.parse(api.sampler_check()),
  generate,
  // Cancel the answer in progress (engine.cancel(): nothing commits once this replies), or
  // the one waiting behind an admission.
  abort: async (_, context) => {
    const generation = context.generation;
    if (!generation) return { aborted: false };
    if (!generation.started) {
      generation.aborted = true;
      return { aborted: true };
    }
    return { aborted: Boolean(context.model?.cancel()) };
  },
  // Test hook: destroy the admitted GPU device once the answer in progress (or the next one)
  // has committed afterTokens tokens; the engine continues that answer on the CPU path.
  "lose-device": async ({ afterTokens }, context) => {
    if (!context.model?.model) throw new RequestFailure(ERROR_CODES.failed, "lose-device: no model is loaded");
    return JSON.parse(await pythonCall("lose-device", () => context.model.lose_device(afterTokens)));
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
  "tokenizer-check": async ({ chars }, context) => {
    if (!context.model) throw new RequestFailure(ERROR_CODES.failed, "tokenizer-check: no model is loaded");
    return JSON.parse(context.model.tokenizer_check(chars));
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
function enqueue(context, task) {
  const run = (context.queue ?? Promise.resolve()).then(task);
  context.queue = run.catch(() => {});
  return run;
}

const engineEvent = (json) => {
  const { event: kind, ...data } = JSON.parse(json);
  postMessage(event(kind === "state" ? "engine-state" : `engine-${kind}`, data));
};

// Stream the artifact into the Python validator chunk by chunk, reporting progress; keep the
// validated model in the worker (the engine will take it from here).
async function loadModel({ url }, context) {
  const target = new URL(url, SITE);
  if (target.origin !== self.location.origin) {
    throw new RequestFailure(ERROR_CODES.badField, `load-model: ${target.origin} is not this site's origin`);
  }
  const started = performance.now();
  const response = await fetchOk(target);
  const total = Number(response.headers.get("content-length")) || null;
  const loader = context.api.ModelLoader(engineEvent);
  const reject = (artifact) => new RequestFailure(ERROR_CODES.badArtifact, `${artifact.code} at ${artifact.where}: ${artifact.sentence}`, artifact);
  let received = 0;
  let lastReport = 0;
  try {
    const reader = response.body.getReader();
    for (;;) {
      const { done, value } = await reader.read();
      if (done) break;
      const rejected = loader.feed(value);
      if (rejected) {
        reader.cancel();   // no point downloading the rest of a bad file
        throw reject(JSON.parse(rejected));
      }
      received += value.byteLength;
      if (performance.now() - lastReport > 100) {
        lastReport = performance.now();
        postMessage(event("load-progress", { url, received, total }));
      }
    }
    const outcome = JSON.parse(loader.finish());
    if (outcome.error) throw reject(outcome.error);
    // The previous model's engine is unloaded (its answer, if any, cancelled at once) and its
    // GPU buffers and device destroyed now, not at GC.
    const previous = context.model;
    context.model = loader;
    if (previous) {
      previous.cancel();
      await enqueue(context, () => previous.release()).finally(() => previous.destroy());
    }
    return { ...outcome.model, url, total_seconds: Math.round(performance.now() - started) / 1000 };
  } catch (error) {
    if (context.model !== loader) loader.destroy();
    throw error;
  }
}

// One answer through the engine (webslm.worker_api.ModelLoader.generate): a delta event per
// committed piece of text, the engine's state changes as engine-state events, the result
// when it ends ("stop", "length" or "abort"). One answer at a time.
async function generate({ messages, settings }, context, requestId) {
  if (!context.model?.model) throw new RequestFailure(ERROR_CODES.failed, "generate: no model is loaded");
  if (context.generation) throw new RequestFailure(ERROR_CODES.failed, "generate: an answer is already being generated");
  const generation = { started: false, aborted: false };
  context.generation = generation;
  try {
    return await enqueue(context, async () => {
      generation.started = true;
      if (generation.aborted) return { text: "", finish_reason: "abort", backend: null };
      const model = context.model;
      const onDelta = (json) => postMessage(event("delta", { request: requestId, ...JSON.parse(json) }));
      return JSON.parse(await pythonCall("generate", () => model.generate(JSON.stringify({ messages, settings }), onDelta)));
    });
  } finally {
    if (context.generation === generation) context.generation = null;
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
  let context;
  try {
    context = await booted;
  } catch (error) {
    if (request.type === "ping") return reply(request.id, "ping", { pong: true, booted: false });
    return errorReply(request.id, ERROR_CODES.bootFailed, String(error?.message ?? error));
  }
  try {
    return reply(request.id, request.type, await HANDLERS[request.type](request.fields, context, request.id));
  } catch (error) {
    if (error instanceof RequestFailure) return errorReply(request.id, error.code, error.message, error.details);
    return errorReply(request.id, ERROR_CODES.failed, String(error?.message ?? error));
  }
}

self.onmessage = async ({ data }) => postMessage(await handle(data));
self.onmessageerror = () => postMessage(errorReply(null, ERROR_CODES.badMessage, "message could not be deserialized"));
