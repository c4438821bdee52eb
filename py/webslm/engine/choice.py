"""Which engine answers: the admitted GPU only when it is not slower than the CPU path.

Admission proves that a GPU computes correctly, not that it is fast. A software adapter
passes it and then answers far slower than the CPU path: on this project's 2-core machine a
SmolLM2 decode step takes 15-20 s on SwiftShader (Chromium), ~1.1-1.5 s on lavapipe
(Firefox, Chromium's compatibility mode) and ~0.25-0.3 s on the CPU path (numpy in Pyodide).
So once the executor is built, the engine times the one thing an answer repeats, a decode
step, on both paths, and keeps the faster:

    CPU step   first, a measured estimate (estimate_cpu_step): layer 0 of the CPU path with
               its real weights, run through the CPU path's own code (CpuBackend.for_timing),
               times n_layers, plus the LM head timed on HEAD_ROWS rows and scaled to the
               whole vocabulary; the faster of TIMING_REPEATS passes. Building the whole CPU
               path only to time it would dequantize every weight (~2 s and 0.5 GB for
               SmolLM2): more than a real GPU's user should pay.
    GPU step   then one real decode step of the built executor at position 0, with the
               argmax readback a greedy answer uses (admission's self-tests have compiled and
               run every kernel by then). It is waited for GIVE_UP times the CPU step at most:
               a GPU still busy then is at least that much slower, the choice is made, and
               the step is left to fail when the engine releases the GPU (its device
               destroyed). A second step is timed only when the first was slower than the
               CPU step but within CLOSE_CALL of it (first-use costs could have decided it);
               the faster of the two counts.

Rule: the GPU is kept when gpu_step <= cpu_step. Otherwise the GPU is released and the
engine answers on the CPU path, its cpu_reason saying why in words a user reads ("the GPU
here is a software renderer, more than 10x slower than the CPU path ...").

Before admission compiles the step (a first visit's main cost on a software adapter: SwiftShader
spent 31.5 s there), the CPU estimate is taken first and handed to admission as the step to
beat (AdmissionPolicy.max_step_seconds): on an adapter that says it is a fallback, admission's
step-floor stage times the costliest mat-vec form's launches (and, where those do not decide,
every mat-vec form's), a lower bound of the GPU step (backends/gpu/step_floor.py), and stops
with "gpu-slower" when even that is slower. The engine
then records that Choice (`Measurement.from_floor`: its GPU figure a lower bound, like a step
given up on) and the page keeps it like any measured verdict.

Skipped when it cannot matter: nothing is timed when there is no admitted GPU to keep
(no WebGPU, admission failed) or when the caller forced the GPU (the page's ?gpu=force,
createEngine({gpu: "force"}), Engine(gpu_choice=None)); the GPU step is not waited for past
GIVE_UP CPU steps, nor timed a second time unless it was a close call.

What it costs: on a real GPU the CPU estimate (a layer dequantized and run a few times: tens
to a few hundred milliseconds under Pyodide) and one decode step (milliseconds); on a software
GPU at most GIVE_UP CPU steps (seconds) instead of its whole decode step (15-60 s on
SwiftShader here), once per load, for an engine many times faster from then on.

The numbers are kept in Engine.choice (the worker's engine-status and admit reply carry
them). They are not put in the capability receipt: it holds coarse buckets only, and exact
timings would fingerprint the machine (admission/receipt.py).
"""
from __future__ import annotations

import asyncio
import dataclasses
import math
import time
from typing import Callable

from ..backends.scores import Want
from ..cpu.backend import CpuBackend, run_to_end

RULE = "GPU kept when its decode step takes no longer than the CPU path's"
CLOSE_CALL = 2.0                 # a GPU step slower than the CPU's, but by less than this: a second look
GIVE_UP = 10.0                   # a GPU step is not waited for past this many CPU steps
HEAD_ROWS = 4096                 # LM head rows timed by the CPU estimate (then scaled to the vocabulary)
TIMING_REPEATS = 2               # the CPU estimate takes the faster of this many passes (the first warms up)


@dataclasses.dataclass(frozen=True)
class CpuStep:
    """A measured estimate of one CPU decode step: seconds, and how it was obtained."""
    seconds: float
    layer_s: float                # one layer, timed
    head_s: float                 # the LM head, scaled from the rows timed
    method: str


