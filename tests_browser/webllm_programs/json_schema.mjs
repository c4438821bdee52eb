// WebLLM's JSON mode with a schema: the schema given as WebLLM's examples give it (JSON text
// under response_format.schema) and as OpenAI's json_schema; the answer always parses and
// matches; string and integer keywords (pattern, minimum, maximum) hold; grammar mode's answer
// is in its grammar's language. A keyword outside the supported subset, a left-recursive
// grammar, and tools on a model whose chat template has none, are refused with a reason
// before any generation.
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
const hex = {
  type: "object",
  properties: { hex: { type: "string", pattern: "^#[0-9a-f]{6}$" }, brightness: { type: "integer", minimum: 0, maximum: 100 } },
  required: ["hex", "brightness"],
  additionalProperties: false,
};
const withKeywords = await engine.chat.completions.create({
  messages: [{ role: "system", content: "Answer in JSON." }, { role: "user", content: "A hex colour code and its brightness." }],
  response_format: { type: "json_schema", json_schema: { name: "hex", schema: hex } },
  temperature: 0.7,
  seed: 11,
  max_tokens: 40,
});
const asGrammar = await engine.chat.completions.create({
  messages: [{ role: "user", content: "Is red a primary colour? Answer yes or no." }],
  response_format: { type: "grammar", grammar: 'root ::= ("yes" | "no") "."' },
  temperature: 0.7,
  seed: 11,
  max_tokens: 8,
});
const unsupported = await refusal({
  response_format: { type: "json_schema", json_schema: { name: "words", schema: { type: "array", uniqueItems: true } } },
});
const badGrammar = await refusal({ response_format: { type: "grammar", grammar: 'root ::= root "a" | "b"' } });
const tools = await refusal({
  tools: [{ type: "function", function: { name: "get_colour", parameters: { type: "object", properties: {} } } }],
});
export const results = { asWebllm, asOpenai, withKeywords, asGrammar, unsupported, badGrammar, tools };
await engine.unload();
