// A completion request, checked and made into the worker's generation request: OpenAI's and
// WebLLM's field names (docs/js-api.md lists each with its status) -> {prompt, settings,
// stream, ...}. Every field is either passed on to the Python sampler and engine, which
// validate it again (py/webslm/worker/requests.py), or refused here with a sentence that says
// why; none is accepted and ignored. No browser API is used, so node runs it too
// (tests/test_js_request.py).

export class BadRequest extends Error {
  constructor(message) {
    super(message);
    this.name = "BadRequest";
  }
}

// The fields both kinds take, and each kind's own.
// response_format on a raw prompt constrains the text that continues it, as on a chat answer
// (the mask does not look at the prompt).
const COMMON = ["stream", "stream_options", "n", "temperature", "top_p", "top_k", "max_tokens", "seed", "stop",
                "signal", "model", "cache_prompt", "frequency_penalty", "presence_penalty", "repetition_penalty",
                "logit_bias", "logprobs", "top_logprobs", "ignore_eos", "response_format"];
const FIELDS = {
  chat: new Set([...COMMON, "messages", "max_completion_tokens", "tools", "tool_choice"]),
  completion: new Set([...COMMON, "prompt", "echo", "suffix", "best_of"]),
};
// Sampling defaults a CreateMLCEngine chatOpts may set for every request (WebLLM's ChatOptions).
export const DEFAULTABLE = ["temperature", "top_p", "top_k", "max_tokens", "frequency_penalty", "presence_penalty",
                            "repetition_penalty", "logit_bias", "ignore_eos", "stop"];
const ROLES = new Set(["system", "user", "assistant"]);
export const MAX_CHOICES = 16;      // n: answered one after another
const MAX_TOP_LOGPROBS = 20;

const present = (v) => v !== undefined && v !== null;

// (request, kind "chat" | "completion", defaults) -> {prompt (messages or a string), settings
// (the worker's names), stream, includeUsage, n, seed (or null: one is drawn per request),
// logprobs, signal}; throws BadRequest.
export function checkRequest(request, kind = "chat", defaults = {}) {
  if (request === null || typeof request !== "object" || Array.isArray(request)) {
    throw new BadRequest(kind === "chat" ? "A request is an object with messages." : "A request is an object with a prompt.");
  }
  for (const key of Object.keys(request)) {
    if (!FIELDS[kind].has(key)) throw new BadRequest(`Unknown request field "${key}".`);
  }
  const r = { ...defaults };
  for (const [key, value] of Object.entries(request)) if (present(value) || !(key in r)) r[key] = value;
  refuseUnsupported(r, kind);

  const stream = r.stream ?? false;
  if (typeof stream !== "boolean") throw new BadRequest("stream must be true or false.");
  let includeUsage = false;
  if (present(r.stream_options)) {
    if (!stream) throw new BadRequest("stream_options is only for streaming requests (stream: true).");
    const { include_usage, ...rest } = r.stream_options;
    if (Object.keys(rest).length) throw new BadRequest(`Unknown stream_options field "${Object.keys(rest)[0]}".`);
    if (present(include_usage) && typeof include_usage !== "boolean") throw new BadRequest("stream_options.include_usage must be true or false.");
    includeUsage = include_usage ?? false;
  }
  const n = number("n", r.n, (v) => Number.isInteger(v) && v >= 1 && v <= MAX_CHOICES, `an integer from 1 to ${MAX_CHOICES}`) ?? 1;
  if (n > 1 && stream) throw new BadRequest("n > 1 is answered without streaming only (stream: false).");

  const settings = {};
  const put = (name, value) => { if (value !== undefined) settings[name] = value; };
  put("temperature", number("temperature", r.temperature, (v) => v >= 0, "≥ 0"));
  put("top_p", number("top_p", r.top_p, (v) => v > 0 && v <= 1, "in (0, 1]"));
  put("top_k", number("top_k", r.top_k, (v) => Number.isInteger(v) && v >= 0, "an integer ≥ 0"));
  put("max_tokens", maxTokens(r));
  put("frequency_penalty", number("frequency_penalty", r.frequency_penalty, (v) => v >= -2 && v <= 2, "in [-2, 2]"));
  put("presence_penalty", number("presence_penalty", r.presence_penalty, (v) => v >= -2 && v <= 2, "in [-2, 2]"));
  put("repetition_penalty", number("repetition_penalty", r.repetition_penalty, (v) => v > 0, "> 0"));
  put("logit_bias", logitBias(r.logit_bias));
  put("ignore_eos", flag("ignore_eos", r.ignore_eos));
  const format = responseFormat(r.response_format);
  if (format !== undefined) settings.response_format = format;
  if (format !== undefined && r.ignore_eos) throw new BadRequest("ignore_eos cannot be set in JSON mode: the answer ends when its JSON is complete.");
  const tools = checkTools(r, stream);
  if (tools) Object.assign(settings, tools);
  const logprobs = flag("logprobs", r.logprobs) ?? false;
  const top = number("top_logprobs", r.top_logprobs, (v) => Number.isInteger(v) && v >= 0 && v <= MAX_TOP_LOGPROBS,
                     `an integer from 0 to ${MAX_TOP_LOGPROBS}`);
  if (top && !logprobs) throw new BadRequest("top_logprobs needs logprobs: true.");
  if (logprobs) Object.assign(settings, { logprobs: true, top_logprobs: top ?? 0 });
  if (present(r.stop)) {
    const stops = typeof r.stop === "string" ? [r.stop] : r.stop;
    if (!Array.isArray(stops) || stops.length > 4 || !stops.every((s) => typeof s === "string" && s.length > 0)) {
      throw new BadRequest("stop must be a string or a list of at most 4 non-empty strings.");
    }
    settings.stop = stops;
  }
  if (present(r.cache_prompt)) {
    if (typeof r.cache_prompt !== "boolean") throw new BadRequest("cache_prompt must be true or false.");
    settings.cache_prompt = r.cache_prompt;
  }
  const seed = number("seed", r.seed, (v) => Number.isInteger(v) && v >= 0 && v < 2 ** 32, "an integer in [0, 2^32)") ?? null;
  if (present(r.model) && typeof r.model !== "string") throw new BadRequest("model must be a string.");
  const prompt = kind === "chat" ? checkMessages(r.messages, Boolean(tools)) : checkPrompt(r.prompt);
  return { prompt, settings, stream, includeUsage, n, seed, logprobs, signal: r.signal };
}