def estimate_cpu_step(model, head_rows: int = HEAD_ROWS, repeats: int = TIMING_REPEATS,
                      clock: Callable[[], float] = time.perf_counter) -> CpuStep:
    """One CPU decode step of `model` at position 0, estimated by timing the CPU path's own
    code on layer 0 (real weights) and on head_rows rows of the LM head, the fastest of
    `repeats` passes: layer x n_layers + head x vocab / head_rows."""
    a = model.architecture
    probe = CpuBackend.for_timing(model, head_rows)
    layer_s = head_s = math.inf
    for _ in range(repeats):
        probe.reset()
        began = clock()
        x = run_to_end(probe.forward_steps([0]))
        mid = clock()
        probe.logits(x)
        layer_s, head_s = min(layer_s, mid - began), min(head_s, clock() - mid)
    head_s *= a.vocab / probe.arch.vocab
    return CpuStep(layer_s * a.n_layers + head_s, layer_s, head_s,
                   f"layer 0 x {a.n_layers} + LM head ({probe.arch.vocab} of {a.vocab} rows, scaled), "
                   f"fastest of {repeats}")


@dataclasses.dataclass(frozen=True)
class Choice:
    """The outcome: which backend answers, and the numbers behind it."""
    backend: str                         # "gpu" | "cpu"
    gpu_step_s: float | None = None      # the GPU decode step (the faster of those timed)
    cpu_step_s: float | None = None      # the CPU estimate
    gpu_steps_timed: int = 0
    gpu_step_finished: bool = True       # False: given up on after GIVE_UP CPU steps (gpu_step_s is a lower bound)
    skipped: str | None = None           # what was not timed, and why
    fallback_adapter: bool = False
    cpu_method: str | None = None
    cost_s: float | None = 0.0           # what choosing took (both measurements); None: inside admission
    remembered_on: str | None = None     # the UTC day of an earlier visit's verdict (verdict.py); None: measured now
    gpu_method: str | None = None        # how gpu_step_s was had, when not by timing decode steps (FLOOR_METHOD)

    @property
    def ratio(self) -> float | None:
        """How many times slower the GPU step is than the CPU step (<1: faster); a lower
        bound when the GPU step was given up on."""
        if self.gpu_step_s is None or not self.cpu_step_s:
            return None
        return self.gpu_step_s / self.cpu_step_s

    def sentence(self) -> str:
        """Why the CPU answers, for the page ("the GPU here is a software renderer, more than
        10x slower than the CPU path ..."; a verdict kept from an earlier visit says so)."""
        more = "" if self.gpu_step_finished else "more than "
        steps = (f"{more}{_times(self.ratio)} slower than the CPU path (one decode step: "
                 f"{more}{_duration(self.gpu_step_s)} on the GPU, {_duration(self.cpu_step_s)} on the CPU)")
        if self.remembered_on is not None:
            what = "this GPU (a software renderer)" if self.fallback_adapter else "this GPU"
            return (f"on an earlier visit ({self.remembered_on}) {what} answered {steps}, so it was not "
                    f"tried again: answering on the CPU")
        what = "the GPU here is a software renderer," if self.fallback_adapter else "the GPU here is"
        return f"{what} {steps}: answering on the CPU"

    def as_dict(self) -> dict:
        ms = lambda s: None if s is None else round(1000 * s, 3)     # noqa: E731
        ratio = self.ratio
        return {"backend": self.backend, "rule": RULE, "gpu_step_ms": ms(self.gpu_step_s),
                "cpu_step_ms": ms(self.cpu_step_s), "gpu_steps_timed": self.gpu_steps_timed,
                "gpu_step_finished": self.gpu_step_finished,
                "ratio": None if ratio is None else round(ratio, 3), "skipped": self.skipped,
                "fallback_adapter": self.fallback_adapter, "cpu_method": self.cpu_method,
                "cost_ms": ms(self.cost_s), "remembered_on": self.remembered_on, "gpu_method": self.gpu_method}


FORCED = Choice("gpu", skipped="the GPU was forced: nothing timed")


