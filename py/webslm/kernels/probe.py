"""Reference kernels: the GPU probe's mat-vec and the benchmarks' copy.

probe_matvec_f32 (shaders/probe_matvec_f32.wgsl) is y = W x in f32, one row per workgroup,
the simplest correct mat-vec. gpu_smoke runs it on every adapter before anything else, and
its check (the gamma(n) bound) is the model for the golden tests. copy_vec4
(shaders/copy.wgsl) is the bandwidth roofline bench/kernels.py divides by."""
from __future__ import annotations

import dataclasses

import numpy as np

from ..webgpu.interface import BufferBinding, BufferUsage, Device, Dispatch
from .registry import CompiledKernel, KernelSpec, register
from .runner import workgroup_grid

F32_UNIT_ROUNDOFF = 2.0 ** -24

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
    """Run the kernel once on fresh buffers and read y back.

    y is poisoned with NaN before the dispatch so that an element the kernel fails to
    write cannot pass for a result."""
    rows, cols = w.shape
    if x.shape != (cols,):
        raise ValueError(f"x has shape {x.shape}, expected ({cols},)")
    storage = BufferUsage.STORAGE | BufferUsage.COPY_DST | BufferUsage.COPY_SRC
    params = device.create_buffer(16, BufferUsage.UNIFORM | BufferUsage.COPY_DST, "matvec params")
    w_buf = device.create_buffer(w.nbytes, storage, "W [rows, cols] f32")
    x_buf = device.create_buffer(x.nbytes, storage, "x [cols] f32")
    y_buf = device.create_buffer(rows * 4, storage, "y [rows] f32")
    try:
        device.write_buffer(params, 0, np.array([rows, cols, 0, 0], dtype=np.uint32))
        device.write_buffer(w_buf, 0, w.astype(np.float32, copy=False))
        device.write_buffer(x_buf, 0, x.astype(np.float32, copy=False))
        device.write_buffer(y_buf, 0, np.full(rows, np.nan, dtype=np.float32))
        group = device.create_bind_group(kernel.bind_group_layout, [
            BufferBinding(params), BufferBinding(w_buf), BufferBinding(x_buf), BufferBinding(y_buf)])
        grid = workgroup_grid(rows, device.limits["maxComputeWorkgroupsPerDimension"])
        device.submit([Dispatch(kernel.pipeline, [group], grid)])
        return np.frombuffer(await device.read_buffer(y_buf, 0, rows * 4), dtype=np.float32).copy()
    finally:
        for buffer in (params, w_buf, x_buf, y_buf):
            device.destroy_buffer(buffer)


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

    For a sum of n f32 products, |computed - exact| <= gamma(n) * sum|w_k x_k| with
    gamma(n) = n u / (1 - n u), u = 2^-24 (Higham, Accuracy and Stability, 3.1). The bound
    uses n = cols + 1 (one more rounding for each product); the oracle is float64."""
    w64, x64 = w.astype(np.float64), x.astype(np.float64)
    exact = w64 @ x64
    magnitude = np.abs(w64) @ np.abs(x64)
    n = w.shape[1] + 1
    gamma = n * F32_UNIT_ROUNDOFF / (1 - n * F32_UNIT_ROUNDOFF)
    bound = gamma * magnitude + np.finfo(np.float32).tiny   # subnormal flush allowance
    error = np.abs(y_gpu.astype(np.float64) - exact)
    unwritten = int(np.isnan(y_gpu).sum())
    finite = ~np.isnan(error)
    return MatvecCheck(
        rows=w.shape[0], cols=w.shape[1], workgroup=workgroup,
        max_abs_error=float(error[finite].max(initial=0.0)),
        max_error_over_bound=float((error[finite] / bound[finite]).max(initial=0.0)),
        unwritten=unwritten)
