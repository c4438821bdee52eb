"""Golden tests of the decode mat-vec (matvec.py): family "matvec" (the plain input on every
encoding, both reductions and, full size, several workgroup shapes) and family
"matvec_fused" (the "norm" and "swiglu" inputs and ACCUMULATE), each case compared with
matvec_oracle.oracle / fused_oracle under the rules docs/kernels.md states.

The cases: random shapes with odd tails on every encoding option; adversarial weights
(constant, alternating signs, huge, tiny) and activations (near-zero and huge norms, a spike
in the tail, extreme gates, a y0 that cancels W x); every code at its maximum, minimum or a
mix; q5 and the super-blocks (`PACKED_FORMS`: extreme codes and scales too); the model's
real weights when given. matvec_variants.py runs the same kinds through the variants.
"""
from __future__ import annotations

import dataclasses
from typing import NamedTuple

import numpy as np

from . import kquant
from .golden import GoldenContext, GoldenResult, compare_bound, golden, label
from .matvec import _quads, choose_kernel, gate_up_row, kernel_name, matvec
from .matvec_oracle import fused_oracle, oracle
from .registry import KERNELS
from .weights import Weights


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


# Encoding options of the plain (not packed) encodings: (encoding, block, zero, scale type).
OPTIONS = [("q4", 32, "min", "f16"), ("q4", 64, "offset", "f32"), ("q8", 32, None, "f16"), ("q8", 256, None, "f32"),
           ("f16", None, None, None), ("f32", None, None, None)]


def _formats(ctx: GoldenContext, options: list, packed: bool = False) -> list:
    """The formats a case list takes: `options` outside admission; at admission those of the
    plan's mat-vec pipelines (GoldenContext.planned_formats), plain or packed, whatever the
    family's own list holds: each pipeline the step runs meets every kind of case."""
    planned = ctx.planned_formats("matvec_")
    if planned is None:
        return options
    return [f for f in planned if (f[0] in kquant.ENCODINGS) == packed]


def _cases(ctx: GoldenContext):
    """(label, weights, x) triples: random shapes, every encoding option, adversarial data."""
    rng = ctx.rng
    shapes = [(1, 1), (7, 33), (33, 100), (64, 256)] if ctx.quick else \
        [(1, 1), (7, 33), (65, 257), (300, 1000), (129, 4099), (4, 8192)]
    for rows, cols in shapes:
        for encoding, block, zero, scale_type in _formats(ctx, OPTIONS):
            w = _random_weights(rng, rows, cols, "normal")
            x = rng.standard_normal((1 if rows > 1 else 3, cols)).astype(np.float32)
            yield (f"random {rows}x{cols} {encoding}/{block}/{zero}/{scale_type}",
                   Weights.quantized(w, encoding, block or 32, zero or "min", scale_type or "f16"), x)
    rows, cols = (9, 97) if ctx.quick else (40, 517)
    adversarial = [("q4", None, "min", "f16"), ("q4", None, "offset", "f16"), ("q8", None, None, "f32"),
                   ("f16", None, None, None)]
    for data in ("constant", "alternating", "huge", "tiny"):
        for encoding, block, zero, scale_type in _formats(ctx, adversarial):
            w = _random_weights(rng, rows, cols, data)
            x = rng.standard_normal((2, cols)).astype(np.float32)
            if data == "alternating":
                x = np.abs(x)
            block = block or (128 if data == "tiny" else 32)
            yield (f"{data} {rows}x{cols} {encoding}/{block}/{zero}/{scale_type}",
                   Weights.quantized(w, encoding, block, zero or "min", scale_type or "f16"), x)
    extreme = [("q4", 32, "min", "f16"), ("q4", 32, "offset", "f16"), ("q8", 32, None, "f16")]
    for which in ("max", "min", "mixed"):
        for encoding, block, zero, scale_type in (f for f in _formats(ctx, extreme) if f[0] in ("q4", "q8")):
            w = _extreme_codes(Weights.quantized(_random_weights(rng, rows, cols, "normal"), encoding, block,
                                                 zero or "min", scale_type), rng, which)
            yield f"{which} codes {rows}x{cols} {encoding}/{zero}", w, rng.standard_normal((1, cols)).astype(np.float32)
    yield from _packed_cases(ctx)
    if ctx.model is not None:
        for name in ("blk.0.ffn_up", "blk.0.attn_k", "token_embd"):
            if name in ctx.model.artifact.manifest.tensors:
                w = Weights.from_model(ctx.model, name)
                yield f"real {name} {w.rows}x{w.cols} {w.encoding}", w, rng.standard_normal((1, w.cols)).astype(np.float32)


