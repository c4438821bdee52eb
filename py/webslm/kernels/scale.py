"""x *= scale in place (shaders/scale.wgsl): Gemma 3's embedding scale (sqrt(hidden)).

    scale_rows   x [T, D] f32, D % 4 == 0 -> x * scale, one f32 multiply per element

Exact: the GPU's f32 product of two f32 values is the correctly rounded one (WGSL's `*` is
correctly rounded for finite results), the same as numpy's, so the golden check is bits
(except that WGSL lets a GPU flush a subnormal input or product to zero).
"""
from __future__ import annotations

from typing import NamedTuple

import numpy as np

from ..webgpu.interface import Device
from . import runner
from .golden import GoldenContext, GoldenResult, compare_exact, golden, label
from .registry import CompiledKernel, KernelSpec, compile_kernel, register

register(KernelSpec("scale_rows", ("scale.wgsl",), "scale_rows", ("uniform", "storage"),
                    {"WG": runner.LAYER_WORKGROUP_SIZES}))


class ScalePlan(NamedTuple):
    kernel: str
    overrides: dict[str, int]
    params: np.ndarray               # quads, scale
    grid: tuple[int, int, int]


def plan_scale(limits: dict[str, int], elements: int, scale: float, workgroup: int | None = None) -> ScalePlan:
    """Validate one launch over `elements` f32 (a multiple of 4) and build it."""
    if elements < 4 or elements % 4:
        raise ValueError(f"scale_rows needs a positive multiple of 4 elements (vec4), got {elements}")
    if not (np.isfinite(scale) and np.isfinite(np.float32(scale))):
        raise ValueError(f"scale {scale!r} must be a finite f32")
    runner.check_binding_size(limits, f"x [{elements}] f32", 4 * elements)
    wg = runner.layer_workgroup(limits, workgroup, 256)
    grid = runner.workgroup_grid(-(-elements // (4 * wg)), limits["maxComputeWorkgroupsPerDimension"])
    return ScalePlan("scale_rows", {"WG": wg}, runner.params_words(elements // 4, float(scale)), grid)


async def scale_rows(device: Device, x: np.ndarray, scale: float, kernel: CompiledKernel | None = None) -> np.ndarray:
    """x * scale (f32) on fresh buffers."""
    plan = plan_scale(device.limits, x.size, scale, kernel.overrides.get("WG") if kernel else None)
    kernel = kernel or await compile_kernel(device, plan.kernel, **plan.overrides)
    out, = await runner.run_once(device, kernel, plan.params, [], [x.astype(np.float32).reshape(-1).copy()], plan.grid)
    return out.reshape(x.shape)


@golden("scale", kernels=("scale_rows",))
async def golden_scale(ctx: GoldenContext) -> list[GoldenResult]:
    """Random rows and adversarial ones (subnormals, values near overflow, signed zeros, inf)
    at Gemma's scales; the product must equal numpy's f32 product bit for bit."""
    rng = ctx.rng
    cases = [("Gemma 3 270M row: sqrt(640)", rng.standard_normal((1, 640)), float(np.sqrt(640))),
             ("prefill 7 x 64, sqrt(64)", rng.standard_normal((7, 64)), 8.0)]
    if not ctx.quick:
        special = np.array([0.0, -0.0, 1e-40, -1e-45, 3e38, -3e38, np.inf, -np.inf, 1.0, -1.0, 7.5, 2.0 ** -126],
                           np.float32)
        cases += [("adversarial values", np.tile(special, (2, 1)), float(np.sqrt(640))),
                  ("many rows", 1e3 * rng.standard_normal((600, 1152)), float(np.sqrt(1152))),
                  ("scale below 1", rng.standard_normal((3, 8)), 0.1)]
    results = []
    for wg in ctx.workgroups(kernel="scale_rows"):
        kernel = await ctx.kernel("scale_rows", WG=wg)
        for case, x, s in cases:
            x = np.asarray(x, np.float32)
            got = await scale_rows(ctx.device, x, s, kernel)
            with np.errstate(over="ignore"):
                want = x * np.float32(s)
            # WGSL lets a GPU flush subnormals: where the input or the product is one, zero passes too.
            tiny = np.finfo(np.float32).tiny
            flushed = ((np.abs(x) < tiny) | (np.abs(want) < tiny)) & (got == 0)
            want = np.where(flushed, got, want)
            results.append(compare_exact("scale", label(kernel.spec, {"WG": wg}), f"{case} x {s:.6g} (bits)",
                                         got.view(np.uint32), want.view(np.uint32)))
    return results
