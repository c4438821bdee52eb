// WebLLM's entry points over webslm's engine, so that a program written for WebLLM runs here
// with one change, its import:
//
//   import * as webllm from "@mlc-ai/web-llm";        // before
//   import * as webllm from "./webllm.mjs";           // after
//   const engine = await webllm.CreateMLCEngine("SmolLM2-135M-Instruct-q0f16-MLC",
//                                               { initProgressCallback: (p) => show(p.text) });
//   const reply = await engine.chat.completions.create({ messages });
//
// What maps and what does not is docs/js-api.md ("WebLLM programs"). An engine option or a
// model id this site cannot serve is refused with a WebSlmError that says so.
import { Engine, WebSlmError } from "./webslm.js";

export { WebSlmError };

// The engine a WebLLM program gets, from the query of the URL this module is imported by,
// since WebLLM's MLCEngineConfig has no such key and the program stays unchanged but for its
// import: "webllm.mjs?gpu=force" keeps an admitted GPU untimed (as the page's ?gpu=force),
// "webllm.mjs?gpu=0" answers on the CPU path without trying the GPU (?gpu=0); without it the
// engine times an admitted GPU against the CPU path and keeps the faster (docs/js-api.md).
const GPU_BY_QUERY = { force: "force", 0: false, 1: true };
const gpuQuery = new URL(import.meta.url).searchParams.get("gpu");
if (gpuQuery !== null && !Object.hasOwn(GPU_BY_QUERY, gpuQuery)) {
  throw new WebSlmError("bad-request", `webllm.mjs?gpu=${gpuQuery.slice(0, 20)}: gpu is force, 0 or 1.`);
}
const GPU = gpuQuery === null ? true : GPU_BY_QUERY[gpuQuery];

// WebLLM's MLCEngineConfig keys this engine takes. logLevel is accepted for WebLLM programs
// that set it; webslm writes nothing to the console, so every level means the same.
const CONFIG_KEYS = new Set(["initProgressCallback", "appConfig", "logLevel"]);
const LOG_LEVELS = new Set(["TRACE", "DEBUG", "INFO", "WARN", "ERROR", "SILENT"]);

// MLCEngineConfig -> webslm's engine options. An appConfig's model_list entries whose `model`
// is a .slm file become ids reload() knows; an entry pointing at MLC weights is refused when
// it is asked for (as any other id this site does not have).
function engineOptions(config = {}) {
  for (const key of Object.keys(config ?? {})) {
    if (!CONFIG_KEYS.has(key)) {
      throw new WebSlmError("bad-request", `engineConfig.${key} is not supported here (webslm takes ${[...CONFIG_KEYS].join(", ")}).`);
    }
  }
  const { initProgressCallback = null, appConfig = null, logLevel = "WARN" } = config ?? {};
  if (initProgressCallback !== null && typeof initProgressCallback !== "function") {
    throw new WebSlmError("bad-request", "engineConfig.initProgressCallback must be a function.");
  }
  if (!LOG_LEVELS.has(logLevel)) throw new WebSlmError("bad-request", `engineConfig.logLevel must be one of ${[...LOG_LEVELS].join(", ")}.`);
  const appModels = [];
  for (const entry of appConfig?.model_list ?? []) {
    if (typeof entry?.model_id === "string" && typeof entry.model === "string" && /\.slm([?#].*)?$/.test(entry.model)) {
      appModels.push({ model_id: entry.model_id, url: entry.model });
    }
  }
  return { initProgressCallback, appModels, unloadKeepsWorker: true, gpu: GPU };
}

// WebLLM's MLCEngine: `new MLCEngine(config)`, then `await engine.reload(modelId)`.
export class MLCEngine extends Engine {
  constructor(engineConfig = {}) {
    super(engineOptions(engineConfig));
  }
}

// WebLLM's CreateMLCEngine(modelId, engineConfig, chatOpts): an engine with the model loaded.
export async function CreateMLCEngine(modelId, engineConfig = {}, chatOpts = undefined) {
  const engine = new MLCEngine(engineConfig);
  await engine.booted;
  await engine.reload(modelId, chatOpts);
  return engine;
}
