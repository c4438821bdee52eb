// The page: starts the worker, shows what it booted and what the GPU check found, which
// engine answers (GPU or CPU, kept current from the worker's engine-state events), and a
// minimal chat whose answers stream in with their tokens/s and time to first token.
import { WorkerClient } from "./worker-client.mjs";

const $ = (id) => document.getElementById(id);

function showStatus(rows, list = $("status")) {
  list.replaceChildren();
  for (const [term, value] of rows) {
    const dt = document.createElement("dt");
    const dd = document.createElement("dd");
    dt.textContent = term;
    dd.textContent = value;
    list.append(dt, dd);
  }
}

// "auto": Python picks the adapter (a real GPU over a software fallback, core over compatibility).
const probeGpu = (client) => client.request("gpu-probe", { featureLevel: "auto", seed: 0 });

// Browsers may withhold adapter details (privacy); show what there is.
function adapterName(adapter) {
  const name = [adapter.vendor, adapter.architecture].filter(Boolean).join(" ") || adapter.description || "unnamed adapter";
  return adapter.is_fallback ? `${name} (software fallback)` : name;
}

function describeGpu(report) {
  if (!report.adapter) return { text: "No WebGPU adapter in this browser: answers will come from the CPU path.", ok: true };
  const features = report.adapter.features;
  const label = ["f32", features.includes("shader-f16") && "f16", features.includes("subgroups") && "subgroups"].filter(Boolean).join(" · ");
  const cases = report.cases.filter((c) => c.passed).length;
  const text = `${adapterName(report.adapter)} · ${report.feature_level} · tier ${report.tier} (${label}) · kernel check ${cases}/${report.cases.length} ${report.outcome}`;
  return { text, ok: report.outcome === "passed" };
}

const megabytes = (n) => `${(n / 1048576).toFixed(1)} MB`;

// The default model named by the site's manifest: streamed into the worker and validated there.
async function loadDefaultModel(client) {
  const manifest = await (await fetch(new URL("./assets/manifest.json", import.meta.url))).json();
  const entry = (manifest.models ?? []).find((m) => m.default);
  if (!entry) {
    $("model-state").textContent = "No default model in this site's assets.";
    return { absent: true };
  }
  const bar = $("model-progress");
  bar.hidden = false;
  $("model-state").textContent = `Downloading and validating ${entry.name}…`;
  const onProgress = (e) => {
    if (e.detail.url !== `assets/${entry.file}`) return;
    bar.value = e.detail.received / (e.detail.total ?? entry.bytes);
  };
  client.addEventListener("load-progress", onProgress);
  try {
    const model = await client.request("load-model", { url: `assets/${entry.file}` });
    if (model.artifact_sha256 !== entry.artifact_sha256) throw new Error(`the model's sha256 ${model.artifact_sha256} is not the one this site lists`);
    bar.value = 1;
    $("model-state").textContent = `${entry.name}: valid.`;
    $("model-state").className = "ok";
    const a = model.architecture;
    showStatus([
      ["Size", `${megabytes(model.bytes)}, ${model.tensors} tensors (${model.encodings.join(", ")})`],
      ["Shape", `${a.n_layers} layers · hidden ${a.hidden} · ${a.n_heads} heads / ${a.n_kv_heads} KV · vocab ${a.vocab} · context ${a.context_length}`],
      ["sha256", model.artifact_sha256],
      ["Validated", `in ${model.validation_seconds.toFixed(2)} s (${model.total_seconds.toFixed(2)} s with the download)`],
    ], $("model"));
    return model;
  } catch (error) {
    $("model-state").textContent = `The model could not be loaded: ${error.message}`;
    $("model-state").className = "bad";
    return { error: error.message, code: error.code };
  } finally {
    client.removeEventListener("load-progress", onProgress);
    bar.hidden = true;
  }
}

