"""One answer, token by token: the one place where a chosen token becomes committed, shown text.

Both generation loops hand every token the sampler chose to `Answer.accept`: generate.py's
synchronous loop, and the Engine's asynchronous one (engine/engine.py), which wraps it in
cancellation, stale results and device loss. accept() does, in this order:

1. EOS ends the answer "stop". The EOS token is not committed.
2. The stream decoder turns the token into text: "" for a special token, and for a padding
   id (a vocabulary larger than the tokenizer's token list), which is committed all the
   same, so the answer goes on with no text for it.
3. The ledger is offered the token at the next position, under the epoch its scores were
   computed in. If it refuses (the answer was cancelled meanwhile) the answer ends "abort".
4. The sampler commits the token. It only ever sees committed tokens: that is what lets a
   rebuilt sampler carry on exactly after a device loss.
5. The stop matcher shows the text, holding back what could still grow into a stop
   sequence; a completed stop sequence ends the answer "stop" and is never shown.
6. The answer's limit (max_tokens, or the room left in the context) ends it "length".

When the answer ends "stop" at EOS, or "length", the held-back text is shown with the end.

With settings.logprobs, each committed token's log-probability (Sampler.logprobs, computed
from the full row before the commit, so over the history the choice saw) is kept and handed
out with the next Delta that carries text, or with the end: every committed token once, in
order, whatever the stop matcher holds back.
accept() only says how the answer ends; the loop then calls end(), because the Engine has
its own bookkeeping to do at an ending (its state machine).
"""
from __future__ import annotations

import dataclasses
import time

from .semantic.ledger import Ledger
from .semantic.sampler import Sampler, SamplerError, SamplerSettings, StopMatcher
from .semantic.tokenizer import StreamDecoder


@dataclasses.dataclass
class Delta:
    """A piece of answer text (token_id: the committed token that released it), or the end:
    finish_reason "stop", "length" or "abort", with the last text and no token_id."""
    text: str
    token_id: int | None = None
    finish_reason: str | None = None
    logprobs: list[dict] | None = None    # settings.logprobs: one entry per token committed since the last Delta


@dataclasses.dataclass
class Timings:
    prompt_tokens: int = 0
    cached_tokens: int = 0          # of the prompt's, kept in the KV cache from before (not re-read)
    generated_tokens: int = 0
    prefill_seconds: float = 0.0
    decode_seconds: float = 0.0


def grammar_mask(model, settings: SamplerSettings):
    """The token mask of settings.response_format (token_mask.GrammarMask, kept on the
    tokenizer), or None for free text."""
    arch, eos = model.architecture, sorted(model.manifest.tokenizer["eos_ids"])
    if settings.response_format == "json_object":
        from .semantic.json_grammar import json_mask_for
        return json_mask_for(model.tokenizer, arch.vocab, frozenset(eos))
    if settings.response_format == "json_schema":
        from .semantic.json_schema import schema_mask_for
        return schema_mask_for(model.tokenizer, arch.vocab, eos, settings.json_schema)
    if settings.response_format == "grammar":
        from .semantic.gbnf import grammar_mask_for
        return grammar_mask_for(model.tokenizer, arch.vocab, eos, settings.grammar)
    return None


def check_room(model, prompt_ids: list[int], settings: SamplerSettings) -> None:
    """SamplerError "out-of-range" on max_tokens when a constrained answer cannot be whole
    within its token limit (max_tokens, or the room the prompt leaves in the context): asked
    before anything is generated, so a request is refused, not answered with a cut text."""
    mask = grammar_mask(model, settings)
    if mask is not None:
        _check_room(mask, settings, min(settings.max_tokens, model.architecture.context_length - len(prompt_ids)))


def _check_room(mask, settings: SamplerSettings, limit: int) -> None:
    need = mask.closing(mask.initial)
    if mask.closes and need > limit:
        room = "max_tokens" if limit == settings.max_tokens else "the room the prompt leaves in the context"
        raise SamplerError("out-of-range", "max_tokens", f"the shortest answer the {settings.response_format} "
                                                         f"format allows takes {need:.0f} tokens (counted as bytes), "
                                                         f"more than {room} ({limit})")


