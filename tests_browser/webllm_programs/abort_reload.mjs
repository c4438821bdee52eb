// WebLLM's abort-and-reload: interrupt a streaming answer, reload the model, ask again; a
// request sent while another runs waits its turn; a model id this site does not have fails.
import * as webllm from "@mlc-ai/web-llm";

const model = "SmolLM2-135M-Instruct-q0f16-MLC";
const engine = await webllm.CreateMLCEngine(model);
const chunks = await engine.chat.completions.create({
  messages: [{ role: "system", content: "Be brief." }, { role: "user", content: "Tell a story." }],
  stream: true,
  temperature: 0,
  max_tokens: 64,
});
let pieces = 0;
let finishReason = null;
for await (const chunk of chunks) {
  if (chunk.choices[0]?.delta.content) {
    pieces += 1;
    if (pieces === 1) engine.interruptGenerate();
  }
  finishReason = chunk.choices[0]?.finish_reason ?? finishReason;
}
await engine.reload(model);
const question = {
  messages: [{ role: "system", content: "Be brief." }, { role: "user", content: "What is the capital of France?" }],
  temperature: 0,
  max_tokens: 1,
};
const [first, second] = await Promise.all([
  engine.chat.completions.create(question),
  engine.chat.completions.create({ ...question, max_tokens: 2 }),
]);
const raw = await engine.completions.create({ prompt: "The capital of France is", temperature: 0, max_tokens: 1 });
// A raw completion held to a grammar; a limit below its shortest text is refused up front.
const cities = { type: "grammar", grammar: 'root ::= " " ("Paris" | "Lyon" | "Nice") "."' };
const rawGrammar = await engine.completions.create({ prompt: "The capital of France is", temperature: 0,
                                                     max_tokens: 8, response_format: cities });
let tooShort = null;
try {
  await engine.completions.create({ prompt: "The capital of France is", max_tokens: 5, response_format: cities });
} catch (error) {
  tooShort = { name: error.name, code: error.code, message: error.message };
}
let unknownModel = null;
try {
  await engine.reload("Llama-3.1-8B-Instruct-q4f32_1-MLC");
} catch (error) {
  unknownModel = { name: error.name, code: error.code, message: error.message };
}
export const results = { pieces, finishReason, first, second, raw, rawGrammar, tooShort, unknownModel };
await engine.unload();
