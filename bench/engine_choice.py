"""What the engine's GPU/CPU choice (py/webslm/engine/choice.py) costs and how well its CPU
estimate predicts the CPU path, on a native WebGPU adapter (wgpu-native).

    PYTHONPATH=py python bench/engine_choice.py --model FILE.slm [--model ...] [--repeats 3] [--out FILE]

Per model, in one process:
- admission and the executor's build (seconds), as the engine's load does them;
- choose() `--repeats` times on the built executor (the first on fresh recordings: what a
  page pays at load), each with its CPU estimate, GPU step, outcome and cost (a step it gave
  up on is waited for before the next, step_given_up_ends);
- the CPU estimate against the real thing: the whole CPU path built (its build time too) and
  `--steps` decode steps timed after a one-token prompt, median; `estimate_over_real` is the
  estimate divided by that median;
- the GPU's warm decode step, median of `--steps` (argmax readback), against the step the
  choice timed;
- on a fallback adapter, admission's speed-stage floor (backends/gpu/step_floor.py: a lower
  bound of the GPU step, measured before compiling the step; admitted with an infinite step to
  beat, so it never stops admission here) against that warm step.
Nothing here asserts: the figures are side by side in the JSON.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import pathlib
import platform
import statistics
import sys
import time

import webslm
from webslm.admission.admit import AdmissionPolicy, admit
from webslm.backends.gpu import GpuBackend
from webslm.backends.scores import Want
from webslm.cpu import CpuBackend
from webslm.engine.choice import choose, estimate_cpu_step
from webslm.webgpu.native import NativeGpu

ARGMAX = Want("argmax")


def cpu_real(model, steps: int) -> dict:
    started = time.perf_counter()
    cpu = CpuBackend(model)
    built = time.perf_counter() - started
    cpu.prefill([0])
    times = []
    for i in range(steps):
        began = time.perf_counter()
        cpu.decode_one(i % model.architecture.vocab)
        times.append(time.perf_counter() - began)
    return {"build_s": round(built, 3), "step_median_ms": round(1000 * statistics.median(times), 3),
            "steps_ms": [round(1000 * t, 3) for t in times]}


async def step_given_up_ends(started: set) -> None:
    """choose() leaves a step it gave up on running (the engine releases the backend then,
    which ends it: choice.time_gpu_step). Here the same backend is timed again, and a submit
    while that step's readback is still mapped aborts wgpu-native: so the tasks choose()
    started end first."""
    await asyncio.gather(*started, return_exceptions=True)


async def gpu_warm(backend, steps: int) -> dict:
    backend.reset()
    await backend.prefill([0], ARGMAX)
    times = []
    for i in range(steps):
        began = time.perf_counter()
        await backend.decode_one(i % backend.vocab, ARGMAX)
        times.append(time.perf_counter() - began)
    backend.reset()
    return {"step_median_ms": round(1000 * statistics.median(times), 3)}


async def bench_model(path: str, args) -> dict:
    model = webslm.open_model(path)
    a = model.architecture
    started = time.perf_counter()
    session = await admit(NativeGpu(), model, AdmissionPolicy(max_step_seconds=float("inf")))
    admitted = time.perf_counter() - started
    started = time.perf_counter()
    backend = await GpuBackend.build(session, model)
    built = time.perf_counter() - started
    try:
        fallback = bool(session.receipt.as_dict().get("fallback_adapter"))
        choices = []
        for _ in range(args.repeats):
            before = asyncio.all_tasks()
            choices.append((await choose(backend, model, fallback_adapter=fallback)).as_dict())
            await step_given_up_ends(asyncio.all_tasks() - before)
        estimate = estimate_cpu_step(model)
        warm = await gpu_warm(backend, args.steps)
    finally:
        backend.release()
    real = cpu_real(model, args.steps)
    return {
        "model": pathlib.Path(path).name, "layers": a.n_layers, "hidden": a.hidden, "vocab": a.vocab,
        "tier": session.tier, "admission_s": round(admitted, 3), "build_s": round(built, 3),
        "choices": choices,
        "cpu_estimate_ms": round(1000 * estimate.seconds, 3), "cpu_estimate_layer_ms": round(1000 * estimate.layer_s, 3),
        "cpu_estimate_head_ms": round(1000 * estimate.head_s, 3),
        "cpu_real": real, "estimate_over_real": round(1000 * estimate.seconds / real["step_median_ms"], 3),
        "gpu_warm": warm,
        "step_floor_ms": None if session.step_floor_s is None else round(1000 * session.step_floor_s, 3),
    }


async def main_async(args) -> dict:
    adapter = await NativeGpu().request_adapter("core")
    summary = adapter.summary()
    rows = []
    for path in args.model:
        rows.append(await bench_model(path, args))
        print(json.dumps(rows[-1]), flush=True)
    return {"adapter": f"{summary.description} ({summary.architecture or summary.vendor})",
            "host": platform.platform(), "python": platform.python_version(),
            "date": time.strftime("%Y-%m-%d"), "command": " ".join(sys.argv), "rows": rows}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", action="append", required=True, help=".slm file (repeatable)")
    ap.add_argument("--repeats", type=int, default=3, help="choose() runs per model (the first is cold)")
    ap.add_argument("--steps", type=int, default=5, help="decode steps timed for the real CPU and warm GPU figures")
    ap.add_argument("--out", type=pathlib.Path, help="write the JSON here")
    args = ap.parse_args(argv)
    result = asyncio.run(main_async(args))
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(result, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
