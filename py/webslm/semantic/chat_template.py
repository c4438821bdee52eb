"""Chat templates rendered exactly as transformers' `apply_chat_template(..., tokenize=False)` does.

transformers renders with jinja2's ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
plus the loopcontrols extension and its own `{% generation %}` tag, a `tojson` filter without HTML
escaping, and the globals raise_exception, strftime_now, namespace (no underscore names) and dict.
The browser has no jinja2, so this module sets up the same environment on webslm's own evaluator
(the jinja/ package) and prepares the template context the way transformers 5.x does:
  * messages/tools/documents/extra kwargs are copied down to plain JSON-like data;
  * a message with reasoning under "reasoning_content", "thinking" or "reasoning" gets it under
    both "thinking" and "reasoning_content" (transformers' `_alias_reasoning_fields`);
  * `tools` and `documents` are always defined (None when not given);
  * special tokens that are None are left undefined (transformers' `special_tokens_map` omits them,
    so `{{ bos_token }}` renders '' rather than 'None').
"""
from __future__ import annotations

from datetime import datetime
from typing import Any

from webslm.semantic.jinja import (
    GlobalFunction, Limits, Template, TemplateError, TemplateLimitError,
    TemplateRaisedError, TemplateRuntimeError, TemplateSecurityError, TemplateSyntaxError,
)
from webslm.semantic.jinja.guards import bounded_json

__all__ = [
    "ChatTemplate", "TemplateError", "TemplateSyntaxError", "TemplateSecurityError",
    "TemplateLimitError", "TemplateRuntimeError", "TemplateRaisedError", "Limits",
]

_REASONING_FIELDS = ("reasoning_content", "thinking", "reasoning")
_MAX_STRFTIME_FORMAT = 1000  # a format string is tiny; a huge one could only amplify output


def _raise_exception(message: Any = None):
    raise TemplateRaisedError(str(message), construct="raise_exception")


def _strftime_now(format: str) -> str:
    if not isinstance(format, str) or len(format) > _MAX_STRFTIME_FORMAT:
        raise TemplateLimitError("strftime_now format must be a short string", construct="strftime_now")
    return datetime.now().strftime(format)


def _dict(*args, **kwargs) -> dict:
    return dict(*args, **kwargs)


def _tojson(renderer, value, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
    # transformers' tojson: no HTML escaping, keys keep their order unless sort_keys. Bounded
    # while it is written (jinja/guards.py): separators and indents repeat once per item.
    return bounded_json(renderer, value, ensure_ascii=ensure_ascii, indent=indent, separators=separators,
                        sort_keys=sort_keys)


_GLOBALS = {
    "raise_exception": GlobalFunction("raise_exception", _raise_exception),
    "strftime_now": GlobalFunction("strftime_now", _strftime_now),
    "dict": GlobalFunction("dict", _dict),
}  # `namespace` (underscore names refused, as transformers' TemplateNamespace) and `range` are built in


def _plain(value: Any, depth: int = 0) -> Any:
    """A fresh copy made of JSON-like types only: the template never sees caller objects, and the
    caller's messages are never modified."""
    if depth > 64:
        raise TemplateLimitError("template input nested too deeply", construct="input")
    if value is None or type(value) in (str, int, float, bool):
        return value
    if isinstance(value, str):
        return str.__str__(value)
    if isinstance(value, int):
        return int.__int__(value)
    if isinstance(value, float):
        return float.__float__(value)
    if isinstance(value, dict):
        return {_plain(k, depth + 1): _plain(v, depth + 1) for k, v in value.items()}
    if isinstance(value, list):
        return [_plain(v, depth + 1) for v in value]
    if isinstance(value, tuple):
        return tuple(_plain(v, depth + 1) for v in value)
    raise TemplateRuntimeError(f"unsupported value of type {type(value).__name__} in template input",
                               construct="input")


def _alias_reasoning_fields(message: dict) -> dict:
    reasoning = next((message[k] for k in _REASONING_FIELDS if message.get(k) is not None), None)
    if reasoning is None:
        return message
    return {"thinking": reasoning, **message, "reasoning_content": reasoning}


class ChatTemplate:
    """A model's chat template, parsed once (syntax and subset errors surface here)."""

    def __init__(self, source: str, bos_token: str | None = None, eos_token: str | None = None,
                 *, limits: Limits = Limits()):
        self.source = source
        self.bos_token = bos_token
        self.eos_token = eos_token
        self._template = Template(source, filters={"tojson": _tojson}, globals=_GLOBALS, limits=limits)

    def render(self, messages: list[dict], add_generation_prompt: bool = True, **extra: Any) -> str:
        """The prompt text for `messages`. `extra` becomes template variables (tools, documents,
        date_string, enable_thinking, ...); they override bos_token/eos_token like transformers'."""
        if not isinstance(messages, (list, tuple)):
            raise TemplateRuntimeError("messages must be a list of dicts", construct="input")
        chat = _plain(list(messages))
        for message in chat:
            if not isinstance(message, dict):
                raise TemplateRuntimeError("each message must be a dict", construct="input")
        context: dict[str, Any] = {}
        if self.bos_token is not None:
            context["bos_token"] = self.bos_token
        if self.eos_token is not None:
            context["eos_token"] = self.eos_token
        context.update(_plain(extra))
        context.update(
            messages=[_alias_reasoning_fields(m) for m in chat],
            tools=_plain(extra.get("tools")),
            documents=_plain(extra.get("documents")),
            add_generation_prompt=add_generation_prompt,
        )
        return self._template.render(context)
