// The page <-> worker message protocol, version "webslm/1". Shared by both sides.
//
// Request (page -> worker):   { protocol: "webslm/1", id: <uint>, type: <request type>, ...fields }
// Reply   (worker -> page):   { protocol: "webslm/1", id: <same id>, type: <request type>, result: {...} }
// Error   (worker -> page):   { protocol: "webslm/1", id: <id or null>, type: "error", error: { code, message } }
// Event   (worker -> page):   { protocol: "webslm/1", id: null, type: "event", event: <name>, ...data }
//
// Events: booting, ready, boot-failed, load-progress {phase: "download" | "validate", done,
// total, source}, admission-stage {stage}, admission-progress {stage, done, total}; prefill-progress
// {request, phase: "prefill" | "replay", done, total, cached} while an answer's prompt is read
// (tokens: done of total, cached of them kept from the answer before); delta {request, text,
// token_id, backend} per committed piece of an answer; engine-state {from, to, reason,
// cpu_reason, ...details (stage, code, sentence, epoch, position)} for every transition of the
// engine's state machine (py/webslm/engine/states.py); engine-released {backend, reason}.
//
// Messages from the page are untrusted: validate() checks every field and rejects unknown
// ones, so the worker acts only on messages it fully understands. A rejected message gets
// an "error" reply and the worker keeps serving.

export const PROTOCOL = "webslm/1";

export const ERROR_CODES = Object.freeze({
  badMessage: "bad-message",     // not an object, wrong protocol, bad id
  unknownType: "unknown-type",   // a type this protocol version does not have
  badField: "bad-field",         // a missing, extra or ill-typed field
  bootFailed: "boot-failed",     // Pyodide, numpy or webslm could not be loaded
  failed: "failed",              // the request was valid but running it failed
  badArtifact: "bad-artifact",   // the model file failed validation (details carry the artifact error code)
  fetchFailed: "fetch-failed",   // the model could not be downloaded (network, HTTP status, CORS)
  cancelled: "cancelled",        // a load that an unload cancelled
});

const FEATURE_LEVELS = ["auto", "core", "compatibility"];  // auto: see py/webslm/webgpu/adapters.py choose_adapter
// admit's tuning (py/webslm/worker/engine_host.py EngineHost.admit): "later-force" is "later"
// that measures even on a software adapter, as "force" does (the tests' way to run it there)
const TUNING_MODES = ["auto", "later", "force", "later-force", "off"];
const isUint32 = (v) => Number.isInteger(v) && v >= 0 && v <= 0xffffffff;
const isPlainObject = (v) => v !== null && typeof v === "object" && Object.getPrototypeOf(v) === Object.prototype;

// A model source: {url} (http/https, relative to the site), {file} (a File or Blob the user
// picked) or {cached} (the sha256 of a model in Cache Storage).
function checkSource(v) {
  if (!isPlainObject(v) || Object.keys(v).length !== 1) return "must be {url}, {file} or {cached}";
  if (Object.hasOwn(v, "url")) {
    return (typeof v.url === "string" && v.url.length > 0 && v.url.length <= 2048) || "url must be a non-empty string of at most 2048 characters";
  }
  if (Object.hasOwn(v, "file")) return (typeof Blob !== "undefined" && v.file instanceof Blob) || "file must be a File or Blob";
  if (Object.hasOwn(v, "cached")) return (typeof v.cached === "string" && /^[0-9a-f]{64}$/.test(v.cached)) || "cached must be 64 lowercase hex digits";
  return "must be {url}, {file} or {cached}";
}

// A field the sender may leave out (the worker takes its default); present, it is checked.
const optional = (check) => Object.assign((v) => check(v), { optional: true });

