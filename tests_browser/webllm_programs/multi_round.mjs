// WebLLM's multi-round chat: the conversation grows by the answer and a new question.
import * as webllm from "@mlc-ai/web-llm";

const engine = await webllm.CreateMLCEngine("SmolLM2-135M-Instruct-q0f16-MLC");
const messages = [{ role: "system", content: "Be brief." }, { role: "user", content: "What is the capital of France?" }];
const first = await engine.chat.completions.create({ messages, temperature: 0, max_tokens: 4 });
messages.push(first.choices[0].message);
messages.push({ role: "user", content: "And of Italy?" });
const second = await engine.chat.completions.create({ messages, temperature: 0, max_tokens: 2 });
await engine.resetChat();
const afterReset = await engine.chat.completions.create({ messages, temperature: 0, max_tokens: 2 });
export const results = { first, second, afterReset };
await engine.unload();