// Admission: the worker proves on this GPU that the model fits and computes correctly
// (webslm.admission), then holds the engine for it; the badge says which engine answers, and why.
async function admitModel(client) {
  const onStage = (e) => { $("admission-state").textContent = `Admitting the model on the GPU: ${e.detail.stage}…`; };
  client.addEventListener("admission-stage", onStage);
  try {
    const result = await client.request("admit", { featureLevel: "auto", fault: null });
    if (result.admitted) {
      const label = ["GPU", ...result.features.map((f) => (f === "shader-f16" ? "f16" : f))].join(" · ");
      engine.gpuLabel = result.features.length ? label : "GPU · f32";
      $("admission-state").textContent = `Admitted at tier ${result.tier} in ${result.seconds.toFixed(1)} s: ${result.self_test_cases} kernel self-tests agree with the CPU oracle.`;
    } else {
      $("admission-state").textContent = `The GPU was not admitted (${result.code} at ${result.stage}): ${result.sentence}`;
    }
    Object.assign(engine, result.engine);
    showEngine();
    $("receipt").textContent = result.receipt_text;
    return result;
  } catch (error) {
    $("admission-state").textContent = `Admission could not run: ${error.message}`;
    return { error: error.message };
  } finally {
    client.removeEventListener("admission-stage", onStage);
  }
}

// The engine as the worker reports it: every state change (py/webslm/engine/states.py) is an
// engine-state event, so the badge follows a GPU lost in the middle of an answer at once.
const GPU_STATES = new Set(["Probing", "Preparing", "GPUReady", "Generating"]);
const CPU_STATES = new Set(["CPUReady", "CPUGenerating", "CPURebuild", "Lost", "VisibleFailure"]);
const engine = { state: "Empty", backend: null, cpu_reason: null, gpuLabel: "GPU", events: [] };

function onEngineState({ detail }) {
  const { protocol, id, type, event: name, ...change } = detail;
  engine.events.push({ ...change, at_ms: Math.round(performance.now()) });
  if (engine.events.length > 500) engine.events.splice(0, engine.events.length - 500);
  engine.state = change.to;
  if (GPU_STATES.has(change.to)) engine.backend = "gpu";
  else if (CPU_STATES.has(change.to)) engine.backend = "cpu";
  else if (change.to === "Empty") engine.backend = null;
  engine.cpu_reason = change.cpu_reason ?? null;
  showEngine();
}

function describeReason(why) {
  if (!why) return "";
  if (why.reason === "GPU lost") return `The GPU was lost (${why.code}): ${why.sentence}. Answers continue on the CPU path.`;
  const where = why.stage ? ` at ${why.stage}` : "";
  return `On the CPU path: ${why.reason} (${why.code}${where}).`;
}

function showEngine() {
  const badge = $("engine-badge");
  if (engine.backend === "gpu" && engine.state !== "Lost") {
    badge.textContent = engine.gpuLabel;
    badge.className = "badge ok";
    badge.title = `engine: ${engine.state}`;
    $("engine-note").textContent = "";
  } else if (engine.backend === "cpu") {
    badge.textContent = "CPU";
    badge.className = "badge bad";
    badge.title = `engine: ${engine.state}${engine.cpu_reason ? ` · ${engine.cpu_reason.code}` : ""}`;
    $("engine-note").textContent = describeReason(engine.cpu_reason);
  }
  const idle = ["GPUReady", "CPUReady"].includes(engine.state);
  $("send").disabled = $("prompt").disabled = !idle || asking !== null;
}

// One question, one answer: the text streams in as the worker commits it; under it, the
// answer's tokens/s, time to first token and the engine(s) that produced it.
let asking = null;
const rate = (x) => (x >= 1 || x === 0 ? x.toFixed(1) : x.toPrecision(2));   // 0.047, not 0.0
const backendName = (b) => (b === "gpu" ? "GPU" : b === "cpu" ? "CPU" : "?");