class Answer:
    """One answer to one prompt: its sampler, its text side (stream decoder, stop matcher),
    the ledger generation (epoch) it commits to, its token limit and its Timings.
    finish_reason is set once, by end()."""

    def __init__(self, model, prompt_ids: list[int], settings: SamplerSettings, ledger: Ledger,
                 timings: Timings | None = None):
        arch = model.architecture
        self.prompt_ids, self.settings, self.ledger = list(prompt_ids), settings, ledger
        self.sampler = Sampler(settings, arch.vocab, history=self.prompt_ids, position=len(self.prompt_ids))
        self.stream = StreamDecoder(model.tokenizer, skip_special=True)
        self.stops = StopMatcher(settings.stop)
        self.eos = frozenset(model.manifest.tokenizer["eos_ids"])
        # Every committed token but the last is fed back into the KV cache, which holds
        # context_length positions.
        self.limit = min(settings.max_tokens, arch.context_length - len(self.prompt_ids))
        self.epoch = ledger.begin(self.prompt_ids)
        self.timings = timings if timings is not None else Timings()
        self.finish_reason: str | None = None
        self.tokenizer = model.tokenizer
        self._logprobs: list[dict] = []     # entries not yet handed out
        # JSON, JSON-schema and grammar modes: the mask, and the recognizer's state over the
        # committed tokens' bytes
        self._grammar = grammar_mask(model, settings)
        if self._grammar is not None:
            self._grammar_state = self._grammar.initial
            _check_room(self._grammar, settings, self.limit)
        self._committed = 0
        self._decode_started: float | None = None

    @property
    def position(self) -> int:
        """The absolute position of the next token (the sampler's: it moves on each commit)."""
        return self.sampler.position

    def allowed(self):
        """The constrained modes' mask of the tokens that may come next (bool [vocab]), else
        None: closable within the token limit (token_mask.GrammarMask.allowed_within)."""
        if self._grammar is None:
            return None
        return self._grammar.allowed_within(self._grammar_state, self.limit - self._committed - 1)

    @property
    def has_room(self) -> bool:
        """Whether another token may be generated. accept() ends the answer at the limit, so
        a loop finds no room before its first token only: the prompt filled the context."""
        return self._committed < self.limit

    @property
    def current(self) -> bool:
        """Whether this answer may still commit: not ended, not cancelled, not superseded."""
        return (self.finish_reason is None and self.ledger.is_open
                and self.ledger.epoch == self.epoch)

    def prefilled(self, started: float) -> None:
        """The prompt's forward pass, begun at `started` (time.perf_counter()), is done:
        record it, and start the decode clock."""
        self.timings.prompt_tokens = len(self.prompt_ids)
        self.timings.prefill_seconds = time.perf_counter() - started
        self._decode_started = time.perf_counter()

    def accept(self, token: int, epoch: int, logits=None) -> Delta:
        """The token the sampler chose for the next position, from scores computed in `epoch`
        (steps 1-6 above). Returns what to show: the text now visible (often ""), with
        finish_reason set when this token ends the answer; then the loop calls end().
        logits: the full row the token was chosen from, needed with settings.logprobs."""
        if token in self.eos:
            return Delta(self._held_back(), None, "stop")
        text = self.stream.push(token)
        if self.ledger.offer(epoch, self.position, token, self.sampler.state_hash_after(token), text) is None:
            return Delta("", None, "abort")
        if self.settings.logprobs:
            self._logprobs.append(self._logprob_entry(logits, token))
        if self._grammar is not None:
            self._advance_grammar(token)
        self.sampler.commit(token)
        self._committed += 1
        self.timings.generated_tokens = self._committed
        shown = self.stops.push(text)
        if shown.stopped:
            return Delta(shown.text, None, "stop")
        if not self.has_room:
            return Delta(shown.text + self._held_back(), None, "length")
        return Delta(shown.text, token, logprobs=self._take_logprobs() if shown.text else None)

    def _logprob_entry(self, logits, token: int) -> dict:
        """OpenAI's logprobs entry for a committed token: {token, bytes, logprob, top_logprobs}."""
        if logits is None:
            raise ValueError("logprobs need the full logits row (want_for asks the backend for it)")
        logprob, top = self.sampler.logprobs(logits, token, self.settings.top_logprobs, self.allowed())
        return {**self._token(token), "logprob": logprob,
                "top_logprobs": [{**self._token(t), "logprob": lp} for t, lp in top]}

    def _advance_grammar(self, token: int) -> None:
        after = self._grammar.advance(self._grammar_state, self.tokenizer.piece_bytes(token) or b"")
        if after is None:                   # the mask allowed it: a bug, never a wrong answer
            raise ValueError(f"token {token} leaves the {self.settings.response_format} grammar; the mask allowed it")
        self._grammar_state = after

    def _token(self, token: int) -> dict:
        raw = self.tokenizer.piece_bytes(token)
        return {"token": raw.decode("utf-8", "replace") if raw is not None else "",
                "bytes": list(raw) if raw is not None else None}

    def _take_logprobs(self) -> list[dict] | None:
        if not self.settings.logprobs:
            return None
        taken, self._logprobs = self._logprobs, []
        return taken

    def _held_back(self) -> str:
        """What the stop matcher and the stream decoder still hold, at a natural end."""
        return self.stops.finish() + self.stream.flush()

    def end(self, reason: str, text: str = "") -> Delta:
        """End the answer with its last text. Its ledger generation is closed, so nothing
        more commits, and the decode time is taken. An answer cancelled or superseded
        meanwhile ends "abort" with no text, whatever the reason given, except "error"
        (the caller raises after ending). Only the first call ends it: a later one returns
        the same finish_reason and no text (the last text was handed out once)."""
        if self.finish_reason is not None:
            return Delta("", None, self.finish_reason)
        if not self.current and reason != "error":
            reason, text = "abort", ""
        if self.current:
            self.ledger.cancel()
        self.finish_reason = reason
        if self._decode_started is not None:
            self.timings.decode_seconds = time.perf_counter() - self._decode_started
        return Delta(text, None, reason, self._take_logprobs())
