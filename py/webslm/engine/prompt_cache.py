"""What a backend's KV cache holds, so that the next prompt re-reads only what it does not share.

A chat sends the whole conversation every turn: the system prompt, every question and every
answer, then the new question. The backend's cache already holds the K/V rows of the last
prompt and of the answer tokens that were fed back, so the engine keeps the longest common
prefix of token ids and prefills only the rest.

The rule:
- Kept: the longest common prefix of the new prompt's ids and the ids the cache holds
  (the last prompt plus the answer tokens fed back, or as much of a prompt as a cancelled
  prefill got through), but never the whole prompt: its last token is always run again,
  because its scores choose the first token of the answer. Ids, not text, are compared, so
  wherever the re-rendered conversation tokenizes differently (an answer whose sampled
  tokens are not the tokenizer's own split, a template that renders earlier turns another
  way, a changed system prompt) the cache is kept up to that token and re-read from there.
  The end-of-turn token after an answer is never in the cache (EOS is not fed back), so a
  new turn's suffix starts with it.
- Dropped (nothing kept): the answer runs on another backend than the one whose cache is
  recorded (the GPU was lost and the CPU path replays the committed tokens, the GPU was
  released, the model was switched or unloaded), an answer failed with an error, or the
  backend's position is not what the record says (the cache was used outside the engine,
  e.g. by conformance). A prompt longer than the context is refused as before; the kept
  prefix is never longer than the prompt, so it cannot overflow.

Positions are absolute, so rows past the kept prefix are simply overwritten by the next
prefill (backends' truncate()). The K/V rows are the same numbers a fresh prefill computes,
up to float rounding: a row computed in a chunk of T tokens and one computed alone are
summed in other orders (BLAS on the CPU, tile shapes on the GPU).
"""
from __future__ import annotations

from typing import Sequence


def common_prefix(a: Sequence[int], b: Sequence[int]) -> int:
    """The length of the longest common prefix of two id sequences."""
    n = min(len(a), len(b))
    for i in range(n):
        if a[i] != b[i]:
            return i
    return n


class PromptCache:
    """The ids whose K/V rows one backend's cache holds, at positions 0..len(ids)-1."""

    def __init__(self):
        self.backend = None
        self.ids: list[int] = []

    def reusable(self, backend, prompt: Sequence[int]) -> int:
        """How many leading positions of `backend`'s cache the prompt can keep (see the rule)."""
        if backend is None or backend is not self.backend or _position(backend) != len(self.ids):
            return 0
        return min(common_prefix(self.ids, prompt), len(prompt) - 1)

    def wrote(self, backend, start: int, ids: Sequence[int]) -> None:
        """After a backend call that wrote `ids` at positions start.. (all of them, some,
        or none when it failed or was cancelled: the backend's position says how far it got)."""
        if backend is not self.backend:
            self.backend, self.ids = backend, []
        position = _position(backend)
        if position is None or start > len(self.ids) or position < start:
            self.forget()
            return
        del self.ids[start:]
        self.ids.extend(int(t) for t in ids[:position - start])
        if len(self.ids) != position:
            self.forget()

    def forget(self) -> None:
        self.backend, self.ids = None, []


def _position(backend) -> int | None:
    try:
        return int(backend.position)
    except Exception:     # noqa: BLE001 - a released backend has no position
        return None
