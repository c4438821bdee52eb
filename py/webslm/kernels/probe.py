"""Reference kernels: the GPU probe's mat-vec and the benchmarks' copy.

probe_matvec_f32 (shaders/probe_matvec_f32.wgsl) is y = W x in f32, one row per workgroup,
the simplest correct mat-vec. gpu_smoke runs it on every adapter before anything else, and
its check (the gamma(n) bound) is the model for the golden tests. copy_vec4
(shaders/copy.wgsl) is the bandwidth roofline bench/kernels.py divides by."""
from __future__ import annotations

import dataclasses

import numpy as np

from ..webgpu.interface import Device
from .golden import F32_TINY, gamma
from .registry import CompiledKernel, KernelSpec, register
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
))


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
