"""Decode mat-vec: y[m] = W x[m] for M = 1 (and a few rows) with W in q4, q8, f16 or f32.

Decode is memory-bound: every weight byte is read once per token and used for one
multiply-add, so the kernels are built to stream weights at full width (16-byte loads,
adjacent invocations on adjacent bytes) and dequantize in registers next to the FMA.
The WGSL is assembled from trusted bundle files only (registry "sources"):

    common_quant.wgsl                 exact q4/q8/f16 decoding helpers
    matvec_main.wgsl                  the entry point and work split (shared)
    matvec_reduce_workgroup.wgsl      row sums in workgroup memory     (tiers A, B)
    matvec_reduce_subgroup.wgsl       row sums with subgroupAdd        (tier C: "subgroups")
    matvec_<encoding>.wgsl            weight bindings and one unit's dot products
    quant_scales.wgsl, quant_mins.wgsl  q4/q8 scale_at, q4 min_at (f16 or f32 scales)

Weights are bound exactly as the artifact stores their parts (docs/slm-format.md): no
repacking, so the bytes on the GPU are the bytes the artifact hash covers.

Host side (below): `weights.Weights` describes a tensor's parts (shared with gemm.py),
`units` counts a row's steps, `choose_kernel` picks the
variant and overrides for a device, `check_shapes` validates before any dispatch, and
`matvec` runs one product. The golden tests and the benchmark hook close the file.
"""
from __future__ import annotations

import dataclasses

import numpy as np

from ..artifact import quant
from ..artifact.format import BLOCK_ELEMENTS, blocks_per_row, row_stride
from ..webgpu.interface import Device
from . import runner
from .golden import GoldenContext, GoldenResult, compare_bound, gamma, golden, label
from .registry import KERNELS, QUANT_SOURCES, KernelSpec, compile_kernel, register
from .weights import ENCODINGS, PART_NAMES, Weights

UNIT_ELEMENTS = {"q4": 32, "q8": 16, "f16": 8, "f32": 4}   # weights one invocation step covers
WORKGROUP_SIZES = (32, 64, 128, 256)
ROWS_PER_WORKGROUP = (1, 2, 4, 8)
UNITS_PER_INVOCATION = 4


def kernel_name(encoding: str, subgroups: bool) -> str:
    return f"matvec_{encoding}" + ("_subgroup" if subgroups else "")


def _specs():
    for encoding in ENCODINGS:
        for subgroups in (False, True):
            overrides = {"WG": WORKGROUP_SIZES, "ROWS": ROWS_PER_WORKGROUP}
            if encoding in ("q4", "q8"):
                overrides |= {"BLOCK": BLOCK_ELEMENTS, "SCALE_F16": (0, 1)}
            if encoding == "q4":
                overrides |= {"ZERO_MIN": (0, 1)}
            reduce = "matvec_reduce_subgroup.wgsl" if subgroups else "matvec_reduce_workgroup.wgsl"
            yield KernelSpec(
                name=kernel_name(encoding, subgroups),
                sources=(("enable_subgroups.wgsl",) if subgroups else ())
                + ("common_quant.wgsl", "matvec_main.wgsl", reduce, f"matvec_{encoding}.wgsl")
                + QUANT_SOURCES.get(encoding, ()),
                entry_point="main",
                bindings=("uniform",) + ("read-only-storage",) * (len(PART_NAMES[encoding]) + 1) + ("storage",),
                overrides=overrides,
                requires=frozenset({"subgroups"}) if subgroups else frozenset(),
            )


register(*_specs())


# -- host side ------------------------------------------------------------------------------

