"""A GPU's first-use costs, paid while the model is still loading.

The first admission in a process (a browser's GPU process, or a native one) pays for things
no model needs: the instance and its adapters, the first device, the shader compiler's first
load, the queue's first submission. On the H200 (bench/admission_trace.py, three admissions in
one process) the first took 2.65 s and the next two 1.04 and 1.22 s: about 1.5 s of the first
was the process's first use of the GPU (adapter 0.67 s, device 0.32 s against 0.1 s, the first
pipeline 196 ms against 60 ms, the first submit-and-read 134 ms against 5 ms).

warm_up() pays them on a throwaway device: the adapter admission will choose, a device with
the features admission will request, one tiny kernel compiled (the loop probe, which no model
step uses, so nothing the admission compiles is cached by it) and run once, the device
destroyed. The worker runs it beside the model's download and validation (worker.mjs,
"prepare-gpu"); admission then starts on a warm GPU and waits for it, never racing it.

A warm-up that fails says why and changes nothing: admission asks the same questions again
and reports its own answer. On a fallback adapter it stops after the device: a software
renderer's first compile would take the CPU the model's validation is using, and the
step-floor stage usually lets such an adapter go anyway (admit.py).
"""
from __future__ import annotations

import time

from ..kernels import probe
from ..kernels.registry import compile_kernel
from ..webgpu.adapters import choose_adapter
from ..webgpu.interface import Gpu
from .tracked import TrackedDevice


async def warm_up(gpu: Gpu | None, feature_level: str = "auto", *, compile_on_fallback: bool = False,
                  clock=time.perf_counter) -> dict:
    """{"warmed": bool, "adapter": its description or None, "fallback": bool, "seconds":
    {step: s}, "reason": why it stopped early or failed ("" when it did everything)}.
    Never raises for the GPU's sake: whatever fails is admission's to report.
    compile_on_fallback: warm a fallback adapter fully too (the tests, whose lavapipe is one)."""
    from .admit import AdmissionPolicy, choose_tier
    report = {"warmed": False, "adapter": None, "fallback": False, "seconds": {}, "reason": ""}
    began = clock()

    def took(step: str) -> None:
        nonlocal began
        now = clock()
        report["seconds"][step] = round(now - began, 4)
        began = now
    if gpu is None:
        report["reason"] = "no WebGPU entry point"
        return report
    device = None
    try:
        adapter = await choose_adapter(gpu, feature_level)
        took("adapter")
        if adapter is None:
            report["reason"] = "no adapter"
            return report
        summary = adapter.summary()
        report["adapter"], report["fallback"] = summary.description, summary.is_fallback
        _, features = choose_tier(frozenset(adapter.features), AdmissionPolicy())
        device = TrackedDevice(await adapter.request_device(features, {}))   # counted as open until destroyed
        took("device")
        if summary.is_fallback and not compile_on_fallback:
            report["reason"] = "a fallback adapter: no compile beside the model's validation"
            return report
        kernel = await compile_kernel(device, "loop_probe")
        took("compile")
        ran, _ = await probe.loop_count(device, kernel, 1, 4)
        took("run")
        if ran != 4:
            report["reason"] = f"the probe ran {ran} of 4 iterations"
            return report
        report["warmed"] = True
        return report
    except Exception as exc:          # noqa: BLE001 - admission asks again and reports its own error
        report["reason"] = f"{type(exc).__name__}: {exc}"
        return report
    finally:
        if device is not None:
            try:
                device.destroy()
            except Exception as exc:  # noqa: BLE001 - a device already lost: nothing is left to free
                report["reason"] = report["reason"] or f"destroy: {type(exc).__name__}: {exc}"
            took("destroy")