# q5 and the super-block encodings (kquant.py): (encoding, block, zero, scale type) of every form.
PACKED_FORMS = [("q5", 32, "offset", "f16"), ("q5", 64, "min", "f32"), ("q5", 256, "min", "f16"),
                ("q4k", 256, "scaled-min", "f16"), ("q5k", 256, "scaled-min", "f16"), ("q6k", 256, "offset", "f16")]


def _packed(rng, form, rows: int, cols: int, **kwargs) -> Weights:
    encoding, block, zero, scale_type = form
    return kquant.random_weights(rng, encoding, rows, cols, block, zero, scale_type, **kwargs)


def _packed_cases(ctx: GoldenContext):
    """(label, weights, x) of q5 and the super-blocks: random shapes (rows hold whole blocks),
    extreme codes and scales (f16 +-65504, subnormals, zeros) with sub-scales at their ends."""
    rng = ctx.rng
    shapes = [(9, 256)] if ctx.quick else [(1, 256), (7, 512), (65, 768), (300, 1024), (4, 4096)]
    forms = _formats(ctx, PACKED_FORMS, packed=True)
    for rows, cols in shapes:
        for form in forms:
            m = 3 if rows == 1 else 1
            yield (f"random {rows}x{cols} {'/'.join(map(str, form))}", _packed(rng, form, rows, cols),
                   rng.standard_normal((m, cols)).astype(np.float32))
    rows, cols = (5, 256) if ctx.quick else (40, 512)
    for codes, scales in ([("mixed", "extreme")] if ctx.quick else
                          [("max", "normal"), ("min", "normal"), ("mixed", "extreme"), ("random", "extreme")]):
        for form in forms:
            yield (f"{codes} codes {scales} scales {rows}x{cols} {'/'.join(map(str, form))}",
                   _packed(rng, form, rows, cols, codes=codes, scales=scales),
                   rng.standard_normal((2, cols)).astype(np.float32))


def _packed_fused_cases(ctx: GoldenContext):
    """FusedCase values of q5 and the super-blocks: each input mode, with and without y0."""
    rng = ctx.rng
    n = rng.standard_normal
    for rows, cols in [(9, 256)] if ctx.quick else [(7, 256), (65, 512)]:
        m = 2 if rows == 7 else 1
        # quick (browser rows, admission): every encoding and zero in every mode, one q5 "min"
        for form in _formats(ctx, PACKED_FORMS[:2] + PACKED_FORMS[3:] if ctx.quick else PACKED_FORMS, packed=True):
            w = _packed(rng, form, rows, cols, scales="extreme" if rows == 7 else "normal")
            what = f"random {rows}x{cols} {'/'.join(map(str, form))}"
            up_offset = cols + 4
            x = (2 * n((m, cols))).astype(np.float32)
            y0 = n((m, rows)).astype(np.float32)
            yield FusedCase(f"{what} norm", w, "norm", x, _norm_weight(rng, cols), 1e-5)
            yield FusedCase(f"{what} swiglu F'={up_offset} +y0", w, "swiglu",
                            gate_up_row(3 * n((m, cols)), n((m, cols)), up_offset), up_offset=up_offset, y0=y0)
            yield FusedCase(f"{what} plain +y0", w, "plain", x, y0=y0)
            if rows == 7:
                yield FusedCase(f"{what} norm +y0", w, "norm", x, _norm_weight(rng, cols), 1e-6, y0=y0)
                yield FusedCase(f"{what} swiglu F'={up_offset}", w, "swiglu",
                                gate_up_row(3 * n((m, cols)), n((m, cols)), up_offset), up_offset=up_offset)


# The overrides that cut a mat-vec into workgroups (a tuning choice), not what it computes: at
# admission a case runs on the plan's pipeline of its format, whatever shape was chosen.
LAUNCH = ("WG", "ROWS")


