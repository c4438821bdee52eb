"""The generation loop on one backend, synchronous (gpt-fast's decode_n_tokens):

    prompt ids -> backend.prefill
    repeat: sampler.choose(logits) -> Answer.accept (EOS, text, ledger, commit, stop, limit)
            -> the text it shows -> backend.decode_one

What a token does once chosen is answer.py's `Answer.accept`, which the Engine's
asynchronous loop (engine/engine.py) calls too, so both give the same answer, delta for
delta. Only committed tokens become text; the text shown is exactly the streamed decoding
of the committed ids, with stop sequences held back until they are ruled out.

Delta and Timings live in answer.py, prompt_ids in request.py; they are importable from
here as well, where callers have always found them.
"""
from __future__ import annotations

import time
from typing import Iterator

from .answer import Answer, Delta, Timings
from .request import prompt_ids
from .semantic.ledger import Ledger
from .semantic.sampler import SamplerSettings

__all__ = ["Delta", "Timings", "generate", "prompt_ids"]


def generate(model, backend, ids: list[int], settings: SamplerSettings,
             ledger: Ledger | None = None, timings: Timings | None = None) -> Iterator[Delta]:
    """Yield the answer's text deltas; the last Delta has a finish_reason. `backend` is a
    webslm.cpu.CpuBackend or anything with its reset/prefill/decode_one; `ledger` and
    `timings`, if given, are filled in as the answer goes."""
    answer = Answer(model, ids, settings, ledger if ledger is not None else Ledger(), timings)
    started = time.perf_counter()
    backend.reset()
    logits = backend.prefill(ids)
    answer.prefilled(started)
    while answer.has_room:
        token = answer.sampler.choose(logits, answer.position, answer.allowed())
        delta = answer.accept(token, answer.epoch, logits)
        if delta.finish_reason:
            # end() settles the ledger and the timings before the last delta is handed
            # out: a consumer may stop iterating right after it.
            yield answer.end(delta.finish_reason, delta.text)
            return
        if delta.text:
            yield delta
        logits = backend.decode_one(token)
    yield answer.end("length")      # the prompt left no room for a single token
