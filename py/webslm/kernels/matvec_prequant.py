"""The decode mat-vec on activations quantized once, beforehand: two launches.

    quantize_x_<input>   x (or x * g with the row's 1/rms, or silu(gate) * up) -> xq, the
                         activations as int8 bytes per 32 with a power-of-two scale and the
                         unit's sum (shaders/quantize_x.wgsl: one workgroup per activation row)
    matvec_int8_<enc>_<variant>   y = W xq with dot4I8Packed, for the encodings of
                         matvec.PREQUANT_VARIANTS: q4 (matvec_q4_dot4.wgsl), q4k
                         (matvec_q4k_xq.wgsl), q6k (matvec_q6k_xq.wgsl), q8 (matvec_q8_xq.wgsl),
                         with matvec_input_int8.wgsl

Why: the packed-dot mat-vec (matvec "dot4" variant) quantizes x in every workgroup, and the
f32 one decodes every code to a float; either way the arithmetic, not the memory, sets the
time. On the H200 (bench/matvec_ceiling.py, docs/RESULTS.md) a q4 mat-vec reading bytes
prepared once ran within 6-20% of a kernel that only loads the weights, about twice as fast
as the f32 kernel at Llama-3.1-8B's shapes. llama.cpp's CUDA mat-vec (mmvq) works the same way.

The bytes come in two orders (shaders/int8_unit.wgsl): nibble order for the q4 family (q4,
q4k, and q6k, whose two high bits join the nibbles), whose code words split into even and odd
nibbles, natural order for q8, whose codes are bytes
already (quantize_x NATURAL). Either way a unit is 32 activations, so a q8 mat-vec here
walks units of 32 (its params block counts those: `x_units`), not q8's usual 16.

Two byte widths (Choice variants, `VARIANTS`), and for the norm mode a second way to its 1/rms:
    "xq2"  two bytes an activation (RESIDUAL=1): x ~ d (q + r / 64), the rounding left over as a
           second byte, 64 times less error; two packed dots a word instead of one. What the
           engine takes.
    "xq"   one byte (RESIDUAL=0), llama.cpp's mmvq numerics. Measured on real weights it is
           not good enough: SmolLM2-135M's activations have outliers (a unit whose largest
           |x| is 40 rounds its other 31 values in steps of 0.3), and `webslm conformance
           --matvec int8-1` found 4 of 32 greedy tokens changed at top-2 margins up to 0.25,
           logits off by up to 2.6 (exact: 0.014; two bytes: see docs/RESULTS.md). Kept for
           benchmarks and for that check, never chosen by the engine.
    "xq2s" "xq2" for a norm-mode form, its 1/rms from squares the units carry (`SQUARES`;
           quantize_x UNIT_SQUARES, the mat-vec's ROW_NORM) instead of the row's header: no
           quantize_x workgroup then reads the whole row, so the norm quantizer spreads over
           workgroups like the plain one (in the Llama-8B step on the H200 the two norm
           quantizers took 6.2 and 5.7 us against the plain one's 3.3), and each mat-vec
           workgroup adds the row's squares as it walks the units. The same bytes; the 1/rms
           sums the squares in another order. Tried by the tuning stage on norm forms.

Numerics: for q4 exactly those of the dot4 variant with the same RESIDUAL (the same
quantize_unit, the same scale rule, the norm's 1/rms applied to the row sums after); for every
encoding `matvec_oracle.fused_oracle(..., int8=1 + RESIDUAL, int8_unit=32)` bounds it: int8
activations, a stated error, not the exact f32 mat-vec. The engine takes it only where
admission's tuning stage measured it faster on the device and checked its output against the
exact kernel's (backends/gpu/tuning.py).

Both launches read the mat-vec's own params block (matvec.params): the quantizer needs cols,
units, x_stride and aux of the op's input mode. xq is the plan's `decode.int8_x` region
(`xq_bytes`: it holds the widest decode matmul's activations).
"""
from __future__ import annotations

from typing import NamedTuple

import numpy as np

from ..webgpu.interface import Device
from . import kquant, matvec, matvec_oracle, runner
from .golden import GoldenContext, GoldenResult, compare_bound, golden, weight_format
from .matvec import INPUT_BINDINGS, MatvecPlan, MatvecShapeError, Weights
from .registry import KernelSpec, capabilities, compile_kernel, register

