"""A request, made into what the generation loop takes: the prompt's token ids and the
sampler's settings. The CLI, the Engine and (to come) the worker all go through here, so a
prompt and a set of settings mean the same thing wherever they are given.

- `prompt_ids(model, prompt, chat, system)`: a prompt as plain text, as {role, content}
  messages, or as token ids already; text longer than the model's context is refused
  ("prompt-too-long") as soon as the tokenizer is sure of it, before it is tokenized in
  full (a 20 MB prompt costs about one context's worth of tokenizing, not 20 MB's).
- `sampler_settings(model, overrides)`: the model's own sampling defaults (the manifest's
  "generation" section) with the request's settings laid over them.
"""
from __future__ import annotations

import dataclasses
import math
from typing import Mapping

import numpy as np

from .errors import CodedError
from .semantic.sampler import SamplerError, SamplerSettings
from .semantic.tokenizer import TooManyTokens


class InvalidRequest(CodedError):
    """Codes: "bad-prompt" (not text, messages or token ids; or text that is not Unicode: a
    lone surrogate), "prompt-too-long" (more tokens than the context holds), "bad-template"
    (the model's chat template failed on these messages), "unknown-setting" (a setting
    SamplerSettings does not have). A setting with a bad value raises SamplerError."""


def prompt_ids(model, prompt, chat: bool = True, system: str | None = None, tools: list | None = None,
               suffix: str = "") -> list[int]:
    """The token ids of a prompt given as:

    - a string: wrapped as one user message and rendered with the model's chat template,
      unless chat is False, then encoded as plain text (the tokenizer adds BOS as the
      manifest says; `system` does not apply);
    - a non-empty list of {role, content} messages: always rendered with the chat template;
    - a non-empty list of token ids: used as they are.

    `system`, for the two templated forms, is put first as a system message unless the
    messages begin with one already. Text is refused (InvalidRequest "prompt-too-long") once
    it has more tokens than the context holds (a prompt that fills it exactly is allowed: its
    answer ends "length" at once); token ids are taken as given (the backend refuses too many).
    tools (messages only): OpenAI's tool list, given to the chat template as transformers
    gives it; suffix: text put after the rendered prompt (a forced tool call's opening)."""
    from .semantic.chat_template import TemplateError
    limit = model.architecture.context_length
    if isinstance(prompt, str):
        if not chat:
            return _encode(model, _text(prompt, "prompt"), limit, add_special=True)
        prompt = [{"role": "user", "content": prompt}]
    try:
        prompt = list(prompt)
    except TypeError:
        prompt = []                          # not a sequence at all: a bad prompt, below
    if prompt and all(isinstance(m, dict) for m in prompt):
        if system and prompt[0].get("role") != "system":
            prompt = [{"role": "system", "content": _text(system, "system")}] + prompt
        for n, message in enumerate(prompt):
            for key, value in message.items():
                if isinstance(value, str):
                    _text(value, f"prompt[{n}].{key}")
        try:
            text = model.chat_template.render(prompt, add_generation_prompt=True,
                                              **({"tools": tools} if tools else {})) + suffix
        except TemplateError as exc:
            raise InvalidRequest("bad-template", "chat_template",
                                 f"the model's chat template failed on these messages: {exc}"[:400]) from None
        # The rendered template carries its own special tokens: no second BOS.
        return _encode(model, text, limit, add_special=False)
    if prompt and all(isinstance(t, (int, np.integer)) and not isinstance(t, bool) for t in prompt):
        return [int(t) for t in prompt]
    raise InvalidRequest("bad-prompt", "prompt", "must be a string, a non-empty list of "
                                                 "{role, content} messages, or a non-empty list of token ids")


def _text(value: str, where: str) -> str:
    """Text that UTF-8 can hold: a lone surrogate (from invalid bytes on a command line, or
    JSON's \\ud800 escape) would fail in the tokenizer."""
    try:
        value.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise InvalidRequest("bad-prompt", where, f"is not valid Unicode text (a lone surrogate at "
                                                  f"character {exc.start})") from None
    return value


def _encode(model, text: str, limit: int, add_special: bool) -> list[int]:
    try:
        return model.tokenizer.encode(text, add_special=add_special, max_tokens=limit)
    except TooManyTokens:
        raise InvalidRequest("prompt-too-long", "prompt", f"has more than {limit} tokens: the model's "
                                                          f"context holds {limit}") from None


# The manifest's "generation" keys (docs/slm-format.md) under their SamplerSettings names.
# Penalties beyond repetition_penalty, stop and seed have no model default: SamplerSettings'
# own defaults apply (off, none, 0).
_MODEL_DEFAULTS = {"temperature": "temperature", "top_k": "top_k", "top_p": "top_p", "min_p": "min_p",
                   "repetition_penalty": "repetition_penalty", "max_tokens": "max_new_tokens"}

