"""The decode mat-vec's oracle and error bounds (matvec.py's kernels; docs/kernels.md, "matvec").

`oracle(weights, x)`: exact y in float64 and an elementwise bound valid for any summation order,
for every .slm encoding. `fused_oracle(...)`: the same for every input mode (plain, RMSNorm,
SwiGLU), with the residual add (ACCUMULATE) and the int8 activations of the dot4 and
pre-quantized variants (`int8_scale`, `int8_error`: their quantization, step by step as the
WGSL does it). The golden families (matvec_cases, matvec_variants, matvec_prequant) and the
benchmarks judge every kernel result by these.
"""
from __future__ import annotations

import numpy as np

from ..artifact import quant
from . import kquant
from .golden import F32_TINY, F32_UNIT_ROUNDOFF, gamma
from .matvec import INPUTS, UNIT_ELEMENTS, MatvecShapeError, _as_array, units
from .weights import Weights

U = F32_UNIT_ROUNDOFF


def _magnitudes(weights: Weights) -> tuple[np.ndarray, np.ndarray, int, str, np.ndarray]:
    """(W exactly decoded [N, K] float64, the per-weight magnitude of its elementary terms,
    n for gamma(n), the rule's words, |s c| [N, K]: the magnitude of the code part alone,
    the part the int8 variants multiply by quantized activations). See `oracle`."""
    padded = units(weights) * UNIT_ELEMENTS[weights.encoding]
    if weights.encoding in kquant.ENCODINGS:      # exact float64 terms (the f32 decode rounds q4k/q5k)
        t = kquant.terms(weights)
        return (t.w, np.abs(t.code) + np.abs(t.zero), 2 * padded + 2,
                "gamma(2 K_padded + 2) * sum(|s c| + |zero part|) |x|", np.abs(t.code))
    w = weights.dequantize().astype(np.float64)
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
        return (w, magnitude_w, 2 * padded + 2, "gamma(2 K_padded + 2) * sum(|s c| + |zero part|) |x|",
                np.abs(s) * codes)
    return w, np.abs(w), padded + 2, "gamma(K_padded + 2) * sum |w| |x|", np.abs(w)


def int8_scale(amax: np.ndarray) -> np.ndarray:
    """The int8 variants' power-of-two scale d (float64) of units whose largest |x| is amax
    (f32, finite, >= 0): matvec_int8_x.wgsl's int8_scale, step by step."""
    field = np.maximum(np.asarray(amax, np.float32).view(np.uint32) >> 23, 13).astype(np.int64)   # d >= 2^-120
    field = field + (np.asarray(amax, np.float64) * np.ldexp(1.0, 133 - field) > 127)
    return np.ldexp(1.0, field - 133)


