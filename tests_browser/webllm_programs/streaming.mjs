// WebLLM's streaming example, with the usage chunk (stream_options.include_usage) and logprobs.
import * as webllm from "@mlc-ai/web-llm";

const engine = await webllm.CreateMLCEngine("SmolLM2-135M-Instruct-q0f16-MLC");
const chunks = await engine.chat.completions.create({
  messages: [
    { role: "system", content: "Be brief." },
    { role: "user", content: [{ type: "text", text: "What is the capital of France?" }] },
  ],
  stream: true,
  stream_options: { include_usage: true },
  temperature: 0,
  max_tokens: 4,
  logprobs: true,
  top_logprobs: 2,
});
let text = "";
let usage = null;
const finishReasons = [];
const logprobs = [];
let chunksWithoutChoices = 0;
let final = null;
for await (const chunk of chunks) {
  if (chunk.choices.length === 0) chunksWithoutChoices += 1;
  if (chunk.choices[0]?.finish_reason) final = chunk;
  text += chunk.choices[0]?.delta.content || "";
  if (chunk.choices[0]?.finish_reason) finishReasons.push(chunk.choices[0].finish_reason);
  logprobs.push(...(chunk.choices[0]?.logprobs?.content ?? []));
  if (chunk.usage) usage = chunk.usage;
}
export const results = { text, usage, finishReasons, logprobs, chunksWithoutChoices, final, message: await engine.getMessage() };
await engine.unload();