// For each request type: its fields and a check for each ([] = no fields).
export const REQUESTS = Object.freeze({
  ping: {},
  status: {},
  "gpu-probe": {
    featureLevel: (v) => FEATURE_LEVELS.includes(v) || `must be one of ${FEATURE_LEVELS.join(", ")}`,
    seed: (v) => isUint32(v) || "must be an integer in [0, 2^32)",
  },
  "resource-log": {},
  // the GPU's first-use costs (adapter, device, first compile and submission) paid on a
  // throwaway device while the model loads (py/webslm/admission/warm_up.py); admit waits for it
  "prepare-gpu": {
    featureLevel: (v) => FEATURE_LEVELS.includes(v) || `must be one of ${FEATURE_LEVELS.join(", ")}`,
  },
  "sampler-check": {},
  // the kernel golden suite (webslm.kernels.golden) on this browser's adapter; withModel adds
  // cases on the loaded model's real weights
  "kernel-golden": {
    featureLevel: (v) => FEATURE_LEVELS.includes(v) || `must be one of ${FEATURE_LEVELS.join(", ")}`,
    size: (v) => ["quick", "full"].includes(v) || "must be quick or full",
    withModel: (v) => typeof v === "boolean" || "must be a boolean",
  },
  // GPU admission of the loaded model (webslm.admission); fault: null, or a named fault case
  // the tests inject (checked in Python against webslm.admission.tracked.NAMED_FAULTS); gpu:
  // "measure" keeps the admitted GPU only if its decode step is not slower than the CPU path's
  // (py/webslm/engine/choice.py) and skips admission where an earlier visit found this GPU
  // slower (py/webslm/engine/verdict.py), "force" keeps it untimed, "remeasure" measures as
  // "measure" does with the earlier visits' verdict forgotten; tuning (optional): the tuning
  // stage's mode, "auto" (the default: measured during admission, not on a software adapter),
  // "later" (the results kept from earlier visits now, the rest measured once the engine is
  // idle), "force" (measured during admission, on any adapter) or "off" (the host's rules)
  admit: {
    featureLevel: (v) => FEATURE_LEVELS.includes(v) || `must be one of ${FEATURE_LEVELS.join(", ")}`,
    fault: (v) => v === null || (typeof v === "string" && /^[a-z-]{1,40}$/.test(v)) || "must be null or a fault name",
    gpu: (v) => ["measure", "force", "remeasure"].includes(v) || "must be measure, force or remeasure",
    tuning: optional((v) => TUNING_MODES.includes(v) || `must be ${TUNING_MODES.join(", ")}`),
  },
  // chars: corpus size for the tokenizer check (webslm.semantic.corpus); needs a loaded model
  // messages and settings are checked in Python (py/webslm/worker/requests.py); here only their shape
  // messages: a list (a chat) or a string (a raw prompt, no chat template: completions.create)
  generate: {
    messages: (v) => (Array.isArray(v) && v.length >= 1 && v.length <= 256) || (typeof v === "string" && v.length >= 1)
      || "must be a list of 1 to 256 messages, or a non-empty prompt string",
    settings: (v) => (v !== null && typeof v === "object" && !Array.isArray(v)) || "must be an object",
  },
  // cancels the answer in progress: no delta of it follows the reply
  abort: {},
  // test hook: destroy the admitted GPU device once the answer in progress (or the next one)
  // has committed afterTokens tokens (0: before its first step); the engine continues it on the CPU
  "lose-device": { afterTokens: (v) => (Number.isInteger(v) && v >= 0 && v <= 100_000) || "must be an integer in [0, 100000]" },
  // teacher-forced conformance of the GPU executor with the CPU oracle over `tokens` positions
  conformance: { tokens: (v) => (Number.isInteger(v) && v >= 1 && v <= 256) || "must be an integer in [1, 256]" },
  // the engine's state, backend ("gpu" | "cpu" | null) and, on the CPU, the reason
  "engine-status": {},
  // soak check: GPU devices and buffers still open, Python's live objects, the Wasm heap's size
  "memory-status": {},
  "tokenizer-check": { chars: (v) => (Number.isInteger(v) && v >= 1 && v <= 4_000_000) || "must be an integer in [1, 4000000]" },
  // Load and validate a model, replacing the current one only once the new one is valid.
  // source: {url}, {file} or {cached}; sha256: null or the artifact sha256 the caller expects (the
  // site manifest's): the cache is looked up by it and a different model is refused; name:
  // null or a display name; cache: load from and store into Cache Storage (worker/model-cache.mjs)
  "load-model": {
    source: checkSource,
    sha256: (v) => v === null || (typeof v === "string" && /^[0-9a-f]{64}$/.test(v)) || "must be null or 64 lowercase hex digits",
    name: (v) => v === null || (typeof v === "string" && v.length <= 200) || "must be null or a string of at most 200 characters",
    cache: (v) => typeof v === "boolean" || "must be a boolean",
  },
  // the engine on the CPU path without trying the GPU (the page's gpu: false)
  "use-cpu": {},
  // unload the model: its answer cancelled, its engine, GPU buffers and device released; a
  // load in progress is cancelled
  unload: {},
  // forget the conversation held in the engine's KV cache (after the answer in progress)
  "reset-chat": {},
});

const ENVELOPE = ["protocol", "id", "type"];

export class ProtocolError extends Error {
  constructor(code, message, id = null) {
    super(message);
    this.code = code;
    this.id = id;
  }
}

// Returns { id, type, fields } or throws ProtocolError.
export function validate(message) {
  if (!isPlainObject(message)) {
    throw new ProtocolError(ERROR_CODES.badMessage, "a message must be a plain object");
  }
  // Echo a well-formed id in every error, so the sender can match the reply to its request.
  const id = Number.isSafeInteger(message.id) && message.id >= 0 ? message.id : null;
  if (message.protocol !== PROTOCOL) {
    throw new ProtocolError(ERROR_CODES.badMessage, `protocol must be "${PROTOCOL}"`, id);
  }
  if (id === null) {
    throw new ProtocolError(ERROR_CODES.badMessage, "id must be a non-negative safe integer");
  }
  const type = message.type;
  if (typeof type !== "string" || !Object.hasOwn(REQUESTS, type)) {
    throw new ProtocolError(ERROR_CODES.unknownType, `unknown message type ${JSON.stringify(String(type)).slice(0, 64)}`, id);
  }
  const schema = REQUESTS[type];
  const fields = {};
  for (const name of Object.keys(message)) {
    if (ENVELOPE.includes(name)) continue;
    if (!Object.hasOwn(schema, name)) {
      throw new ProtocolError(ERROR_CODES.badField, `${type}: unexpected field ${JSON.stringify(name).slice(0, 64)}`, id);
    }
  }
  for (const [name, check] of Object.entries(schema)) {
    if (!Object.hasOwn(message, name)) {
      if (check.optional) continue;
      throw new ProtocolError(ERROR_CODES.badField, `${type}: missing field "${name}"`, id);
    }
    const verdict = check(message[name]);
    if (verdict !== true) throw new ProtocolError(ERROR_CODES.badField, `${type}: field "${name}" ${verdict}`, id);
    fields[name] = message[name];
  }
  return { id, type, fields };
}

export const reply = (id, type, result) => ({ protocol: PROTOCOL, id, type, result });
export const errorReply = (id, code, message, details) => ({ protocol: PROTOCOL, id, type: "error", error: { code, message, ...(details ? { details } : {}) } });
export const event = (name, data = {}) => ({ protocol: PROTOCOL, id: null, type: "event", event: name, ...data });
