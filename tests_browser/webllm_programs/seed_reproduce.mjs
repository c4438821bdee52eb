// WebLLM's seed-to-reproduce: the same seed gives the same answer (the first of n choices
// is drawn with the request's seed, the next with seed + 1); the penalties and a logit bias
// take part in the sampling.
import * as webllm from "@mlc-ai/web-llm";

const engine = await webllm.CreateMLCEngine("SmolLM2-135M-Instruct-q0f16-MLC");
const request = {
  messages: [{ role: "system", content: "Be brief." }, { role: "user", content: "Name a colour." }],
  temperature: 1.5,
  top_p: 1,
  seed: 42,
  max_tokens: 2,
  frequency_penalty: 0.5,
  presence_penalty: 0.5,
  logit_bias: { "28": -100 },
};
const a = await engine.chat.completions.create(request);
const both = await engine.chat.completions.create({ ...request, n: 2 });
export const results = { a, both };
await engine.unload();
