"""The GPU smoke check: one adapter, one device, the reference kernel on adversarial data.

The same coroutine runs natively (tests/test_kernels_native.py, on wgpu-native) and in
each browser's worker (tests_browser/), so both GPU interface implementations are held to
one set of cases and one tolerance rule (kernels/probe.py: check_matvec).

This is the foundation's probe, not admission: it reports what an adapter offers and
whether our WGSL computes correctly there. Admission (feature/limit planning, self-test
suite, receipt) builds on it. Which adapter, and its tier, are webgpu/adapters.py's.
"""
from __future__ import annotations

import dataclasses
import time

import numpy as np

from . import shader_bundle
from .kernels.probe import check_matvec, probe_matvec
from .kernels.registry import KERNELS, compile_kernel
from .kernels.runner import largest_workgroup, max_invocations
from .webgpu.adapters import choose_adapter, tier_for
from .webgpu.interface import Device, Gpu

# (rows, cols, workgroup size, data): odd tails, a row shorter than the workgroup, a
# single element, a grid taller than one dimension allows, and extreme magnitudes.
CASES = (
    (1, 1, 64, "normal"),
    (7, 3, 64, "normal"),
    (33, 67, 128, "normal"),
    (300, 1000, 256, "normal"),
    (5, 4099, 64, "normal"),
    (70_000, 3, 64, "normal"),
    (16, 257, 64, "huge"),
    (16, 257, 64, "tiny"),
    (16, 256, 128, "alternating"),
)


def make_case(rng: np.random.Generator, rows: int, cols: int, data: str) -> tuple[np.ndarray, np.ndarray]:
    w = rng.standard_normal((rows, cols), dtype=np.float32)
    x = rng.standard_normal(cols, dtype=np.float32)
    if data == "huge":          # products near 1e36, still finite in f32
        w *= np.float32(1e18)
        x *= np.float32(1e18)
    elif data == "tiny":        # products near 1e-30: small but normal, so an all-zero y fails
        w *= np.float32(1e-15)
        x *= np.float32(1e-15)
    elif data == "alternating":  # heavy cancellation: +a, -a, +b, -b, ...
        w = np.abs(w) * np.where(np.arange(cols) % 2 == 0, 1, -1).astype(np.float32)
        x = np.repeat(np.abs(x[: cols // 2]), 2)[:cols]
    return w, x


def fit_workgroup(wanted: int, limits: dict[str, int]) -> int:
    """The largest allowlisted probe workgroup size <= wanted that the device admits."""
    size = largest_workgroup(limits, KERNELS["probe_matvec_f32"].overrides["WG"], wanted)
    if size is None:
        raise ValueError(f"no probe_matvec_f32 workgroup size fits {max_invocations(limits)} invocations")
    return size


async def run_matvec_cases(device: Device, seed: int = 0) -> list[dict]:
    rng = np.random.default_rng(seed)
    kernels = {}
    results = []
    for rows, cols, wanted, data in CASES:
        workgroup = fit_workgroup(wanted, device.limits)
        if workgroup not in kernels:
            kernels[workgroup] = await compile_kernel(device, "probe_matvec_f32", WG=workgroup)
        w, x = make_case(rng, rows, cols, data)
        y = await probe_matvec(device, kernels[workgroup], w, x)
        check = check_matvec(w, x, y, workgroup)
        results.append({**dataclasses.asdict(check), "data": data, "passed": check.passed})
    return results


async def probe(gpu: Gpu, feature_level: str = "auto", seed: int = 0) -> dict:
    """Adapter summary, tier, and the kernel cases on a fresh device; JSON-able."""
    report = {"shader_bundle_hash": shader_bundle.bundle_hash(), "feature_level": feature_level}
    started = time.perf_counter()
    adapter = await choose_adapter(gpu, feature_level)
    if adapter is None:
        return {**report, "adapter": None, "outcome": "no-webgpu-adapter"}
    report["feature_level"] = adapter.feature_level
    report["adapter"] = dataclasses.asdict(adapter.summary())
    report["tier"] = tier_for(adapter.features)
    device = await adapter.request_device()
    errors = []
    device.on_uncaptured_error(errors.append)
    try:
        device.push_error_scope("validation")
        report["cases"] = await run_matvec_cases(device, seed)
        scoped = await device.pop_error_scope()
    finally:
        device.destroy()
    report["gpu_errors"] = [dataclasses.asdict(e) for e in ([scoped] if scoped else []) + errors]
    passed = all(case["passed"] for case in report["cases"]) and not report["gpu_errors"]
    report["outcome"] = "passed" if passed else "failed"
    report["seconds"] = round(time.perf_counter() - started, 3)
    return report
