"""Reference kernels: the GPU probe's mat-vec, the benchmarks' copy, and the loop probe.

probe_matvec_f32 (shaders/probe_matvec_f32.wgsl) is y = W x in f32, one row per workgroup,
the simplest correct mat-vec. gpu_smoke runs it on every adapter before anything else, and
its check (the gamma(n) bound) is the model for the golden tests. copy_vec4
(shaders/copy.wgsl) is the bandwidth roofline bench/kernels.py divides by. loop_probe
(shaders/loop_probe.wgsl) finds an adapter that stops long shader loops early (`loop_limit`):
admission asks it why a self-test failed."""
from __future__ import annotations

import dataclasses

import numpy as np

from ..webgpu.interface import Device
from .golden import F32_TINY, gamma
from .registry import CompiledKernel, KernelSpec, compile_kernel, register
from .runner import params_words, run_once, workgroup_grid

register(KernelSpec(
    name="probe_matvec_f32",
    sources=("probe_matvec_f32.wgsl",),
    entry_point="main",
    bindings=("uniform", "read-only-storage", "read-only-storage", "storage"),
    overrides={"WG": (64, 128, 256)},
), KernelSpec(
    name="copy_vec4",      # the benchmarks' bandwidth roofline (shaders/copy.wgsl)
    sources=("copy.wgsl",),
    entry_point="main",
    bindings=("uniform", "read-only-storage", "storage"),
    overrides={"WG": (64, 128, 256)},
), KernelSpec(
    name="loop_probe",     # loop_limit below
    sources=("loop_probe.wgsl",),
    entry_point="main",
    bindings=("uniform", "storage"),
    overrides={},
))

LOOP_PROBE_STEPS = (512, 256)      # outer x inner = 131072: twice the most llvmpipe runs
LOOP_PROBE_SEED = 12345


def _generator_after(steps: int, seed: int = LOOP_PROBE_SEED) -> int:
    """The probe's generator state after `steps` steps (x -> 1664525 x + 1013904223 mod 2^32),
    by composing the affine map with itself: O(log steps)."""
    a, c, mult, add = 1664525, 1013904223, 1, 0      # (mult, add): the map for the steps so far
    while steps:
        if steps & 1:
            mult, add = (mult * a) % 2**32, (add * a + c) % 2**32
        a, c = (a * a) % 2**32, (c * a + c) % 2**32
        steps >>= 1
    return (mult * seed + add) % 2**32


async def loop_count(device: Device, kernel: CompiledKernel, outer: int, inner: int) -> tuple[int, int]:
    """One invocation of the compiled loop_probe over outer x inner steps: (iterations it ran,
    the generator's state after them)."""
    params = np.array([outer, inner, LOOP_PROBE_SEED, 0], dtype=np.uint32)
    (count,) = await run_once(device, kernel, params, [], [(2, np.uint32)], (1, 1, 1))
    return int(count[0]), int(count[1])


async def loop_limit(device: Device) -> int | None:
    """None when one invocation ran all LOOP_PROBE_STEPS iterations of a nested loop (and
    the generator's value agrees); otherwise the iterations it ran: the adapter stops shader
    loops early (llvmpipe: at 65535 in all, counting every loop of the invocation), so a
    kernel whose invocations loop longer computes garbage there, silently."""
    outer, inner = LOOP_PROBE_STEPS
    ran, state = await loop_count(device, await compile_kernel(device, "loop_probe"), outer, inner)
    if ran == outer * inner and state == _generator_after(outer * inner):
        return None
    return ran


async def probe_matvec(device: Device, kernel: CompiledKernel, w: np.ndarray, x: np.ndarray) -> np.ndarray:
    """Run the kernel once on fresh buffers (runner.run_once: y poisoned with NaN first, so an
    element the kernel fails to write cannot pass for a result) and read y back."""
    rows, cols = w.shape
    if x.shape != (cols,):
        raise ValueError(f"x has shape {x.shape}, expected ({cols},)")
    grid = workgroup_grid(rows, device.limits["maxComputeWorkgroupsPerDimension"])
    (y,) = await run_once(device, kernel, params_words(rows, cols),
                          [w.astype(np.float32, copy=False), x.astype(np.float32, copy=False)],
                          [(rows, np.float32)], grid)
    return y


@dataclasses.dataclass(frozen=True)
class MatvecCheck:
    """One comparison of the GPU result with a float64 numpy oracle."""
    rows: int
    cols: int
    workgroup: int
    max_abs_error: float
    max_error_over_bound: float   # <= 1 passes
    unwritten: int                # NaNs left from the poison

    @property
    def passed(self) -> bool:
        return self.unwritten == 0 and self.max_error_over_bound <= 1.0


def check_matvec(w: np.ndarray, x: np.ndarray, y_gpu: np.ndarray, workgroup: int) -> MatvecCheck:
    """Compare with an error bound valid for any summation order.

    For a sum of n f32 products, |computed - exact| <= gamma(n) * sum|w_k x_k| (Higham,
    Accuracy and Stability, 3.1; golden.gamma, whose u allows WGSL's rounding either way).
    The bound uses n = cols + 1 (one more rounding for each product); the oracle is float64."""
    w64, x64 = w.astype(np.float64), x.astype(np.float64)
    exact = w64 @ x64
    magnitude = np.abs(w64) @ np.abs(x64)
    n = w.shape[1] + 1
    bound = gamma(n) * magnitude + F32_TINY   # + a subnormal flush allowance
    error = np.abs(y_gpu.astype(np.float64) - exact)
    unwritten = int(np.isnan(y_gpu).sum())
    finite = ~np.isnan(error)
    return MatvecCheck(
        rows=w.shape[0], cols=w.shape[1], workgroup=workgroup,
        max_abs_error=float(error[finite].max(initial=0.0)),
        max_error_over_bound=float((error[finite] / bound[finite]).max(initial=0.0)),
        unwritten=unwritten)
