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

Where the costliest form alone stays under the step to beat, every decode mat-vec form is
timed too, all their launches in one submission (again one submission's cost, as the step's):
in Firefox (wgpu on lavapipe) the costliest form read 93-196 ms of a ~700 ms step, against a
CPU step of 72-102 ms, so half the first visits admitted the model fully (9 s) only to let it
go after timing a step. Their pipelines are the step's own: the compile stage reuses them.
That floor comes near the step itself (all its mat-vecs), so it is the least of two
submissions: on a busy CPU one read above the real step for a 2-layer test model.
"""
from __future__ import annotations

import dataclasses
import time

from .tuning_stage import Stage


@dataclasses.dataclass(frozen=True)
class StepFloor:
    seconds: float            # at least this much GPU time a decode step
    what: str                 # what was timed, for the sentence that reports it
    compiled: dict            # (kernel, sorted overrides) -> compiled kernel, for the compile stage


async def step_floor(device, model, plan, buffers, beat: float | None = None,
                     clock=time.perf_counter) -> StepFloor:
    """The costliest decode mat-vec form's rule launches, every layer's in one submission; if
    that is not past `beat` (seconds; None: stop there), every mat-vec form's, in one submission."""
    stage = Stage(device, model, plan, buffers, None, clock)
    try:
        forms = stage.forms()

        def elements(key: str) -> int:
            weights = stage.lowering.matvec_form(forms[key][0])[1]
            return weights.rows * weights.cols * len(forms[key])
        order = sorted(forms, key=elements, reverse=True)
        seconds = await _timed(stage, [forms[order[0]]])
        what = f"{order[0]} mat-vec alone, in its {len(forms[order[0]])} layers"
        if beat is not None and seconds <= beat and len(order) > 1:
            seconds = await _timed(stage, [forms[key] for key in order], samples=2)
            what = (f"{len(order)} decode mat-vec forms, {sum(len(ops) for ops in forms.values())} "
                    f"launches, without the step's other kernels")
        return StepFloor(seconds, what, dict(stage.forward._compiled))
    finally:
        stage.release()


async def _timed(stage: Stage, groups: list[list], samples: int = 1) -> float:
    """GPU seconds of the groups' rule launches in one submission, less the round trip (the
    least of `samples` submissions: a busy CPU only ever adds time, and this is a lower bound);
    each group's pipeline used once, alone, first."""
    dispatches = []
    for ops in groups:
        stage.fill_inputs(ops)
        launched = await stage.launches(ops, None)
        per_op = len(launched) // len(ops)
        await stage.seconds_per_op(ops[:1], launched[:per_op], rounds=0)       # the pipeline's first use
        dispatches += launched
    every = [op for ops in groups for op in ops]
    await stage.measure_trip(every)
    per_op = max(1, len(dispatches) // len(every))
    seconds = [await stage.seconds_per_op(every, dispatches, rounds=0) for _ in range(samples)]
    return min(seconds) * (len(dispatches) // per_op)
