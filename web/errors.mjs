// webslm's errors and what the user can do about them: the WebSlmError every API call throws
// (its code and an advice sentence shown under the message), a worker's error reply turned into
// one (`fromWorker`), and the advice for each reason the CPU path answers instead of the GPU
// (`withAdvice`, the engine's cpuReason). web/webslm.js re-exports WebSlmError; docs/js-api.md
// lists the codes.
import { WorkerError } from "./worker-client.mjs";

// What the user can do about each kind of error: shown under its sentence.
const ADVICE = {
  "worker-failed": "Reload the page. If it keeps failing, this browser may not support WebAssembly in module workers.",
  "fetch-failed": "Check the address and the connection. A model on another site must allow this one to read it (CORS).",
  "bad-artifact": "The file is damaged or is not a webslm model: download it again, or make one with `webslm convert`.",
  "bad-request": "Check the request: roles are system, user or assistant; temperature ≥ 0; 0 < top_p ≤ 1; max_tokens ≥ 1; the conversation must fit the model's context. If the model's chat template failed, pick another model.",
  "no-model": "Load a model first.",
  "unknown-model": "Give one of this site's model ids (engine.models.available()), the URL of a .slm file, or a File.",
  cancelled: "The load was cancelled by unload(): load the model again to use it.",
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
  "gpu-slower-remembered": "To time the GPU again, choose “Measure the GPU again” under Model & settings › Engine (engine.measureGpu() in the API); ?gpu=force keeps the GPU without timing it.",
  "out-of-memory": "The GPU has not enough free memory for this model: close other tabs or apps that use it, or pick a smaller model.",
  "allocation-failed": "The GPU refused the model's buffers: close other tabs or apps that use it, or pick a smaller model.",
  "limit-too-small": "This GPU's limits are too small for this model: a smaller model may fit.",
  "missing-feature": "This GPU lacks a feature the model needs on the GPU.",
  "unsupported-model": "The GPU path does not run this model's architecture yet.",
  "self-test-failed": "This GPU computed a kernel wrongly, so it is not trusted with the model; a driver or browser update may fix it.",
  "loop-limit": "This GPU is a software renderer that stops long shader loops early, so it cannot read a prompt as long as this model's context; the CPU path answers instead.",
  "self-test-incomplete": "A kernel this model needs has no self-test in this build, so the GPU is not trusted with it: please report it.",
  "pipeline-failed": "This GPU could not compile a kernel; a driver or browser update may fix it.",
  "device-lost": "The GPU was reset (a driver update, too much load, or the system reclaimed it): reload the page to try it again.",
  "readback-failed": "The GPU stopped answering: reload the page to try it again.",
};
export const withAdvice = (reason) => (reason ? { ...reason, advice: reason.advice ?? CPU_ADVICE[reason.code] ?? "Reload the page to try the GPU again." } : null);

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
export function fromWorker(error) {
  if (!(error instanceof WorkerError)) return new WebSlmError("failed", String(error?.message ?? error));
  const code = { "bad-field": "bad-request", "boot-failed": "worker-failed" }[error.code] ?? error.code;
  return new WebSlmError(ADVICE[code] ? code : "failed", error.message, error.details ?? null);
}
