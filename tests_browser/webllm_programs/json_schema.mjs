// WebLLM's JSON mode with a schema: the schema given as WebLLM's examples give it (JSON text
// under response_format.schema) and as OpenAI's json_schema; the answer always parses and
// matches. A keyword outside the supported subset, and tools on a model whose chat template
// has none, are refused with a reason before any generation.
import * as webllm from "@mlc-ai/web-llm";

const engine = await webllm.CreateMLCEngine("SmolLM2-135M-Instruct-q0f16-MLC");
const schema = {
  type: "object",
  properties: { colour: { enum: ["red", "green", "blue"] }, primary: { type: "boolean" } },
  required: ["colour", "primary"],
  additionalProperties: false,
};
const messages = [
  { role: "system", content: "Answer in JSON." },
  { role: "user", content: "Name a primary colour." },
];
const asWebllm = await engine.chat.completions.create({
  messages,
  response_format: { type: "json_object", schema: JSON.stringify(schema) },
  temperature: 0.7,
  seed: 11,
  max_tokens: 40,
});
const asOpenai = await engine.chat.completions.create({
  messages,
  response_format: { type: "json_schema", json_schema: { name: "colour", strict: true, schema } },
  temperature: 0.7,
  seed: 11,
  max_tokens: 40,
});
const refusal = async (request) => {
  try {
    await engine.chat.completions.create({ messages, max_tokens: 4, ...request });
    return null;
  } catch (error) {
    return { name: error.name, code: error.code, message: error.message };
  }
};
const unsupported = await refusal({
  response_format: { type: "json_schema", json_schema: { name: "word", schema: { type: "string", pattern: "^[a-z]+$" } } },
});
const tools = await refusal({
  tools: [{ type: "function", function: { name: "get_colour", parameters: { type: "object", properties: {} } } }],
});
export const results = { asWebllm, asOpenai, unsupported, tools };
await engine.unload();
