"""The mat-vec that quantizes its own output for the next mat-vec
(shaders/matvec_quantize_out.wgsl): registry entries, host side, golden tests.

    qout_matvec_int8_<enc>_<variant>[_subgroup]   the pre-quantized mat-vec of that encoding
        (matvec_prequant.py), entry main_quantize_out; overrides its own (WG, ROWS, RESIDUAL,
        ACCUMULATE, ROW_NORM, ...) and ROW_BLOCKS = 32 / ROWS, OUT_NATURAL 0|1, SWIGLU_OUT 0|1

On activations quantized once (matvec_prequant.py) each reader of a mat-vec's output needs a
quantize_x launch that reads back what the mat-vec just wrote: 3.3-6.2 us a launch on the H200
in the Llama-8B step, three a layer (docs/RESULTS.md). This kernel writes those bytes itself,
for two kinds of reader:
    norm    o and down add into the residual stream x (ACCUMULATE); gate|up, the next layer's
            q|k|v and the head read x through their RMSNorm, on "xq2s" (the 1/rms from the
            units' squares): units of y * g with the sum of y's squares, no header
    swiglu  (SWIGLU_OUT) the stacked gate|up (gate rows 0 .. R/2, up R/2 .. R), whose
            silu(gate) * up the down projection reads: those units and the header's scale 1
Each workgroup owns one unit of the reader's input, 32 output rows (SWIGLU_OUT: 32 gate and the
32 up rows), in 32 / ROWS blocks of the plain kernel's ROWS, and after its last block quantizes
the values it just stored with quantize_unit, the function quantize_x runs, on values computed
with the same operations: xq_out's bytes and scales are quantize_x's for that y, word for word,
and y is the plain kernel's, bit for bit (the same row sums in the same order). The units' two
f32 sums may differ in their last bits (SUMS_BOUND).

Bindings: the pre-quantized mat-vec's (params, weight parts, xq, y), then
    next_norm  (read-only) the norm reader's weight g [rows] (whole vec4s; unused with SWIGLU_OUT)
    xq_out     (storage) [M][1 + words * units] vec4<u32>, units = rows / 32 (SWIGLU_OUT: rows / 64)

Whether a session uses it is measured: lowering takes it only where every reader is on the
pre-quantized path with one byte form (program/lowering.py matmul_output_quantizer), and the
tuning stage times the whole decode step with and without the fused quantizers and keeps the
faster (attention_xq.CHOICE, which covers both kinds). Fewer workgroups than the plain launch
(one per 32 rows): on a small projection (Llama-1B's 2048 rows: 64 workgroups) the mat-vec
itself may get slower; the step timing decides.

Golden family "matvec_quantize_out": on random weights of every pre-quantized encoding, random,
adversarial and extreme-scale activations and outputs, both byte widths and orders, several
block shapes and both kinds of reader: y equal bit for bit to the plain pre-quantized mat-vec's,
xq_out's bytes and scales word for word quantize_x's from that y, its sums within SUMS_BOUND.
"""
from __future__ import annotations

import numpy as np

from ..webgpu.interface import Device
from . import kquant, matvec, matvec_prequant, runner
from .golden import GoldenContext, GoldenResult, compare_bound, compare_exact, golden
from .golden import label as variant_label
from .matvec import MatvecPlan, MatvecShapeError, Weights
from .registry import KERNELS, KernelSpec, register

PREFIX = matvec_prequant.QUANTIZING_PREFIX
UNIT_ROWS = matvec_prequant.UNIT        # output rows a workgroup owns: one unit of the reader's input


def kernel_name(matvec_kernel: str) -> str:
    """The quantizing form of a pre-quantized mat-vec kernel."""
    return PREFIX + matvec_kernel


def _after_enables(sources: tuple[str, ...], first: str) -> tuple[str, ...]:
    """`sources` with `first` after its enable-directive files (which must open the module)."""
    enables = tuple(name for name in sources if name.startswith("enable_"))
    return enables + (first,) + tuple(name for name in sources if name not in enables)