async function ask(client, prompt, settings = {}) {
  if (asking) throw new Error("an answer is already being generated");
  const item = document.createElement("li");
  const question = Object.assign(document.createElement("p"), { className: "question", textContent: prompt });
  const answer = Object.assign(document.createElement("p"), { className: "answer" });
  const meta = Object.assign(document.createElement("p"), { className: "answer-meta", textContent: "…" });
  item.append(question, answer, meta);
  $("answers").append(item);
  const sent = performance.now();
  let first = null;
  const seen = [];
  const { id, result } = client.start("generate", { messages: [{ role: "user", content: prompt }], settings });
  asking = { id, item };
  const onDelta = ({ detail }) => {
    if (detail.request !== id) return;
    if (first === null) first = performance.now() - sent;
    answer.textContent += detail.text;
    if (seen.at(-1) !== detail.backend) seen.push(detail.backend);
    meta.textContent = `${seen.map(backendName).join(" → ")} · generating…`;
  };
  client.addEventListener("delta", onDelta);
  $("stop").disabled = false;
  showEngine();
  try {
    const reply = await result;
    const ttft = first === null ? null : first / 1000;
    const timings = { ...reply.timings, page_time_to_first_token_s: ttft, page_total_s: (performance.now() - sent) / 1000 };
    const done = { ...reply, timings, request: id, shown_text: answer.textContent };
    const parts = [
      `${reply.usage?.completion_tokens ?? 0} tokens`,
      `${rate(reply.timings?.decode_tokens_per_s ?? 0)} tokens/s`,
      ttft === null ? "no text" : `first token ${ttft.toFixed(2)} s`,
      (reply.backends ?? [reply.backend]).map(backendName).join(" → "),
    ];
    if (reply.finish_reason === "abort") parts.push("stopped");
    if (reply.finish_reason === "length") parts.push("length limit");
    meta.textContent = parts.join(" · ");
    meta.dataset.tokensPerS = reply.timings?.decode_tokens_per_s ?? "";
    meta.dataset.ttftS = ttft ?? "";
    window.webslm.lastAnswer = done;
    return done;
  } catch (error) {
    meta.textContent = `The answer failed: ${error.message}`;
    window.webslm.lastAnswer = { error: error.message, code: error.code, request: id };
    throw error;
  } finally {
    client.removeEventListener("delta", onDelta);
    asking = null;
    $("stop").disabled = true;
    showEngine();
  }
}

function wireChat(client) {
  const form = $("ask-form");
  const prompt = $("prompt");
  form.addEventListener("submit", (e) => {
    e.preventDefault();
    const text = prompt.value.trim();
    if (!text || asking) return;
    prompt.value = "";
    ask(client, text).catch(() => {});
  });
  prompt.addEventListener("keydown", (e) => {
    if (e.key === "Enter" && !e.shiftKey) {
      e.preventDefault();
      form.requestSubmit();
    }
  });
  $("stop").addEventListener("click", () => client.request("abort").catch(() => {}));
}

async function main() {
  const client = new WorkerClient(new URL("./worker/worker.mjs", import.meta.url));
  window.webslm = {
    client, status: null, gpu: null, model: null, admission: null,
    engine,                 // {state, backend, cpu_reason, events}: kept current from engine-state events
    lastAnswer: null,       // the last answer: text, finish_reason, usage, timings (worker and page), backends
    ask: (prompt, settings) => ask(client, prompt, settings),
  };
  client.addEventListener("engine-state", onEngineState);
  wireChat(client);
  client.addEventListener("booting", (e) => { $("engine-state").textContent = `Loading ${e.detail.stage}…`; });
  try {
    await client.ready;
  } catch (error) {
    $("engine-state").textContent = `The worker could not start: ${error.message}`;
    $("engine-state").className = "bad";
    return;
  }
  const status = await client.request("status");
  window.webslm.status = status;
  $("engine-state").textContent = `Worker ready in ${(status.boot.total_ms / 1000).toFixed(1)} s.`;
  const rows = [
    ["Pyodide", status.pyodide], ["Python", status.python], ["numpy", status.numpy], ["webslm", status.webslm],
    ["Shader bundle", status.shader_bundle_hash],
    ["Boot", `Pyodide ${status.boot.pyodide_ms} ms · numpy ${status.boot.numpy_ms} ms · webslm ${status.boot.webslm_ms} ms`],
    ["WebGPU", status.has_navigator_gpu ? "checking…" : "no WebGPU (navigator.gpu is absent)"],
  ];
  showStatus(rows);
  window.webslm.model = await loadDefaultModel(client);
  try {
    const report = await probeGpu(client);
    window.webslm.gpu = report;
    const { text, ok } = describeGpu(report);
    rows[rows.length - 1][1] = report.adapter ? `${adapterName(report.adapter)} · ${report.feature_level} · tier ${report.tier}` : "no WebGPU adapter";
    showStatus(rows);
    $("gpu-summary").textContent = text;
    $("gpu-summary").className = ok ? "ok" : "bad";
    $("gpu-details").textContent = JSON.stringify(report, null, 1);
  } catch (error) {
    window.webslm.gpu = { error: error.message };
    $("gpu-summary").textContent = `GPU check failed: ${error.message}`;
    $("gpu-summary").className = "bad";
  }
  if (window.webslm.model && !window.webslm.model.error && !window.webslm.model.absent) {
    window.webslm.admission = await admitModel(client);
  } else {
    $("admission-state").textContent = "No model to admit.";
    window.webslm.admission = { admitted: false, code: "no-model" };
  }
}

main();
