"""CpuPath: the numpy reference engine (webslm.cpu.CpuBackend) behind the async Backend surface.

The engine drives the GPU executor and this path through the same calls (backends/scores.py),
so that after a device loss it can carry on the same answer here: rebuild(prompt + committed)
and the same loop continues. In browsers without WebGPU it is the only path.

The CPU always computes the full logits row; `Scores.from_logits` reduces it to what the
engine asked for (top-k or argmax) with the sampler's canonical order, so the sampler sees
the same shape of input whichever backend produced it.

Pausing. numpy work cannot be interrupted, and under Pyodide it runs on the worker's only
thread: while it runs, no message from the page (a Stop) is even read. So the forward pass
is a generator that stops after each half layer (CpuBackend.forward_steps), and this path
gives the event loop a turn at those stops whenever PAUSE_S of work has gone by since the
last turn, and at the start of every call. At each turn it reports the prompt's progress
and checks the generation epoch (`current_epoch`, set by the engine, as for the GPU
executor): a cancelled answer's work ends there with BackendCancelled, keeping the chunks
already in the cache. Under Pyodide a turn is asyncio.sleep(0) on its WebLoop, which
schedules the rest as a new browser task, so the worker's onmessage runs in between. There
are no threads; natively it is the same asyncio.
"""
from __future__ import annotations

import asyncio
import time
from typing import Callable, Iterator

from ..cpu import CpuBackend
from ..errors import CodedError
from .scores import BackendCancelled, Scores, Want

# progress(done, total): prompt tokens whose work is done (an estimate inside a chunk).
Progress = Callable[[int, int], None]


class CpuPathError(CodedError):
    """The path was used after release() (code "released")."""


class CpuPath:
    """The CPU half of the engine. Building it dequantizes every weight into f32 once (the
    expensive part), so the engine builds one per model and reuses it; pass `backend` to
    wrap a CpuBackend that already exists."""

    kind = "cpu"
    # At most this much numpy work between two turns of the event loop. A turn costs ~0.1 ms
    # in a browser worker; 50 ms keeps that under 1% and a Stop well inside half a second.
    PAUSE_S = 0.05

    def __init__(self, model, backend: CpuBackend | None = None):
        self._cpu: CpuBackend | None = backend if backend is not None else CpuBackend(model)
        self._sequence = 0          # submissions so far: the tag that orders results
        self.current_epoch: Callable[[], int] | None = None   # set by the engine

    @property
    def position(self) -> int:
        return self._backend().position

    def _backend(self) -> CpuBackend:
        if self._cpu is None:
            raise CpuPathError("released", "CpuPath", "the CPU path was released; build a new one")
        return self._cpu

    def _scores(self, logits, want: Want, epoch: int) -> Scores:
        self._sequence += 1
        return Scores.from_logits(logits, want, self._backend().position, epoch, self._sequence)

    def _check_epoch(self, epoch: int) -> None:
        if self.current_epoch is not None and epoch != self.current_epoch():
            raise BackendCancelled("stale-epoch", "epoch", f"generation {epoch} was cancelled")

    async def _run(self, steps: Iterator[int], epoch: int, progress: Progress | None = None, total: int = 0):
        """Drive a CpuBackend step generator to its end (its return value), with a turn of
        the event loop first and then whenever PAUSE_S has gone by; at each turn progress
        is reported and the epoch checked. A cancel closes the generator: the cache keeps
        the chunks finished before it (CpuBackend.forward_steps)."""
        try:
            await asyncio.sleep(0)
            self._check_epoch(epoch)
            turn = time.perf_counter()
            while True:
                try:
                    done = next(steps)
                except StopIteration as end:
                    return end.value
                if time.perf_counter() - turn >= self.PAUSE_S:
                    if progress is not None:
                        progress(done, total)
                    await asyncio.sleep(0)
                    self._check_epoch(epoch)
                    turn = time.perf_counter()
        finally:
            steps.close()

    async def prefill(self, ids: list[int], want: Want, epoch: int = 0, progress: Progress | None = None) -> Scores:
        ids = list(ids)
        logits = await self._run(self._backend().prefill_steps(ids), epoch, progress, len(ids))
        return self._scores(logits, want, epoch)

    async def decode_one(self, token: int, want: Want, epoch: int = 0) -> Scores:
        return self._scores(await self._run(self._backend().decode_steps(int(token)), epoch), want, epoch)

    async def rebuild(self, ids: list[int], want: Want, epoch: int = 0, progress: Progress | None = None) -> Scores:
        ids = list(ids)
        logits = await self._run(self._backend().rebuild_steps(ids), epoch, progress, len(ids))
        return self._scores(logits, want, epoch)

    def truncate(self, position: int) -> None:
        """Keep the first `position` positions of the cache (a prompt that shares a prefix)."""
        self._backend().truncate(position)

    def reset(self) -> None:
        self._backend().reset()

    def release(self) -> None:
        """Drop the dequantized weights and the KV cache (numpy frees them with the last
        reference). Releasing twice is harmless."""
        self._cpu = None
