"""The page's generation request, checked, and the two errors a request can end in.

worker/protocol.mjs checks each message's shape; what a generation request's messages and
settings mean is checked here, by the same request.prompt_ids and request.sampler_settings
the CLI and the Python API use: the prompt is bounded against the context before it is
tokenized in full, the chat template's failures are typed, and every setting is validated
as given (a `stop` string is refused, not split into characters). The worker tells the two
errors apart by their class names (worker.mjs, pythonCall): RequestError replies
"bad-field", with its code in the message; WorkerRequestFailed (and any other exception)
"failed".
"""
from __future__ import annotations

import dataclasses

from ..errors import CodedError

ROLES = ("system", "user", "assistant")
MAX_MESSAGES, MAX_CONTENT_CHARS, MAX_PARTS = 256, 100_000, 64
# cache_prompt (default true): keep the KV cache's shared prefix from the previous answer
# (engine/prompt_cache.py); false re-reads the whole prompt. Not a sampler setting.
ENGINE_SETTINGS = ("cache_prompt",)


class RequestError(CodedError):
    """A page request that is well-formed JSON but not a valid generation request. Codes:
    "bad-request" (its shape), request.InvalidRequest's ("bad-prompt", "prompt-too-long",
    "bad-template", "unknown-setting") and SamplerError's ("bad-type", "out-of-range",
    "not-finite")."""


class WorkerRequestFailed(RuntimeError):
    """A valid request the worker cannot serve in its current state (the reply's "failed")."""


@dataclasses.dataclass
class GenerationPlan:
    """A checked generation request: the prompt's token ids, the sampler's settings, and the
    request's tools (semantic/tool_calls.py; None without tools)."""
    ids: list[int]
    settings: object
    tools: object = None


def generation_request(model, request: dict):
    """(prompt token ids, SamplerSettings) of a page's generation request (generation_plan)."""
    plan = generation_plan(model, request)
    return plan.ids, plan.settings


def generation_plan(model, request: dict) -> GenerationPlan:
    """The plan of a page's generation request {messages, settings}: the settings laid over
    the model's defaults; RequestError if it is not valid. messages is the chat (rendered
    with the model's chat template), or a string: a raw prompt (completions.create), encoded
    as it is, BOS as the model's tokenizer says. settings.tools and settings.tool_choice are
    OpenAI's (TOOL_SETTINGS): the tools are rendered through the chat template, and a forced
    call (tool_choice "required" or a function) is JSON-schema mode with the call's schema."""
    from ..answer import check_room
    from ..request import InvalidRequest, prompt_ids, sampler_settings
    from ..semantic.sampler import SamplerError
    from ..semantic.tool_calls import ToolError, tool_plan
    if not isinstance(request, dict) or set(request) - {"messages", "settings"}:
        raise RequestError("bad-request", "request", "a generation request is {messages, settings}")
    settings = request.get("settings", {})
    if not isinstance(settings, dict):
        raise RequestError("bad-request", "settings", "must be an object of sampling settings")
    settings = {k: v for k, v in settings.items() if k not in ENGINE_SETTINGS}
    tools, tool_choice = settings.pop("tools", None), settings.pop("tool_choice", None)
    raw = isinstance(request.get("messages"), str)
    try:
        tools = tool_plan(model.chat_template, tools, tool_choice) if not raw or tools else None
        if raw and tools is not None:
            raise ToolError("bad-tools", "tools", "a raw prompt (completions) takes no tools")
        prompt = _raw_prompt(request["messages"]) if raw else _messages(request.get("messages"), tools is not None)
        if tools is not None and tools.forced:
            if settings.get("response_format") not in (None, "text", {"type": "text"}):
                raise ToolError("bad-tools", "response_format", "cannot be set with a forced tool call: the call's "
                                                                "own schema constrains the answer")
            settings["response_format"] = {"type": "json_schema", "json_schema": {"name": "tool_call",
                                                                                  "schema": tools.schema()}}
        ids = prompt_ids(model, prompt, chat=not raw, tools=tools.rendered if tools else None,
                         suffix=tools.prompt_suffix if tools else "")
        plan = GenerationPlan(ids, sampler_settings(model, settings), tools)
        check_room(model, ids, plan.settings)
        return plan
    except (InvalidRequest, SamplerError, ToolError) as exc:
        raise RequestError(exc.code, exc.where, exc.sentence) from None


def cache_prompt(request: dict) -> bool:
    """The request's settings.cache_prompt (true when not given); RequestError if not a boolean."""
    value = (request.get("settings") or {}).get("cache_prompt", True)
    if not isinstance(value, bool):
        raise RequestError("bad-type", "settings.cache_prompt", "must be true or false")
    return value