def _specs():
    for encoding, variant in matvec.PREQUANT_VARIANTS.items():
        for subgroups in (False, True):
            base = KERNELS[matvec.kernel_name(encoding, subgroups, "int8", variant)]
            yield KernelSpec(
                name=kernel_name(base.name),
                sources=_after_enables(base.sources, "matvec_quantize_out_overrides.wgsl")
                + ("int8_pack.wgsl", "int8_store.wgsl", "silu.wgsl", "matvec_quantize_out.wgsl"),
                entry_point="main_quantize_out",
                bindings=base.bindings + ("read-only-storage", "storage"),
                overrides=base.overrides | {"OUT_NATURAL": (0, 1), "SWIGLU_OUT": (0, 1),
                                            "ROW_BLOCKS": tuple(UNIT_ROWS // r for r in matvec.ROWS_PER_WORKGROUP)},
                requires=base.requires,
            )


register(*_specs())


def plan(device: Device, matvec_plan: MatvecPlan, weights: Weights, m: int, natural: bool,
         swiglu: bool = False) -> MatvecPlan:
    """The pre-quantized mat-vec `matvec_plan` (matvec_prequant.plan(...).matvec) as its
    quantizing form: the same params, one workgroup per 32 output rows (`swiglu`: the stacked
    gate|up, 32 gate and 32 up rows), the reader's byte order (`natural`: a q8 reader). Its
    inputs after the weight parts are xq and then next_norm; its outputs y and then xq_out."""
    out_rows = weights.rows // 2 if swiglu else weights.rows
    if out_rows % UNIT_ROWS or (swiglu and weights.rows % 2):
        raise MatvecShapeError("rows", f"quantizing the output needs whole units: {out_rows} rows "
                                       f"{'a half ' if swiglu else ''}are not a multiple of {UNIT_ROWS}")
    gx, gy, _ = runner.workgroup_grid(out_rows // UNIT_ROWS, device.limits["maxComputeWorkgroupsPerDimension"])
    overrides = dict(matvec_plan.overrides) | {"ROW_BLOCKS": UNIT_ROWS // matvec_plan.overrides["ROWS"],
                                               "OUT_NATURAL": int(natural), "SWIGLU_OUT": int(swiglu)}
    return MatvecPlan(kernel_name(matvec_plan.kernel), overrides, matvec_plan.params, (gx, gy, m),
                      matvec_plan.inputs + ("next_norm",))


def out_bytes(rows: int, m: int = 1, residual: bool = True, swiglu: bool = False) -> int:
    """Bytes of the xq_out a quantizing mat-vec of `rows` rows writes."""
    return matvec_prequant.xq_bytes((rows // 2 if swiglu else rows) // UNIT_ROWS, m, residual)


async def run(ctx: GoldenContext, weights: Weights, x: np.ndarray, y0: np.ndarray | None,
              next_norm: np.ndarray | None, *, residual: bool = True, natural: bool = False,
              workgroup: int | None = None, rows_per_group: int | None = None, swiglu: bool = False,
              in_norm: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray, dict]:
    """(y [M, rows], xq_out [M, words] u32, the launch's overrides) on fresh buffers: x
    quantized by quantize_x_plain (`in_norm`: quantize_x_norm with that g, "xq2s"), then the
    quantizing mat-vec (y += W x with y0, else y = W x), writing for a norm reader with
    `next_norm` or (`swiglu`) for a down projection."""
    m = np.atleast_2d(x).shape[0]
    base, xq = await _quantized_input(ctx, weights, x, y0, residual, workgroup, rows_per_group, in_norm)
    p = plan(ctx.device, base.matvec, weights, m, natural, swiglu)
    kernel = await ctx.kernel(p.kernel, **p.overrides)
    y = (m * weights.rows, np.float32) if y0 is None else np.asarray(y0, np.float32).reshape(-1).copy()
    g = np.ones(4, np.float32) if next_norm is None else matvec.padded_norm_weight(next_norm, weights.rows)
    y, xq_out = await runner.run_once(ctx.device, kernel, p.params, [*weights.bindings(), xq, g],
                                      [y, (out_bytes(weights.rows, m, residual, swiglu) // 4, np.uint32)], p.grid)
    return y.reshape(m, weights.rows), xq_out.reshape(m, -1), p.overrides


async def plain_run(ctx: GoldenContext, weights: Weights, x: np.ndarray, y0: np.ndarray | None, *,
                    residual: bool, workgroup: int | None, rows_per_group: int | None,
                    in_norm: np.ndarray | None = None) -> np.ndarray:
    """y of the plain pre-quantized mat-vec with the same launch shape (the reference for y)."""
    norm = {} if in_norm is None else {"input": "norm", "norm_weight": in_norm, "eps": 1e-5, "squares": True}
    return await matvec_prequant.run(ctx, weights, np.atleast_2d(x), y0=y0, workgroup=workgroup,
                                     rows_per_group=rows_per_group, residual=residual, **norm)


async def _quantized_input(ctx, weights, x, y0, residual, workgroup, rows_per_group, in_norm):
    """(matvec_prequant's plan, xq) for x as the op's own quantizer makes it."""
    m = np.atleast_2d(x).shape[0]
    xs, stride = matvec.padded_activations(np.atleast_2d(np.asarray(x, np.float32)))
    mode = "plain" if in_norm is None else "norm"
    norm = {} if in_norm is None else {"eps": 1e-5, "norm_elements": matvec._quads(weights.cols), "squares": True}
    base = matvec_prequant.plan(ctx.device, weights, m, stride, weights.rows, mode, y0 is not None,
                                workgroup=workgroup, rows_per_group=rows_per_group, residual=residual, **norm)
    inputs = [xs] + ([] if in_norm is None else [matvec.padded_norm_weight(in_norm, weights.cols)])
    quantizer = await ctx.kernel(base.quantize.kernel, **base.quantize.overrides)
    (xq,) = await runner.run_once(ctx.device, quantizer, base.quantize.params, inputs,
                                  [(matvec_prequant.xq_bytes(matvec_prequant.x_units(weights), m, residual) // 4,
                                    np.uint32)], base.quantize.grid)
    return base, xq


# -- golden tests ---------------------------------------------------------------------------

def _activations(rng, kind: str, m: int, cols: int) -> np.ndarray:
    n = rng.standard_normal
    if kind == "random":
        return (2 * n((m, cols))).astype(np.float32)
    if kind == "outliers":             # one huge value a unit: the others round coarsely
        x = n((m, cols)).astype(np.float32)
        x[:, ::32] *= 1e4
        return x
    if kind == "tiny":                 # scales near the clamp of int8_scale's exponent
        return (n((m, cols)) * 1e-30).astype(np.float32)
    raise ValueError(kind)


# (label, encoding, rows, cols, M, activations, y0 scale, g kind, ROWS, WG, output): y0 None for
# y = W x; output "norm" (a reader through its norm, g the reader's norm weight) or "swiglu" (the
# stacked gate|up: rows are 2F, a down projection reads silu(gate) * up; g the producer's own
# input norm, "xq2s", as gate|up has)
CASES = [
    ("q4 rows 32", "q4", 32, 256, 1, "random", 1.0, "random", None, None, "norm"),
    ("q4 Llama-ish", "q4", 256, 1024, 1, "random", 1.0, "random", 4, 64, "norm"),
    ("q4 two rows of x", "q4", 96, 512, 2, "random", 3.0, "random", 8, 32, "norm"),
    ("q4 one row a block", "q4", 64, 256, 1, "outliers", 1e3, "random", 1, 32, "norm"),
    ("q4 16 rows a block", "q4", 128, 512, 1, "random", None, "ones", 16, 128, "norm"),
    ("q8", "q8", 64, 512, 1, "random", 1.0, "random", 2, 64, "norm"),
    ("q8 tiny x", "q8", 96, 256, 1, "tiny", 1e-30, "random", 4, 256, "norm"),
    ("q4k", "q4k", 64, 512, 1, "random", 1.0, "random", 4, 64, "norm"),
    ("q6k", "q6k", 32, 256, 1, "outliers", 1.0, "extreme", 8, 32, "norm"),
    ("q4 gate|up", "q4", 256, 512, 1, "random", None, "random", 4, 64, "swiglu"),
    ("q4 gate|up, two rows of x", "q4", 128, 256, 2, "outliers", None, "extreme", 16, 32, "swiglu"),
    ("q8 gate|up", "q8", 64, 256, 1, "random", None, "ones", 1, 128, "swiglu"),
    ("q4k gate|up", "q4k", 192, 256, 1, "random", None, "random", 8, 256, "swiglu"),
]
QUICK_CASES = [CASES[1], CASES[5], CASES[9]]


def _weights(rng, encoding: str, rows: int, cols: int) -> Weights:
    if encoding in ("q4k", "q6k"):
        return kquant.random_weights(rng, encoding, rows, cols)
    return matvec.random_weights_fast(rng, encoding, rows, cols)


def _norm_weight(rng, kind: str, rows: int) -> np.ndarray:
    if kind == "ones":
        return np.ones(rows, np.float32)
    g = (1 + 0.5 * rng.standard_normal(rows)).astype(np.float32)
    if kind == "extreme":               # sign flips and scales far from 1
        g[::3] *= -1e3
        g[1::5] *= 1e-3
    return g


def _planned_cases(ctx: GoldenContext) -> list[tuple]:
    """(case + (ROW_NORM,), RESIDUAL, OUT_NATURAL) to run. Outside admission the case lists with
    both widths and orders (quick: the first of each); at admission one case of each planned
    pipeline's encoding, launch shape, output kind, input norm and byte form."""
    if ctx.planned is None:
        cases = [(*case, case[-1] == "swiglu") for case in (QUICK_CASES if ctx.quick else CASES)]
        return [(case, residual, natural) for i, case in enumerate(cases)
                for residual, natural in ((1, 0), (1, 1), (0, i % 2))[: 1 if ctx.quick else 3]]
    out = []
    for name, items in sorted(ctx.planned):
        if not name.startswith(PREFIX):
            continue
        o = dict(items)
        encoding = next(e for e, v in matvec.PREQUANT_VARIANTS.items() if f"_int8_{e}_{v}" in name)
        cols = 256 if encoding in ("q4k", "q6k") else 512
        out.append((("the plan's pipeline", encoding, 128, cols, 1, "random", 1.0 if o.get("ACCUMULATE") else None,
                     "random", o["ROWS"], o["WG"], "swiglu" if o["SWIGLU_OUT"] else "norm", o["ROW_NORM"]),
                    o["RESIDUAL"], o["OUT_NATURAL"]))
    return out


SUMS_BOUND = 2.0 ** -22     # of the sum of the terms' magnitudes (_compare_units)


def _compare_units(name: str, case: str, got: np.ndarray, want: np.ndarray, words: int, values: np.ndarray,
                   squares: np.ndarray) -> list[GoldenResult]:
    """Units past the header: every byte word and the scale d word for word; the sum of the
    unit's `values` and of `squares` (y^2 for a norm reader, 0 else) within SUMS_BOUND of the
    sum of their terms' magnitudes from the quantizer's. Those two are f32 sums of products that
    a shader compiler may contract into fused multiply-adds in one kernel and not in the other
    (lavapipe's did: 1 ulp in a few units' sums, 20 ulps of a sum that cancelled), which changes
    each product's rounding by at most half an ulp of it: 2^-24 of its magnitude, 2^-23 summed
    with margin."""
    terms = np.abs(np.asarray(values, np.float64)).reshape(-1, 32).sum(axis=1)
    squares = np.asarray(squares, np.float64).reshape(-1, 32).sum(axis=1)
    got, want = got.reshape(-1, words, 4), want.reshape(-1, words, 4)
    sums_got = got[:, 2, 1:3].copy().view(np.float32)
    sums_want = want[:, 2, 1:3].copy().view(np.float32)
    masked_got, masked_want = got.copy(), want.copy()
    masked_got[:, 2, 1:3] = masked_want[:, 2, 1:3] = 0
    return [compare_exact(FAMILY, name, f"{case}: xq_out bytes and scales against quantize_x", masked_got,
                          masked_want),
            compare_bound(FAMILY, name, f"{case}: xq_out sums against quantize_x", sums_got, sums_want,
                          SUMS_BOUND * np.stack([terms, squares], axis=1), "2^-22 of the terms' magnitudes")]


def _silu_times_up(h: np.ndarray, f: int) -> np.ndarray:
    """silu(gate) * up of rows [gate | up] (f each), in float64: the magnitudes for the bound."""
    gate, up = np.asarray(h[:, :f], np.float64), np.asarray(h[:, f:], np.float64)
    return gate * 0.5 * (1 + np.tanh(gate / 2)) * up          # gate * sigmoid(gate), without overflow


FAMILY = "matvec_quantize_out"


@golden(FAMILY, kernels=(PREFIX,))
async def golden_matvec_quantize_out(ctx: GoldenContext) -> list[GoldenResult]:
    results = []
    subgroups = "subgroups" in ctx.device.features
    for case, residual, natural in _planned_cases(ctx):
        label, encoding, rows, cols, m, kind, y0_scale, g_kind, rows_per_group, workgroup, out, in_norm = case
        base_name = matvec.kernel_name(encoding, subgroups, "int8", matvec.PREQUANT_VARIANTS[encoding])
        if not ctx.variants(kernel_name(base_name)):
            continue
        swiglu = out == "swiglu"
        weights = _weights(ctx.rng, encoding, rows, cols)
        x = _activations(ctx.rng, kind, m, cols)
        y0 = None if y0_scale is None else (y0_scale * ctx.rng.standard_normal((m, rows))).astype(np.float32)
        g = _norm_weight(ctx.rng, g_kind, cols if swiglu else rows)
        own_norm = _norm_weight(ctx.rng, "random", cols) if in_norm and not swiglu else g if in_norm else None
        y, xq_out, overrides = await run(ctx, weights, x, y0, None if swiglu else g, residual=bool(residual),
                                         natural=bool(natural), workgroup=workgroup, rows_per_group=rows_per_group,
                                         swiglu=swiglu, in_norm=own_norm)
        name = variant_label(KERNELS[kernel_name(base_name)], overrides)
        case = (f"{label}: {encoding} {rows}x{cols} M={m} {kind} x, y0 {y0_scale}, g {g_kind}, "
                f"{'gate|up for down' if swiglu else 'for a norm reader'}{', norm input' if in_norm else ''}, "
                f"bytes {1 + residual}{' natural' if natural else ''}")
        want_y = await plain_run(ctx, weights, x, y0, residual=bool(residual), workgroup=overrides["WG"],
                                 rows_per_group=overrides["ROWS"], in_norm=own_norm)
        results.append(compare_exact(FAMILY, name, f"{case}: y against the plain mat-vec", y.view(np.uint32),
                                     want_y.view(np.uint32)))
        # The bytes quantize_x makes from that y for a reader of this byte order (its weights'
        # values do not matter: only xq is read back): quantize_x_norm with UNIT_SQUARES (no
        # header: ROW_NORM readers skip it), or quantize_x_swiglu (header 1).
        k = rows // 2 if swiglu else rows
        reader = matvec.random_weights_fast(ctx.rng, "q8" if natural else "q4", 4, k)
        if swiglu:
            want = await matvec_prequant.run(ctx, reader, want_y, input="swiglu", up_offset=k,
                                             residual=bool(residual), quantized_only=True)
            results.append(compare_exact(FAMILY, name, f"{case}: xq_out header", xq_out[:, :4], want[:, :4]))
            values, squares = _silu_times_up(want_y, k), np.zeros((m, k))
        else:
            want = await matvec_prequant.run(ctx, reader, want_y, input="norm", norm_weight=g, eps=1e-5,
                                             residual=bool(residual), squares=True, quantized_only=True)
            values, squares = np.asarray(want_y, np.float64) * g, np.asarray(want_y, np.float64) ** 2
        results += _compare_units(name, case, xq_out[:, 4:], want[:, 4:], 5 if residual else 3, values, squares)
    return results
