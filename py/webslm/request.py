"""A request, made into what the generation loop takes: the prompt's token ids and the
sampler's settings. The CLI, the Engine and (to come) the worker all go through here, so a
prompt and a set of settings mean the same thing wherever they are given.

- `prompt_ids(model, prompt, chat, system)`: a prompt as plain text, as {role, content}
  messages, or as token ids already.
- `sampler_settings(model, overrides)`: the model's own sampling defaults (the manifest's
  "generation" section) with the request's settings laid over them.
"""
from __future__ import annotations

import dataclasses
from typing import Mapping

import numpy as np

from .errors import CodedError
from .semantic.sampler import SamplerSettings


class InvalidRequest(CodedError):
    """Codes: "bad-prompt" (not text, messages or token ids), "unknown-setting" (a setting
    SamplerSettings does not have). A setting with a bad value raises SamplerError."""


def prompt_ids(model, prompt, chat: bool = True, system: str | None = None) -> list[int]:
    """The token ids of a prompt given as:

    - a string: wrapped as one user message and rendered with the model's chat template,
      unless chat is False, then encoded as plain text (the tokenizer adds BOS as the
      manifest says; `system` does not apply);
    - a non-empty list of {role, content} messages: always rendered with the chat template;
    - a non-empty list of token ids: used as they are.

    `system`, for the two templated forms, is put first as a system message unless the
    messages begin with one already."""
    if isinstance(prompt, str):
        if not chat:
            return model.tokenizer.encode(prompt)
        prompt = [{"role": "user", "content": prompt}]
    try:
        prompt = list(prompt)
    except TypeError:
        prompt = []                          # not a sequence at all: a bad prompt, below
    if prompt and all(isinstance(m, dict) for m in prompt):
        if system and prompt[0].get("role") != "system":
            prompt = [{"role": "system", "content": system}] + prompt
        text = model.chat_template.render(prompt, add_generation_prompt=True)
        # The rendered template carries its own special tokens: no second BOS.
        return model.tokenizer.encode(text, add_special=False)
    if prompt and all(isinstance(t, (int, np.integer)) and not isinstance(t, bool) for t in prompt):
        return [int(t) for t in prompt]
    raise InvalidRequest("bad-prompt", "prompt", "must be a string, a non-empty list of "
                                                 "{role, content} messages, or a non-empty list of token ids")


# The manifest's "generation" keys (docs/slm-format.md) under their SamplerSettings names.
# Penalties beyond repetition_penalty, stop and seed have no model default: SamplerSettings'
# own defaults apply (off, none, 0).
_MODEL_DEFAULTS = {"temperature": "temperature", "top_k": "top_k", "top_p": "top_p", "min_p": "min_p",
                   "repetition_penalty": "repetition_penalty", "max_tokens": "max_new_tokens"}

_SETTINGS = frozenset(f.name for f in dataclasses.fields(SamplerSettings))


def sampler_settings(model, overrides: Mapping | None = None) -> SamplerSettings:
    """SamplerSettings for one answer: the model's sampling defaults, each replaced by the
    request's value where it gives one (None: the model's defaults alone). The result is
    validated as any SamplerSettings is (SamplerError for a bad value)."""
    overrides = dict(overrides or {})
    unknown = sorted(set(overrides) - _SETTINGS)
    if unknown:
        raise InvalidRequest("unknown-setting", unknown[0],
                             f"is not a sampling setting (those are {', '.join(sorted(_SETTINGS))})")
    generation = model.manifest.generation
    defaults = {ours: generation[theirs] for ours, theirs in _MODEL_DEFAULTS.items()}
    return SamplerSettings(**{**defaults, **overrides})
