"""Stop sequences (docs/sampler.md, section 9): StopMatcher finds a request's stop strings in
the committed text as it streams, holding back what could still become one. The engine
enforces them; the sampler only carries them in its settings (and state hash).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

from .sampler_settings import SamplerError, _stops


@dataclass(frozen=True)
class StopStep:
    """What a StopMatcher.push allows: text to show now, and whether (which) a stop matched."""
    text: str
    stopped: bool = False
    stop: str | None = None


class StopMatcher:
    """Finds stop sequences in streamed committed text (docs/sampler.md 9).

    Holds back the longest suffix that could still grow into a stop, so no part of a stop is
    ever shown. The match is the one that completes first (then the longest of those), which
    is what a character-by-character scan finds: the result does not depend on how the text
    was split into deltas."""

    def __init__(self, stops: Sequence[str]):
        self._stops = _stops(stops)
        self._held = ""
        self._stopped = False

    @property
    def held(self) -> str:
        return self._held

    @property
    def stopped(self) -> bool:
        return self._stopped

    def push(self, delta: str) -> StopStep:
        if self._stopped:
            raise SamplerError("stopped", "delta", "a stop sequence has already matched")
        if not isinstance(delta, str):
            raise SamplerError("bad-type", "delta", "must be a string")
        text = self._held + delta
        # Each stop's first occurrence is also its earliest end; among stops, the earliest end
        # wins, then the earliest start (the longest stop ending there).
        matches = [(start + len(stop), start, stop)
                   for stop in self._stops if (start := text.find(stop)) >= 0]
        if matches:
            _, start, stop = min(matches)
            self._held, self._stopped = "", True
            return StopStep(text[:start], True, stop)
        self._held = self._longest_stop_prefix_suffix(text)
        return StopStep(text[: len(text) - len(self._held)])

    def _longest_stop_prefix_suffix(self, text: str) -> str:
        longest = max((len(s) for s in self._stops), default=1) - 1
        for n in range(min(longest, len(text)), 0, -1):
            tail = text[-n:]
            if any(s.startswith(tail) for s in self._stops):
                return tail
        return ""

    def finish(self) -> str:
        """The held-back text, at the end of a generation that stopped for another reason."""
        held, self._held = self._held, ""
        return held
