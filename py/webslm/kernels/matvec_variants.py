"""Golden tests of the mat-vec variants (matvec.VARIANTS): q4_dot4 and q8_dot4 (int8
activations and packed dot products) and f16_wide (16-byte loads), each in every input mode
("plain", "norm", "swiglu"), with and without ACCUMULATE, on both reductions.

The kernels share matvec_main.wgsl and the input files with the plain mat-vec, so the cases
are the plain family's kinds (random shapes with odd tails, adversarial activations, extreme
codes, real weights) run through `matvec_oracle.fused_oracle`; for the dot4 variants (each case with
RESIDUAL 0 and 1) with `int8` 1 or 2, whose bound adds the activation's rounding to bytes
(`matvec_oracle.int8_error`).

That rounding makes the bound on random activations loose (about sum |s c| |x| / 64), too
loose to notice a dropped column. So most dot4 cases also run on activations the kernel
quantizes exactly (`exact_int8_activations`: every unit is integers times its power-of-two
scale): there the int8 term is 0 and the bound is the plain mat-vec's, which a dropped
tail, a shifted row or a swapped byte order fails (tests/test_kernels_matvec_variants.py).
"""
from __future__ import annotations

from typing import NamedTuple

import numpy as np

from .golden import GoldenContext, GoldenResult, compare_bound, golden, label
from .matvec import UNIT_ELEMENTS, Weights, _quads, choose_kernel, gate_up_row, kernel_name
from .matvec_oracle import fused_oracle
from .matvec_cases import LAUNCH, FusedCase, _extreme_codes, _norm_weight, _random_weights, both_accumulates
from .registry import KERNELS

# (encoding, variant, block, zero, scale type): every option each variant serves.
OPTIONS = [("q4", "dot4", 32, "min", "f16"), ("q4", "dot4", 64, "offset", "f32"), ("q4", "dot4", 256, "min", "f32"),
           ("q8", "dot4", 32, None, "f16"), ("q8", "dot4", 256, None, "f32"), ("f16", "wide", None, None, None)]
QUICK_OPTIONS = [("q4", "dot4", 32, "min", "f16"), ("q8", "dot4", 32, None, "f16"), ("f16", "wide", None, None, None)]


def _options(ctx: GoldenContext, int8_unit: int | None) -> list[tuple]:
    """The options the random cases take: QUICK_OPTIONS or OPTIONS; at admission the weight
    formats of the plan's own mat-vec pipelines (of the pre-quantized path's when `int8_unit`
    is given), each with the variant that serves it."""
    if ctx.planned is None:
        return QUICK_OPTIONS if ctx.quick else OPTIONS
    # the pre-quantized path's formats include those the plan runs only in a derived form (its
    # quantizers still need a case: matvec_prequant.DERIVED_PREFIXES)
    from .matvec_prequant import DERIVED_PREFIXES
    prefixes = [p + "matvec_int8_" for p in ("",) + DERIVED_PREFIXES] if int8_unit else ["matvec_"]
    planned = sorted({f for prefix in prefixes for f in ctx.planned_formats(prefix)}, key=str)
    variant = {"q4": "dot4", "q8": "dot4", "f16": "wide"}
    return [(f[0], variant[f[0]], *f[1:]) for f in planned if f[0] in variant]


class VariantCase(NamedTuple):
    variant: str                  # "dot4", "wide"
    case: FusedCase