def _raw_prompt(value: str) -> str:
    if not 1 <= len(value) <= MAX_MESSAGES * MAX_CONTENT_CHARS:
        raise RequestError("bad-request", "prompt", f"must be 1 to {MAX_MESSAGES * MAX_CONTENT_CHARS} characters")
    return value


def _messages(value, tools: bool = False) -> list[dict]:
    """The messages as {role, content: str}. A content given as a list of text parts
    ([{type: "text", text}], OpenAI's form) is their texts joined by newlines; other parts
    (images, audio) are refused: no model here reads them. With tools, a conversation may
    also hold an assistant's tool_calls (content null) and "tool" messages with their
    results (tool_call_id): the calls' arguments are handed to the template as objects, as
    transformers does."""
    if not isinstance(value, list) or not 1 <= len(value) <= MAX_MESSAGES:
        raise RequestError("bad-request", "messages", f"must be a list of 1 to {MAX_MESSAGES} messages")
    out = []
    for n, message in enumerate(value):
        extra = TOOL_MESSAGE_FIELDS.get(message.get("role")) if isinstance(message, dict) else None
        if extra and not tools and set(message) & extra:
            raise RequestError("bad-request", f"messages[{n}]", "tool calls and tool results need the request's "
                                                                "tools (and a model that supports them)")
        if not isinstance(message, dict) or "role" not in message or set(message) - {"role", "content"} - (extra or set()) \
                or not ("content" in message or (tools and message.get("tool_calls"))):
            raise RequestError("bad-request", f"messages[{n}]", "must be {role, content}")
        content = message.get("content")
        if content is None and message.get("tool_calls"):
            content = ""
        if isinstance(content, list):
            content = _text_parts(content, f"messages[{n}].content")
        roles = ROLES + ("tool",) if tools else ROLES
        if message["role"] not in roles or not isinstance(content, str) or len(content) > MAX_CONTENT_CHARS:
            raise RequestError("bad-request", f"messages[{n}]", f"role must be one of {', '.join(roles)}, content "
                                                               f"a string of at most {MAX_CONTENT_CHARS} characters")
        checked = {"role": message["role"], "content": content}
        if message.get("tool_calls") is not None:
            checked["tool_calls"] = _tool_calls(message["tool_calls"], f"messages[{n}].tool_calls")
        for key in ("tool_call_id", "name"):
            if message.get(key) is not None:
                if not isinstance(message[key], str) or len(message[key]) > 256:
                    raise RequestError("bad-request", f"messages[{n}].{key}", "must be a string of at most 256 characters")
                checked[key] = message[key]
        out.append(checked)
    return out


# The fields a message of a role may have beyond {role, content}, in a request with tools.
TOOL_MESSAGE_FIELDS = {"assistant": {"tool_calls"}, "tool": {"tool_call_id", "name"}}


def _tool_calls(calls, where: str) -> list[dict]:
    """An assistant's earlier calls ([{id, type: "function", function: {name, arguments}}],
    arguments as JSON text or an object) as the chat template takes them."""
    import json
    if not isinstance(calls, list) or not 1 <= len(calls) <= 64:
        raise RequestError("bad-request", where, "must be a list of 1 to 64 tool calls")
    out = []
    for i, call in enumerate(calls):
        function = call.get("function") if isinstance(call, dict) else None
        if not isinstance(function, dict) or not isinstance(function.get("name"), str) \
                or call.get("type", "function") != "function":
            raise RequestError("bad-request", f"{where}[{i}]", 'must be {id, type: "function", function: {name, arguments}}')
        arguments = function.get("arguments", {})
        if isinstance(arguments, str):
            try:
                arguments = json.loads(arguments)
            except ValueError:
                raise RequestError("bad-request", f"{where}[{i}].function.arguments", "is not JSON text") from None
        if not isinstance(arguments, dict):
            raise RequestError("bad-request", f"{where}[{i}].function.arguments", "must be a JSON object")
        entry = {"type": "function", "function": {"name": function["name"], "arguments": arguments}}
        if isinstance(call.get("id"), str):
            entry["id"] = call["id"]
        out.append(entry)
    return out


def _text_parts(parts: list, where: str) -> str:
    if not 1 <= len(parts) <= MAX_PARTS:
        raise RequestError("bad-request", where, f"must be a string or a list of 1 to {MAX_PARTS} text parts")
    texts = []
    for i, part in enumerate(parts):
        if isinstance(part, dict) and part.get("type") not in (None, "text"):
            raise RequestError("bad-request", f"{where}[{i}]", f"is a {str(part['type'])[:20]!r} part: only text "
                                                               "parts are read (no model here takes images or audio)")
        if not isinstance(part, dict) or set(part) != {"type", "text"} or not isinstance(part["text"], str):
            raise RequestError("bad-request", f"{where}[{i}]", 'must be {type: "text", text: a string}')
        texts.append(part["text"])
    return "\n".join(texts)