// Fields with a value webslm cannot serve: refused, with what would have been needed.
function refuseUnsupported(r, kind) {
  if (kind === "completion") {
    if (present(r.echo) && r.echo !== false) throw new BadRequest("echo is not supported: the prompt is not repeated in the answer.");
    if (present(r.suffix)) throw new BadRequest("suffix is not supported: no model here fills in the middle.");
    if (present(r.best_of) && r.best_of !== 1) throw new BadRequest("best_of is not supported (use n).");
  }
}

// response_format -> the worker's: "json_object", or the object itself with a schema (its
// subset is checked in Python: py/webslm/semantic/json_schema.py, a keyword outside it is
// refused by name) or a grammar (py/webslm/semantic/gbnf.py); undefined for text.
function responseFormat(format) {
  if (!present(format)) return undefined;
  if (typeof format !== "object" || Array.isArray(format) || !["text", "json_object", "json_schema", "grammar"].includes(format.type)) {
    throw new BadRequest('response_format must be {type: "text"}, {type: "json_object"} (optionally with a schema), {type: "json_schema", json_schema: {name, schema}} or {type: "grammar", grammar}.');
  }
  const given = Object.keys(format).filter((k) => format[k] !== undefined && format[k] !== null);
  const only = (...keys) => {
    const extra = given.filter((k) => !keys.includes(k));
    if (extra.length) throw new BadRequest(`response_format.${extra[0]} is not a field of a ${format.type} response_format.`);
  };
  if (format.type === "grammar") {
    only("type", "grammar");
    if (typeof format.grammar !== "string" || !format.grammar.trim()) {
      throw new BadRequest("response_format.grammar must be the grammar's GBNF text.");
    }
    return { type: "grammar", grammar: format.grammar };   // its subset is checked in Python (semantic/gbnf.py)
  }
  if (format.type === "text") {
    only("type");
    return undefined;
  }
  if (format.type === "json_object") {
    only("type", "schema");
    if (!present(format.schema)) return "json_object";
    if (typeof format.schema !== "string" && (typeof format.schema !== "object" || Array.isArray(format.schema))) {
      throw new BadRequest("response_format.schema must be a JSON schema, or its JSON text.");
    }
    return { type: "json_object", schema: format.schema };
  }
  only("type", "json_schema");
  const spec = format.json_schema;
  if (typeof spec !== "object" || spec === null || typeof spec.schema !== "object" || spec.schema === null) {
    throw new BadRequest("response_format.json_schema must be {name, schema} with schema a JSON schema.");
  }
  return { type: "json_schema", json_schema: spec };
}

// tools / tool_choice -> the worker's settings {tools, tool_choice} (checked in Python against
// the model's chat template: py/webslm/semantic/tool_calls.py), or null without tools.
function checkTools(r, stream) {
  const tools = present(r.tools) ? r.tools : [];
  if (!Array.isArray(tools)) throw new BadRequest("tools must be a list of {type: \"function\", function: {name, description, parameters}}.");
  const choice = r.tool_choice;
  if (present(choice) && !["auto", "none", "required"].includes(choice)
      && !(typeof choice === "object" && choice.type === "function" && typeof choice.function?.name === "string")) {
    throw new BadRequest('tool_choice must be "auto", "none", "required" or {type: "function", function: {name}}.');
  }
  if (tools.length === 0) {
    if (present(choice) && choice !== "none" && choice !== "auto") throw new BadRequest("tool_choice names a tool, but the request has no tools.");
    return null;
  }
  tools.forEach((tool, i) => {
    if (tool?.type !== "function" || typeof tool.function?.name !== "string") {
      throw new BadRequest(`tools[${i}] must be {type: "function", function: {name, description, parameters}}.`);
    }
  });
  if (present(r.response_format) && r.response_format.type !== "text" && choice !== "none" && choice !== "auto") {
    throw new BadRequest("response_format cannot be set with a forced tool call: the call's own schema constrains the answer.");
  }
  return { tools, ...(present(choice) ? { tool_choice: choice } : {}) };
}

