// The model panel: which model is loaded, loading another one (file picker, drag-and-drop
// anywhere on the page, or a URL), the progress of a load phase by phase, the error of a load
// that failed, and the models kept in the browser's cache.

import { sentence } from "./ui-engine.mjs";

const $ = (id) => document.getElementById(id);

function formatBytes(n) {
  if (!Number.isFinite(n)) return "?";
  if (n >= 1e9) return `${(n / 1e9).toFixed(2)} GB`;
  if (n >= 1e6) return `${(n / 1e6).toFixed(1)} MB`;
  return `${Math.round(n / 1e3)} kB`;
}

const SOURCES = { network: "downloaded", cache: "from cache", file: "from file" };

// A load's phases, as the engine's progress events name them (each has its row in
// index.html); done/total are bytes for the first three, pipelines and kernel families for
// the last two.
const PHASES = new Set(["download", "validate", "upload", "compile", "self-test"]);
const BYTE_PHASES = new Set(["download", "validate", "upload"]);
const UNITS = { compile: "pipelines", "self-test": "kernel families" };

function progressNumbers(phase, done, total) {
  if (BYTE_PHASES.has(phase)) {
    const mb = (n) => (n / 1e6).toFixed(1);
    return total ? `${mb(done)} / ${mb(total)} MB` : `${mb(done)} MB`;
  }
  return total ? `${done} / ${total} ${UNITS[phase]}` : `${done} ${UNITS[phase]}`;
}

// "the default model", "model.slm", "https://…/model.slm"
export function describeSource(source) {
  if (source === "default") return "the default model";
  if (typeof source === "string") return source;
  return source?.name || "the file";
}

function setLoadControlsDisabled(disabled) {
  for (const id of ["model-file", "model-url", "load-url"]) $(id).disabled = disabled;
}

export function startLoad(source, { replacing }) {
  $("model-error").textContent = "";
  if (!replacing) $("model-state").textContent = `Loading ${describeSource(source)}…`;
  $("progress").hidden = false;
  for (const row of document.querySelectorAll(".progress-row")) row.hidden = true;
  $("header-status").textContent = `Loading ${describeSource(source)}…`;
  setLoadControlsDisabled(true);
}

// The first phase reads the model's bytes: from the network, or from the cache or a file.
const READ_LABELS = { network: "Download", cache: "Read from the cache", file: "Read from the file" };

// One `progress` event: its phase's bar, label and numbers. "boot" (the worker starting) and
// "admission" (a stage starting, without numbers) go to the header line only.
export function showProgress({ phase, stage, done, total, source }) {
  if (phase === "boot" || phase === "admission") {
    const what = phase === "boot" ? "Starting Python in a worker" : "Checking the GPU";
    const words = stage === "speed" ? "timing a decode step against the CPU" : stage;   // the engine's choice
    $("header-status").textContent = stage ? `${what}: ${words}…` : `${what}…`;
    return;
  }
  if (!PHASES.has(phase)) return;
  const bar = $(`progress-${phase}`);
  const row = bar.closest(".progress-row");
  row.hidden = false;
  if (phase === "download") row.querySelector("label").textContent = READ_LABELS[source] ?? READ_LABELS.network;
  if (total) {
    bar.max = total;
    bar.value = Math.min(done, total);
  } else {
    bar.removeAttribute("value");   // indeterminate: the size is not known yet
  }
  const numbers = progressNumbers(phase, done ?? 0, total);
  $(`progress-${phase}-numbers`).textContent = numbers;
  $("header-status").textContent = `${row.querySelector("label").textContent} · ${numbers}`;
}

function endLoad() {
  $("progress").hidden = true;
  setLoadControlsDisabled(false);
}

// The loaded model: its name, size, encodings, where it came from and its identity.
export function showModel(model) {
  endLoad();
  $("model-error").textContent = "";
  const name = Object.assign(document.createElement("p"), { className: "model-name", textContent: model.name || "Unnamed model" });
  const facts = [
    formatBytes(model.bytes),
    model.encodings?.length ? model.encodings.join(", ") : null,
    SOURCES[model.source] ?? model.source,
    Number.isFinite(model.validation_seconds) ? `validated in ${model.validation_seconds.toFixed(1)} s` : null,
  ].filter(Boolean).join(" · ");
  const details = Object.assign(document.createElement("p"), { className: "model-facts", textContent: facts });
  const sha = Object.assign(document.createElement("p"), { className: "model-sha" });
  sha.append("sha256 ", Object.assign(document.createElement("code"), { textContent: model.artifact_sha256 }));
  $("model-state").replaceChildren(name, details, sha);
  $("header-status").textContent = model.name || "Model loaded";
}

// A failed load: one sentence of what went wrong, what to do, and which model still answers.
export function showLoadFailure(error, source, previous) {
  endLoad();
  // A file the validator refused: its sentence first, then the rule it broke (code and place),
  // as docs/slm-format.md names them; anything else: the error's own message.
  const artifact = error.code === "bad-artifact" && error.details?.sentence ? error.details : null;
  const said = artifact
    ? `${sentence(artifact.sentence).replace(/[.!?]$/, "")} (${artifact.code} at ${artifact.where}).`
    : sentence(error.message);
  const what = [said, error.advice].filter(Boolean).join(" ");
  const still = previous
    ? `${previous.name || "The previous model"} is still loaded and answering.`
    : "No model is loaded: open a .slm file or enter its URL.";
  const message = `Could not load ${describeSource(source)}: ${what} ${still}`;
  $("model-error").textContent = message;
  $("header-status").textContent = previous ? previous.name || "Model loaded" : "No model loaded";
  if (!previous) $("model-state").textContent = "No model loaded.";
  return message;
}