# Settings that are not SamplerSettings fields but become one: ignore_eos (the EOS ids banned
# through logit_bias, so the answer runs to max_tokens or a stop string).
_REQUEST_ONLY = frozenset({"ignore_eos"})
_SETTINGS = frozenset(f.name for f in dataclasses.fields(SamplerSettings)) | _REQUEST_ONLY


def sampler_settings(model, overrides: Mapping | None = None) -> SamplerSettings:
    """SamplerSettings for one answer: the model's sampling defaults, each replaced by the
    request's value where it gives one (None: the model's defaults alone). The result is
    validated as any SamplerSettings is (SamplerError for a bad value).

    As JSON gives them: logit_bias may be {"token id": bias} (decimal string keys), and
    ignore_eos: true bans the model's EOS ids (a -inf bias on each)."""
    overrides = dict(overrides or {})
    unknown = sorted(set(overrides) - _SETTINGS)
    if unknown:
        raise InvalidRequest("unknown-setting", unknown[0],
                             f"is not a sampling setting (those are {', '.join(sorted(_SETTINGS))})")
    ignore_eos = overrides.pop("ignore_eos", False)
    if not isinstance(ignore_eos, bool):
        raise SamplerError("bad-type", "ignore_eos", "must be true or false")
    if "logit_bias" in overrides:
        overrides["logit_bias"] = _json_bias(overrides["logit_bias"])
    if isinstance(overrides.get("response_format"), dict):          # OpenAI's {"type": ...}
        overrides.update(_response_format(overrides["response_format"]))
    if ignore_eos and overrides.get("response_format", "text") != "text":
        raise SamplerError("out-of-range", "ignore_eos", "cannot be set in JSON mode: the answer ends "
                                                         "when its object is complete")
    generation = model.manifest.generation
    defaults = {ours: generation[theirs] for ours, theirs in _MODEL_DEFAULTS.items()}
    settings = SamplerSettings(**{**defaults, **overrides})
    vocab = model.architecture.vocab
    for token, _ in settings.logit_bias:
        if token >= vocab:
            raise SamplerError("out-of-range", "logit_bias", f"token {token} is not in this model's "
                                                             f"vocabulary [0, {vocab})")
    if ignore_eos:
        banned = {int(t): -math.inf for t in model.manifest.tokenizer["eos_ids"]}
        settings = dataclasses.replace(settings, logit_bias={**dict(settings.logit_bias), **banned})
    return settings


def _response_format(form: dict) -> dict:
    """OpenAI's and WebLLM's response_format as SamplerSettings fields:
    {type: "text"}, {type: "json_object"}, {type: "json_object", schema: <schema or its JSON
    text>} (WebLLM's) and {type: "json_schema", json_schema: {name, description, strict,
    schema}} (OpenAI's; name, description and strict are taken and not used: the schema is
    always enforced)."""
    kind = form.get("type")
    given = {k for k, v in form.items() if v is not None}
    if kind == "json_schema":
        spec = form.get("json_schema")
        if given - {"type", "json_schema"} or not isinstance(spec, dict) or spec.get("schema") is None:
            raise SamplerError("out-of-range", "response_format", "json_schema must be {type: \"json_schema\", "
                                                                  "json_schema: {name, schema}}")
        unknown = sorted(set(spec) - {"name", "description", "strict", "schema"})
        if unknown:
            raise SamplerError("out-of-range", f"response_format.json_schema.{unknown[0]}", "is not a field of "
                                                                                            "json_schema")
        return {"response_format": "json_schema", "json_schema": spec["schema"]}
    if kind == "json_object" and given <= {"type", "schema"}:
        if form.get("schema") is not None:
            return {"response_format": "json_schema", "json_schema": form["schema"]}
        return {"response_format": "json_object"}
    if kind == "grammar":
        if given != {"type", "grammar"} or not isinstance(form.get("grammar"), str):
            raise SamplerError("out-of-range", "response_format", 'grammar must be {type: "grammar", grammar: '
                                                                  '"<GBNF text>"}')
        return {"response_format": "grammar", "grammar": form["grammar"]}
    if kind == "text" and given == {"type"}:
        return {"response_format": "text"}
    raise SamplerError("out-of-range", "response_format", "must be {type: text}, {type: json_object}, "
                                                          "{type: json_object, schema}, {type: json_schema, "
                                                          "json_schema: {name, schema}} or {type: grammar, grammar}")


def _json_bias(value):
    """{"123": -5} (JSON's string keys) as {123: -5}; anything else is left to SamplerSettings."""
    if not isinstance(value, dict):
        return value
    out = {}
    for key, bias in value.items():
        if isinstance(key, str):
            if not (key.isascii() and key.isdigit() and len(key) <= 10):
                raise SamplerError("bad-type", "logit_bias", f"a key must be a token id in decimal, "
                                                             f"not {key[:20]!r}")
            key = int(key)
        out[key] = bias
    return out

