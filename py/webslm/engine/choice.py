"""Which engine answers: the admitted GPU only when it is not slower than the CPU path.

Admission proves that a GPU computes correctly, not that it is fast. A software adapter
passes it and then answers far slower than the CPU path: on this project's 2-core machine a
SmolLM2 decode step takes 15-20 s on SwiftShader (Chromium), ~1.1-1.5 s on lavapipe
(Firefox, Chromium's compatibility mode) and ~0.25-0.3 s on the CPU path (numpy in Pyodide).
So once the executor is built, the engine times the one thing an answer repeats, a decode
step, on both paths, and keeps the faster:

    GPU step   one real decode step of the built executor at position 0, with the argmax
               readback a greedy answer uses. Admission's self-tests have compiled and run
               every kernel by then. A second step is timed only when the first was slower
               than the CPU step but within CLOSE_CALL of it (first-use costs could have
               decided it); the faster of the two counts.
    CPU step   a measured estimate (estimate_cpu_step): layer 0 of the CPU path with its real
               weights, run through the CPU path's own code (CpuBackend.for_timing), times
               n_layers, plus the LM head timed on HEAD_ROWS rows and scaled to the whole
               vocabulary. Building the whole CPU path only to time it would dequantize every
               weight (~2 s and 0.5 GB for SmolLM2): more than a real GPU's user should pay.

Rule: the GPU is kept when gpu_step <= cpu_step. Otherwise the GPU is released and the
engine answers on the CPU path, its cpu_reason saying why in words a user reads ("the GPU
here is a software renderer, 90x slower than the CPU path ...").

Skipped when it cannot matter:
- everything, when the caller forced the GPU (the page's ?gpu=force, createEngine({gpu:
  "force"}), Engine(gpu_choice=None)): nothing is timed and the GPU is kept;
- the CPU step, when the GPU step was shorter than any CPU could take: the time to read the
  model's weights once, as stored, at CPU_READ_CEILING bytes/s. No CPU path can read fewer
  bytes than the quantized weights, and no single-threaded Wasm numpy reads faster than that.
  (A real GPU: SmolLM2 on the H200 decodes in ~2 ms; its 98 MB of weights need ~2 ms at
  50 GB/s; Llama-3.2-1B's 0.7 GB need 14 ms against a 2.3 ms step.)

What it costs: on a real GPU one decode step (milliseconds) and, unless skipped, one layer
of the CPU path (tens of milliseconds); on a software GPU, one decode step of it (seconds on
SwiftShader), paid once at load, for an engine many times faster from then on.

The numbers are kept in Engine.choice (the worker's engine-status and admit reply carry
them). They are not put in the capability receipt: it holds coarse buckets only, and exact
timings would fingerprint the machine (admission/receipt.py).
"""
from __future__ import annotations

import dataclasses
import math
import time
from typing import Callable

from ..backends.scores import Want
from ..cpu.backend import CpuBackend, run_to_end

RULE = "GPU kept when its decode step takes no longer than the CPU path's"
CLOSE_CALL = 2.0                 # a GPU step slower than the CPU's, but by less than this: a second look
CPU_READ_CEILING = 50e9          # bytes/s: faster than one core streams memory (see the module docstring)
HEAD_ROWS = 4096                 # LM head rows timed by the CPU estimate (then scaled to the vocabulary)
TIMING_REPEATS = 3               # the CPU estimate takes the fastest of this many passes


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
    code on layer 0 (real weights) and on head_rows rows of the LM head, fastest of
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


def weight_bytes(model) -> int:
    """Bytes of the model's weights as stored: what any CPU step has to read at least once."""
    return int(sum(t.nbytes for t in model.manifest.tensors.values()))