def units(weights: Weights) -> int:
    """Steps of UNIT_ELEMENTS weights per row, padding included."""
    if weights.encoding in ("q4", "q8"):
        return weights.blocks * weights.block // UNIT_ELEMENTS[weights.encoding]
    return -(-weights.cols // UNIT_ELEMENTS[weights.encoding])


def choose_kernel(device: Device, weights: Weights, workgroup: int | None = None,
                  rows_per_group: int = 4) -> tuple[str, dict[str, int]]:
    """The variant and overrides for this device: subgroup sums when the device has them; a
    workgroup size that gives each invocation about UNITS_PER_INVOCATION units (the
    reduction after the loop costs about as much as a few units, measured on the H200:
    docs/RESULTS.md), unless `workgroup` asks for one; never more than the limits admit."""
    wanted = workgroup or max(32, units(weights) // UNITS_PER_INVOCATION)
    size = runner.largest_workgroup(device.limits, WORKGROUP_SIZES, wanted)
    if size is None:
        raise ValueError(f"no mat-vec workgroup size fits {min(wanted, runner.max_invocations(device.limits))} "
                         f"invocations")
    overrides = {"WG": size, "ROWS": rows_per_group, **weights.overrides()}
    return kernel_name(weights.encoding, "subgroups" in device.features), overrides


def check_shapes(device: Device, weights: Weights, m: int, x_stride: int) -> None:
    """Everything the kernel's addressing assumes, checked before any GPU work."""
    if weights.encoding not in ENCODINGS:
        raise ValueError(f"mat-vec has no {weights.encoding!r} encoding")
    if weights.rows < 1 or weights.cols < 1 or m < 1:
        raise ValueError(f"empty mat-vec: rows={weights.rows} cols={weights.cols} m={m}")
    if x_stride % 4 or x_stride < weights.cols:
        raise ValueError(f"x_stride {x_stride} must be a multiple of 4 and >= cols {weights.cols}")
    if m > device.limits["maxComputeWorkgroupsPerDimension"]:
        raise ValueError(f"{m} activation rows exceed the grid's z limit")
    widest = max(weights.rows * units(weights) * UNIT_ELEMENTS[weights.encoding], m * x_stride, m * weights.rows)
    if widest >= runner.U32_LIMIT:
        raise ValueError(f"mat-vec addresses {widest} elements, past u32 indexing")
    for name, part in weights.parts.items():
        runner.check_binding_size(device.limits, f"weight part {name} (split the tensor: memory planner)",
                                  len(memoryview(part).cast("B")))


def params(weights: Weights, x_stride: int, y_stride: int) -> np.ndarray:
    return runner.params_words(weights.rows, weights.cols, weights.blocks, units(weights),
                               weights.row_words, x_stride, y_stride)


def grid(device: Device, weights: Weights, rows_per_group: int, m: int) -> tuple[int, int, int]:
    groups = -(-weights.rows // rows_per_group)
    gx, gy, _ = runner.workgroup_grid(groups, device.limits["maxComputeWorkgroupsPerDimension"])
    return (gx, gy, m)


def padded_activations(x: np.ndarray, fill: float = np.nan) -> tuple[np.ndarray, int]:
    """x [M, K] -> ([M, x_stride] f32, x_stride) with x_stride a multiple of 4. The padding
    holds `fill` (NaN in tests: the kernels must mask it, never multiply it)."""
    m, k = x.shape
    stride = -(-k // 4) * 4
    out = np.full((m, stride), fill, np.float32)
    out[:, :k] = x
    return out, stride


def _as_array(part) -> np.ndarray:
    return np.frombuffer(memoryview(part).cast("B"), np.uint8)


async def matvec(ctx_or_device, weights: Weights, x: np.ndarray, name: str | None = None,
                 overrides: dict[str, int] | None = None) -> np.ndarray:
    """y [M, rows] = x [M, cols] W^T, once, on fresh buffers (tests, self-tests)."""
    ctx = ctx_or_device if isinstance(ctx_or_device, GoldenContext) else GoldenContext(ctx_or_device, None)
    device = ctx.device
    x = np.atleast_2d(np.asarray(x, np.float32))
    if x.shape[1] != weights.cols:
        raise ValueError(f"x has {x.shape[1]} columns, the weights {weights.cols}")
    if name is None:
        name, overrides = choose_kernel(device, weights)
    xs, stride = padded_activations(x)
    check_shapes(device, weights, x.shape[0], stride)
    kernel = await ctx.kernel(name, **overrides)
    (y,) = await runner.run_once(
        device, kernel, params(weights, stride, weights.rows),
        [*weights.bindings(), xs], [(x.shape[0] * weights.rows, np.float32)],
        grid(device, weights, overrides["ROWS"], x.shape[0]))
    return y.reshape(x.shape[0], weights.rows)


# -- the oracle and its error bound ---------------------------------------------------------

def oracle(weights: Weights, x: np.ndarray) -> tuple[np.ndarray, np.ndarray, str]:
    """(exact y in float64, elementwise error bound, rule) for any summation order.

    The kernels compute, per unit, s * sum(c x) (+ m * sum(x) for q4 "min", - 8 s sum(x)
    for "offset"). Each elementary term (s c_k x_k, m x_k, 8 s x_k) is rounded at most
    once as a product, once by its scale, and once per addition on its path, and no path
    has more additions than there are terms, so |y - exact| <= gamma(n) * sum |terms| with
    n = terms + 2 (Higham 3.1 / 4.2). Terms are 2 per weight for q4 (code and zero part),
    1 otherwise; padding weights count (they are multiplied by masked zeros)."""
    x64 = np.atleast_2d(x).astype(np.float64)
    w = weights.dequantize().astype(np.float64)
    exact = x64 @ w.T
    padded = units(weights) * UNIT_ELEMENTS[weights.encoding]
    if weights.encoding == "q4":
        codes = quant.unpack_nibbles(_as_array(weights.parts["codes"]).reshape(weights.rows, -1))
        codes = codes[:, :weights.cols].astype(np.float64)
        scale_dtype = quant.SCALE_DTYPES[weights.scale_type]
        s = np.repeat(np.frombuffer(weights.parts["scales"], scale_dtype).reshape(weights.rows, -1)
                      .astype(np.float64), weights.block, axis=1)[:, :weights.cols]
        if weights.zero == "min":
            mins = np.repeat(np.frombuffer(weights.parts["mins"], scale_dtype).reshape(weights.rows, -1)
                             .astype(np.float64), weights.block, axis=1)[:, :weights.cols]
            magnitude_w = np.abs(s * codes) + np.abs(mins)
        else:
            magnitude_w = np.abs(s) * (codes + 8.0)
        n, rule = 2 * padded + 2, "gamma(2 K_padded + 2) * sum(|s c| + |zero part|) |x|"
    else:
        magnitude_w = np.abs(w)
        n, rule = padded + 2, "gamma(K_padded + 2) * sum |w| |x|"
    bound = gamma(n) * (np.abs(x64) @ magnitude_w.T)
    return exact, bound, rule


# -- golden tests ---------------------------------------------------------------------------

def _random_weights(rng, rows, cols, data: str) -> np.ndarray:
    w = rng.standard_normal((rows, cols)).astype(np.float32)
    if data == "constant":
        w[:] = np.float32(0.37)
    elif data == "alternating":
        w = np.abs(w) * np.where(np.arange(cols) % 2 == 0, 1, -1).astype(np.float32)
    elif data == "huge":
        w *= np.float32(1e4)      # f16 scales up to ~2e3, still finite; f32 scales further below
    elif data == "tiny":
        w *= np.float32(1e-6)     # f16 scales become subnormal (exactly decoded)
    return w


def _extreme_codes(weights: Weights, rng, which: str) -> Weights:
    """Overwrite every code with its maximum, minimum or a random mix of both."""
    codes = bytearray(weights.parts["codes"])
    if weights.encoding == "q4":
        pick = {"max": 0xFF, "min": 0x00}.get(which)
        values = [pick] * len(codes) if pick is not None else rng.choice([0x00, 0xFF, 0x0F, 0xF0], len(codes))
    else:
        pick = {"max": 0x7F, "min": 0x80}.get(which)        # +127 and -128
        values = [pick] * len(codes) if pick is not None else rng.choice([0x7F, 0x80, 0x81], len(codes))
    codes[:] = bytes(int(v) for v in values)
    # padding codes past cols must stay zero (the validator requires it)
    per_row = len(codes) // weights.rows
    real = weights.cols if weights.encoding == "q8" else (weights.cols + 1) // 2
    arr = np.frombuffer(codes, np.uint8).reshape(weights.rows, per_row).copy()
    arr[:, real:] = 0
    if weights.encoding == "q4" and weights.cols % 2:
        arr[:, real - 1] &= 0x0F
    return dataclasses.replace(weights, parts={**weights.parts, "codes": arr.tobytes()})


def _cases(ctx: GoldenContext):
    """(label, weights, x) triples: random shapes, every encoding option, adversarial data."""
    rng = ctx.rng
    shapes = [(1, 1), (7, 33), (33, 100), (64, 256)] if ctx.quick else \
        [(1, 1), (7, 33), (65, 257), (300, 1000), (129, 4099), (4, 8192)]
    for rows, cols in shapes:
        for encoding, block, zero, scale_type in [("q4", 32, "min", "f16"), ("q4", 64, "offset", "f32"),
                                                  ("q8", 32, None, "f16"), ("q8", 256, None, "f32"),
                                                  ("f16", None, None, None), ("f32", None, None, None)]:
            w = _random_weights(rng, rows, cols, "normal")
            x = rng.standard_normal((1 if rows > 1 else 3, cols)).astype(np.float32)
            yield (f"random {rows}x{cols} {encoding}/{block}/{zero}/{scale_type}",
                   Weights.quantized(w, encoding, block or 32, zero or "min", scale_type or "f16"), x)
    rows, cols = (9, 97) if ctx.quick else (40, 517)
    for data in ("constant", "alternating", "huge", "tiny"):
        for encoding, zero, scale_type in [("q4", "min", "f16"), ("q4", "offset", "f16"), ("q8", None, "f32"),
                                           ("f16", None, None)]:
            w = _random_weights(rng, rows, cols, data)
            x = rng.standard_normal((2, cols)).astype(np.float32)
            if data == "alternating":
                x = np.abs(x)
            yield (f"{data} {rows}x{cols} {encoding}/{zero}/{scale_type}",
                   Weights.quantized(w, encoding, 128 if data == "tiny" else 32, zero or "min", scale_type or "f16"), x)
    for which in ("max", "min", "mixed"):
        for encoding, zero in [("q4", "min"), ("q4", "offset"), ("q8", None)]:
            w = _extreme_codes(Weights.quantized(_random_weights(rng, rows, cols, "normal"), encoding, 32, zero or "min"),
                               rng, which)
            yield f"{which} codes {rows}x{cols} {encoding}/{zero}", w, rng.standard_normal((1, cols)).astype(np.float32)
    if ctx.model is not None:
        for name in ("blk.0.ffn_up", "blk.0.attn_k", "token_embd"):
            if name in ctx.model.artifact.manifest.tensors:
                w = Weights.from_model(ctx.model, name)
                yield f"real {name} {w.rows}x{w.cols} {w.encoding}", w, rng.standard_normal((1, w.cols)).astype(np.float32)


@golden("matvec")
async def golden_matvec(ctx: GoldenContext) -> list[GoldenResult]:
    """Every case on the device's default choice (subgroup sums where admitted) and on the
    workgroup-memory reduction; the random cases also on every workgroup shape (full)."""
    results = []
    variants = {spec.name for spec in ctx.variants("matvec_")}
    default = [(None, 4)]
    every_shape = default if ctx.quick else default + [(32, 8), (64, 1), (256, 2)]
    for case, weights, x in _cases(ctx):
        exact, bound, rule = oracle(weights, x)
        for subgroups in (False, True):
            name = kernel_name(weights.encoding, subgroups)
            if name not in variants:
                continue
            for workgroup, rows_per_group in (every_shape if case.startswith("random") else default):
                _, overrides = choose_kernel(ctx.device, weights, workgroup, rows_per_group)
                y = await matvec(ctx, weights, x, name, overrides)
                results.append(compare_bound("matvec", label(KERNELS[name], overrides), case, y, exact, bound, rule))
    return results


# -- benchmark hook -------------------------------------------------------------------------

BENCH_SHAPES = {
    "smollm2 q/o 576x576": {"rows": 576, "cols": 576},
    "smollm2 gate+up 3072x576": {"rows": 3072, "cols": 576},
    "smollm2 down 576x1536": {"rows": 576, "cols": 1536},
    "smollm2 head 49152x576": {"rows": 49152, "cols": 576},
    "llama1b q 2048x2048": {"rows": 2048, "cols": 2048, "big": True},
    "llama1b gate+up 16384x2048": {"rows": 16384, "cols": 2048, "big": True},
    "llama1b down 2048x8192": {"rows": 2048, "cols": 8192, "big": True},
    "square 4096x4096": {"rows": 4096, "cols": 4096},
    "llama8b gate 14336x4096": {"rows": 14336, "cols": 4096, "big": True},
    "llama8b down 4096x14336": {"rows": 4096, "cols": 14336, "big": True},
}
# An encoding, optionally with overrides to sweep: "q4" or "q4/WG=256/ROWS=2".
BENCH_NAMES = ("q4", "q8", "f16", "f32")


def random_weights_fast(rng, encoding: str, rows: int, cols: int, block: int = 32,
                        zero: str = "min", scale_type: str = "f16") -> Weights:
    """Random parts of the right sizes without quantizing (benchmarks on big shapes)."""
    blocks = blocks_per_row(cols, block)
    stride = row_stride(encoding, cols, block)
    codes = rng.integers(0, 256, rows * stride, dtype=np.uint8).tobytes()
    if encoding in ("f16", "f32"):
        dtype = np.float16 if encoding == "f16" else np.float32
        data = (rng.standard_normal(rows * stride // dtype().itemsize) * 0.02).astype(dtype).tobytes()
        return Weights(encoding, rows, cols, {"data": data})
    scale_dtype = quant.SCALE_DTYPES[scale_type]
    scales = (rng.random(rows * blocks) * 0.01 + 0.001).astype(scale_dtype).tobytes()
    mins = (-rng.random(rows * blocks) * 0.05).astype(scale_dtype).tobytes()
    parts = {"codes": codes, "scales": scales}
    if encoding == "q4" and zero == "min":
        parts["mins"] = mins
    return Weights(encoding, rows, cols, parts, block, zero if encoding == "q4" else None, scale_type)


async def prepare_bench(device: Device, name: str, shape: dict, rng,
                        overrides: dict[str, int] | None = None) -> runner.Prepared:
    """`name` is an encoding, optionally with overrides ("q4/WG=256/ROWS=2"); the variant
    (subgroups or not) follows the device."""
    encoding, *settings = name.split("/")
    overrides = {**{k: int(v) for k, v in (item.split("=") for item in settings)}, **(overrides or {})}
    weights = random_weights_fast(rng, encoding, shape["rows"], shape["cols"])
    chosen, chosen_overrides = choose_kernel(device, weights)
    overrides = {**chosen_overrides, **overrides}
    kernel = await compile_kernel(device, chosen, **overrides)
    x, stride = padded_activations(rng.standard_normal((1, weights.cols)).astype(np.float32), 0.0)
    check_shapes(device, weights, 1, stride)
    prepared = runner.prepare(device, kernel, params(weights, stride, weights.rows),
                              [*weights.bindings(), x], [(weights.rows, np.float32)],
                              grid(device, weights, overrides["ROWS"], 1))
    prepared.bytes_moved = weights.nbytes + x.nbytes + weights.rows * 4
    prepared.flops = 2 * weights.rows * weights.cols
    return prepared