@golden("matvec", kernels=("matvec_",))
async def golden_matvec(ctx: GoldenContext) -> list[GoldenResult]:
    """Every case on the device's default choice (subgroup sums where admitted) and on the
    workgroup-memory reduction; the random cases also on every workgroup shape (full)."""
    results = []
    variants = {spec.name for spec in ctx.variants("matvec_")}
    default = [(None, 4)]
    every_shape = default if ctx.quick else default + [(32, 8), (64, 1), (256, 2), (64, 16)]
    for case, weights, x in _cases(ctx):
        exact, bound, rule = oracle(weights, x)
        for subgroups in (False, True):
            name = kernel_name(weights.encoding, subgroups)
            if name not in variants:
                continue
            for workgroup, rows_per_group in (every_shape if case.startswith("random") else default):
                _, asked = choose_kernel(ctx.device, weights, workgroup, rows_per_group)
                for overrides in ctx.launches(name, asked, LAUNCH):
                    y = await matvec(ctx, weights, x, name, overrides)
                    results.append(compare_bound("matvec", label(KERNELS[name], overrides), case, y, exact, bound,
                                                 rule))
                # At admission a plain mat-vec the step runs with ACCUMULATE (the residual add
                # of an output projection) takes these cases too, onto a random y0.
                for overrides in ([] if ctx.planned is None else ctx.launches(name, {**asked, "ACCUMULATE": 1}, LAUNCH)):
                    y0 = ctx.rng.standard_normal((x.shape[0], weights.rows)).astype(np.float32)
                    y = await matvec(ctx, weights, x, name, overrides, y0=y0)
                    results.append(compare_bound("matvec", label(KERNELS[name], overrides), f"{case} +y0", y,
                                                 *fused_oracle(weights, x, y0=y0)))
    return results


# -- golden tests of the fused inputs and ACCUMULATE ----------------------------------------

class FusedCase(NamedTuple):
    name: str
    weights: Weights
    input: str                          # "plain", "norm", "swiglu"
    x: np.ndarray                       # [M, cols] (plain, norm) or h [M, x_stride] (swiglu)
    norm_weight: np.ndarray | None = None
    eps: float | None = None
    up_offset: int | None = None
    y0: np.ndarray | None = None        # ACCUMULATE when given

    def oracle(self) -> tuple[np.ndarray, np.ndarray, str]:
        return fused_oracle(self.weights, self.x, self.input, self.norm_weight, self.eps, self.up_offset, self.y0)

    async def run(self, ctx: GoldenContext, name: str, overrides: dict[str, int]) -> np.ndarray:
        return await matvec(ctx, self.weights, self.x, name, overrides, input=self.input,
                            norm_weight=self.norm_weight, eps=self.eps, up_offset=self.up_offset, y0=self.y0)




def _norm_weight(rng, cols: int) -> np.ndarray:
    return (1 + 0.1 * rng.standard_normal(cols)).astype(np.float32)


