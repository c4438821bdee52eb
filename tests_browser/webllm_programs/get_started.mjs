// WebLLM's "get started": create an engine with a progress callback, ask one question.
import * as webllm from "@mlc-ai/web-llm";

const progress = [];
const engine = await webllm.CreateMLCEngine("SmolLM2-135M-Instruct-q0f16-MLC", {
  initProgressCallback: (report) => progress.push(report),
});
const reply = await engine.chat.completions.create({
  messages: [{ role: "system", content: "Be brief." }, { role: "user", content: "What is the capital of France?" }],
  temperature: 0,
  max_tokens: 4,
});
export const results = {
  progress,
  reply,
  message: await engine.getMessage(),
  stats: await engine.runtimeStatsText(),
};
await engine.unload();