function number(name, value, ok, range) {
  if (!present(value)) return undefined;
  if (typeof value !== "number" || !Number.isFinite(value) || !ok(value)) {
    throw new BadRequest(`${name} must be ${range}, not ${JSON.stringify(value)?.slice(0, 40)}.`);
  }
  return value;
}

function flag(name, value) {
  if (!present(value)) return undefined;
  if (typeof value !== "boolean") throw new BadRequest(`${name} must be true or false.`);
  return value;
}

// max_completion_tokens is OpenAI's newer name for max_tokens; both given, they must agree.
function maxTokens(r) {
  const check = (name) => number(name, r[name], (v) => Number.isInteger(v) && v >= 1, "an integer ≥ 1");
  const old = check("max_tokens"), newer = check("max_completion_tokens");
  if (old !== undefined && newer !== undefined && old !== newer) {
    throw new BadRequest(`max_tokens (${old}) and max_completion_tokens (${newer}) disagree: give one.`);
  }
  return newer ?? old;
}

// {"token id": bias}: ids in decimal, biases in [-100, 100] (the model's vocabulary is checked in Python).
function logitBias(value) {
  if (!present(value)) return undefined;
  if (typeof value !== "object" || Array.isArray(value)) throw new BadRequest('logit_bias must be {"token id": bias}.');
  const out = {};
  for (const [key, bias] of Object.entries(value)) {
    if (!/^[0-9]{1,10}$/.test(key)) throw new BadRequest(`logit_bias: "${key.slice(0, 20)}" is not a token id.`);
    if (typeof bias !== "number" || !Number.isFinite(bias) || bias < -100 || bias > 100) {
      throw new BadRequest(`logit_bias["${key}"] must be a number in [-100, 100].`);
    }
    out[key] = bias;
  }
  return out;
}

// The fields a message may have beyond {role, content} in a request with tools: an assistant's
// earlier calls, and a tool's result.
const TOOL_FIELDS = { assistant: ["tool_calls"], tool: ["tool_call_id", "name"] };

function checkMessages(messages, tools = false) {
  if (!Array.isArray(messages) || messages.length < 1 || messages.length > 256) {
    throw new BadRequest("messages must be a list of 1 to 256 messages.");
  }
  return messages.map((m, i) => {
    if (!m || typeof m !== "object") throw new BadRequest(`messages[${i}] must be {role, content}.`);
    const allowed = ["role", "content", ...(tools ? TOOL_FIELDS[m.role] ?? [] : [])];
    const extra = Object.keys(m).filter((k) => !allowed.includes(k) && m[k] !== undefined);
    if (!tools && (m.role === "tool" || extra.includes("tool_calls") || extra.includes("tool_call_id"))) {
      throw new BadRequest(`messages[${i}]: tool messages and tool calls need the request's tools.`);
    }
    if (extra.length) throw new BadRequest(`messages[${i}]: unknown field "${extra[0]}" (a message is {role, content}).`);
    if (!ROLES.has(m.role) && !(tools && m.role === "tool")) {
      throw new BadRequest(`messages[${i}].role must be system, user or assistant${tools ? " or tool" : ""}.`);
    }
    // tool_calls, tool_call_id, name: passed on as given (worker/requests.py checks them)
    const extras = Object.fromEntries(allowed.slice(2).filter((k) => present(m[k])).map((k) => [k, m[k]]));
    if (extras.tool_calls && !present(m.content)) return { role: m.role, content: null, ...extras };
    if (typeof m.content === "string") return { role: m.role, content: m.content, ...extras };
    if (!Array.isArray(m.content) || m.content.length < 1) {
      throw new BadRequest(`messages[${i}].content must be a string or a list of text parts.`);
    }
    m.content.forEach((part, j) => {
      if (part?.type !== "text") {
        throw new BadRequest(`messages[${i}].content[${j}] is a ${JSON.stringify(part?.type ?? null)} part: only text parts are read (no model here takes images or audio).`);
      }
      if (typeof part.text !== "string" || Object.keys(part).some((k) => k !== "type" && k !== "text")) {
        throw new BadRequest(`messages[${i}].content[${j}] must be {type: "text", text: a string}.`);
      }
    });
    return { role: m.role, content: m.content.map(({ type, text }) => ({ type, text })), ...extras };
  });
}

function checkPrompt(prompt) {
  if (typeof prompt !== "string" || prompt.length === 0) {
    throw new BadRequest("prompt must be a non-empty string (a list of prompts is not supported: send one request each).");
  }
  return prompt;
}