def int8_error(t: np.ndarray, t_err: np.ndarray, unit: int, residual: bool = False) -> np.ndarray:
    """Per activation, a bound on |t_k - d q_k| (with `residual`: |t_k - d (q_k + r_k / 64)|),
    the rounding of the int8 variants (t [M, K] the f32 values the kernel quantizes as the
    host computes them, t_err a bound on how far the kernel's own values may be from them,
    unit the activations per scale).

    Where t_err is 0 across a unit, the kernel quantizes exactly t: its d is int8_scale of the
    unit's max |t|, and an activation whose t / d (64 t / d) is an integer is represented
    exactly (error 0), any other within one step, d (d / 64) (half a step when rounding to
    nearest; WGSL allows either neighbour). Elsewhere the kernel's max |t| is at most
    max(|t| + t_err), whose binade gives d at most 2^(E - 5) (the doubled case), and the
    error is at most one step of that."""
    t = np.atleast_2d(np.asarray(t, np.float32))
    m, k = t.shape
    padded = -(-k // unit) * unit
    values, errors = np.zeros((m, padded), np.float32), np.zeros((m, padded))
    values[:, :k], errors[:, :k] = t, np.broadcast_to(t_err, t.shape)
    values, errors = values.reshape(m, -1, unit), errors.reshape(m, -1, unit)
    exact_unit = (errors == 0).all(axis=2)
    d_exact = int8_scale(np.abs(values).max(axis=2))
    upper = np.nextafter(((np.abs(values) + errors).max(axis=2)).astype(np.float32), np.float32(np.inf))
    d_upper = np.ldexp(1.0, np.maximum(upper.view(np.uint32) >> 23, 13).astype(np.int64) - 132)
    step = np.where(exact_unit, d_exact, d_upper)[..., None] / (64.0 if residual else 1.0)
    ratio = values / step
    delta = np.where(exact_unit[..., None] & (ratio == np.round(ratio)), 0.0, step)
    return delta.reshape(m, padded)[:, :k]


def oracle(weights: Weights, x: np.ndarray) -> tuple[np.ndarray, np.ndarray, str]:
    """(exact y in float64, elementwise error bound, rule) for any summation order.

    The kernels compute, per unit, s * sum(c x) (+ m * sum(x) for q4 "min", - 8 s sum(x)
    for "offset"). Each elementary term (s c_k x_k, m x_k, 8 s x_k) is rounded at most
    once as a product, once by its scale, and once per addition on its path, and no path
    has more additions than there are terms, so |y - exact| <= gamma(n) * sum |terms| with
    n = terms + 2 (Higham 3.1 / 4.2). Terms are 2 per weight for q4, q5 and the super-block
    encodings (code and zero part: kquant.terms, exact), 1 otherwise; padding weights count (they are multiplied by masked zeros)."""
    x64 = np.atleast_2d(x).astype(np.float64)
    w, magnitude_w, n, rule, _ = _magnitudes(weights)
    return x64 @ w.T, gamma(n) * (np.abs(x64) @ magnitude_w.T), rule


NORM_INPUT_RULE = ("(1+R)(1+u) inv gamma(n+1) sum|terms(x g)| + (R + u + R u)|exact| + (n+2) 2^-126 (1 + inv), "
                   "R = gamma(K)/2 + 12u + 2^-126/(2 eps); exact = float64 W (x g) / sqrt(mean(x^2) + f32(eps))")
SWIGLU_INPUT_RULE = ("sum|w| B + gamma(n) sum|terms(|z| + B)| + (n+2) 2^-126, z = float64 silu(gate) up, "
                     "B its swiglu rule; exact = float64 W z")
ACCUMULATE_RULE = " ; ACCUMULATE: (1+u) bound + u (|y0| + |W x|) + 2^-126, exact + y0"
INT8_RULE = (" ; int8 (x2: with the residual byte): + (1 + gamma(n)) Q (norm: (1+R)(1+u) inv (1 + gamma(n+1)) Q) + (n+2) 2^-126, "
             "Q = sum |s c| delta, delta = int8_error of the activation, also added to its magnitude")


def fused_oracle(weights: Weights, x: np.ndarray, input: str = "plain", norm_weight: np.ndarray | None = None,
                 eps: float | None = None, up_offset: int | None = None,
                 y0: np.ndarray | None = None, int8: int = 0,
                 int8_unit: int | None = None) -> tuple[np.ndarray, np.ndarray, str]:
    """(exact y in float64, elementwise bound, rule) of every input mode, with or without y0.

    "plain": `oracle`. "norm": the kernel multiplies W by t = fl(x g) (one rounding each, so
    the mat-vec rule with one more rounding per term: gamma(n+1) sum|terms(x g)|), then scales
    the row sum by inv = inverseSqrt(fl(fl(sum x^2) / K + eps)), whose relative error R is
    gamma(K)/2 (the K squares and their sum, halved by the root) + 12u (division 2.5 ULP, + eps,
    inverseSqrt 2 ULP, second-order terms) + 2^-126/(2 eps) (flushed subnormal squares), and one
    more rounding for the product: |y - exact| <= (1+R)(1+u) inv gamma(n+1) M + (R+u+Ru)|exact|.
    "swiglu": the kernel multiplies W by t with |t - z| <= B (swiglu.swiglu_oracle's rule), so
    |y - W z| <= sum |w| B + gamma(n) sum|terms(|z| + B)|. ACCUMULATE adds y0 with one more
    rounding: (1+u) bound + u (|y0| + |exact|). Every mode adds (n + 2) 2^-126 for flushed
    subnormal products.

    `int8` (the dot4 variants, and matvec_prequant's mat-vecs; 1: RESIDUAL=0, 2: RESIDUAL=1;
    `int8_unit` activations a scale, default the encoding's unit): the code part of each term
    multiplies d q_k (d (q_k + r_k / 64)) instead of the activation t_k the mode computes,
    within delta_k of it (`int8_error`), so the bound gains Q = sum_k |s c_k| delta_k (scaled
    like the rest of the row sum in the norm mode), and the rounding terms are taken on
    magnitudes |t| + delta."""
    from .swiglu import swiglu_oracle
    x64 = np.atleast_2d(x).astype(np.float64)
    w, magnitude_w, n, rule, code_magnitude = _magnitudes(weights)
    k = weights.cols
    unit = int8_unit or UNIT_ELEMENTS[weights.encoding]
    if int8 and weights.encoding not in ("q4", "q8", "q4k", "q6k"):
        raise MatvecShapeError("variant", f"int8 activations are for q4, q8, q4k and q6k, not {weights.encoding}")
    if int8 and weights.encoding == "q6k":
        code_magnitude = np.abs(w)                       # its kernel multiplies the whole weight (c - 32)
    quantized = 0.0                                      # Q, see above
    if input == "plain":
        if int8:
            quantized = int8_error(x, 0.0, unit, int8 == 2) @ code_magnitude.T
        exact, bound = x64 @ w.T, gamma(n) * (np.abs(x64) @ magnitude_w.T + quantized) + quantized
    elif input == "norm":
        eps64 = float(np.float32(eps))
        g = np.asarray(norm_weight, np.float32).astype(np.float64).reshape(1, -1)
        inv = 1.0 / np.sqrt(np.mean(x64 * x64, axis=1, keepdims=True) + eps64)     # [M, 1]
        z = x64 * g
        exact = (z @ w.T) * inv
        r = gamma(k) / 2 + 12 * U + F32_TINY / (2 * eps64)
        if int8:                                         # t = fl(x g): exact where representable
            t = z.astype(np.float32)
            quantized = int8_error(t, np.where(t == z, 0.0, 2 * U * np.abs(z)), unit, int8 == 2) @ code_magnitude.T
        bound = ((1 + r) * (1 + U) * inv * (gamma(n + 1) * (np.abs(z) @ magnitude_w.T + quantized) + quantized)
                 + (r + U + r * U) * np.abs(exact) + (n + 2) * F32_TINY * (1 + inv))
        rule = NORM_INPUT_RULE
    elif input == "swiglu":
        up_offset = x64.shape[1] // 2 if up_offset is None else up_offset
        h = np.concatenate([x[:, :k], x[:, up_offset:up_offset + k]], axis=1).astype(np.float32)
        z, b = swiglu_oracle(np.atleast_2d(h))
        exact = z @ w.T
        if int8:                                         # the kernel's t is within b of z
            quantized = int8_error(z.astype(np.float32), b + U * np.abs(z), unit, int8 == 2) @ code_magnitude.T
        bound = (b @ np.abs(w).T + gamma(n) * ((np.abs(z) + b) @ magnitude_w.T + quantized) + quantized
                 + (n + 2) * F32_TINY)
        rule = SWIGLU_INPUT_RULE
    else:
        raise MatvecShapeError("input", f"mat-vec input must be one of {sorted(INPUTS)}, not {input!r}")
    if int8:
        bound = bound + (n + 2) * F32_TINY
        rule += INT8_RULE
    if y0 is not None:
        y0 = np.asarray(y0, np.float32).astype(np.float64)
        bound = (1 + U) * bound + U * (np.abs(y0) + np.abs(exact)) + F32_TINY
        exact = exact + y0
        rule += ACCUMULATE_RULE
    return exact, bound, rule