function cachedDate(at) {
  const date = new Date(at);   // an ISO timestamp
  return at && !Number.isNaN(date.getTime()) ? `cached ${date.toLocaleDateString()}` : null;
}

function cacheButton(className, text, label, data) {
  const button = Object.assign(document.createElement("button"), { type: "button", className, textContent: text });
  Object.assign(button.dataset, data);
  button.setAttribute("aria-label", label);
  return button;
}

// The cached models (one li each, with its Remove button) and the space they use.
export async function showCache(engine, currentSha) {
  let models, usage;
  try {
    [models, usage] = await Promise.all([engine.models.list(), engine.models.usage()]);
  } catch (error) {
    $("cache-list").replaceChildren();
    $("cache-usage").textContent = `The model cache cannot be read: ${error.message}`;
    return;
  }
  $("cache-list").replaceChildren(...models.map((m) => {
    const item = document.createElement("li");
    const text = document.createElement("div");
    const name = Object.assign(document.createElement("span"), { className: "cache-name", textContent: m.name || m.sha256.slice(0, 12) });
    const facts = [formatBytes(m.bytes), cachedDate(m.cached_at), m.sha256 === currentSha && "in use"].filter(Boolean).join(" · ");
    text.append(name, Object.assign(document.createElement("span"), { className: "cache-facts", textContent: facts }));
    item.append(text);
    if (m.sha256 !== currentSha) item.append(cacheButton("use", "Load", `Load ${m.name || m.sha256}`, { sha256: m.sha256 }));
    item.append(cacheButton("remove", "Remove", `Remove ${m.name || m.sha256} from the cache`, { sha256: m.sha256 }));
    return item;
  }));
  // usage and quota are the browser's estimate for the whole site (its offline copy too), if it gives one
  const space = usage.quota ? ` · this site uses ${formatBytes(usage.usage)} of ${formatBytes(usage.quota)} available` : "";
  $("cache-usage").textContent = models.length
    ? `${formatBytes(usage.models_bytes)} in ${models.length} cached model${models.length === 1 ? "" : "s"}${space}`
    : `No models cached yet${space}`;
}

// This site's models (assets/manifest.json: the default one, and any other set-up found
// cached): name, size, architecture and quantization, with a Load button but for the one in use.
export async function showSiteModels(engine, currentSha) {
  let models;
  try {
    models = await engine.models.available();
  } catch (error) {
    $("site-models").replaceChildren(Object.assign(document.createElement("li"), { textContent: error.message }));
    return;
  }
  $("site-models").replaceChildren(...models.map((m) => {
    const item = document.createElement("li");
    item.dataset.id = m.id;
    const text = document.createElement("div");
    const name = Object.assign(document.createElement("span"), { className: "cache-name", textContent: m.name || m.id });
    const facts = [formatBytes(m.bytes), m.architecture, m.quantization, m.default && "default",
                   m.artifact_sha256 === currentSha && "in use"].filter(Boolean).join(" · ");
    text.append(name, Object.assign(document.createElement("span"), { className: "cache-facts", textContent: facts }));
    item.append(text);
    if (m.artifact_sha256 !== currentSha) item.append(cacheButton("use", "Load", `Load ${m.name || m.id}`, { id: m.id }));
    return item;
  }));
}

const ignore = () => {};   // a failed load is shown by load() itself

// The ways in: file picker, URL box, a file dropped anywhere, a site model's Load, a cached
// model's Load and Remove.
// load(source) and remove(sha256) return promises.
export function wireModelControls({ load, remove }) {
  $("model-file").addEventListener("change", (e) => {
    const file = e.target.files[0];
    e.target.value = "";   // picking the same file again is a change too
    if (file) load(file).catch(ignore);
  });
  $("url-form").addEventListener("submit", (e) => {
    e.preventDefault();
    const url = $("model-url").value.trim();
    if (url) load(url).catch(ignore);
    else $("model-error").textContent = "Enter the address of a .slm file first.";
  });
  $("site-models").addEventListener("click", (e) => {
    const button = e.target.closest("button.use");
    if (button) load(button.dataset.id).catch(ignore);
  });
  $("cache-list").addEventListener("click", (e) => {
    const button = e.target.closest("button");
    if (button?.classList.contains("use")) load({ sha256: button.dataset.sha256 }).catch(ignore);
    if (!button?.classList.contains("remove")) return;
    button.disabled = true;
    remove(button.dataset.sha256).catch((error) => {
      button.disabled = false;
      $("cache-usage").textContent = `Could not remove it: ${error.message}`;
    });
  });
  wireDrop(load);
}

// The whole page takes a dropped file. dragenter/dragleave fire for every element crossed,
// so a counter tells when the drag has really left the page.
function wireDrop(load) {
  const overlay = $("drop-overlay");
  const carriesFiles = (e) => e.dataTransfer?.types?.includes("Files");
  let depth = 0;
  const hide = () => {
    depth = 0;
    overlay.hidden = true;
  };
  document.addEventListener("dragenter", (e) => {
    if (!carriesFiles(e)) return;
    depth += 1;
    overlay.hidden = false;
  });
  document.addEventListener("dragleave", (e) => {
    if (carriesFiles(e) && --depth <= 0) hide();
  });
  document.addEventListener("dragover", (e) => {
    if (!carriesFiles(e)) return;
    e.preventDefault();   // without this the browser would open the file instead
    e.dataTransfer.dropEffect = "copy";
  });
  document.addEventListener("drop", (e) => {
    if (!carriesFiles(e)) return;
    e.preventDefault();
    hide();
    const file = e.dataTransfer.files[0];
    if (file) load(file).catch(ignore);
  });
}
