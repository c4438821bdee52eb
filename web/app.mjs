// The page: starts the worker, shows what it booted and what the GPU check found.
// (The chat UI arrives with the engine; until then this is the status page.)
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

async function main() {
  const client = new WorkerClient(new URL("./worker/worker.mjs", import.meta.url));
  window.webslm = { client, status: null, gpu: null, model: null };
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
}

main();