VARIANTS = {"xq": 0, "xq2": 1, "xq2s": 1}    # matvec.Choice.variant of this path -> RESIDUAL (module docstring)
SQUARES = frozenset({"xq2s"})           # variants whose norm comes from the units' squares (norm forms only)
VARIANT = "xq2"                         # the one the engine's tuning tries
UNIT = 32                               # activations per quantized unit (one scale, one sum)
QUANTIZE_SIZES = (32, 64, 128, 256)     # quantize_x workgroup sizes (one lane per unit)
# The quantize_x workgroup size taken, by input mode: units per workgroup (one a lane), as many
# workgroups as a row needs. Measured in the Llama-8B step on the H200 (docs/RESULTS.md,
# "quantize_x over many workgroups"): the swiglu row of 448 units went from 7.6 us on one
# workgroup to 3.1 us on 7 of 64; a norm row wants one workgroup as wide as it (up to 256),
# since its header needs every square of the row and workgroup 0 would walk the others' units
# in turn (4.7 us on one workgroup of 128, 6.0 on two of 64, 11.8 on four of 32).
QUANTIZE_WG = 64
QUANTIZE_WG_NORM = 256


QUANTIZER_PREFIX = "quantize_x_"
QUANTIZING_PREFIX = "qout_"         # the mat-vecs that quantize their output too (matvec_quantize_out.py)
ROPE_PREFIX = "rkv_"             # a mat-vec with RoPE + KV append in it (matvec_rope_kv.py)
# The kernels made of a mat-vec with more work after it: a plan may run a mat-vec only so.
DERIVED_PREFIXES = (QUANTIZING_PREFIX, ROPE_PREFIX)
QUANTIZER_PARAMS = (1, 3, 5, 7)     # the params words quantize_x reads: cols, units, x_stride, aux


def quantize_name(input: str) -> str:
    return f"{QUANTIZER_PREFIX}{input}"


def _specs():
    for input in ("plain", "norm", "swiglu"):
        yield KernelSpec(
            name=quantize_name(input),
            sources=("matvec_params.wgsl", "quantize_x.wgsl", f"matvec_input_{input}.wgsl", "int8_unit.wgsl",
                     "int8_pack.wgsl", "int8_quads.wgsl", "int8_store.wgsl", "matvec_int8_x.wgsl") + (("silu.wgsl",) if input == "swiglu" else ()),
            entry_point="main",
            bindings=("uniform", "storage") + ("read-only-storage",) * len(INPUT_BINDINGS[input]),
            overrides={"WG": QUANTIZE_SIZES, "NATURAL": (0, 1), "RESIDUAL": (0, 1),
                       "UNIT_SQUARES": (0, 1) if input == "norm" else (0,)},
            requires=frozenset({matvec.DOT4_FEATURE}),
        )


register(*_specs())


def xq_bytes(units: int, m: int = 1, residual: bool = True) -> int:
    """Bytes of xq for m activation rows of `units` units: a 16-byte header and 3 vec4 a unit
    (5 with the residual bytes)."""
    return 16 * m * (1 + (5 if residual else 3) * units)


def x_units(weights: Weights) -> int:
    """Units of 32 activations per row (padding included): what both launches walk."""
    return matvec.units(weights) * matvec.UNIT_ELEMENTS[weights.encoding] // UNIT


def serves(device: Device, weights: Weights) -> bool:
    """Whether this path can run the weights on the device: an encoding of
    matvec.PREQUANT_VARIANTS, rows of whole units of 32, and packed dot products in its WGSL."""
    return (weights.encoding in matvec.PREQUANT_VARIANTS and matvec.DOT4_FEATURE in capabilities(device)
            and matvec.units(weights) * matvec.UNIT_ELEMENTS[weights.encoding] % UNIT == 0)


class PrequantPlan(NamedTuple):
    quantize: MatvecPlan             # the quantizer: inputs are the op's activation bindings, output xq
    matvec: MatvecPlan               # the mat-vec: input xq


