// WebLLM's seed-to-reproduce: the same seed gives the same answer (the first of n choices
// is drawn with the request's seed, the next with seed + 1); the penalties and a logit bias
// take part in the sampling; JSON mode answers with (a prefix of) a JSON object.
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
const json = await engine.chat.completions.create({
  messages: [{ role: "system", content: "Answer in JSON." }, { role: "user", content: "Describe a cat." }],
  response_format: { type: "json_object" },
  temperature: 0.7,
  seed: 1,
  max_tokens: 12,
});
export const results = { a, both, json };
await engine.unload();