def _fused_cases(ctx: GoldenContext):
    """FusedCase values: random shapes on every encoding option for each input mode (norm;
    swiglu and plain with ACCUMULATE; on one shape also norm with and swiglu without it),
    adversarial activations, extreme codes, and the model's real weights when given."""
    rng = ctx.rng
    n = rng.standard_normal
    shapes = [(33, 100)] if ctx.quick else [(1, 1), (7, 33), (65, 257), (300, 1000), (129, 4099)]
    for rows, cols in shapes:
        m = 2 if (rows, cols) == (7, 33) else 1
        for encoding, block, zero, scale_type in _formats(ctx, OPTIONS):
            w = Weights.quantized(_random_weights(rng, rows, cols, "normal"), encoding, block or 32, zero or "min",
                                  scale_type or "f16")
            what = f"random {rows}x{cols} {encoding}/{block}/{zero}/{scale_type}"
            up_offset = _quads(cols) + (4 if cols % 4 == 0 else 0)
            h = gate_up_row(3 * n((m, cols)), n((m, cols)), up_offset)
            x = (2 * n((m, cols))).astype(np.float32)
            y0 = n((m, rows)).astype(np.float32)
            yield FusedCase(f"{what} norm", w, "norm", x, _norm_weight(rng, cols), 1e-5)
            yield FusedCase(f"{what} swiglu F'={up_offset} +y0", w, "swiglu", h, up_offset=up_offset, y0=y0)
            yield FusedCase(f"{what} plain +y0", w, "plain", x, y0=y0)
            if (rows, cols) in ((7, 33), (33, 100)) and not ctx.quick:
                yield FusedCase(f"{what} norm +y0", w, "norm", x, _norm_weight(rng, cols), 1e-6, y0=y0)
                yield FusedCase(f"{what} swiglu F'={up_offset}", w, "swiglu", h, up_offset=up_offset)
    rows, cols = (9, 97) if ctx.quick else (40, 517)
    adversarial_options = _formats(ctx, [("q4", 32, "min", "f16")] if ctx.quick else [
        ("q4", 32, "min", "f16"), ("q4", 32, "offset", "f16"), ("q8", 32, None, "f32"), ("f16", None, None, None)])
    spike = 1e-3 * n((1, cols))
    spike[0, -1] = 1e3                       # the only large value sits in the single-element tail
    extremes = np.array([88, -88, 100, -100, 1e30, -1e30, 87.5, -87.5, 0, -0.0, 1e-30, -1e-30,
                         20, -20, 1, -1], np.float32)
    gates = np.resize(extremes, cols)[None, :]
    norm_inputs = [("near-zero x (eps dominates)", 1e-20 * n((1, cols)), _norm_weight(rng, cols)),
                   ("spike in the tail", spike, _norm_weight(rng, cols)),
                   ("mixed-sign norm weights 1e3 1e-3", n((1, cols)),
                    np.where(np.arange(cols) % 2 == 0, 1e3, -1e-3).astype(np.float32) * _norm_weight(rng, cols))]
    if not ctx.quick:
        norm_inputs += [("huge x 1e15", 1e15 * n((1, cols)), _norm_weight(rng, cols)),
                        ("constant x", np.full((1, cols), -0.75), _norm_weight(rng, cols))]
    up_offset = _quads(cols)
    swiglu_inputs = [("extreme gates +-88 +-100 +-1e30", gate_up_row(gates, np.full_like(gates, 1.5), up_offset))]
    if not ctx.quick:
        swiglu_inputs += [("gate ramp -120..120", gate_up_row(np.linspace(-120, 120, cols)[None, :], n((1, cols)),
                                                              up_offset)),
                          ("tiny 1e-30 gates", gate_up_row(1e-30 * n((1, cols)), 1e-5 * n((1, cols)), up_offset))]
    for encoding, block, zero, scale_type in adversarial_options:
        w = Weights.quantized(_random_weights(rng, rows, cols, "normal"), encoding, block or 32, zero or "min",
                              scale_type or "f16")
        what = f"{rows}x{cols} {encoding}/{zero}/{scale_type}"
        for label_, x, g in norm_inputs:
            yield FusedCase(f"{label_} {what} norm", w, "norm", np.asarray(x, np.float32), g, 1e-5)
        for label_, h in swiglu_inputs:
            yield FusedCase(f"{label_} {what} swiglu +y0", w, "swiglu", h, up_offset=up_offset,
                            y0=n((1, rows)).astype(np.float32))
        x = n((1, cols)).astype(np.float32)
        wx = fused_oracle(w, x)[0].astype(np.float32)
        yield FusedCase(f"y0 cancels W x {what} plain +y0", w, "plain", x, y0=-wx)
        if not ctx.quick:
            yield FusedCase(f"huge y0 1e30 {what} plain +y0", w, "plain", x, y0=(1e30 * n((1, rows))).astype(np.float32))
    if not ctx.quick:
        for which in ("max", "min", "mixed"):
            for encoding, zero in [("q4", "min"), ("q4", "offset"), ("q8", None)]:
                w = _extreme_codes(Weights.quantized(_random_weights(rng, rows, cols, "normal"), encoding, 32,
                                                     zero or "min"), rng, which)
                what = f"{which} codes {rows}x{cols} {encoding}/{zero}"
                yield FusedCase(f"{what} norm", w, "norm", n((1, cols)).astype(np.float32), _norm_weight(rng, cols), 1e-5)
                yield FusedCase(f"{what} swiglu +y0", w, "swiglu",
                                gate_up_row(3 * n((1, cols)), n((1, cols)), _quads(cols)), up_offset=_quads(cols),
                                y0=n((1, rows)).astype(np.float32))
    yield from _packed_fused_cases(ctx)
    model = ctx.model
    if model is not None:
        tensors = model.artifact.manifest.tensors
        a = model.architecture
        x = (2 * n((1, a.hidden))).astype(np.float32)
        for matrix, norm_name in (("blk.0.attn_q", "blk.0.attn_norm"), ("blk.0.ffn_up", "blk.0.ffn_norm")):
            if matrix in tensors and norm_name in tensors:
                w = Weights.from_model(model, matrix)
                yield FusedCase(f"real {matrix} {w.rows}x{w.cols} {w.encoding} norm ({norm_name})", w, "norm", x,
                                model.dequantize(norm_name).astype(np.float32), a.norm_eps)
        if "blk.0.attn_output" in tensors:
            w = Weights.from_model(model, "blk.0.attn_output")
            yield FusedCase(f"real blk.0.attn_output {w.rows}x{w.cols} {w.encoding} plain +y0", w, "plain",
                            n((1, w.cols)).astype(np.float32), y0=x)
        if all(f"blk.0.{t}" in tensors for t in ("ffn_down", "ffn_gate", "ffn_up")):
            w = Weights.from_model(model, "blk.0.ffn_down")
            unit = n((1, a.hidden))
            gate = unit @ model.dequantize("blk.0.ffn_gate").astype(np.float64).T
            up = unit @ model.dequantize("blk.0.ffn_up").astype(np.float64).T
            up_offset = _quads(w.cols)
            yield FusedCase(f"real blk.0.ffn_down {w.rows}x{w.cols} {w.encoding} swiglu F'={up_offset} +y0", w,
                            "swiglu", gate_up_row(gate, up, up_offset), up_offset=up_offset, y0=x)


