// WebLLM's initProgressCallback ({progress, timeElapsed, text}) from webslm's progress events.
//
// A load has stages of very different length; each gets a slice of 0..1 (the worker's boot
// before the first load, the download, the validation, then admission's upload, compile and
// self-test), and within a slice done/total moves it where the total is known. progress
// never goes back within one load; 1 comes only when the load has finished (finish()).

const SLICES = {
  boot: [0.0, 0.08],
  download: [0.08, 0.55],
  validate: [0.55, 0.72],
  admission: [0.72, 0.74],
  upload: [0.74, 0.82],
  compile: [0.82, 0.9],
  "self-test": [0.9, 0.99],
};
const BOOT_STAGES = ["pyodide", "numpy", "webslm"];
const MB = (bytes) => `${(bytes / 1e6).toFixed(1)} MB`;

export function describe({ phase, stage, done, total, source }) {
  const of = total ? ` ${done} of ${total}` : done !== null && done !== undefined ? ` ${done}` : "";
  switch (phase) {
    case "boot": return `Starting the engine: ${stage}`;
    case "download": return `${source === "cache" ? "Reading the model from the cache" : "Downloading the model"}: ${MB(done)}${total ? ` of ${MB(total)}` : ""}`;
    case "validate": return `Checking the model: ${MB(done)}${total ? ` of ${MB(total)}` : ""}`;
    case "admission": return `Preparing the GPU: ${stage}`;
    case "floor": return "Timing the GPU's costliest kernels against the CPU";
    case "upload": return `Uploading the weights to the GPU: ${MB(done)}${total ? ` of ${MB(total)}` : ""}`;
    case "compile": return `Compiling GPU pipelines:${of}`;
    case "self-test": return `Testing the GPU's kernels:${of}`;
    default: return `${phase}${stage ? `: ${stage}` : ""}`;
  }
}

// The fraction of the whole load a progress event stands for, or null for one that is not a load's.
export function fraction({ phase, stage, done, total }) {
  const slice = SLICES[phase];
  if (!slice) return null;
  const [from, to] = slice;
  let part = 0;
  if (phase === "boot") part = Math.max(0, BOOT_STAGES.indexOf(stage)) / BOOT_STAGES.length;
  else if (total > 0 && done >= 0) part = Math.min(1, done / total);
  return from + (to - from) * part;
}

export class InitProgress {
  constructor(callback = null) {
    this.callback = callback;
    this.started = performance.now();
    this.progress = 0;
  }

  start() {
    this.started = performance.now();
    this.progress = 0;
  }

  #send(progress, text) {
    this.progress = Math.max(this.progress, progress);
    this.callback?.({ progress: this.progress, timeElapsed: (performance.now() - this.started) / 1000, text });
  }

  report(detail) {
    const at = fraction(detail);
    if (at !== null) this.#send(at, describe(detail));
  }

  finish(text) {
    this.#send(1, text);
  }
}
