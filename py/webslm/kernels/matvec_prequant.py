"""The q4 decode mat-vec on activations quantized once, beforehand: two launches.

    quantize_x_<input>   x (or x * g with the row's 1/rms, or silu(gate) * up) -> xq, the
                         activations as int8 bytes per 32 with a power-of-two scale and the
                         unit's sum (shaders/quantize_x.wgsl: one workgroup per activation row)
    matvec_int8_q4_dot4  y = W xq with dot4I8Packed (matvec_q4_dot4.wgsl + matvec_input_int8.wgsl)

Why: the packed-dot mat-vec (matvec "dot4" variant) quantizes x in every workgroup, and the
f32 one decodes every nibble to a float; either way the arithmetic, not the memory, sets the
time. On the H200 (bench/matvec_ceiling.py, docs/RESULTS.md) a mat-vec reading bytes prepared
once ran within 6-20% of a kernel that only loads the weights, about twice as fast as the
f32 kernel at Llama-3.1-8B's shapes. llama.cpp's CUDA mat-vec (mmvq) works the same way.

Numerics: exactly those of the dot4 variant with RESIDUAL=0 (the same quantize_unit, the
same scale rule, the norm's 1/rms applied to the row sums after), so `matvec.fused_oracle(...,
int8=1)` bounds it: int8 activations, a stated error, not the exact f32 mat-vec. The engine
takes it only where admission's tuning stage measured it faster on the device and checked
its output against the exact kernel's (backends/gpu/tuning.py); variant name "xq".

Both launches read the mat-vec's own params block (matvec.params): the quantizer needs cols,
units, x_stride and aux of the op's input mode. xq is the plan's `decode.int8_x` region
(`xq_bytes`: it holds the widest decode matmul's activations).
"""
from __future__ import annotations

from typing import NamedTuple

import numpy as np

from ..webgpu.interface import Device
from . import matvec, runner
from .golden import GoldenContext, GoldenResult, compare_bound, golden
from .matvec import INPUT_BINDINGS, MatvecPlan, MatvecShapeError, Weights
from .registry import KernelSpec, capabilities, register

VARIANT = "xq"                          # matvec.Choice.variant of this path
QUANTIZE_SIZES = (32, 64, 128, 256)     # quantize_x workgroup sizes (one lane per unit)


def quantize_name(input: str) -> str:
    return f"quantize_x_{input}"


def _specs():
    for input in ("plain", "norm", "swiglu"):
        yield KernelSpec(
            name=quantize_name(input),
            sources=("matvec_params.wgsl", "quantize_x.wgsl", f"matvec_input_{input}.wgsl", "int8_unit.wgsl",
                     "int8_pack.wgsl", "matvec_int8_x.wgsl") + (("silu.wgsl",) if input == "swiglu" else ()),
            entry_point="main",
            bindings=("uniform", "storage") + ("read-only-storage",) * len(INPUT_BINDINGS[input]),
            overrides={"WG": QUANTIZE_SIZES},
            requires=frozenset({matvec.DOT4_FEATURE}),
        )


register(*_specs())


def xq_bytes(units: int, m: int = 1) -> int:
    """Bytes of xq for m activation rows of `units` units: a 16-byte header and 3 vec4 a unit."""
    return 16 * m * (1 + 3 * units)


def serves(device: Device, weights: Weights) -> bool:
    """Whether this path can run the weights on the device: q4, and packed dot products in its WGSL."""
    return weights.encoding == "q4" and matvec.DOT4_FEATURE in capabilities(device)


class PrequantPlan(NamedTuple):
    quantize: MatvecPlan             # the quantizer: inputs are the op's activation bindings, output xq
    matvec: MatvecPlan               # the mat-vec: input xq


