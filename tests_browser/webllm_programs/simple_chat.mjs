// WebLLM's "simple chat": a message list, an input and a send button; each message sent is
// answered by a streamed completion whose deltas are appended to the answer's bubble as they
// arrive, and the conversation (messages) grows turn by turn. The UI lives in a container this
// program adds to the page and removes at the end, so the page it runs in is left as it was.
import * as webllm from "@mlc-ai/web-llm";

const container = document.createElement("div");
container.id = "simple-chat";
const messageList = document.createElement("div");
const input = document.createElement("input");
input.type = "text";
input.placeholder = "Type a message...";
const sendButton = document.createElement("button");
sendButton.textContent = "Send";
sendButton.disabled = true;                     // until the engine is ready
container.append(messageList, input, sendButton);
document.body.append(container);

function appendMessage(role, text) {
  const bubble = document.createElement("div");
  bubble.className = `message ${role}`;
  bubble.textContent = text;
  messageList.append(bubble);
  return bubble;
}

const engine = await webllm.CreateMLCEngine("SmolLM2-135M-Instruct-q0f16-MLC");
const messages = [{ role: "system", content: "Be brief." }];
const turns = [];                               // per answer: chunks with text, the usage chunk's usage, the final chunk

async function onMessageSend() {
  const content = input.value.trim();
  if (!content) return;
  input.value = "";
  sendButton.disabled = true;
  messages.push({ role: "user", content });
  appendMessage("user", content);
  const bubble = appendMessage("assistant", "");
  const chunks = await engine.chat.completions.create({
    messages,
    stream: true,
    stream_options: { include_usage: true },
    temperature: 0,
    max_tokens: 4,
  });
  let reply = "";
  let textChunks = 0;
  let usage = null;
  let final = null;
  for await (const chunk of chunks) {
    const delta = chunk.choices[0]?.delta.content ?? "";
    if (delta) {
      reply += delta;
      textChunks += 1;
      bubble.textContent = reply;
    }
    if (chunk.choices[0]?.finish_reason) final = chunk;
    if (chunk.usage) usage = chunk.usage;
  }
  const message = await engine.getMessage();
  messages.push({ role: "assistant", content: message });
  turns.push({ textChunks, usage, final, message });
  sendButton.disabled = false;
}

// The user: types into the input and clicks Send, twice, each time after the answer before.
let sending = null;
sendButton.addEventListener("click", () => { sending = onMessageSend(); });
sendButton.disabled = false;
for (const question of ["What is the capital of France?", "And of Italy?"]) {
  input.value = question;
  sendButton.click();
  await sending;
}

const rendered = [...messageList.children].map((bubble) => ({ className: bubble.className, text: bubble.textContent }));
container.remove();
export const results = { rendered, turns, messages, containerGone: document.getElementById("simple-chat") === null };
await engine.unload();
