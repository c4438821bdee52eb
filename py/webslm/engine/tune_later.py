"""Engine.tune_gpu: the tuning admission left for later, measured while no answer runs.

A first visit on a GPU is admitted without the tuning stage (AdmissionPolicy.tune_later: the
kept results and the rule), so that the page is ready seconds sooner; the stage then runs on
the live session when the engine is idle (GpuBackend.retune, admission/retune.py). It runs as
the engine's backend call in flight, so generate() waits for it, and generate() first asks it
to stop (`_tuning_stop`): the stage ends at its next checkpoint (a compile or a timed round)
and is tried again by the next tune_gpu call. A mixin of Engine: it uses the engine's state,
its call in flight and its loss handling.
"""
from __future__ import annotations

import asyncio

from ..backends.scores import BackendCancelled, BackendLost
from .states import State as S


class TuneLater:
    async def tune_gpu(self, cache: dict | None = None):
        """Measure the mat-vec launches admission deferred (AdmissionPolicy.tune_later) and
        take the faster ones (GpuBackend.retune), while no answer runs. An answer asked for
        meanwhile stops it at its next checkpoint (generate() sets _tuning_stop) and it is
        tried again by the next call. Returns the TuningReport (its cache_entries for the
        caller to keep), or None when there was nothing to measure or it was stopped. A device
        lost meanwhile leaves the GPU, as between answers."""
        gpu = self._gpu
        if self.state is not S.GPU_READY or gpu is None or not getattr(gpu, "tuning_deferred", False):
            return None
        self._tuning_stop = False

        async def checkpoint():
            if self._tuning_stop or self._gpu is not gpu:
                raise BackendCancelled("retune-stopped", "engine", "an answer was asked for")
        call = self._in_flight = asyncio.ensure_future(gpu.retune(cache, checkpoint))
        call.add_done_callback(self._retired)
        # The prompt cache stays: the retune keeps the conversation's rows and position (or, on
        # a full cache, resets the position, which the prompt cache then finds changed).
        try:
            report = await call
        except BackendCancelled:
            return None
        except Exception as exc:
            if self._gpu is not gpu:             # lost meanwhile: the engine has left it already
                return None
            lost = exc if isinstance(exc, BackendLost) else self._dead_gpu()
            if lost is None:
                raise
            self._gpu_died(gpu, lost)
            return None
        self._event({"event": "tuning", **report.summary()})
        return report

    def stop_tuning(self) -> None:
        """Stop tune_gpu's stage at its next checkpoint (the worker: a request is waiting)."""
        self._tuning_stop = True

