// The chat page. It starts the engine (web/webslm.js: a Web Worker running Python), loads the
// default model, or the one named by ?model=, and wires the views together: the conversation
// (ui-chat.mjs), the model panel (ui-model.mjs), the engine badge and receipt (ui-engine.mjs)
// and the settings (ui-settings.mjs). window.webslm is the page's surface for users and tests.
//
// URL parameters: ?gpu=0 keeps the GPU out (the CPU path answers); ?gpu=force keeps an admitted
// GPU even where it is slower than the CPU path (by default the engine times both and keeps
// the faster, and a GPU found slower is not admitted again on later visits: "Measure the GPU
// again" times it afresh); ?model=<url> loads that .slm instead of the site's default model.
import * as chat from "./ui-chat.mjs";
import * as engineView from "./ui-engine.mjs";
import * as modelPanel from "./ui-model.mjs";
import { setTheme, showModelDefaults, wireTheme } from "./ui-settings.mjs";
import * as startCard from "./ui-start.mjs";

const $ = (id) => document.getElementById(id);

const params = new URLSearchParams(location.search);
const useGpu = params.get("gpu") !== "0";
const gpuOption = params.get("gpu") === "force" ? "force" : useGpu;
const firstModel = params.get("model") || "default";

// Set before anything is awaited, so a test can find it at once and wait on its fields.
const page = {
  engine: null,        // the Engine, once createEngine has resolved
  client: null,        // engine.protocol: the raw worker client, for tests only
  status: null,        // engine.worker: what the worker booted
  model: null,         // engine.model after a load; {error, code} when the first load failed
  admission: null,     // the last `admission` event's detail
  ready: false,        // a model is loaded and the engine can answer
  timings: {},         // {page_ready_s}: from navigation start to the first ready
  lastAnswer: null,    // the last answer's record (ui-chat.mjs), or its error
  ask: (prompt, settings) => chat.send(String(prompt), settings ?? {}),
  newChat: () => chat.newChat(),
  regenerate: () => chat.regenerate(),
  stop: () => chat.stop(),
  setTheme,
  loadModel,
};
window.webslm = page;

function setReady(ready, reason = null) {
  page.ready = ready;
  chat.setReady(ready, reason);
  if (ready && page.timings.page_ready_s === undefined) page.timings.page_ready_s = performance.now() / 1000;
}

// Load a model (a File, a URL string or "default"): what the file picker, the URL box and a
// dropped file call. The engine keeps the previous model when the new one fails, and the
// page says so; an answer in progress is stopped first.
let loading = false;

// Refused before anything starts: said in the model panel, like a failed load.
function refuse(message, code) {
  $("model-error").textContent = message;
  return Object.assign(new Error(message), { code });
}

// A picked or dropped file must be named .slm: a photo or a GGUF is refused by its name
// before a byte of it is read (the validator refuses a misnamed one by its first bytes).
const notSlm = (source) => typeof source?.name === "string" && typeof source.arrayBuffer === "function" && !/\.slm$/i.test(source.name);

async function loadModel(source) {
  const engine = page.engine;
  if (!engine) throw refuse("The engine is still starting: load the model again in a moment.", "no-engine");
  if (loading) throw refuse("A model is already loading: wait for it to finish, then load this one.", "busy");
  if (notSlm(source)) {
    const error = refuse(`"${source.name}" is not a .slm file: only webslm's .slm model files load here (the command line's \`webslm convert\` makes one from a GGUF).`, "not-slm");
    startCard.failStart(error.message);
    throw error;
  }
  loading = true;
  let previous = null;
  try {
    await chat.stopAndWait();
    previous = engine.model;
    setReady(false, "A model is loading: Send works once it is ready.");
    modelPanel.startLoad(source, { replacing: Boolean(previous) });
    startCard.beginStart(`Loading ${modelPanel.describeSource(source)}`);
    engineView.showLoading();
    await engine.load(source);
    page.model = engine.model;
    modelPanel.showModel(engine.model);
    engineView.showAfterLoad(engine, { gpuDisabled: !useGpu });
    showModelDefaults(engine.model.generation);
    startCard.endStart();
    return engine.model;
  } catch (error) {
    const said = modelPanel.showLoadFailure(error, source, previous);
    startCard.failStart(said);
    if (!previous) page.model = { error: error.message, code: error.code ?? null };
    throw error;
  } finally {
    loading = false;
    engineView.showEngine(engine);
    setReady(Boolean(engine.model), engine.model ? null : "No model is loaded: open a .slm file or enter its URL in Model & settings.");
    modelPanel.showCache(engine, engine.model?.artifact_sha256);
    modelPanel.showSiteModels(engine, engine.model?.artifact_sha256);
  }
}

// "Measure the GPU again" (shown where an earlier visit found the GPU slower than the CPU
// path and the engine went to the CPU without admitting it): the loaded model is admitted
// anew and timed (engine.measureGpu()); what it finds replaces what was kept.
async function measureGpuAgain() {
  const engine = page.engine;
  if (!engine?.model || loading) return;
  loading = true;
  try {
    await chat.stopAndWait();
    setReady(false, "The GPU is being measured: Send works once it is done.");
    startCard.beginStart("Measuring the GPU against the CPU");
    engineView.showLoading();
    await engine.measureGpu();
    startCard.endStart();
  } catch (error) {
    startCard.failStart([error.message, error.advice].filter(Boolean).join(" "));
  } finally {
    loading = false;
    engineView.showEngine(engine);
    setReady(Boolean(engine.model), engine.model ? null : "No model is loaded: open a .slm file or enter its URL in Model & settings.");
  }
}

