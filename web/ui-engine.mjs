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

// Python's and the worker's sentences start in lower case and may lack the full stop. Only a
// plain word is capitalised: a sentence that starts with a URL, a path or a name from code
// ("https://…/m.slm could not be downloaded", "load-model: cancelled") starts as it is.
export const sentence = (text) => {
  const trimmed = String(text).trim();
  const plainWord = /^[a-z]+(?:'[a-z]+)?(?=[\s,;.!?]|:\s|$)/.test(trimmed);
  return (plainWord ? trimmed.charAt(0).toUpperCase() + trimmed.slice(1) : trimmed) + (/[.!?]$/.test(trimmed) ? "" : ".");
};

// The GPU loss arrives as statechange {to: "Lost", code, sentence}; the engine's cpuReason
// carries it from CPURebuild on. Either way the note says the same thing.
function lossReason(engine, detail) {
  if (engine.cpuReason?.reason === "GPU lost") return engine.cpuReason;
  if (detail?.to === "Lost") return detail.cpu_reason ?? { reason: "GPU lost", code: detail.code, sentence: detail.sentence };
  return null;
}

// "17.2 s", "310 ms", "2.10 ms"
const duration = (ms) => (ms >= 1000 ? `${(ms / 1000).toFixed(1)} s` : ms >= 10 ? `${Math.round(ms)} ms` : `${ms.toFixed(2)} ms`);

// The decode steps timed when the engine was chosen (engine.choice), in a few words; "" untimed.
// A GPU step given up on (gpu_step_finished false) took more than the time shown.
function choiceText(choice) {
  if (!choice?.gpu_step_ms || !choice.cpu_step_ms) return "";
  const more = choice.gpu_step_finished === false ? "more than " : "";
  return `a decode step takes ${more}${duration(choice.gpu_step_ms)} on the GPU, ${duration(choice.cpu_step_ms)} on the CPU`;
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
  // a sentence that says it already ("...: answering on the CPU") is not prefixed with it again
  const text = /answering on the CPU/i.test(reason) ? reason : `Answering on the CPU${why.code ? ` (${why.code})` : ""}: ${reason}`;
  return [text, why.advice].filter(Boolean).join(" ");
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
  else if (backendOf(state) === "gpu") {
    setBadge(gpuLabel(engine.features), "gpu", [title, `tier ${engine.tier}`, choiceText(engine.choice)].filter(Boolean).join(" · "));
  } else if (backendOf(state) === "cpu") {
    // the tooltip says why, as the note does (a GPU slower than the CPU: by how much)
    const why = engine.cpuReason?.sentence;
    setBadge("CPU", "cpu", [title, why && sentence(why)].filter(Boolean).join(" · "));
  }
  else if (NO_MODEL_STATES.has(state)) setBadge("No model", "off", title);
  const note = $("engine-note");
  note.textContent = noteText(engine, detail);
  delete note.dataset.kind;
  // an earlier visit's verdict kept the GPU out: the user may have it timed again
  $("measure-gpu").hidden = !(backendOf(state) === "cpu" && engine.cpuReason?.code === "gpu-slower-remembered");
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
  if (result.remembered) {
    const choice = result.engine?.choice ?? {};
    const more = choice.gpu_step_finished === false ? "more than " : "";
    const steps = choice.gpu_step_ms && choice.cpu_step_ms
      ? `one decode step took ${more}${duration(choice.gpu_step_ms)} on the GPU and ${duration(choice.cpu_step_ms)} on the CPU`
      : "the GPU was slower than the CPU";
    text = `The GPU was not tried: on an earlier visit (${choice.remembered_on ?? "recently"}) ${steps}, so the CPU answers.`;
  } else if (result.admitted) {
    const cases = Number.isInteger(result.self_test_cases) ? `${result.self_test_cases} kernel self-tests agree` : "the kernel self-tests agree";
    text = `Admitted at tier ${result.tier} in ${result.seconds.toFixed(1)} s: ${cases} with the CPU oracle.`;
    const choice = result.engine?.choice;
    if (result.engine?.backend === "cpu" && choice?.backend === "cpu") {
      text += ` Not used: ${choiceText(choice)}, so the CPU answers.`;
    } else if (choice?.gpu_step_ms) {
      text += ` Kept: ${choiceText(choice)}.`;
    }
  } else if (result.code === "gpu-slower" && result.engine?.choice?.gpu_step_ms) {
    // admission's step-floor stage: the step cannot beat the CPU's, so nothing more was compiled
    text = `Not used: ${choiceText(result.engine.choice)}, found in ${result.seconds.toFixed(1)} s before compiling the rest, so the CPU answers.`;
  } else {
    const where = [result.code, result.stage && `at ${result.stage}`].filter(Boolean).join(" ");
    text = `The GPU was not admitted${where ? ` (${where})` : ""}: ${sentence(result.sentence || "no reason given")} The CPU answers.`;
  }
  $("admission-state").textContent = text;
}

const STAGE_WORDS = { speed: "timing a decode step against the CPU", "step-floor": "timing its costliest kernels against the CPU" };

export function showAdmissionStage(stage) {
  $("admission-state").textContent = `Checking the GPU: ${STAGE_WORDS[stage] ?? stage}…`;
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