def plan(device: Device, weights: Weights, m: int, x_stride: int, y_stride: int, input: str = "plain",
         accumulate: bool = False, eps: float | None = None, up_offset: int | None = None,
         norm_elements: int | None = None, workgroup: int | None = None,
         rows_per_group: int | None = None) -> PrequantPlan:
    """Both launches, validated on the host (matvec.plan's checks for the op's input mode)."""
    if not serves(device, weights):
        raise MatvecShapeError("variant", f"pre-quantized activations need q4 weights and {matvec.DOT4_FEATURE} "
                                          f"(got {weights.encoding})")
    base = matvec.plan(device, weights, m, x_stride, y_stride, input, accumulate, eps, up_offset, norm_elements,
                       workgroup, rows_per_group, variant="dot4")
    overrides = {k: v for k, v in base.overrides.items() if k != "RESIDUAL"}
    name = matvec.kernel_name("q4", "subgroups" in device.features, "int8", "dot4")
    units = matvec.units(weights)
    size = runner.largest_workgroup(device.limits, QUANTIZE_SIZES, max(32, 1 << (units - 1).bit_length()))
    if size is None:
        raise MatvecShapeError("workgroup", "no quantize_x workgroup size fits the device's limits")
    quantize = MatvecPlan(quantize_name(input), {"WG": size}, base.params, (1, 1, m), INPUT_BINDINGS[input])
    return PrequantPlan(quantize, MatvecPlan(name, overrides, base.params, base.grid, INPUT_BINDINGS["int8"]))


async def run(ctx: GoldenContext, weights: Weights, x: np.ndarray, *, input: str = "plain",
              norm_weight: np.ndarray | None = None, eps: float | None = None, up_offset: int | None = None,
              y0: np.ndarray | None = None, workgroup: int | None = None,
              rows_per_group: int | None = None) -> np.ndarray:
    """y [M, rows] once on fresh buffers (tests): the two launches, xq read back in between."""
    device = ctx.device
    x = np.atleast_2d(np.asarray(x, np.float32))
    if input == "swiglu":
        up_offset = x.shape[1] // 2 if up_offset is None else up_offset
        xs, stride = x, x.shape[1]
    else:
        xs, stride = matvec.padded_activations(x)
    inputs = [xs] + ([matvec.padded_norm_weight(norm_weight, weights.cols)] if input == "norm" else [])
    m = x.shape[0]
    p = plan(device, weights, m, stride, weights.rows, input, y0 is not None, eps, up_offset,
             matvec._quads(weights.cols) if input == "norm" else None, workgroup, rows_per_group)
    quantizer = await ctx.kernel(p.quantize.kernel, **p.quantize.overrides)
    (xq,) = await runner.run_once(device, quantizer, p.quantize.params, inputs,
                                  [(xq_bytes(matvec.units(weights), m) // 4, np.uint32)], p.quantize.grid)
    output = (m * weights.rows, np.float32) if y0 is None else np.asarray(y0, np.float32).reshape(-1).copy()
    kernel = await ctx.kernel(p.matvec.kernel, **p.matvec.overrides)
    (y,) = await runner.run_once(device, kernel, p.matvec.params, [*weights.bindings(), xq], [output],
                                 p.matvec.grid)
    return y.reshape(m, weights.rows)


@golden("matvec_prequant", kernels=("quantize_x_", "matvec_int8_"))
async def golden_matvec_prequant(ctx: GoldenContext) -> list[GoldenResult]:
    """The dot4 variant's q4 cases (random shapes with odd tails, int8-exact activations,
    adversarial activations and codes, real weights) through the two launches, against
    `matvec.fused_oracle(int8=1)`: the bound of the one-launch dot4 variant with RESIDUAL=0,
    whose numerics this path has. Full runs also try other launch shapes of the mat-vec."""
    from .matvec_variants import _adversarial_cases, _random_cases, _real_cases
    results = []
    if not ctx.variants("quantize_x_"):
        return results
    name = matvec.kernel_name("q4", "subgroups" in ctx.device.features, "int8", "dot4")
    shapes = [(None, None)] if ctx.quick else [(None, None), (32, 16), (256, 1), (64, 8)]
    for item in (*_random_cases(ctx), *_adversarial_cases(ctx), *_real_cases(ctx)):
        case = item.case
        if item.variant != "dot4" or case.weights.encoding != "q4" or not ctx.uses(quantize_name(case.input)):
            continue
        exact, bound, rule = matvec.fused_oracle(case.weights, case.x, case.input, case.norm_weight, case.eps,
                                                 case.up_offset, case.y0, int8=1)
        for workgroup, rows in (shapes if case.name.startswith("random") else shapes[:1]):
            y = await run(ctx, case.weights, case.x, input=case.input, norm_weight=case.norm_weight, eps=case.eps,
                          up_offset=case.up_offset, y0=case.y0, workgroup=workgroup, rows_per_group=rows)
            shape = {"WG": workgroup or "rule", "ROWS": rows or "rule"}
            results.append(compare_bound("matvec_prequant", f"{quantize_name(case.input)}+{name} {shape}",
                                         case.name, y, exact, bound, rule))
    return results