async function removeCached(sha256) {
  await page.engine.models.remove(sha256);
  await modelPanel.showCache(page.engine, page.engine.model?.artifact_sha256);
}

// The engine's events drive the views: state (badge, note, the answer in progress),
// progress (the load's bars; an answer's prompt being read) and admission (the admission line).
function follow(engine) {
  engine.addEventListener("statechange", ({ detail }) => {
    engineView.showEngine(engine, detail);
    chat.followEngine(detail);
  });
  engine.addEventListener("progress", ({ detail }) => {
    if (detail.phase === "prefill" || detail.phase === "replay") {
      chat.followProgress(detail);
      return;
    }
    if (!loading) return;       // a load the page did not start (a tool on engine.protocol) is not shown
    modelPanel.showProgress(detail);
    startCard.showStartProgress(detail);
    if (detail.phase === "admission") engineView.showAdmissionStage(detail.stage);
  });
  engine.addEventListener("admission", ({ detail }) => {
    page.admission = detail;
    // with ?gpu=0 no admission runs: the "admission" is the CPU path being set up (showAfterLoad)
    if (useGpu) engineView.showAdmission(detail);
  });
}

// The worker (or the engine's script) could not start: nothing can answer, and the page says why.
function failStart(error) {
  engineView.showEngineFailure(error);
  startCard.failStart([error.message, error.advice].filter(Boolean).join(" "));
  setReady(false, "The engine did not start: nothing can answer (the note at the top says why).");
  page.model = { error: error.message, code: error.code ?? "worker-failed" };
  $("model-state").textContent = "No model: the engine did not start.";
  $("model-error").textContent = `Nothing can be loaded: the engine did not start (${error.code ?? "worker-failed"}).`;
  $("header-status").textContent = "The engine did not start";
  for (const id of ["model-file", "model-url", "load-url"]) $(id).disabled = true;
}

// The service worker keeps the page, the worker, Pyodide and the model for offline visits.
// It is a convenience: the page works without it, and the note says which case this is.
async function offerOffline(api) {
  const note = $("offline-note");
  try {
    const { ok, reason } = await api.registerOfflineSupport();
    note.textContent = ok ? "Works offline after this visit." : `Not available offline: ${reason}`;
  } catch (error) {
    note.textContent = `Not available offline: ${error.message}`;
  }
}

// Phones: the panel is a drawer over the conversation. Esc closes it (and is not taken as "stop").
function wireDrawer() {
  const panel = $("panel");
  const toggle = $("panel-toggle");
  const setOpen = (open) => {
    panel.classList.toggle("open", open);
    toggle.setAttribute("aria-expanded", String(open));
    $("backdrop").hidden = !open;
    (open ? $("panel-close") : toggle).focus();
  };
  toggle.addEventListener("click", () => setOpen(true));
  $("panel-close").addEventListener("click", () => setOpen(false));
  $("backdrop").addEventListener("click", () => setOpen(false));
  panel.addEventListener("keydown", (e) => {
    if (e.key === "Escape" && panel.classList.contains("open")) {
      e.preventDefault();
      setOpen(false);
    }
  });
}

async function start() {
  wireTheme();
  wireDrawer();
  chat.wireChat({
    getEngine: () => page.engine,
    onAnswer: (record) => { page.lastAnswer = record; },
    // a message sent: a failed load before it is old news (the model that answers is named in the panel)
    onSend: () => {
      startCard.dismissStart();
      $("model-error").textContent = "";
    },
  });
  modelPanel.wireModelControls({ load: loadModel, remove: removeCached });
  $("measure-gpu").addEventListener("click", () => measureGpuAgain());
  if (firstModel !== "default") $("model-url").value = firstModel;
  engineView.showStarting("Starting Python in a worker…");
  startCard.beginStart("Starting the engine");

  // Imported here rather than at the top so that a missing or broken engine script is
  // reported on the page instead of leaving it blank.
  let api;
  try {
    api = await import("./webslm.js");
  } catch (error) {
    failStart({ message: `The engine's script could not be loaded (${error.message}).`, advice: "Reload the page; if this persists, the site is incomplete." });
    return;
  }
  offerOffline(api);
  let engine;
  try {
    // model: null, then load(): the engine exists (and its events are followed) before the
    // first model arrives, and a failed first load still leaves an engine to load another.
    // The worker's boot is reported before there is an engine to listen to: through
    // onProgress. Everything later comes as the engine's progress events (follow()).
    const onProgress = (detail) => {
      if (detail.phase !== "boot") return;
      modelPanel.showProgress(detail);
      startCard.showStartProgress(detail);
    };
    engine = new api.Engine({ gpu: gpuOption, onProgress });
  } catch (error) {
    failStart(error);
    return;
  }
  page.engine = engine;
  page.client = engine.protocol;
  follow(engine);
  // The first model's download starts now, beside the worker's boot (Engine.load); a failure
  // is shown in the model panel. A boot that fails is the news, said last.
  const first = loadModel(firstModel).catch(() => {});
  try {
    await engine.booted;
  } catch (error) {
    await first;
    failStart(error);
    return;
  }
  page.status = engine.worker;
  engineView.showWorker(engine.worker);
  engineView.showEngine(engine);
  await first;
}

start();