async def time_gpu_step(backend, give_up_s: float | None = None,
                        clock: Callable[[], float] = time.perf_counter) -> tuple[float, bool]:
    """(seconds, finished) of one decode step of the executor at position 0 (argmax
    readback), waited for give_up_s at most (None: to its end). Finished, the KV cache is
    empty again (reset); not finished, the step is still running: the caller releases the
    backend, which ends it (its failure then is nobody's)."""
    backend.reset()
    began = clock()
    step = asyncio.ensure_future(backend.decode_one(0, Want("argmax"), 0))
    await asyncio.wait([step], timeout=give_up_s)
    elapsed = clock() - began
    if not step.done():
        step.add_done_callback(lambda t: t.cancelled() or t.exception())   # retrieved: nobody waits for it
        return elapsed, False
    backend.reset()
    step.result()                 # a failure (BackendLost) is the caller's
    return elapsed, True


async def choose(backend, model, cpu_step: Callable[[object], CpuStep] = estimate_cpu_step, *,
                 fallback_adapter: bool = False, clock: Callable[[], float] = time.perf_counter) -> Choice:
    """The CPU step of `model` (cpu_step(model): a CpuStep), then a GPU decode step of
    `backend` (the built executor), given up on after GIVE_UP CPU steps: the Choice by RULE.
    cpu_step and clock are the tests' seams: they inject the timings."""
    began = clock()
    cpu = cpu_step(model)
    gpu_s, finished = await time_gpu_step(backend, GIVE_UP * cpu.seconds, clock)
    timed = 1
    if finished and cpu.seconds < gpu_s < CLOSE_CALL * cpu.seconds:
        again, again_finished = await time_gpu_step(backend, GIVE_UP * cpu.seconds, clock)
        timed = 2
        if again_finished:        # (given up on, it was slower than the first: the first stands)
            gpu_s = min(gpu_s, again)
    return Choice("gpu" if finished and gpu_s <= cpu.seconds else "cpu", gpu_s, cpu.seconds, timed, finished,
                  fallback_adapter=fallback_adapter, cpu_method=cpu.method, cost_s=clock() - began)


FLOOR_METHOD = ("a lower bound before compiling the step: its costliest mat-vec in every layer (where "
                "that did not decide, every mat-vec), timed in one submission (admission's step-floor stage)")


class Measurement:
    """Engine's gpu_choice: choose() with these seams (tests inject both), the CPU step
    estimated once per model, so that admission can be given it first (`cpu`,
    AdmissionPolicy.max_step_seconds) and the choice after it reuses it."""

    def __init__(self, cpu_step: Callable[[object], CpuStep] = estimate_cpu_step,
                 clock: Callable[[], float] = time.perf_counter):
        self._estimate, self.clock = cpu_step, clock
        self._kept: tuple[object, CpuStep] | None = None    # (the model, its estimate)

    def cpu(self, model) -> CpuStep:
        if self._kept is None or self._kept[0] is not model:
            self._kept = (model, self._estimate(model))
        return self._kept[1]

    async def __call__(self, backend, model, fallback_adapter: bool) -> Choice:
        return await choose(backend, model, self.cpu, fallback_adapter=fallback_adapter, clock=self.clock)

    def from_floor(self, model, floor_s: float, fallback_adapter: bool = True) -> Choice:
        """The CPU path, chosen before the GPU step was built: admission's step-floor stage measured
        at least floor_s for it, more than the CPU step."""
        cpu = self.cpu(model)
        return Choice("cpu", floor_s, cpu.seconds, 0, False, fallback_adapter=fallback_adapter,
                      cpu_method=cpu.method, cost_s=None, gpu_method=FLOOR_METHOD)


def admission_policy(gpu_choice, model, policy):
    """The policy admission runs with: `policy`, and when gpu_choice times the GPU against the
    CPU path (a Measurement), the CPU step to beat (Measurement.cpu, estimated now and reused by
    the choice): on a software adapter admission stops before compiling a step that cannot."""
    if not isinstance(gpu_choice, Measurement):
        return policy
    from ..admission.admit import AdmissionPolicy
    return dataclasses.replace(policy or AdmissionPolicy(), max_step_seconds=gpu_choice.cpu(model).seconds)


def by_measurement(cpu_step: Callable[[object], CpuStep] = estimate_cpu_step,
                   clock: Callable[[], float] = time.perf_counter) -> Measurement:
    return Measurement(cpu_step, clock)


def _times(ratio: float) -> str:
    return f"{ratio:.0f}x" if ratio >= 10 else f"{ratio:.1f}x"


def _duration(seconds: float) -> str:
    if seconds >= 1:
        return f"{seconds:.1f} s"
    if seconds >= 0.01:
        return f"{1000 * seconds:.0f} ms"
    return f"{1000 * seconds:.2f} ms"
