"""The prefill GEMM's numpy oracle and error bounds, and the weights its tests and benchmarks use.

Y = X W^T in float64 from the f32 inputs and the exactly decoded weights, with an elementwise
bound per kernel kind (docs/kernels.md, section "gemm"):

- f32 workgroup tiles (gemm_<enc>, gemm_tiled_<enc>): each weight is decoded with one rounding
  (fma(c, s, m), (c - 8) s or c s; none for f16/f32 weights) and K products are summed with
  FMAs in f32. By Higham's lemma 3.3 the two compose to gamma(K + 2) relative to
  sum (|s c| + |m|) |x|, for any summation order. Each operation that flushes a subnormal loses
  at most `tiny`, hence (K + 2) tiny. ACCUMULATE adds one rounding of y0 + sum.
- f16 workgroup tiles (gemm_tiled_half_<enc>): the activation and the f32-decoded weight are
  each rounded to f16 once before the f32 products; `half_bound` below derives the extra terms.
"""
from __future__ import annotations

import numpy as np

from ..artifact import quant
from ..artifact.format import blocks_per_row
from .golden import F32_TINY, F32_UNIT_ROUNDOFF, gamma
from . import kquant
from .weights import Weights

RULE = ("|y - exact| <= gamma(K + 2) * sum_k (|s c_k| + |m|) |x_k| + (K + 2) tiny; "
        "accumulate: gamma(K + 3) * (that sum + |y0|) + (K + 3) tiny")
HALF_RULE = ("f16 tiles: x~ = fl16(x), w~ = fl16(fl32(w)), |fl16(v) - v| <= h |v| + t (h = 2^-10, t = 2^-24): "
             "gamma(K) sum |x~||w~| + sum_k [(h (1+u)(2+h) + u) |x| mag + t ((1+h)(1+u) mag + (1+h) |x|) + t^2] "
             "+ (K + 2) tiny; accumulate: (1+u) that + u |exact| + tiny")
F16_MAX = 65504.0
H16 = 2.0 ** -10      # one f16 ulp relative: WGSL may round a conversion to either neighbour
T16 = 2.0 ** -24      # the f16 subnormal spacing: the most a conversion of a tiny value errs


def decode64(weights: Weights) -> tuple[np.ndarray, np.ndarray]:
    """(W, magnitude) in float64, [N, K]: W = s c + m exactly as the format defines it, and
    the magnitude |s c| + |m| (|s (c - 8)| for "offset", |w| for f16/f32) the bound uses.
    q5 and the super-blocks (kquant.terms): the kernels decode fma(c, s, m) for "min" and
    "scaled-min" (magnitude |s c| + |m|), (c - offset) s for "offset" (magnitude |w|)."""
    n, k, enc = weights.rows, weights.cols, weights.encoding
    if enc in kquant.ENCODINGS:
        t = kquant.terms(weights)
        if weights.zero == "offset":
            return t.w, np.abs(t.w)
        return t.w, np.abs(t.code) + np.abs(t.zero)
    if enc in ("f16", "f32"):
        w = quant.dequantize(enc, (n, k), None, weights.parts).astype(np.float64)
        return w, np.abs(w)
    parts = {name: np.frombuffer(memoryview(v).cast("B"), np.uint8) for name, v in weights.parts.items()}
    dtype = quant.SCALE_DTYPES[weights.scale_type]

    def per_block(name: str) -> np.ndarray:   # [N, blocks] scales or mins -> [N, K]
        side = parts[name].view(dtype)[: n * weights.blocks].reshape(n, -1).astype(np.float64)
        return np.repeat(side, weights.block, axis=1)[:, :k]

    s = per_block("scales")
    if enc == "q8":
        c = parts["codes"].view(np.int8).reshape(n, -1)[:, :k].astype(np.float64)
        return s * c, np.abs(s * c)
    c = quant.unpack_nibbles(parts["codes"].reshape(n, -1))[:, :k].astype(np.float64)
    if weights.zero == "offset":
        return s * (c - 8), np.abs(s * (c - 8))
    mins = per_block("mins")
    return s * c + mins, np.abs(s * c) + np.abs(mins)


def oracle(weights: Weights, x: np.ndarray, y0: np.ndarray | None = None, half: bool = False,
           decoded: tuple[np.ndarray, np.ndarray] | None = None):
    """(exact Y in float64, elementwise bound, rule) for f32 tiles, or f16 tiles when `half`.
    `decoded` (decode64's result) saves decoding the same weights again."""
    x64 = np.atleast_2d(x).astype(np.float64)
    w, magnitude = decoded if decoded is not None else decode64(weights)
    k = weights.cols
    exact = x64 @ w.T
    if half:
        bound, rule = half_bound(x64, magnitude), HALF_RULE
    else:
        bound, rule = gamma(k + 2) * (np.abs(x64) @ magnitude.T) + (k + 2) * F32_TINY, RULE
    if y0 is None:
        return exact, bound, rule
    y0 = np.asarray(y0, np.float64).reshape(exact.shape)
    if half:
        u = F32_UNIT_ROUNDOFF
        return exact + y0, (1 + u) * bound + u * np.abs(exact + y0) + F32_TINY, rule
    return exact + y0, gamma(k + 3) * (np.abs(x64) @ magnitude.T + np.abs(y0)) + (k + 3) * F32_TINY, rule


