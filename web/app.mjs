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

// Admission: the worker proves on this GPU that the model fits and computes correctly
// (webslm.admission); the badge says which engine will answer, and why.
async function admitModel(client) {
  const onStage = (e) => { $("admission-state").textContent = `Admitting the model on the GPU: ${e.detail.stage}…`; };
  client.addEventListener("admission-stage", onStage);
  try {
    const result = await client.request("admit", { featureLevel: "auto", fault: null });
    const badge = $("engine-badge");
    if (result.admitted) {
      const label = ["GPU", ...result.features.map((f) => (f === "shader-f16" ? "f16" : f))].join(" · ");
      badge.textContent = result.features.length ? label : "GPU · f32";
      badge.className = "badge ok";
      $("admission-state").textContent = `Admitted at tier ${result.tier} in ${result.seconds.toFixed(1)} s: ${result.self_test_cases} kernel self-tests agree with the CPU oracle.`;
    } else {
      badge.textContent = "CPU";
      badge.className = "badge bad";
      $("admission-state").textContent = `The GPU was not admitted (${result.code} at ${result.stage}): ${result.sentence}`;
    }
    $("receipt").textContent = result.receipt_text;
    return result;
  } catch (error) {
    $("admission-state").textContent = `Admission could not run: ${error.message}`;
    return { error: error.message };
  } finally {
    client.removeEventListener("admission-stage", onStage);
  }
}

async function main() {
  const client = new WorkerClient(new URL("./worker/worker.mjs", import.meta.url));
  window.webslm = { client, status: null, gpu: null, model: null, admission: null };
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
