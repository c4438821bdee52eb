// One answer of the engine (web/webslm.js) as the OpenAI-shaped API hands it out: the worker's
// events for its request become stream chunks, its reply the final completion.
import { fromWorker } from "./errors.mjs";

// n > 1: the choices' completions as one, usage summed (the prompt counted once).
export function combineChoices(completions) {
  const [first] = completions;
  const tokens = completions.reduce((sum, c) => sum + c.usage.completion_tokens, 0);
  return { ...first, choices: completions.map((c, index) => ({ ...c.choices[0], index })),
           usage: { ...first.usage, completion_tokens: tokens, total_tokens: first.usage.prompt_tokens + tokens },
           webslm: { ...first.webslm, choices: completions.map((c) => ({ ...c.webslm, usage: c.usage })) } };
}

// One answer in flight: the worker's delta events for its request become chunks, its reply
// the final chunk (finish_reason, usage, and webslm's own numbers), then, with
// stream_options.include_usage, WebLLM's usage chunk (no choices); its prefill-progress
// events become the engine's progress events (phase "prefill" or "replay"). After stop()
// no more text is taken: the answer then ends "abort" if any arrived. kind "chat" is a chat
// completion, "completion" a raw-prompt text completion.
export class Answer {
  constructor(engine, { id, result }, { seed, kind = "chat", index = 0, logprobs = false, includeUsage = false }) {
    this.engine = engine;
    this.kind = kind;
    this.index = index;
    this.id = `${kind === "chat" ? "chatcmpl" : "cmpl"}-${id}-${Date.now().toString(36)}`;
    this.object = kind === "chat" ? "chat.completion" : "text_completion";
    this.created = Math.floor(Date.now() / 1000);
    this.modelName = engine.model?.name ?? "webslm";
    this.seed = seed;
    this.logprobs = logprobs;
    this.queue = [];                  // chunks not yet taken by the reader
    this.wake = null;
    this.finished = false;
    this.failure = null;
    this.first = true;
    this.stopped = false;             // stop() was called: text that arrives is dropped
    this.dropped = false;             // ... and some was
    this.text = "";                   // the text handed out
    this.logprobsOut = 0;             // logprobs entries handed out with it
    const onDelta = ({ detail }) => {
      if (detail.request !== id) return;
      if (this.stopped) {
        this.dropped = true;
        return;
      }
      this.text += detail.text;
      this.logprobsOut += detail.logprobs?.length ?? 0;
      // with tools, a delta may hold no content (text held while a call may be starting) or a
      // call's pieces (OpenAI's delta.tool_calls)
      if (detail.text || detail.tool_calls || detail.logprobs?.length) {
        this.#push(this.#chunk(detail.text, null, detail.logprobs, detail.tool_calls));
      }
    };
    const onProgress = ({ detail: { protocol, id: _, type, event, request, ...progress } }) => {
      if (request !== id || this.stopped) return;
      engine.dispatchEvent(new CustomEvent("progress", { detail: { ...progress, request: this.id } }));
    };
    engine.protocol.addEventListener("delta", onDelta);
    engine.protocol.addEventListener("prefill-progress", onProgress);
    this.done = result.then(
      (reply) => {
        this.reply = this.dropped
          ? { ...reply, text: this.text, finish_reason: "abort", logprobs: reply.logprobs?.slice(0, this.logprobsOut) ?? null }
          : reply;
        const rest = this.reply.logprobs?.slice(this.logprobsOut);
        this.#push({ ...this.#chunk(null, this.reply.finish_reason, rest), usage: usage(reply), webslm: this.#extras(reply) });
        if (includeUsage) this.#push({ ...this.#head("chunk"), choices: [], usage: usage(reply) });
      },
      (error) => { this.failure = fromWorker(error); },
    ).finally(() => {
      engine.protocol.removeEventListener("delta", onDelta);
      engine.protocol.removeEventListener("prefill-progress", onProgress);
      this.finished = true;
      this.wake?.();
    });
  }

  stop() {
    this.stopped = true;
  }

  #head(part) {
    const object = part === "chunk" && this.kind === "chat" ? "chat.completion.chunk" : this.object;
    return { id: this.id, object, created: this.created, model: this.modelName };
  }

  // A streamed piece: text (null: the end) with its logprobs entries and tool call pieces.
  #chunk(text, finishReason, entries, toolCalls) {
    const choice = { index: this.index };
    if (this.kind === "chat") {
      choice.delta = text === null ? {} : this.first ? { role: "assistant", content: text } : { content: text };
      if (toolCalls) {
        if (!text) choice.delta.content = null;
        choice.delta.tool_calls = toolCalls;
      }
      this.first &&= text === null;
    } else {
      choice.text = text ?? "";
    }
    choice.finish_reason = finishReason;
    if (this.logprobs) choice.logprobs = { content: entries ?? [] };
    return { ...this.#head("chunk"), choices: [choice] };
  }

  #extras({ text, finish_reason, usage: _, logprobs: __, tool_calls: ___, content: ____, ...rest }) {
    return { ...rest, seed: this.seed };
  }

  #push(chunk) {
    this.queue.push(chunk);
    this.wake?.();
  }

  // An async iterable of chunks; leaving the loop early aborts the answer.
  chunks() {
    const next = async () => {
      for (;;) {
        if (this.queue.length) return { value: this.queue.shift(), done: false };
        if (this.failure) throw this.failure;
        if (this.finished) return { value: undefined, done: true };
        await new Promise((resolve) => { this.wake = resolve; });
        this.wake = null;
      }
    };
    const stop = async () => {
      if (!this.finished) await this.engine.abort().catch(() => {});
      await this.done;
      this.queue.length = 0;
      return { value: undefined, done: true };
    };
    return { [Symbol.asyncIterator]: () => ({ next, return: stop }) };
  }

  async completion() {
    await this.done;
    if (this.failure) throw this.failure;
    const reply = this.reply;
    const choice = this.kind === "chat"
      ? { index: this.index, message: { role: "assistant", content: reply.text }, finish_reason: reply.finish_reason }
      : { index: this.index, text: reply.text, finish_reason: reply.finish_reason };
    if (reply.tool_calls) {             // the answer called tools: content is the text around the calls, or null
      choice.message = { role: "assistant", content: reply.content ?? null, tool_calls: reply.tool_calls };
    }
    choice.logprobs = this.logprobs ? { content: reply.logprobs ?? [] } : null;
    return { ...this.#head("completion"), choices: [choice], usage: usage(reply), webslm: this.#extras(reply) };
  }
}

// OpenAI's usage, and WebLLM's usage.extra from the worker's timings. An answer aborted
// before it started has neither: zeros.
export function usage({ usage: u = {}, timings: t = {} }) {
  const prompt = u.prompt_tokens ?? 0, completion = u.completion_tokens ?? 0;
  const cached = u.prompt_tokens_details?.cached_tokens ?? 0;
  const rate = (tokens, seconds) => (seconds > 0 ? tokens / seconds : 0);
  return { prompt_tokens: prompt, completion_tokens: completion, total_tokens: prompt + completion,
           prompt_tokens_details: { cached_tokens: cached },
           extra: { e2e_latency_s: t.total_seconds ?? 0,
                    prefill_tokens_per_s: rate(prompt - cached, t.prefill_seconds),
                    decode_tokens_per_s: rate(completion, t.decode_seconds),
                    time_to_first_token_s: t.time_to_first_token_s ?? null,
                    time_per_output_token_s: completion > 0 ? (t.decode_seconds ?? 0) / completion : null } };
}
