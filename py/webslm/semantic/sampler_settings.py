"""The sampler's settings (docs/sampler.md, section 1): SamplerSettings, validated and
immutable, the typed SamplerError every sampler step raises, and the limits a request's
settings must keep (logit_bias, top_logprobs, response_format).

Each setting is checked once, here, with a typed error before any work; the values are then
canonical (-0.0 is 0.0, a dict of biases is sorted pairs), so one behaviour has one state
hash (sampler.py, section 8). The choice itself is in sampler.py; the stop sequences this
file validates are matched by stop_sequences.py.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from ..errors import CodedError

MAX_U32 = 0xFFFF_FFFF
MAX_U64 = 0xFFFF_FFFF_FFFF_FFFF


class SamplerError(CodedError):
    """A typed sampler error: a stable code (CODES), where (a field or argument), a sentence."""


CODES = {
    "bad-type": "a setting or argument has the wrong type",
    "out-of-range": "a setting or argument is outside its allowed range",
    "not-finite": "a setting is NaN or infinite",
    "bad-logits": "logits have the wrong shape, or contain NaN or +inf (also after penalties)",
    "no-token": "every logit is -inf: no token can be chosen",
    "position-mismatch": "choose() was asked for a position other than the sampler's next one",
    "bad-token": "a token id outside [0, vocab_size)",
    "bad-candidates": "candidate ids are not distinct, out of range, or do not match their logits",
    "candidates-insufficient": "the candidate set cannot prove it holds every choosable token",
    "stopped": "text was pushed into a StopMatcher that has already matched a stop",
}

# logit_bias: OpenAI's range for a bias, and a bound on how many tokens one request may bias.
# A bias may also be -inf: the token is never chosen (ignore_eos bans the EOS ids this way).
MAX_BIAS = 100.0
MAX_BIASED_TOKENS = 4096
# top_logprobs: OpenAI allows up to 20 alternatives per position (WebLLM up to 5).
MAX_TOP_LOGPROBS = 20
# response_format: "text", "json_object" (the engine masks every token that would leave the
# answer no JSON object: semantic/json_grammar.py; the mask comes to choose() as `allowed`) or
# "json_schema" (the same, for the JSON texts valid against json_schema: semantic/json_schema.py).
RESPONSE_FORMATS = ("text", "json_object", "json_schema", "grammar")


# == 1. Settings ==============================================================================

def _real(name: str, value, *, low: float, high: float, low_open: bool = False) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise SamplerError("bad-type", name, f"must be a number, not {type(value).__name__}")
    value = float(value)
    if not math.isfinite(value):
        raise SamplerError("not-finite", name, f"must be finite, not {value!r}")
    if value < low or (low_open and value == low) or value > high:
        bracket = "(" if low_open else "["
        raise SamplerError("out-of-range", name, f"must be in {bracket}{low}, {high}], not {value!r}")
    return value + 0.0  # -0.0 -> 0.0: one canonical value per behaviour (the state hash)


def _integer(name: str, value, *, low: int, high: int) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        raise SamplerError("bad-type", name, f"must be an integer, not {type(value).__name__}")
    value = int(value)
    if not low <= value <= high:
        raise SamplerError("out-of-range", name, f"must be in [{low}, {high}], not {value}")
    return value


@dataclass(frozen=True)
class SamplerSettings:
    """Validated, immutable sampling settings (docs/sampler.md, section 1).

    temperature 0 is greedy. top_k 0, top_p 1, min_p 0, repetition_penalty 1 and the two
    additive penalties 0 switch their step off. penalty_window is the number of most recent
    history tokens the penalties look at (0 = the whole history). stop and max_tokens are
    enforced by the engine (StopMatcher, token count); they are here so that one object, and
    one state hash, describes the whole request.

    logit_bias ((token id, bias) pairs in ascending id order; a dict {id: bias} is accepted
    and sorted) adds each bias to its token's logit before the penalties; a bias is in
    [-100, 100], or -inf to ban the token. logprobs and top_logprobs (0 to 20 alternatives,
    which needs logprobs) change no choice: they make the engine report, for each committed
    token, its log-probability (Sampler.logprobs), which needs the full logits row."""
    temperature: float = 1.0
    top_k: int = 0
    top_p: float = 1.0
    min_p: float = 0.0
    repetition_penalty: float = 1.0
    frequency_penalty: float = 0.0
    presence_penalty: float = 0.0
    penalty_window: int = 64
    stop: tuple[str, ...] = ()
    max_tokens: int = 256
    seed: int = 0
    logit_bias: tuple[tuple[int, float], ...] = ()
    logprobs: bool = False
    top_logprobs: int = 0
    response_format: str = "text"
    json_schema: str = ""          # response_format "json_schema": the schema as compact JSON text
    grammar: str = ""              # response_format "grammar": the GBNF text (semantic/gbnf.py)

    def __post_init__(self):
        inf = math.inf
        checked = {
            "temperature": _real("temperature", self.temperature, low=0.0, high=inf),
            "top_k": _integer("top_k", self.top_k, low=0, high=MAX_U32),
            "top_p": _real("top_p", self.top_p, low=0.0, high=1.0, low_open=True),
            "min_p": _real("min_p", self.min_p, low=0.0, high=1.0),
            "repetition_penalty": _real("repetition_penalty", self.repetition_penalty,
                                        low=0.0, high=inf, low_open=True),
            "frequency_penalty": _real("frequency_penalty", self.frequency_penalty, low=-inf, high=inf),
            "presence_penalty": _real("presence_penalty", self.presence_penalty, low=-inf, high=inf),
            "penalty_window": _integer("penalty_window", self.penalty_window, low=0, high=MAX_U32),
            "stop": _stops(self.stop),
            "max_tokens": _integer("max_tokens", self.max_tokens, low=1, high=MAX_U32),
            "seed": _integer("seed", self.seed, low=0, high=MAX_U64),
            "logit_bias": _biases(self.logit_bias),
            "logprobs": _flag("logprobs", self.logprobs),
            "top_logprobs": _integer("top_logprobs", self.top_logprobs, low=0, high=MAX_TOP_LOGPROBS),
            "response_format": _choice("response_format", self.response_format, RESPONSE_FORMATS),
        }
        checked["json_schema"] = _schema(self.json_schema, checked["response_format"])
        checked["grammar"] = _grammar(self.grammar, checked["response_format"])
        if checked["top_logprobs"] and not checked["logprobs"]:
            raise SamplerError("out-of-range", "top_logprobs", "needs logprobs: true")
        for name, value in checked.items():
            object.__setattr__(self, name, value)

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0

    @property
    def penalties_active(self) -> bool:
        return (self.repetition_penalty != 1.0 or self.frequency_penalty != 0.0
                or self.presence_penalty != 0.0)

    @property
    def bias_can_raise(self) -> bool:
        """Whether logit_bias raises some logit (a positive bias)."""
        return any(bias > 0.0 for _, bias in self.logit_bias)

    @property
    def extended(self) -> bool:
        """Whether a setting added after the first state format is on (logit_bias, logprobs):
        the state hash then uses the second format (section 8)."""
        return bool(self.logit_bias) or self.logprobs or self.top_logprobs > 0 or self.response_format != "text"

    @property
    def penalties_can_raise(self) -> bool:
        """Whether a penalty can raise some logit (section 7: candidates then need more care)."""
        return (self.repetition_penalty < 1.0 or self.frequency_penalty < 0.0
                or self.presence_penalty < 0.0)


def _choice(name: str, value, choices) -> str:
    if value not in choices or not isinstance(value, str):
        raise SamplerError("out-of-range", name, f"must be one of {', '.join(choices)}, not {str(value)[:40]!r}")
    return value


def _schema(value, response_format: str) -> str:
    """json_schema as compact JSON text, compiled once to check it is in the supported subset
    (json_schema.SchemaError otherwise); "" unless response_format is "json_schema"."""
    if response_format != "json_schema":
        if value not in ("", None):
            raise SamplerError("out-of-range", "json_schema", 'needs response_format "json_schema"')
        return ""
    if value in ("", None):
        raise SamplerError("out-of-range", "json_schema", 'response_format "json_schema" needs a schema')
    from .json_schema import canonical_schema
    return canonical_schema(value)


def _grammar(value, response_format: str) -> str:
    """The GBNF text, compiled once to check it (gbnf.GrammarError otherwise); "" unless
    response_format is "grammar"."""
    if response_format != "grammar":
        if value not in ("", None):
            raise SamplerError("out-of-range", "grammar", 'needs response_format "grammar"')
        return ""
    from .gbnf import compile_grammar
    compile_grammar(value)
    return value


def _flag(name: str, value) -> bool:
    if not isinstance(value, (bool, np.bool_)):
        raise SamplerError("bad-type", name, f"must be true or false, not {type(value).__name__}")
    return bool(value)


def _biases(value) -> tuple[tuple[int, float], ...]:
    """logit_bias as (id, bias) pairs in ascending id order, each id once."""
    if isinstance(value, dict):
        value = list(value.items())
    if isinstance(value, (str, bytes)) or not isinstance(value, (tuple, list)):
        raise SamplerError("bad-type", "logit_bias", "must be {token id: bias} or (id, bias) pairs")
    if len(value) > MAX_BIASED_TOKENS:
        raise SamplerError("out-of-range", "logit_bias", f"biases more than {MAX_BIASED_TOKENS} tokens")
    pairs = {}
    for pair in value:
        if not isinstance(pair, (tuple, list)) or len(pair) != 2:
            raise SamplerError("bad-type", "logit_bias", "must be {token id: bias} or (id, bias) pairs")
        token = _integer("logit_bias token id", pair[0], low=0, high=MAX_U32)
        bias = pair[1]
        where = f"logit_bias[{token}]"
        if isinstance(bias, bool) or not isinstance(bias, (int, float)):
            raise SamplerError("bad-type", where, f"must be a number, not {type(bias).__name__}")
        bias = float(bias)
        if bias != -math.inf:
            bias = _real(where, bias, low=-MAX_BIAS, high=MAX_BIAS)
        if token in pairs:
            raise SamplerError("out-of-range", "logit_bias", f"token {token} is biased twice")
        pairs[token] = bias
    return tuple(sorted(pairs.items()))


def _stops(value) -> tuple[str, ...]:
    if isinstance(value, str) or not isinstance(value, (tuple, list)):
        raise SamplerError("bad-type", "stop", "must be a tuple or list of strings")
    for i, stop in enumerate(value):
        where = f"stop[{i}]"
        if not isinstance(stop, str):
            raise SamplerError("bad-type", where, f"must be a string, not {type(stop).__name__}")
        if not stop:
            raise SamplerError("out-of-range", where, "an empty stop sequence would match everywhere")
        try:
            stop.encode("utf-8")
        except UnicodeEncodeError:
            raise SamplerError("out-of-range", where, "is not valid Unicode (lone surrogate)") from None
    return tuple(value)
