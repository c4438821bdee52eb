"""The token-commit ledger: the only place a token becomes shown.

GPU (or CPU) results arrive asynchronously, tagged with the generation epoch and position
they were computed for. A result commits only if its epoch is the current generation's and
its position is exactly the next one; anything else (a result from before a cancel, a
duplicate, one that overtook its predecessor) is dropped and counted, never shown. So there
is no duplicate position, no gap, and nothing commits after cancel(). After a device loss the
committed tokens and the sampler state hash recorded with the last one (replay()) are all a
CPU rebuild needs to continue exactly where the page is.

Positions are absolute sequence positions, the same counter the sampler's RNG uses: the
first generated token has position len(prompt_ids).
"""
from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass
from typing import Iterable

from ..errors import CodedError

_HEX64 = re.compile(r"[0-9a-f]{64}")


class LedgerError(CodedError):
    """A programming error in the caller (not a race): a bad argument or an epoch never issued."""


# Why an offer was dropped (Ledger.dropped counts them): all are normal under async results.
DROP_REASONS = {
    "stale": "the offer's epoch is not the current generation's, or the generation was cancelled",
    "duplicate": "the position was already committed",
    "out-of-order": "the position is beyond the next one (its predecessor has not committed)",
}


@dataclass(frozen=True)
class CommitRecord:
    generation_epoch: int
    position: int
    token_id: int
    sampler_state_hash: str  # the sampler's state_hash() after this token, hex sha256
    text_delta_hash: str     # sha256 hex of the token's text delta, UTF-8


@dataclass(frozen=True)
class Replay:
    """What a CPU rebuild needs: re-run the prompt and committed tokens through the model,
    restore the sampler from its settings with history and position advanced over
    committed_ids, check its state_hash() equals sampler_state_hash, continue at next_position."""
    generation_epoch: int  # the epoch begin() returned (also after a cancel)
    prompt_ids: tuple[int, ...]
    committed_ids: tuple[int, ...]
    sampler_state_hash: str | None  # after the last committed token; None before the first
    next_position: int


def _nonneg_int(where: str, value) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise LedgerError("bad-argument", where, f"must be a non-negative integer, not {value!r}")
    return value


class Ledger:
    def __init__(self):
        self._epoch = 0           # 0 is never a generation: offers for it are always stale
        self._open = False        # whether the current epoch may still commit
        self._generation = 0      # the epoch begin() issued for the generation held here
        self._prompt: tuple[int, ...] = ()
        self._records: list[CommitRecord] = []
        self._deltas: list[str] = []
        self._dropped = dict.fromkeys(DROP_REASONS, 0)

    # -- lifecycle -----------------------------------------------------------------------------

    def begin(self, prompt_ids: Iterable[int]) -> int:
        """Start a generation; returns its epoch. The previous generation's results go stale."""
        prompt = tuple(prompt_ids)
        for i, token in enumerate(prompt):
            _nonneg_int(f"prompt_ids[{i}]", token)
        self._epoch += 1
        self._open = True
        self._generation = self._epoch
        self._prompt = prompt
        self._records, self._deltas = [], []
        return self._epoch

    def cancel(self) -> int:
        """End the generation (user cancel, stop sequence, max_tokens, device loss): returns a
        new epoch that never commits, so every in-flight result is dropped as stale. The
        committed tokens stay readable (committed_text, replay())."""
        self._epoch += 1
        self._open = False
        return self._epoch

    # -- commits -------------------------------------------------------------------------------

    def offer(self, epoch: int, position: int, token_id: int, sampler_state_hash: str,
              text_delta: str) -> CommitRecord | None:
        """Commit token_id at position, or drop it (returns None; dropped counts why)."""
        _nonneg_int("epoch", epoch)
        _nonneg_int("position", position)
        _nonneg_int("token_id", token_id)
        if not isinstance(sampler_state_hash, str) or not _HEX64.fullmatch(sampler_state_hash):
            raise LedgerError("bad-argument", "sampler_state_hash", "must be 64 lowercase hex digits")
        if not isinstance(text_delta, str):
            raise LedgerError("bad-argument", "text_delta", "must be a string")
        try:
            delta_bytes = text_delta.encode("utf-8")
        except UnicodeEncodeError:
            raise LedgerError("bad-argument", "text_delta", "is not valid Unicode") from None
        if epoch > self._epoch:
            raise LedgerError("unknown-epoch", "epoch", f"{epoch} was never issued (current {self._epoch})")

        if epoch != self._epoch or not self._open:
            return self._drop("stale")
        expected = self.next_position
        if position < expected:
            return self._drop("duplicate")
        if position > expected:
            return self._drop("out-of-order")
        record = CommitRecord(epoch, position, token_id, sampler_state_hash,
                              hashlib.sha256(delta_bytes).hexdigest())
        self._records.append(record)
        self._deltas.append(text_delta)
        return record

    def _drop(self, reason: str) -> None:
        self._dropped[reason] += 1
        return None

    # -- reading -------------------------------------------------------------------------------

    @property
    def epoch(self) -> int:
        return self._epoch

    @property
    def is_open(self) -> bool:
        return self._open

    @property
    def next_position(self) -> int:
        return len(self._prompt) + len(self._records)

    @property
    def records(self) -> tuple[CommitRecord, ...]:
        return tuple(self._records)

    @property
    def committed_ids(self) -> tuple[int, ...]:
        return tuple(r.token_id for r in self._records)

    @property
    def committed_text(self) -> str:
        return "".join(self._deltas)

    @property
    def dropped(self) -> dict[str, int]:
        return dict(self._dropped)

    def replay(self) -> Replay:
        last = self._records[-1].sampler_state_hash if self._records else None
        return Replay(self._generation, self._prompt, self.committed_ids, last, self.next_position)
