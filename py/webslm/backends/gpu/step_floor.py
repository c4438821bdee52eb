"""A lower bound of one decode step's GPU time, measured before the step's pipelines are
compiled: admission's "step-floor" stage on a software adapter (admission/admit.py).

Chromium's software adapter (SwiftShader) spent 31.5 s of a first visit's 33 s admission
compiling the step's pipelines, then answered slower than the CPU path, so the engine let the
GPU go (engine/choice.py). Most of that is avoidable: the costliest decode mat-vec form (the
most weight elements over its layers) runs once in every layer of every step, so its rule's
launch for one layer, timed and multiplied by its layer count, bounds the step from below. One
pipeline is compiled for it (the compile stage reuses it), and the launch is looked at LOOKS
times, the fastest kept (the first runs on a cold pipeline), each less an empty submit's
round trip (timing.round_trip). Where even that is slower than the CPU path's step, nothing
else needs compiling to know the GPU loses.
"""
from __future__ import annotations

import dataclasses
import time

from . import timing
from .tuning_stage import Stage

LOOKS = 2


@dataclasses.dataclass(frozen=True)
class StepFloor:
    seconds: float            # at least this much GPU time a decode step
    form: str                 # the mat-vec form timed
    layers: int               # its launches a step
    launch_s: float           # one launch, the fastest look, less the round trip
    compiled: dict            # (kernel, sorted overrides) -> compiled kernel, for the compile stage


async def step_floor(device, model, plan, buffers, clock=time.perf_counter) -> StepFloor:
    """The costliest decode mat-vec form's rule launch, timed for one layer, times its layers."""
    stage = Stage(device, model, plan, buffers, None, clock)
    try:
        forms = stage.forms()

        def elements(key: str) -> int:
            weights = stage.lowering.matvec_form(forms[key][0])[1]
            return weights.rows * weights.cols * len(forms[key])
        form = max(forms, key=elements)
        one = forms[form][:1]
        stage.fill_inputs(one)
        dispatches = await stage.launches(one, None)
        stage.trip = await timing.round_trip(device, stage._sync(one), clock)
        launch_s = min([await stage.seconds_per_op(one, dispatches, rounds=0) for _ in range(LOOKS)])
        return StepFloor(launch_s * len(forms[form]), form, len(forms[form]), launch_s,
                         dict(stage.forward._compiled))
    finally:
        stage.release()