def plan(device: Device, weights: Weights, m: int, x_stride: int, y_stride: int, input: str = "plain",
         accumulate: bool = False, eps: float | None = None, up_offset: int | None = None,
         norm_elements: int | None = None, workgroup: int | None = None,
         rows_per_group: int | None = None, residual: bool = True,
         quantize_workgroup: int | None = None, squares: bool = False) -> PrequantPlan:
    """Both launches, validated on the host (matvec.plan's checks for the op's input mode);
    `residual`: two bytes an activation ("xq2"), else one ("xq"); `quantize_workgroup`: units
    a quantize_x workgroup takes (one a lane; a row takes ceil(units / it) workgroups; default
    QUANTIZE_WG, for the norm mode QUANTIZE_WG_NORM); `squares`: the norm mode's 1/rms from the
    units' squares ("xq2s": no header, QUANTIZE_WG like the other modes)."""
    if squares and input != "norm":
        raise MatvecShapeError("variant", f"squares in the units serve a norm input only, not {input!r}")
    if not serves(device, weights):
        raise MatvecShapeError("variant", f"pre-quantized activations need weights of "
                                          f"{sorted(matvec.PREQUANT_VARIANTS)} in whole units of {UNIT} and "
                                          f"{matvec.DOT4_FEATURE} (got {weights.encoding})")
    variant = matvec.PREQUANT_VARIANTS[weights.encoding]
    base = matvec.plan(device, weights, m, x_stride, y_stride, input, accumulate, eps, up_offset, norm_elements,
                       workgroup, rows_per_group, variant=variant if variant in matvec.VARIANTS[weights.encoding]
                       else "")
    overrides = ({k: v for k, v in base.overrides.items() if k != "RESIDUAL"}
                 | {"RESIDUAL": int(residual), "ROW_NORM": int(squares)})
    name = matvec.kernel_name(weights.encoding, "subgroups" in device.features, "int8", variant)
    units = x_units(weights)
    params = base.params.copy()
    params[3] = units                    # Params.units: units of 32 for both launches (q8: half its 16s)
    # The default is no wider than the row's units; a size asked for is taken as it is (lanes
    # past the units idle), so a self-test on a short row runs the step's own pipeline.
    size = runner.largest_workgroup(device.limits, QUANTIZE_SIZES, quantize_workgroup or min(
        QUANTIZE_WG_NORM if input == "norm" and not squares else QUANTIZE_WG,
        max(32, 1 << (units - 1).bit_length())))
    if size is None:
        raise MatvecShapeError("workgroup", "no quantize_x workgroup size fits the device's limits")
    groups = -(-units // size)
    if groups > device.limits.get("maxComputeWorkgroupsPerDimension", 65535):
        raise MatvecShapeError("grid", f"{units} units need {groups} quantize_x workgroups, over the device's limit")
    quantize = MatvecPlan(quantize_name(input), {"WG": size, "NATURAL": int(weights.encoding == "q8"),
                                                 "RESIDUAL": int(residual), "UNIT_SQUARES": int(squares)}, params,
                          (groups, 1, m), INPUT_BINDINGS[input])
    return PrequantPlan(quantize, MatvecPlan(name, overrides, params, base.grid, INPUT_BINDINGS["int8"]))


def _inputs(weights: Weights, x: np.ndarray, input: str, norm_weight, up_offset):
    """x as the input mode binds it: [(arrays...), x_stride, up_offset]."""
    x = np.atleast_2d(np.asarray(x, np.float32))
    if input == "swiglu":
        up_offset = x.shape[1] // 2 if up_offset is None else up_offset
        xs, stride = x, x.shape[1]
    else:
        xs, stride = matvec.padded_activations(x)
    inputs = [xs] + ([matvec.padded_norm_weight(norm_weight, weights.cols)] if input == "norm" else [])
    return inputs, stride, up_offset


def _launches(ctx: GoldenContext, case, residual: int, shapes: list, squares: bool = False) -> list[tuple]:
    """(mat-vec WG, ROWS, quantize_x WG) to run a case with: `shapes` outside admission; at
    admission each pairing of the plan's own mat-vec and quantizer pipelines for the case's
    format, input mode and width (GoldenContext.launches), none if the plan has none."""
    if ctx.planned is None:
        return shapes
    inputs, stride, up_offset = _inputs(case.weights, case.x, case.input, case.norm_weight, case.up_offset)
    m = np.atleast_2d(case.x).shape[0]
    p = plan(ctx.device, case.weights, m, stride, case.weights.rows, case.input, case.y0 is not None, case.eps,
             up_offset, matvec._quads(case.weights.cols) if case.input == "norm" else None, residual=bool(residual),
             squares=squares)
    matvecs = ctx.launches(p.matvec.kernel, p.matvec.overrides, ("WG", "ROWS"))
    quantizers = ctx.launches(p.quantize.kernel, p.quantize.overrides)
    if quantizers and not matvecs:
        # A quantizer whose mat-vec the plan runs only in a derived form (quantizing its output,
        # matvec_quantize_out.py; with RoPE, matvec_rope_kv.py): with the plain mat-vec of the
        # case's weight format, where the plan has a derived mat-vec of that format.
        qout = {weight_format(name, dict(items)) for name, items in ctx.planned
                if name.startswith(DERIVED_PREFIXES)}
        matvecs = [p.matvec.overrides] if weight_format(p.matvec.kernel, p.matvec.overrides) in qout else []
    elif matvecs and not quantizers:
        # A mat-vec whose input only a quantizing mat-vec writes in the plan: with the
        # quantizer as the plan would make it, which writes the same bytes
        # (matvec_quantize_out.py's golden family checks that).
        quantizers = [p.quantize.overrides]
    return [(mv["WG"], mv["ROWS"], q["WG"]) for mv in matvecs for q in quantizers]


async def run(ctx: GoldenContext, weights: Weights, x: np.ndarray, *, input: str = "plain",
              norm_weight: np.ndarray | None = None, eps: float | None = None, up_offset: int | None = None,
              y0: np.ndarray | None = None, workgroup: int | None = None,
              rows_per_group: int | None = None, residual: bool = True,
              quantize_workgroup: int | None = None, quantized_only: bool = False,
              squares: bool = False) -> np.ndarray:
    """y [M, rows] once on fresh buffers (tests): the two launches, xq read back in between;
    `quantized_only`: xq itself, [M][words] u32 (the layout of matvec_input_int8.wgsl)."""
    device = ctx.device
    m = np.atleast_2d(x).shape[0]
    inputs, stride, up_offset = _inputs(weights, x, input, norm_weight, up_offset)
    p = plan(device, weights, m, stride, weights.rows, input, y0 is not None, eps, up_offset,
             matvec._quads(weights.cols) if input == "norm" else None, workgroup, rows_per_group, residual,
             quantize_workgroup, squares)
    quantizer = await ctx.kernel(p.quantize.kernel, **p.quantize.overrides)
    (xq,) = await runner.run_once(device, quantizer, p.quantize.params, inputs,
                                  [(xq_bytes(x_units(weights), m, residual) // 4, np.uint32)], p.quantize.grid)
    if quantized_only:
        return xq.reshape(m, -1)
    output = (m * weights.rows, np.float32) if y0 is None else np.asarray(y0, np.float32).reshape(-1).copy()
    kernel = await ctx.kernel(p.matvec.kernel, **p.matvec.overrides)
    (y,) = await runner.run_once(device, kernel, p.matvec.params, [*weights.bindings(), xq], [output],
                                 p.matvec.grid)
    return y.reshape(m, weights.rows)


# -- benchmark hook (bench/kernels.py --families matvec_prequant) ----------------------------

# The mat-vec launch alone on bytes quantized beforehand (its quantizer runs once, untimed:
# one per op in the engine, ~3 us on the H200, which the engine's tuning times with it).
BENCH_SHAPES = {name: shape for name, shape in matvec.BENCH_SHAPES.items() if shape.get("big")}
# An encoding, with the launch shape: WG and ROWS as admission's tuning finds them on the H200;
# BYTES=1 the one-byte activations ("xq"), else two ("xq2").
BENCH_NAMES = ("q4/WG=32/ROWS=4", "q4/WG=32/ROWS=8", "q4/WG=64/ROWS=8", "q4/WG=32/ROWS=16",
               "q8/WG=32/ROWS=4", "q8/WG=32/ROWS=8", "q8/WG=32/ROWS=16",
               "q4k/WG=32/ROWS=4", "q4k/WG=32/ROWS=8", "q6k/WG=32/ROWS=4", "q6k/WG=32/ROWS=8",
               "q4/WG=32/ROWS=8/BYTES=1", "q8/WG=32/ROWS=8/BYTES=1", "q4k/WG=32/ROWS=8/BYTES=1",
               "q6k/WG=32/ROWS=8/BYTES=1")


async def prepare_bench(device: Device, name: str, shape: dict, rng) -> runner.Prepared:
    """One mat-vec on its own buffers, its xq made by the quantizer on random x (bench/kernels.py)."""
    encoding, *settings = name.split("/")
    pairs = {k: int(v) for k, v in (item.split("=") for item in settings)}
    weights = matvec.random_weights_fast(rng, encoding, shape["rows"], shape["cols"])
    x, stride = matvec.padded_activations(rng.standard_normal((1, weights.cols)).astype(np.float32), 0.0)
    residual = pairs.get("BYTES", 2) == 2
    p = plan(device, weights, 1, stride, weights.rows, workgroup=pairs.get("WG"), rows_per_group=pairs.get("ROWS"),
             residual=residual)
    quantizer = await compile_kernel(device, p.quantize.kernel, **p.quantize.overrides)
    (xq,) = await runner.run_once(device, quantizer, p.quantize.params, [x],
                                  [(xq_bytes(x_units(weights), 1, residual) // 4, np.uint32)], p.quantize.grid)
    kernel = await compile_kernel(device, p.matvec.kernel, **p.matvec.overrides)
    prepared = runner.prepare(device, kernel, p.matvec.params, [*weights.bindings(), xq],
                              [(weights.rows, np.float32)], p.matvec.grid)
    prepared.bytes_moved = weights.nbytes + xq.nbytes + weights.rows * 4
    prepared.flops = 2 * weights.rows * weights.cols
    return prepared


SUPER_BLOCK_ENCODINGS = ("q4k", "q6k")   # the PREQUANT_VARIANTS encodings with cases here (kquant.py)


def _super_block_cases(ctx: GoldenContext):
    """FusedCase values of q4k and q6k (matvec_q4k_xq.wgsl, matvec_q6k_xq.wgsl): random shapes
    (whole super-blocks) in every input mode, on int8-exact and on random activations;
    adversarial activations; extreme codes and scales (f16 +-65504, subnormals, zeros;
    sub-scales and sub-mins at their ends, q6k's of either sign); the model's own matrices of
    these encodings where it has them."""
    from .matvec_cases import FusedCase, _norm_weight
    from .matvec_variants import adversarial_activations, exact_int8_activations
    rng, n = ctx.rng, ctx.rng.standard_normal
    for rows, cols in [(9, 256)] if ctx.quick else [(7, 256), (65, 512), (300, 1024), (4, 4096)]:
        for encoding in SUPER_BLOCK_ENCODINGS:
            w = kquant.random_weights(rng, encoding, rows, cols)
            what = f"random {rows}x{cols} {encoding}"
            m = 2 if rows == 7 else 1
            exact = exact_int8_activations(rng, m, cols, UNIT)
            yield FusedCase(f"{what} plain int8-exact x", w, "plain", exact)
            yield FusedCase(f"{what} norm int8-exact x, g = 1", w, "norm", exact, np.ones(cols, np.float32), 1e-5)
            yield FusedCase(f"{what} plain +y0", w, "plain", (2 * n((m, cols))).astype(np.float32),
                            y0=n((m, rows)).astype(np.float32))
            yield FusedCase(f"{what} norm", w, "norm", (2 * n((m, cols))).astype(np.float32),
                            _norm_weight(rng, cols), 1e-5)
            yield FusedCase(f"{what} swiglu +y0", w, "swiglu",
                            matvec.gate_up_row(3 * n((m, cols)), n((m, cols)), cols),
                            up_offset=cols, y0=n((m, rows)).astype(np.float32))
    if ctx.quick:
        return
    rows, cols = 40, 512
    for encoding in SUPER_BLOCK_ENCODINGS:
        w = kquant.random_weights(rng, encoding, rows, cols)
        for name, x in adversarial_activations(rng, cols, UNIT):
            yield FusedCase(f"{name} {rows}x{cols} {encoding} plain", w, "plain", x)
        for codes, scales in (("max", "normal"), ("min", "normal"), ("mixed", "extreme"), ("random", "extreme")):
            extreme = kquant.random_weights(rng, encoding, rows, cols, codes=codes, scales=scales)
            what = f"{codes} codes {scales} scales {rows}x{cols} {encoding}"
            yield FusedCase(f"{what} plain int8-exact x", extreme, "plain",
                            exact_int8_activations(rng, 1, cols, UNIT))
            yield FusedCase(f"{what} swiglu +y0", extreme, "swiglu",
                            matvec.gate_up_row(3 * n((1, cols)), n((1, cols)), cols),
                            up_offset=cols, y0=n((1, rows)).astype(np.float32))
    if ctx.model is not None:
        for name, tensor in ctx.model.artifact.manifest.tensors.items():
            if tensor.encoding in SUPER_BLOCK_ENCODINGS and name.startswith("blk.0."):
                w = Weights.from_model(ctx.model, name)
                yield FusedCase(f"real {name} {w.rows}x{w.cols} {w.encoding} plain", w, "plain",
                                n((1, w.cols)).astype(np.float32))


def _cases(ctx: GoldenContext):
    """Every FusedCase of the encodings this path serves: the dot4 variant's q4 and q8 cases
    (random shapes with odd tails, int8-exact and adversarial activations, extreme codes, real
    weights; exact activations in units of 32 as this path quantizes them), q4k's and q6k's."""
    from .matvec_cases import both_accumulates
    from .matvec_variants import _adversarial_cases, _random_cases, _real_cases
    for item in (*_random_cases(ctx, UNIT), *_adversarial_cases(ctx, UNIT), *_real_cases(ctx, UNIT)):
        if item.variant == "dot4" and item.case.weights.encoding in matvec.PREQUANT_VARIANTS:
            yield from both_accumulates(ctx, [item.case])
    yield from both_accumulates(ctx, _super_block_cases(ctx))


@golden("matvec_prequant", kernels=("quantize_x_", "matvec_int8_"))
async def golden_matvec_prequant(ctx: GoldenContext) -> list[GoldenResult]:
    """Each case through the two launches, against `matvec_oracle.fused_oracle(int8=1 + RESIDUAL,
    int8_unit=32)`: for q4 the bound of the one-launch dot4 variant with the same RESIDUAL,
    whose numerics this path has. Full runs take every case with one and with two bytes an
    activation and also try other launch shapes of the mat-vec on the random cases; quick runs
    alternate the two widths. Norm cases also run "xq2s" (two bytes, 1/rms from the units'
    squares) wherever they run two bytes."""
    results = []
    if not ctx.variants("quantize_x_"):
        return results
    subgroups = "subgroups" in ctx.device.features
    # (mat-vec WG, ROWS, quantize_x WG): a quantize_x workgroup of 32 spreads every row of
    # more than 32 units over several workgroups (in quick runs on every other case)
    shapes = ([(None, None, None)] if ctx.quick else
              [(None, None, None), (32, 16, 32), (256, 1, 256), (64, 8, 32)])
    for index, case in enumerate(_cases(ctx)):
        encoding = case.weights.encoding
        name = matvec.kernel_name(encoding, subgroups, "int8", matvec.PREQUANT_VARIANTS[encoding])
        if not (ctx.uses(quantize_name(case.input)) and any(ctx.uses(p + name) for p in ("",) + DERIVED_PREFIXES)):
            continue
        # at admission both widths, of which `_launches` keeps those the plan compiled; a norm
        # case also with its 1/rms from the units' squares ("xq2s", two bytes)
        widths = (0, 1) if ctx.planned is not None else (index % 2,) if ctx.quick else (1, 0)
        forms = [(residual, False) for residual in widths] + (
            [(1, True)] if case.input == "norm" and (1 in widths or ctx.planned is not None) else [])
        for residual, squares in forms:
            launches = _launches(ctx, case, residual, shapes if case.name.startswith("random") and residual
                                 else shapes[:1], squares)
            if launches:                      # (at admission most cases run on no planned pipeline)
                exact, bound, rule = matvec_oracle.fused_oracle(case.weights, case.x, case.input, case.norm_weight,
                                                         case.eps, case.up_offset, case.y0, int8=1 + residual,
                                                         int8_unit=UNIT)
            for workgroup, rows, quantize in launches:
                quantize = 32 if ctx.quick and index % 2 and ctx.planned is None else quantize
                y = await run(ctx, case.weights, case.x, input=case.input, norm_weight=case.norm_weight,
                              eps=case.eps, up_offset=case.up_offset, y0=case.y0, workgroup=workgroup,
                              rows_per_group=rows, residual=bool(residual), quantize_workgroup=quantize,
                              squares=squares)
                shape = {"WG": workgroup or "rule", "ROWS": rows or "rule", "BYTES": 1 + residual, "QWG": quantize,
                         **({"SQUARES": 1} if squares else {})}
                results.append(compare_bound("matvec_prequant", f"{quantize_name(case.input)}+{name} {shape}",
                                             case.name, y, exact, bound, rule))
    return results