def half_bound(x64: np.ndarray, magnitude: np.ndarray) -> np.ndarray:
    """The f16-tile bound. Per term, with mag = |s c| + |m| >= |w| and |fl32(w)| <= (1+u) mag:
    |x~ w~ - x w| <= (h|x| + t)((1+h)(1+u) mag + t) + |x| (h (1+u) mag + t) + u |x| mag, and the
    f32 dot of x~, w~ adds gamma(K) sum |x~||w~|, |x~| <= (1+h)|x| + t, |w~| <= (1+h)(1+u) mag + t.
    Values past the f16 range (65504) are outside the rule: refused here."""
    if np.abs(x64).max(initial=0) > F16_MAX or magnitude.max(initial=0) * (1 + F32_UNIT_ROUNDOFF) > F16_MAX:
        raise ValueError("the f16-tile rule needs activations and weights within the f16 range (65504)")
    u, h, t = F32_UNIT_ROUNDOFF, H16, T16
    k = magnitude.shape[1]
    ax = np.abs(x64)
    s = ax @ magnitude.T                                 # sum |x| mag
    x1 = ax.sum(axis=1, keepdims=True)                   # sum |x|, per row
    m1 = magnitude.sum(axis=1)[None, :]                  # sum mag, per column
    tilde = (1 + h) ** 2 * (1 + u) * s + t * (1 + h) * (1 + u) * m1 + t * (1 + h) * x1 + k * t * t
    terms = (h * (1 + u) * (2 + h) + u) * s + t * ((1 + h) * (1 + u) * m1 + (1 + h) * x1) + k * t * t
    return gamma(k) * tilde + terms + (k + 2) * F32_TINY


def wrong_results(weights: Weights, x: np.ndarray) -> dict[str, np.ndarray]:
    """Results a broken kernel could produce; the comparison must reject each one."""
    w, _ = decode64(weights)
    x64 = np.atleast_2d(x).astype(np.float64)
    exact = x64 @ w.T
    m, n = exact.shape
    return {
        "transposed": (exact.T.reshape(m, n) if m != n else exact.T.copy()),
        "missing K tail": x64[:, :-1] @ w[:, :-1].T,
        "shifted row": np.roll(exact, 1, axis=0),
        "shifted column": np.roll(exact, 1, axis=1),
        "zeros": np.zeros_like(exact),
    }


def random_parts(rng, encoding: str, n: int, k: int, block: int = 32, zero: str = "min",
                 scale_type: str = "f16", codes: str = "random", scale: float = 0.01) -> Weights:
    """Parts built directly (no quantizer): random or extreme codes, scales of magnitude
    `scale` (times 0.5..1, random sign for mins). Padding codes past K stay 0 as the format
    requires. Also the benchmarks' fast random weights."""
    if encoding in ("f16", "f32"):
        w = (rng.standard_normal((n, k)) * scale).astype(np.float32)
        return Weights.quantized(w, encoding)
    if encoding in kquant.ENCODINGS:     # codes "random", "max", "min" or "mixed"
        return kquant.random_weights(rng, encoding, n, k, block if encoding == "q5" else None,
                                     zero if encoding == "q5" else None, scale_type, codes, scale=scale)
    blocks = blocks_per_row(k, block)
    width = blocks * block
    lo, hi = (0, 15) if encoding == "q4" else (-128, 127)
    if codes == "random":   # random bytes: every code value, and fast for benchmark sizes
        raw = rng.integers(0, 256, (n, width // 2 if encoding == "q4" else width), dtype=np.uint8)
    else:
        if codes in ("max", "min"):
            c = np.full((n, width), hi if codes == "max" else lo)
        elif codes == "eights":   # q4 "offset" values 0 and s: with a huge s, padding decodes to -8 s = -inf
            c = rng.choice([8, 9], (n, width))
        else:   # "mixed": extremes only (q8 also -127)
            c = rng.choice([lo, hi] if encoding == "q4" else [-128, -127, 127], (n, width))
        raw = quant.pack_nibbles(c.astype(np.uint8)) if encoding == "q4" else c.astype(np.int8).view(np.uint8)
    if encoding == "q8":
        raw[:, k:] = 0
    else:
        raw[:, (k + 1) // 2:] = 0
        if k % 2:
            raw[:, k // 2] &= 0x0F
    dtype = quant.SCALE_DTYPES[scale_type]
    s = (scale * rng.uniform(0.5, 1.0, (n, blocks))).astype(dtype)
    if encoding == "q8":
        return Weights("q8", n, k, {"codes": raw.tobytes(), "scales": s.tobytes()}, block, None, scale_type)
    parts = {"codes": raw.tobytes(), "scales": s.tobytes()}
    if zero == "min":
        finite = float(np.finfo(dtype).max)
        mins = np.clip(scale * rng.uniform(-8.0, 8.0, (n, blocks)), -finite, finite)
        parts["mins"] = mins.astype(dtype).tobytes()
    return Weights("q4", n, k, parts, block, zero, scale_type)
