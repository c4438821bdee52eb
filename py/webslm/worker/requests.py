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


def generation_request(model, request: dict):
    """(prompt token ids, SamplerSettings) of a page's generation request {messages,
    settings}, the settings laid over the model's defaults; RequestError if it is not valid.
    messages is the chat (rendered with the model's chat template), or a string: a raw
    prompt (completions.create), encoded as it is, BOS as the model's tokenizer says."""
    from ..request import InvalidRequest, prompt_ids, sampler_settings
    from ..semantic.sampler import SamplerError
    if not isinstance(request, dict) or set(request) - {"messages", "settings"}:
        raise RequestError("bad-request", "request", "a generation request is {messages, settings}")
    raw = isinstance(request.get("messages"), str)
    prompt = _raw_prompt(request["messages"]) if raw else _messages(request.get("messages"))
    settings = request.get("settings", {})
    if not isinstance(settings, dict):
        raise RequestError("bad-request", "settings", "must be an object of sampling settings")
    settings = {k: v for k, v in settings.items() if k not in ENGINE_SETTINGS}
    try:
        return prompt_ids(model, prompt, chat=not raw), sampler_settings(model, settings)
    except (InvalidRequest, SamplerError) as exc:
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


def _messages(value) -> list[dict]:
    """The messages as {role, content: str}. A content given as a list of text parts
    ([{type: "text", text}], OpenAI's form) is their texts joined by newlines; other parts
    (images, audio) are refused: no model here reads them."""
    if not isinstance(value, list) or not 1 <= len(value) <= MAX_MESSAGES:
        raise RequestError("bad-request", "messages", f"must be a list of 1 to {MAX_MESSAGES} messages")
    out = []
    for n, message in enumerate(value):
        if not isinstance(message, dict) or set(message) != {"role", "content"}:
            raise RequestError("bad-request", f"messages[{n}]", "must be {role, content}")
        content = message["content"]
        if isinstance(content, list):
            content = _text_parts(content, f"messages[{n}].content")
        if message["role"] not in ROLES or not isinstance(content, str) or len(content) > MAX_CONTENT_CHARS:
            raise RequestError("bad-request", f"messages[{n}]", f"role must be one of {', '.join(ROLES)}, content "
                                                               f"a string of at most {MAX_CONTENT_CHARS} characters")
        out.append({"role": message["role"], "content": content})
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
