"""A lower bound of one decode step's GPU time, measured before the step's pipelines are
compiled: admission's "step-floor" stage on a software adapter (admission/admit.py).

Chromium's software adapter (SwiftShader) spent 31.5 s of a first visit's 33 s admission
compiling the step's pipelines, then answered slower than the CPU path, so the engine let the
GPU go (engine/choice.py). Most of that is avoidable: the costliest decode mat-vec form (the
most weight elements over its layers) runs once in every layer of every step, so its rule's
launches for every layer, in one submission as the step runs them, bound the step from below.
One pipeline is compiled for them (the compile stage reuses it); one launch runs first, alone,
to pay the pipeline's first use, and the timed submission is less an empty submit's round
trip (Stage.measure_trip), which the step's own timing (choice.time_gpu_step) includes. Where
even that is slower than the CPU path's step, nothing else needs compiling to know the GPU
loses.

One launch timed and multiplied by the layers, as this first did, is no bound: a submission's
own cost (on lavapipe a few milliseconds beyond an empty one) was multiplied with it, and for a
2-layer test model the "floor" read 10.9 ms against a 10.8 ms step (a CI run of
tests/test_step_floor.py).
"""
from __future__ import annotations

import dataclasses
import time

from .tuning_stage import Stage


@dataclasses.dataclass(frozen=True)
class StepFloor:
    seconds: float            # at least this much GPU time a decode step
    form: str                 # the mat-vec form timed
    layers: int               # its launches a step
    launch_s: float           # one launch: the timed submission, less the round trip, over the layers
    compiled: dict            # (kernel, sorted overrides) -> compiled kernel, for the compile stage


async def step_floor(device, model, plan, buffers, clock=time.perf_counter) -> StepFloor:
    """The costliest decode mat-vec form's rule launches, every layer's in one submission."""
    stage = Stage(device, model, plan, buffers, None, clock)
    try:
        forms = stage.forms()

        def elements(key: str) -> int:
            weights = stage.lowering.matvec_form(forms[key][0])[1]
            return weights.rows * weights.cols * len(forms[key])
        form = max(forms, key=elements)
        ops = forms[form]
        stage.fill_inputs(ops)
        dispatches = await stage.launches(ops, None)
        per_op = len(dispatches) // len(ops)
        await stage.seconds_per_op(ops[:1], dispatches[:per_op], rounds=0)     # the pipeline's first use
        await stage.measure_trip(ops)
        launch_s = await stage.seconds_per_op(ops, dispatches, rounds=0)      # all layers, one submission
        return StepFloor(launch_s * len(ops), form, len(ops), launch_s, dict(stage.forward._compiled))
    finally:
        stage.release()
