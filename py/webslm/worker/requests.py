"""The page's generation request, checked, and the two errors a request can end in.

worker/protocol.mjs checks each message's shape; what a generation request's messages and
settings mean is checked here, where the model's defaults are known. The worker tells the
two errors apart by their class names (worker.mjs, pythonCall): RequestError replies
"bad-field", WorkerRequestFailed (and any other exception) "failed".
"""
from __future__ import annotations

ROLES = ("system", "user", "assistant")
SAMPLER_KEYS = ("temperature", "top_p", "top_k", "min_p", "repetition_penalty", "max_tokens", "seed", "stop")
# cache_prompt (default true): keep the KV cache's shared prefix from the previous answer
# (engine/prompt_cache.py); false re-reads the whole prompt
SETTING_KEYS = SAMPLER_KEYS + ("cache_prompt",)


class RequestError(ValueError):
    """A page request that is well-formed JSON but not a valid generation request."""


class WorkerRequestFailed(RuntimeError):
    """A valid request the worker cannot serve in its current state (the reply's "failed")."""


def generation_request(model, request: dict):
    """(messages, SamplerSettings) of a page's generation request {messages, settings}, the
    settings merged over the model's defaults; RequestError if it is not valid."""
    from ..semantic.sampler import SamplerError, SamplerSettings
    if not isinstance(request, dict) or set(request) - {"messages", "settings"}:
        raise RequestError("a generation request is {messages, settings}")
    messages = _messages(request.get("messages"))
    settings = request.get("settings") or {}
    if not isinstance(settings, dict) or set(settings) - set(SETTING_KEYS):
        raise RequestError(f"settings may only have {', '.join(SETTING_KEYS)}")
    defaults = model.manifest.generation
    merged = {"temperature": defaults["temperature"], "top_p": defaults["top_p"], "top_k": defaults["top_k"],
              "min_p": defaults["min_p"], "repetition_penalty": defaults["repetition_penalty"],
              "max_tokens": defaults["max_new_tokens"], **{k: v for k, v in settings.items() if k in SAMPLER_KEYS}}
    merged["stop"] = tuple(merged.get("stop", ()))
    try:
        return messages, SamplerSettings(**merged)
    except (SamplerError, TypeError) as exc:
        raise RequestError(f"settings: {exc}") from None


def cache_prompt(request: dict) -> bool:
    """The request's settings.cache_prompt (true when not given); RequestError if not a boolean."""
    value = (request.get("settings") or {}).get("cache_prompt", True)
    if not isinstance(value, bool):
        raise RequestError("settings: cache_prompt must be true or false")
    return value


def _messages(value) -> list[dict]:
    if not isinstance(value, list) or not 1 <= len(value) <= 256:
        raise RequestError("messages must be a list of 1 to 256 messages")
    for n, message in enumerate(value):
        if not isinstance(message, dict) or set(message) != {"role", "content"}:
            raise RequestError(f"messages[{n}] must be {{role, content}}")
        if message["role"] not in ROLES or not isinstance(message["content"], str) or len(message["content"]) > 100_000:
            raise RequestError(f"messages[{n}]: role must be one of {ROLES}, content a string of at most 100000 characters")
    return value