@dataclasses.dataclass(frozen=True)
class Choice:
    """The outcome: which backend answers, and the numbers behind it."""
    backend: str                         # "gpu" | "cpu"
    gpu_step_s: float | None = None      # the GPU decode step (the faster of those timed)
    cpu_step_s: float | None = None      # the CPU estimate, None when skipped
    gpu_steps_timed: int = 0
    skipped: str | None = None           # what was not timed, and why
    fallback_adapter: bool = False
    cpu_method: str | None = None
    cost_s: float = 0.0                  # what choosing took (both measurements)

    @property
    def ratio(self) -> float | None:
        """How many times slower the GPU step is than the CPU step (<1: faster)."""
        if self.gpu_step_s is None or not self.cpu_step_s:
            return None
        return self.gpu_step_s / self.cpu_step_s

    def sentence(self) -> str:
        """Why the CPU answers, for the page ("the GPU here is a software renderer, 90x ...")."""
        what = "the GPU here is a software renderer," if self.fallback_adapter else "the GPU here is"
        return (f"{what} {_times(self.ratio)} slower than the CPU path (one decode step: "
                f"{_duration(self.gpu_step_s)} on the GPU, {_duration(self.cpu_step_s)} on the CPU): "
                f"answering on the CPU")

    def as_dict(self) -> dict:
        ms = lambda s: None if s is None else round(1000 * s, 3)     # noqa: E731
        ratio = self.ratio
        return {"backend": self.backend, "rule": RULE, "gpu_step_ms": ms(self.gpu_step_s),
                "cpu_step_ms": ms(self.cpu_step_s), "gpu_steps_timed": self.gpu_steps_timed,
                "ratio": None if ratio is None else round(ratio, 3), "skipped": self.skipped,
                "fallback_adapter": self.fallback_adapter, "cpu_method": self.cpu_method,
                "cost_ms": ms(self.cost_s)}


FORCED = Choice("gpu", skipped="the GPU was forced: nothing timed")


async def time_gpu_step(backend, clock: Callable[[], float] = time.perf_counter) -> float:
    """Seconds of one decode step of the executor at position 0 (argmax readback); the KV
    cache is empty before and after (reset)."""
    backend.reset()
    began = clock()
    try:
        await backend.decode_one(0, Want("argmax"), 0)
        return clock() - began
    finally:
        backend.reset()


async def choose(backend, model, cpu_step: Callable[[object], CpuStep] = estimate_cpu_step, *,
                 fallback_adapter: bool = False, clock: Callable[[], float] = time.perf_counter) -> Choice:
    """Time a GPU decode step of `backend` (the built executor) and, unless it cannot matter,
    a CPU step of `model` (cpu_step(model), a CpuStep); the Choice by RULE. cpu_step and clock
    are the tests' seams: they inject the timings."""
    began = clock()
    gpu_s = await time_gpu_step(backend, clock)
    timed = 1
    floor = weight_bytes(model) / CPU_READ_CEILING
    if gpu_s < floor:
        return Choice("gpu", gpu_s, None, timed, fallback_adapter=fallback_adapter, cost_s=clock() - began,
                      skipped=f"CPU step not timed: the GPU step is shorter than reading the weights once "
                              f"at {CPU_READ_CEILING / 1e9:g} GB/s ({_duration(floor)})")
    cpu = cpu_step(model)
    if cpu.seconds < gpu_s < CLOSE_CALL * cpu.seconds:
        gpu_s = min(gpu_s, await time_gpu_step(backend, clock))
        timed += 1
    return Choice("gpu" if gpu_s <= cpu.seconds else "cpu", gpu_s, cpu.seconds, timed,
                  fallback_adapter=fallback_adapter, cpu_method=cpu.method, cost_s=clock() - began)


def by_measurement(cpu_step: Callable[[object], CpuStep] = estimate_cpu_step,
                   clock: Callable[[], float] = time.perf_counter):
    """Engine's gpu_choice: choose() with these seams (tests inject both)."""
    async def gpu_choice(backend, model, fallback_adapter: bool) -> Choice:
        return await choose(backend, model, cpu_step, fallback_adapter=fallback_adapter, clock=clock)
    return gpu_choice


def _times(ratio: float) -> str:
    return f"{ratio:.0f}x" if ratio >= 10 else f"{ratio:.1f}x"


def _duration(seconds: float) -> str:
    if seconds >= 1:
        return f"{seconds:.1f} s"
    if seconds >= 0.01:
        return f"{1000 * seconds:.0f} ms"
    return f"{1000 * seconds:.2f} ms"
