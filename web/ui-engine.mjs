// The engine's visible state: the badge (which engine answers: "GPU · f16 · subgroups" or
// "CPU"), the note beside it (why the CPU answers, or that the GPU was lost), the admission
// line, the capability receipt and what the worker booted. Everything is redrawn from the
// Engine's own members on every statechange, so a GPU lost in the middle of an answer turns
// the badge to CPU at once.

const $ = (id) => document.getElementById(id);

// Engine states (py/webslm/engine/states.py) that say which engine is in charge; the rest
// (CancelPending, Destroying, …) are passing, and leave the badge as it was.
const CHECKING_STATES = new Set(["Probing", "Preparing"]);
const GPU_STATES = new Set(["GPUReady", "Generating"]);
const CPU_STATES = new Set(["CPUReady", "CPUGenerating", "CPURebuild", "Lost", "VisibleFailure"]);
const NO_MODEL_STATES = new Set(["Empty", "Unloaded"]);

// "gpu", "cpu", or null while nothing answers or the state does not say.
export function backendOf(state) {
  if (GPU_STATES.has(state)) return "gpu";
  if (CPU_STATES.has(state)) return "cpu";
  return null;
}

export const backendName = (backend) => ({ gpu: "GPU", cpu: "CPU" })[backend] ?? "?";

// "GPU · f16 · subgroups"; a GPU without either feature computes in f32.
function gpuLabel(features = []) {
  const names = [features.includes("shader-f16") && "f16", features.includes("subgroups") && "subgroups"].filter(Boolean);
  return ["GPU", ...(names.length ? names : ["f32"])].join(" · ");
}

// Python's and the worker's sentences start in lower case and may lack the full stop.
export const sentence = (text) => {
  const trimmed = String(text).trim();
  return trimmed.charAt(0).toUpperCase() + trimmed.slice(1) + (/[.!?]$/.test(trimmed) ? "" : ".");
};

// The GPU loss arrives as statechange {to: "Lost", code, sentence}; the engine's cpuReason
// carries it from CPURebuild on. Either way the note says the same thing.
function lossReason(engine, detail) {
  if (engine.cpuReason?.reason === "GPU lost") return engine.cpuReason;
  if (detail?.to === "Lost") return detail.cpu_reason ?? { reason: "GPU lost", code: detail.code, sentence: detail.sentence };
  return null;
}

// Why the CPU answers, and (cpuReason.advice) what the user can do about it.
function noteText(engine, detail) {
  const lost = lossReason(engine, detail);
  if (lost) {
    const parts = [`The GPU was lost${lost.code ? ` (${lost.code})` : ""}.`, lost.sentence && sentence(lost.sentence), "Answers continue on the CPU.", lost.advice];
    return parts.filter(Boolean).join(" ");
  }
  const why = engine.cpuReason;
  if (!why) return "";
  const reason = sentence(why.sentence || why.reason || "the GPU is not in use");
  return [`Answering on the CPU${why.code ? ` (${why.code})` : ""}: ${reason}`, why.advice].filter(Boolean).join(" ");
}

function setBadge(text, kind, title = "") {
  const badge = $("engine-badge");
  badge.textContent = text;
  badge.dataset.kind = kind;   // the CSS colours it: gpu, cpu, busy, off
  badge.title = title;
}

// Redraw the badge and note from the engine (detail: the statechange being handled, if any).
export function showEngine(engine, detail = null) {
  const state = engine.state;
  const title = `engine state: ${state}`;
  if (CHECKING_STATES.has(state)) setBadge("Checking the GPU…", "busy", title);
  else if (state === "Loading") setBadge("Loading…", "busy", title);
  else if (backendOf(state) === "gpu") setBadge(gpuLabel(engine.features), "gpu", `${title} · tier ${engine.tier}`);
  else if (backendOf(state) === "cpu") setBadge("CPU", "cpu", title);
  else if (NO_MODEL_STATES.has(state)) setBadge("No model", "off", title);
  const note = $("engine-note");
  note.textContent = noteText(engine, detail);
  delete note.dataset.kind;
}

export function showLoading() {
  setBadge("Loading…", "busy");
}

export function showStarting(text) {
  setBadge("Starting…", "busy");
  $("header-status").textContent = text;
}

// The worker could not start: nothing will answer. Say so where the badge is.
export function showEngineFailure(error) {
  setBadge("Stopped", "off");
  $("engine-note").textContent = [sentence(error.message), error.advice].filter(Boolean).join(" ");
  $("engine-note").dataset.kind = "error";
  $("admission-state").textContent = "No engine: the worker did not start.";
}

// The `admission` event's detail: the GPU proved (or failed to prove) that the model fits
// and computes like the CPU oracle.
export function showAdmission(result) {
  let text;
  if (result.admitted) {
    const cases = Number.isInteger(result.self_test_cases) ? `${result.self_test_cases} kernel self-tests agree` : "the kernel self-tests agree";
    text = `Admitted at tier ${result.tier} in ${result.seconds.toFixed(1)} s: ${cases} with the CPU oracle.`;
  } else {
    const where = [result.code, result.stage && `at ${result.stage}`].filter(Boolean).join(" ");
    text = `The GPU was not admitted${where ? ` (${where})` : ""}: ${sentence(result.sentence || "no reason given")} The CPU answers.`;
  }
  $("admission-state").textContent = text;
}

export function showAdmissionStage(stage) {
  $("admission-state").textContent = `Checking the GPU: ${stage}…`;
}

// After a load: the receipt of its admission, or why there is none.
export function showAfterLoad(engine, { gpuDisabled }) {
  if (gpuDisabled) $("admission-state").textContent = "The GPU was not tried: the page was opened with ?gpu=0.";
  $("receipt").textContent = engine.receiptText || "No receipt: no GPU admission has run.";
}

// What the worker booted, and how long it took.
export function showWorker(worker) {
  if (!worker) return;
  const boot = worker.boot?.total_ms ? `${(worker.boot.total_ms / 1000).toFixed(1)} s` : null;
  const rows = [
    ["Python", worker.python && `${worker.python} (Pyodide ${worker.pyodide})`],
    ["numpy", worker.numpy],
    ["webslm", worker.webslm],
    ["Shader bundle", worker.shader_bundle_hash],
    ["Started in", boot],
  ].filter(([, value]) => value);
  $("worker-info").replaceChildren(...rows.flatMap(([term, value]) => {
    const dt = document.createElement("dt");
    const dd = document.createElement("dd");
    dt.textContent = term;
    dd.textContent = value;
    return [dt, dd];
  }));
}
