"""CpuPath: the numpy reference engine (webslm.cpu.CpuBackend) behind the async Backend surface.

The engine drives the GPU executor and this path through the same calls (backends/scores.py),
so that after a device loss it can carry on the same answer here: rebuild(prompt + committed)
and the same loop continues. In browsers without WebGPU it is the only path.

The CPU always computes the full logits row; `Scores.from_logits` reduces it to what the
engine asked for (top-k or argmax) with the sampler's canonical order, so the sampler sees
the same shape of input whichever backend produced it.

Each call yields to the event loop once before computing: numpy work cannot be interrupted,
but a cancel() from another task (the worker's message handler) gets a turn between steps.
Under Pyodide this is the same asyncio API on the browser's loop; there are no threads.
"""
from __future__ import annotations

import asyncio

from ..cpu import CpuBackend
from ..errors import CodedError
from .scores import Scores, Want


class CpuPathError(CodedError):
    """The path was used after release() (code "released")."""


class CpuPath:
    """The CPU half of the engine. Building it dequantizes every weight into f32 once (the
    expensive part), so the engine builds one per model and reuses it; pass `backend` to
    wrap a CpuBackend that already exists."""

    kind = "cpu"

    def __init__(self, model, backend: CpuBackend | None = None):
        self._cpu: CpuBackend | None = backend if backend is not None else CpuBackend(model)
        self._sequence = 0          # submissions so far: the tag that orders results

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

    async def prefill(self, ids: list[int], want: Want, epoch: int = 0) -> Scores:
        await asyncio.sleep(0)
        return self._scores(self._backend().prefill(list(ids)), want, epoch)

    async def decode_one(self, token: int, want: Want, epoch: int = 0) -> Scores:
        await asyncio.sleep(0)
        return self._scores(self._backend().decode_one(int(token)), want, epoch)

    async def rebuild(self, ids: list[int], want: Want, epoch: int = 0) -> Scores:
        await asyncio.sleep(0)
        return self._scores(self._backend().rebuild(list(ids)), want, epoch)

    def reset(self) -> None:
        self._backend().reset()

    def release(self) -> None:
        """Drop the dequantized weights and the KV cache (numpy frees them with the last
        reference). Releasing twice is harmless."""
        self._cpu = None