@golden("matvec_fused", kernels=("matvec_",))
async def golden_matvec_fused(ctx: GoldenContext) -> list[GoldenResult]:
    """The input modes "norm" and "swiglu" and ACCUMULATE on every case, with the device's
    workgroup choice on both reductions (subgroups where admitted); the random cases of two
    encodings also on other workgroup shapes (full)."""
    results = []
    variants = {spec.name for spec in ctx.variants("matvec_")}
    default = [(None, 4)]
    every_shape = default + [(32, 8), (64, 1), (32, 16)]
    for case in both_accumulates(ctx, _fused_cases(ctx)):
        accumulate = case.y0 is not None
        shapes = every_shape if (not ctx.quick and case.name.startswith("random 65x257")
                                 and case.weights.encoding in ("q4", "f32")) else default
        oracle_ = None
        for subgroups in (False, True):
            name = kernel_name(case.weights.encoding, subgroups, case.input)
            if name not in variants:
                continue
            for workgroup, rows_per_group in shapes:
                _, asked = choose_kernel(ctx.device, case.weights, workgroup, rows_per_group, case.input, accumulate)
                for overrides in ctx.launches(name, asked, LAUNCH):
                    oracle_ = oracle_ or case.oracle()           # only for a case that runs
                    y = await case.run(ctx, name, overrides)
                    results.append(compare_bound("matvec_fused", label(KERNELS[name], overrides), case.name, y,
                                                 *oracle_))
    return results


def both_accumulates(ctx: GoldenContext, cases):
    """The cases; at admission each also with ACCUMULATE the other way (a random y0 added, or
    the case's taken away), so that an input mode the plan compiled with or without the
    residual add meets every kind of case (the quick lists give swiglu only with y0)."""
    for case in cases:
        yield case
        if ctx.planned is not None:
            if case.y0 is None:
                m = np.atleast_2d(case.x).shape[0]
                yield case._replace(name=f"{case.name} +y0",
                                    y0=ctx.rng.standard_normal((m, case.weights.rows)).astype(np.float32))
            else:
                yield case._replace(name=f"{case.name.replace(' +y0', '')} (without y0)", y0=None)
