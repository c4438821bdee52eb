"""The generation loop on one backend, as the engine drives it (gpt-fast's decode_n_tokens):

    prompt -> chat template -> token ids -> backend.prefill
    repeat: sampler.choose(logits) -> ledger.offer (commit) -> streamed text -> backend.decode_one

Only committed tokens become text; the text shown is exactly the streamed decoding of the
committed ids, with stop sequences held back until they are ruled out. The GPU engine reuses
this loop with its own backend; after a device loss the CPU backend rebuilds from the
ledger's committed ids and the same loop continues.
"""
from __future__ import annotations

import dataclasses
import time
from typing import Iterator

from .semantic.ledger import Ledger
from .semantic.sampler import Sampler, SamplerSettings, StopMatcher
from .semantic.tokenizer import StreamDecoder


@dataclasses.dataclass
class Delta:
    """A piece of answer text, or the end (finish_reason set: "stop", "length")."""
    text: str
    token_id: int | None = None
    finish_reason: str | None = None


@dataclasses.dataclass
class Timings:
    prompt_tokens: int = 0
    generated_tokens: int = 0
    prefill_seconds: float = 0.0
    decode_seconds: float = 0.0


def prompt_ids(model, prompt: str, chat: bool, system: str | None = None) -> list[int]:
    if not chat:
        return model.tokenizer.encode(prompt)
    messages = ([{"role": "system", "content": system}] if system else []) + [{"role": "user", "content": prompt}]
    # The rendered template carries its own special tokens; don't add BOS a second time.
    text = model.chat_template.render(messages, add_generation_prompt=True)
    return model.tokenizer.encode(text, add_special=False)


def generate(model, backend, ids: list[int], settings: SamplerSettings,
             ledger: Ledger | None = None, timings: Timings | None = None) -> Iterator[Delta]:
    """Yield the answer's text deltas; the last Delta has a finish_reason."""
    ledger = ledger or Ledger()
    timings = timings if timings is not None else Timings()
    eos = set(model.manifest.tokenizer["eos_ids"])
    sampler = Sampler(settings, model.architecture.vocab, history=ids, position=len(ids))
    stream, stops = StreamDecoder(model.tokenizer, skip_special=True), StopMatcher(settings.stop)
    epoch = ledger.begin(ids)
    limit = min(settings.max_tokens, model.architecture.context_length - len(ids))

    started = time.perf_counter()
    backend.reset()
    logits = backend.prefill(ids)
    timings.prompt_tokens, timings.prefill_seconds = len(ids), time.perf_counter() - started

    started = time.perf_counter()

    def finish(text: str, reason: str) -> Delta:
        # Timings and the ledger are settled before the last delta is handed out: a consumer
        # may stop iterating right after it.
        timings.decode_seconds = time.perf_counter() - started
        ledger.cancel()   # the generation is over: nothing may commit to it any more
        return Delta(text, None, reason)

    for step in range(limit):
        position = len(ids) + step
        token = sampler.choose(logits, position)
        if token in eos:
            yield finish(stops.finish() + stream.flush(), "stop")
            return
        text = stream.push(token)
        ledger.offer(epoch, position, token, sampler.state_hash_after(token), text)
        sampler.commit(token)
        timings.generated_tokens += 1
        shown = stops.push(text)
        if shown.stopped:
            yield finish(shown.text, "stop")
            return
        if shown.text:
            yield Delta(shown.text, token)
        if step + 1 < limit:
            logits = backend.decode_one(token)
    yield finish(stops.finish() + stream.flush(), "length")