def exact_int8_activations(rng, m: int, cols: int, unit: int, exponents=(-8, -4)) -> np.ndarray:
    """x [m, cols] that the int8 variants quantize without error: per unit of `unit`
    activations, integers q with |q| <= 127 times 2^E, the unit's largest |q| in 64..127 so
    that its scale is exactly 2^E (matvec_int8_x.wgsl)."""
    units = -(-cols // unit)
    q = rng.integers(-127, 128, (m, units, unit)).astype(np.float64)
    q[:, :, 0] = rng.choice([-1.0, 1.0], (m, units)) * rng.integers(64, 128, (m, units))   # inside cols
    e = rng.integers(*exponents, (m, units, 1))
    return (q * np.ldexp(1.0, e)).reshape(m, -1)[:, :cols].astype(np.float32)


def _weights(rng, rows: int, cols: int, option, data: str = "normal") -> Weights:
    encoding, _, block, zero, scale_type = option
    return Weights.quantized(_random_weights(rng, rows, cols, data), encoding, block or 32, zero or "min",
                             scale_type or "f16")


def _random_cases(ctx: GoldenContext, int8_unit: int | None = None):
    """Random shapes (odd tails for dot4; K % 8 == 0 for f16_wide) in every mode: the main
    options (QUICK_OPTIONS) on every shape, the other block sizes, zeros and scale types on
    two shapes. `int8_unit`: the activations per int8 scale of the kernel under test, when
    not the encoding's unit (matvec_prequant: 32)."""
    rng, n = ctx.rng, ctx.rng.standard_normal
    shapes = [(33, 96)] if ctx.quick else [(1, 32), (7, 40), (7, 33), (65, 264), (65, 257), (300, 1000), (129, 4099)]
    for option in _options(ctx, int8_unit):
        encoding, variant, block, zero, scale_type = option
        for rows, cols in shapes:
            if (variant == "wide" and cols % 8) or (option not in QUICK_OPTIONS and (rows, cols) not in
                                                    ((7, 33), (65, 264))):
                continue
            w = _weights(rng, rows, cols, option)
            what = f"random {rows}x{cols} {encoding}_{variant}/{block}/{zero}/{scale_type}"
            m = 2 if (rows, cols) in ((7, 40), (33, 96)) else 1
            up_offset = _quads(cols) + (4 if cols % 4 == 0 else 0)
            x = (2 * n((m, cols))).astype(np.float32)
            h = gate_up_row(3 * n((m, cols)), n((m, cols)), up_offset)
            y0 = n((m, rows)).astype(np.float32)
            if variant == "dot4":
                exact = exact_int8_activations(rng, m, cols, int8_unit or UNIT_ELEMENTS[encoding])
                yield VariantCase(variant, FusedCase(f"{what} plain int8-exact x", w, "plain", exact))
                yield VariantCase(variant, FusedCase(f"{what} norm int8-exact x, g = 1", w, "norm", exact,
                                                     np.ones(cols, np.float32), 1e-5))
            yield VariantCase(variant, FusedCase(f"{what} plain +y0", w, "plain", x, y0=y0))
            yield VariantCase(variant, FusedCase(f"{what} norm", w, "norm", x, _norm_weight(rng, cols), 1e-5))
            yield VariantCase(variant, FusedCase(f"{what} swiglu F'={up_offset} +y0", w, "swiglu", h,
                                                 up_offset=up_offset, y0=y0))
            if (rows, cols) in ((7, 40), (7, 33), (33, 96)) and not ctx.quick:
                yield VariantCase(variant, FusedCase(f"{what} plain", w, "plain", x))
                yield VariantCase(variant, FusedCase(f"{what} norm +y0", w, "norm", x, _norm_weight(rng, cols),
                                                     1e-6, y0=y0))
                yield VariantCase(variant, FusedCase(f"{what} swiglu F'={up_offset}", w, "swiglu", h,
                                                     up_offset=up_offset))


def adversarial_activations(rng, cols: int, unit: int) -> list[tuple[str, np.ndarray]]:
    """(name, x [1, cols]) that stress an int8 rounding of `unit` activations a scale."""
    n = rng.standard_normal
    spike = (1e-3 * n((1, cols))).astype(np.float32)
    spike[0, ::unit] = 1e3                    # one outlier a unit: the rest rounds to 0
    zeros = (2 * n((1, cols))).astype(np.float32)
    zeros[0, :2 * unit] = 0                   # whole units of zeros
    ties = exact_int8_activations(rng, 1, cols, unit)
    ties[0, 1::unit] *= np.float32(1.0 + 1.0 / 128)     # values between two steps
    boundary = np.ldexp(rng.uniform(127.01, 127.99, (1, cols)), rng.integers(-8, 8, (1, cols)))
    return [("outlier 1e3 in each unit", spike), ("zero units", zeros), ("off-grid ties", ties),
            ("max |x| / 2^E in (127, 128): doubled scale", boundary.astype(np.float32)),
            ("tiny x 1e-30", (1e-30 * n((1, cols))).astype(np.float32)),
            ("huge x 1e30", (1e30 * n((1, cols))).astype(np.float32)),
            ("int8-exact x over 2^-60 .. 2^60", exact_int8_activations(rng, 1, cols, unit, (-60, 60)))]


def _adversarial_cases(ctx: GoldenContext, int8_unit: int | None = None):
    """Activations that stress the int8 rounding, extreme codes and weights, for each variant."""
    if ctx.quick:
        return
    rng, n = ctx.rng, ctx.rng.standard_normal
    rows, cols = 40, 520                      # a tail of 8 past 512 for q4, exact units for q8 and f16
    for option in OPTIONS:
        encoding, variant = option[0], option[1]
        unit = int8_unit or UNIT_ELEMENTS[encoding]
        w = _weights(rng, rows, cols, option)
        what = f"{rows}x{cols} {encoding}_{variant}/{option[2]}/{option[3]}/{option[4]}"
        for name, x in adversarial_activations(rng, cols, unit):
            yield VariantCase(variant, FusedCase(f"{name} {what} plain", w, "plain", x))
        yield VariantCase(variant, FusedCase(f"near-zero x (eps dominates) {what} norm", w, "norm",
                                             (1e-20 * n((1, cols))).astype(np.float32), _norm_weight(rng, cols), 1e-5))
        extremes = np.resize(np.array([88, -88, 100, -100, 1e30, -1e30, 0, -0.0, 1e-30, 20, -20, 1], np.float32), cols)
        yield VariantCase(variant, FusedCase(f"extreme gates {what} swiglu +y0", w, "swiglu",
                                             gate_up_row(extremes[None, :], np.full((1, cols), 1.5), _quads(cols)),
                                             up_offset=_quads(cols), y0=n((1, rows)).astype(np.float32)))
        if encoding == "f16":
            for data in ("huge", "tiny", "alternating"):
                yield VariantCase(variant, FusedCase(f"{data} weights {what} plain", _weights(rng, rows, cols, option,
                                                                                            data),
                                                     "plain", (2 * n((2, cols))).astype(np.float32)))
            continue
        for which in ("max", "min", "mixed"):
            extreme = _extreme_codes(w, rng, which)
            exact = exact_int8_activations(rng, 1, cols, unit)
            yield VariantCase(variant, FusedCase(f"{which} codes {what} plain int8-exact x", extreme, "plain", exact))
            yield VariantCase(variant, FusedCase(f"{which} codes {what} swiglu +y0", extreme, "swiglu",
                                                 gate_up_row(3 * n((1, cols)), n((1, cols)), _quads(cols)),
                                                 up_offset=_quads(cols), y0=n((1, rows)).astype(np.float32)))


def _real_cases(ctx: GoldenContext, int8_unit: int | None = None):
    """The model's weights where a variant serves their encoding: each matrix on random and
    on int8-exact activations, and the FFN down projection on the real gate|up."""
    model = ctx.model
    if model is None:
        return
    rng, n = ctx.rng, ctx.rng.standard_normal
    tensors = model.artifact.manifest.tensors
    a = model.architecture
    for name in ("blk.0.ffn_up", "blk.0.attn_k", "token_embd", "blk.0.ffn_down"):
        if name not in tensors:
            continue
        w = Weights.from_model(model, name)
        variants = {"q4": "dot4", "q8": "dot4", "f16": "wide" if w.cols % 8 == 0 else None}.get(w.encoding)
        if variants is None:
            continue
        what = f"real {name} {w.rows}x{w.cols} {w.encoding}_{variants}"
        yield VariantCase(variants, FusedCase(f"{what} plain", w, "plain", n((1, w.cols)).astype(np.float32)))
        if variants == "dot4":
            exact = exact_int8_activations(rng, 1, w.cols, int8_unit or UNIT_ELEMENTS[w.encoding], (-8, 0))
            yield VariantCase(variants, FusedCase(f"{what} plain int8-exact x", w, "plain", exact))
        if name == "blk.0.ffn_up" and "blk.0.ffn_norm" in tensors:
            yield VariantCase(variants, FusedCase(f"{what} norm (blk.0.ffn_norm)", w, "norm",
                                                  (2 * n((1, a.hidden))).astype(np.float32),
                                                  model.dequantize("blk.0.ffn_norm").astype(np.float32), a.norm_eps))
        if name == "blk.0.ffn_down" and "blk.0.ffn_gate" in tensors and "blk.0.ffn_up" in tensors:
            unit = n((1, a.hidden))
            gate = unit @ model.dequantize("blk.0.ffn_gate").astype(np.float64).T
            up = unit @ model.dequantize("blk.0.ffn_up").astype(np.float64).T
            yield VariantCase(variants, FusedCase(f"{what} swiglu +y0", w, "swiglu",
                                                  gate_up_row(gate, up, _quads(w.cols)), up_offset=_quads(w.cols),
                                                  y0=n((1, w.rows)).astype(np.float32)))


@golden("matvec_variants", kernels=("matvec_",))
async def golden_matvec_variants(ctx: GoldenContext) -> list[GoldenResult]:
    """Full: every case on both reductions (subgroups where admitted) with the default launch
    shape, each dot4 case with RESIDUAL 0 and 1, and the random cases of the 65-row shapes
    (main options) also on other (WG, ROWS) (RESIDUAL=0: the launch shape does not touch the
    residual). Quick (browsers, admission): the reduction the engine takes, and RESIDUAL 0 and
    1 on alternate dot4 cases, so that each kernel file is compiled a few times, not dozens."""
    results = []
    available = {spec.name for spec in ctx.variants("matvec_")}
    default = [(None, 4)]
    every_shape = default + [(32, 16), (256, 1), (64, 2), (128, 8)]
    reductions = (("subgroups" in ctx.device.features,) if ctx.quick else (False, True))
    cases = [VariantCase(item.variant, case) for item in (*_random_cases(ctx), *_adversarial_cases(ctx),
                                                          *_real_cases(ctx))
             for case in both_accumulates(ctx, [item.case])]
    for index, item in enumerate(cases):
        case = item.case
        accumulate = case.y0 is not None
        shapes = every_shape if (not ctx.quick and case.name.startswith(("random 65x264", "random 65x257"))
                                 and item.case.weights.block in (None, 32)) else default
        # at admission both widths, of which the plan's pipelines keep theirs (GoldenContext.launches)
        residuals = (None,) if item.variant != "dot4" else (
            (index % 2,) if ctx.quick and ctx.planned is None else (0, 1))
        for residual in residuals:
            oracle_ = None
            for subgroups in reductions:
                name = kernel_name(case.weights.encoding, subgroups, case.input, item.variant)
                if name not in available:
                    continue
                for workgroup, rows_per_group in (shapes if not residual else default):
                    _, asked = choose_kernel(ctx.device, case.weights, workgroup, rows_per_group, case.input,
                                             accumulate, item.variant)
                    if residual is not None:
                        asked["RESIDUAL"] = residual
                    for overrides in ctx.launches(name, asked, LAUNCH):
                        oracle_ = oracle_ or fused_oracle(case.weights, case.x, case.input, case.norm_weight,
                                                          case.eps, case.up_offset, case.y0,
                                                          int8=0 if residual is None else 1 + residual)
                        y = await case.run(ctx, name, overrides)
                        results.append(compare_bound("matvec_variants", label(KERNELS[name], overrides), case.name,
                                                     y, *oracle_))
    return results
