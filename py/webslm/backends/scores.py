"""What a forward step hands the sampler, and the surface both backends offer.

The engine cannot tell the GPU executor from the CPU path except by `kind`: each appends
tokens to its KV cache and returns the next position's scores, as the engine asked for them
(`Want`): the full logits row, a canonical top-k candidate set, or only the argmax. The GPU
reads back a few bytes for the last two; the CPU always has the full row and reduces it.

Every result is tagged with the generation epoch and position it was computed for, and the
executor's submission sequence number, so the ledger can drop a stale one (a cancel, a loss)
instead of showing it.
"""
from __future__ import annotations

import dataclasses
from typing import Protocol

import numpy as np

from ..errors import CodedError


class BackendLost(CodedError):
    """The accelerator is gone (device lost, or a GPU error made its state untrustworthy).
    Codes: "device-lost", "gpu-error", "readback-failed". The engine switches to the CPU path
    and replays the committed tokens; nothing the lost backend computed after the last commit
    is used."""


class BackendCancelled(CodedError):
    """The work was abandoned at a submission boundary because its epoch went stale."""


@dataclasses.dataclass(frozen=True)
class Want:
    """What the sampler needs at the next position: "full" (the whole row), "top-k" with k
    (sampler.needs_full_logits(k) is False), or "argmax" (greedy without penalties)."""
    kind: str = "full"
    k: int = 1

    def __post_init__(self):
        if self.kind not in ("full", "top-k", "argmax"):
            raise ValueError(f"Want.kind must be 'full', 'top-k' or 'argmax', not {self.kind!r}")
        if self.kind == "top-k" and not (isinstance(self.k, int) and self.k >= 1):
            raise ValueError(f"Want.k must be a positive int, not {self.k!r}")


@dataclasses.dataclass(frozen=True)
class Scores:
    """The next position's scores: `logits` [V] f32 when full, else `ids` [k] (rank order)
    with their exact logits `values` [k]. Tagged with where it was computed."""
    position: int                     # the position these scores choose a token for
    epoch: int = 0                    # the generation epoch the work was submitted under
    sequence: int = 0                 # the backend's submission counter
    logits: np.ndarray | None = None
    ids: np.ndarray | None = None
    values: np.ndarray | None = None

    def choose(self, sampler, allowed=None) -> int:
        """The sampler's token for self.position (the sampler decides, never the backend);
        allowed: JSON mode's token mask, which needs the full row (engine.want_for asks for it)."""
        if self.logits is not None:
            return sampler.choose(self.logits, self.position, allowed)
        if allowed is not None:
            raise ValueError("a token mask needs the full logits row")
        return sampler.choose_from_candidates(self.ids, self.values, self.position)

    @classmethod
    def from_logits(cls, logits: np.ndarray, want: Want, position: int, epoch: int = 0,
                    sequence: int = 0) -> "Scores":
        """Reduce a full row as asked (the CPU path), with the sampler's canonical order."""
        logits = np.ascontiguousarray(logits, np.float32)
        if want.kind == "full":
            return cls(position, epoch, sequence, logits=logits)
        from ..semantic.sampler import canonical_top_k
        ids = canonical_top_k(logits, 1 if want.kind == "argmax" else min(want.k, logits.size))
        return cls(position, epoch, sequence, ids=ids, values=logits[ids])


class Backend(Protocol):
    """The surface of both backends. Positions are absolute: after prefill(ids) on a reset
    backend, `position == len(ids)` and the scores are for that position."""
    kind: str            # "gpu" | "cpu"
    position: int        # tokens in the KV cache

    async def prefill(self, ids: list[int], want: Want, epoch: int = 0, progress=None) -> Scores:
        """Append ids (the prompt, or the part of it the cache does not hold) to the cache;
        scores for the next position. progress(done, len(ids)) is called as pieces finish;
        a stale epoch ends the work between pieces (BackendCancelled), keeping the pieces
        already in the cache (`position` says how far it got)."""

    async def decode_one(self, token: int, want: Want, epoch: int = 0) -> Scores:
        """Append one token; scores for the next position."""

    async def rebuild(self, ids: list[int], want: Want, epoch: int = 0, progress=None) -> Scores:
        """Reset and replay ids (the prompt and the committed tokens)."""

    def truncate(self, position: int) -> None:
        """Keep the first `position` positions (a new prompt sharing that prefix)."""

    def reset(self) -> None:
        """Forget every position (a new conversation); buffers stay."""

    def release(self) -> None:
        """Free everything, deterministically; the backend is unusable afterwards."""
