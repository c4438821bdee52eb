// The start, where the user looks: while the engine boots and a model loads, a card in the
// conversation area (on a phone the model panel with its bars is a closed drawer) says what
// is happening now, moves one bar through every step (the worker's boot, the download, the
// validation, and on a GPU the upload, pipeline compilation, self-tests and the timing of a
// decode step against the CPU), counts the seconds of the step in progress (some take tens
// of seconds without a progress event), and lists the steps done with their time. A load
// that fails says so here too; the card goes when a model is ready or a message is sent.
import { describe, fraction } from "./init-progress.mjs";

const $ = (id) => document.getElementById(id);

// The steps of a start, by key: a progress phase, or an admission stage that takes time
// without progress events of its own ("gpu": the short stages before the upload; "checks":
// the GPU's error scopes after the self-tests; "speed": the engine choice's timing; "floor":
// admission's step-floor stage on a software adapter, which may end the GPU's part).
const STEP_NAMES = {
  boot: "Starting Python in a worker",
  download: "Downloading the model",
  validate: "Checking the model",
  gpu: "Preparing the GPU",
  upload: "Uploading the weights to the GPU",
  compile: "Compiling GPU pipelines",
  "self-test": "Testing the GPU's kernels against the CPU",
  checks: "Checking the GPU for errors",
  speed: "Timing a decode step on the GPU and on the CPU",
  floor: "Timing the GPU's costliest kernels against the CPU",
};
const READING = { cache: "Reading the model from the cache", file: "Reading the model file" };
// ("step-floor" is entered on every adapter but runs on software ones only: its step opens on
// its own progress event, phase "floor", not on the stage's.)
const STAGE_STEPS = { allocate: "upload", "step-floor": "upload", tune: "compile", compile: "compile", "self-test": "self-test", scopes: "checks", publish: "checks", speed: "speed" };
// where the bar stands when a step starts (the progress events move it on within the step)
const STEP_START = { gpu: 0.72, checks: 0.99, speed: 0.99 };

let steps = [];          // {key, name, started, ended, numbers, now}: this start's steps, in order
let at = 0;              // the bar's position, 0..1: it never goes back within one start
let timer = null;        // redraws the running step's seconds while nothing else arrives

const seconds = (ms) => `${(ms / 1000).toFixed(ms < 10_000 ? 1 : 0)} s`;

// The step a progress event belongs to, or null.
function stepOf({ phase, stage }) {
  if (phase === "admission") return STAGE_STEPS[stage] ?? "gpu";
  return phase in STEP_NAMES ? phase : null;
}

// The step with this key: the running one, an earlier one (a late event of a step already
// left: it only updates that step's numbers), or a new one that starts now, which ends the
// steps still running; but the worker's boot goes on while the model downloads (the worker
// reads it from the start: worker.mjs startLoad), until the model's validation begins.
function stepFor(key, detail) {
  const found = steps.find((step) => step.key === key);
  if (found) return found;
  const now = performance.now();
  for (const step of steps) {
    if (step.ended === null && !(step.key === "boot" && key === "download")) step.ended = now;
  }
  const name = key === "download" ? READING[detail.source] ?? STEP_NAMES.download : STEP_NAMES[key];
  const step = { key, name, started: now, ended: null, numbers: "", now: name };
  steps.push(step);
  $("start-step").textContent = `${name}…`;     // a live region: a screen reader says each step once
  return step;
}

function draw() {
  const current = steps.at(-1);
  $("start-steps").replaceChildren(...steps.map((step) => {
    const li = document.createElement("li");
    li.className = step.ended === null ? "running" : "done";
    const took = seconds((step.ended ?? performance.now()) - step.started);
    li.append(Object.assign(document.createElement("span"), { className: "step-name", textContent: step.name }),
              Object.assign(document.createElement("span"), { className: "step-time", textContent: [step.numbers, took].filter(Boolean).join(" · ") }));
    return li;
  }));
  const bar = $("start-bar");
  bar.value = at;
  bar.setAttribute("aria-valuetext", `${Math.round(at * 100)} percent`);
  $("start-now").textContent = current && current.ended === null ? `${current.now}…` : "";
}

// A start begins (the engine's boot, or a model's load): the card shows with this title.
// A load right after the boot continues the same start (its steps stay listed).
export function beginStart(title) {
  const card = $("start");
  if (timer === null) {
    steps = [];
    at = 0;
    timer = setInterval(draw, 500);
  }
  card.hidden = false;
  delete card.dataset.failed;
  $("start-title").textContent = title;
  $("start-error").textContent = "";
  draw();
  card.scrollIntoView?.({ block: "nearest" });
}

// One progress event of the start (the engine's, or the worker's boot).
export function showStartProgress(detail) {
  if ($("start").hidden || timer === null) return;
  const key = stepOf(detail);
  if (key === null) return;
  const step = stepFor(key, detail);
  if (detail.phase !== "admission") {
    step.now = describe(detail);
    if (detail.total && (key === "compile" || key === "self-test")) step.numbers = `${detail.done} of ${detail.total}`;
  } else if (key === "gpu") {
    step.now = `${STEP_NAMES.gpu}: ${detail.stage}`;
  }
  const where = key in STEP_START ? STEP_START[key] : fraction(detail.phase === "admission" ? { phase: key, done: 0, total: 0 } : detail);
  if (where !== null) at = Math.max(at, where);
  draw();
}

// The model is ready: the card goes (its steps are in the model panel's bars too).
export function endStart() {
  clearInterval(timer);
  timer = null;
  $("start").hidden = true;
}

// The load failed: the card says so, where the user looks, until the next start or message.
export function failStart(message) {
  clearInterval(timer);
  timer = null;
  for (const step of steps) if (step.ended === null) step.ended = performance.now();
  const card = $("start");
  card.hidden = false;
  card.dataset.failed = "";
  $("start-title").textContent = "The model did not load";
  $("start-now").textContent = "";
  $("start-error").textContent = message;
  $("start-step").textContent = "";
  draw();
}

// A message was sent: an old failure is no longer news.
export function dismissStart() {
  if (timer === null) $("start").hidden = true;
}
