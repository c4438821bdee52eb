"""q5 and the super-block encodings (q4k, q5k, q6k) on the kernels' side: weights made part by
part for tests and benchmarks, and their exact decomposition for the oracles' error bounds.

The artifact has no quantizer for these encodings (the converter only repacks GGUF blocks),
so `random_weights` writes the parts directly: codes and high bits are random (or extreme)
bytes, and the scales are drawn from ordinary values or from the f16 extremes. Every byte
pattern decodes, as long as u6 sub-scales stay in 0..63 (the validator's rule).

`terms` splits each weight into what the kernels multiply: w = code part + zero part, in
float64 and exactly (an f16 times a 6- or 8-bit integer times a code is exact in float64):

    q5 "min"     s c + m                 q5 "offset"  s c - 16 s
    q4k, q5k     (d sc) c - dmin m       q6k          (d sc) c - 32 (d sc)

The mat-vec kernels compute s * sum(c x) + z * sum(x) per unit of 32 (q6k: per half), so
their error is bounded by the magnitudes of the two parts, as q4's (kernels/matvec.py oracle).
"""
from __future__ import annotations

import dataclasses

import numpy as np

from ..artifact import quant
from ..artifact.format import SUB_BLOCK_ELEMENTS, SUPER_BLOCK_ELEMENTS, ZERO_OFFSETS, blocks_per_row
from .weights import Weights

ENCODINGS = ("q5", "q4k", "q5k", "q6k")
F16_EXTREMES = np.array([65504.0, -65504.0, 2.0 ** -24, -(2.0 ** -24), 0.0, 6.1035e-05, -3.0e-3, 1.0],
                        np.float16)                      # the largest finite, the smallest subnormal, ...


def default_form(encoding: str) -> tuple[int, str]:
    """(block, zero) of an encoding's one super-block form; q5 defaults to block 32 "offset"."""
    return {"q5": (32, "offset"), "q4k": (256, "scaled-min"), "q5k": (256, "scaled-min"),
            "q6k": (256, "offset")}[encoding]


def _fill(rng, n: int, codes: str) -> np.ndarray:
    """n bytes: random, all bits set ("max"), all clear ("min"), or a mix of both ("mixed")."""
    if codes == "random":
        return rng.integers(0, 256, n, dtype=np.uint8)
    if codes == "mixed":
        return rng.choice(np.array([0x00, 0xFF], np.uint8), n)
    return np.full(n, 0xFF if codes == "max" else 0x00, np.uint8)


def _scales(rng, n: int, dtype, scale: float, kind: str) -> np.ndarray:
    """n scales: `scale` times 0.5..1 with random signs ("normal"), or f16 extremes mixed in."""
    values = scale * rng.uniform(0.5, 1.0, n) * rng.choice([-1.0, 1.0], n)
    if kind == "extreme":
        pick = rng.random(n) < 0.5
        values[pick] = rng.choice(F16_EXTREMES, int(pick.sum())).astype(np.float64)
    return values.astype(dtype)


def random_weights(rng, encoding: str, rows: int, cols: int, block: int | None = None, zero: str | None = None,
                   scale_type: str = "f16", codes: str = "random", scales: str = "normal",
                   scale: float = 0.01) -> Weights:
    """A [rows, cols] tensor of `encoding` made part by part (see the module docstring).
    cols must be a multiple of the block (these encodings have no partial blocks). `codes`:
    "random", "max", "min" or "mixed" (every code, high bits included, at an extreme);
    `scales`: "normal" or "extreme" (half of them f16 extremes: +-65504, +-2^-24, 0, ...);
    sub-scales span their whole range (u6 0..63, q6k int8 -128..127)."""
    form_block, form_zero = default_form(encoding)
    block = block or form_block
    zero = zero or form_zero
    if cols % block:
        raise ValueError(f"{encoding} rows hold whole blocks of {block}: cols {cols} is not a multiple")
    if encoding != "q5":
        scale_type = "f16"
    elements, blocks = rows * cols, rows * blocks_per_row(cols, block)
    dtype = quant.SCALE_DTYPES[scale_type]
    parts = {"codes": _fill(rng, elements // 2, codes)}
    high = {"q5": 1, "q5k": 1, "q6k": 2}.get(encoding, 0)
    if high:
        parts["high_bits"] = _fill(rng, elements * high // 8, codes)
    parts["scales"] = _scales(rng, blocks, dtype, scale, scales)
    if zero in ("min", "scaled-min"):
        parts["mins"] = _scales(rng, blocks, dtype, scale * (8 if zero == "min" else 1), scales)
    if encoding in SUB_BLOCK_ELEMENTS:
        subs = elements // SUB_BLOCK_ELEMENTS[encoding]
        if encoding == "q6k":
            parts["sub_scales"] = rng.integers(0, 256, subs, dtype=np.uint8)     # every int8
        else:
            parts["sub_scales"] = rng.integers(0, 64, subs, dtype=np.uint8)
            parts["sub_mins"] = rng.integers(0, 64, subs, dtype=np.uint8)
        for name in ("sub_scales", "sub_mins"):
            if name in parts and codes in ("max", "min") and rows:      # the ends of the range
                parts[name][:2] = (63, 0) if encoding != "q6k" else (0x7F, 0x80)
    parts = {name: np.ascontiguousarray(value).view(np.uint8).tobytes() for name, value in parts.items()}
    return Weights(encoding, rows, cols, parts, block, zero, scale_type)


@dataclasses.dataclass(frozen=True)
class Terms:
    """w = code + zero elementwise, all float64 [rows, cols] and exact (module docstring)."""
    code: np.ndarray     # the code part: s c
    zero: np.ndarray     # the zero part: m, -16 s, -dmin m or -32 (d sc)

    @property
    def w(self) -> np.ndarray:
        return self.code + self.zero


def terms(weights: Weights) -> Terms:
    rows, cols, encoding = weights.rows, weights.cols, weights.encoding
    if encoding not in ENCODINGS:
        raise ValueError(f"terms are for {ENCODINGS}, not {encoding!r}")
    c = quant.unpack_codes(encoding, weights.parts, rows, cols).astype(np.float64)

    def per(part: str, dtype, size: int) -> np.ndarray:      # one value per `size` elements -> [rows, cols]
        values = np.frombuffer(memoryview(weights.parts[part]).cast("B"), dtype).astype(np.float64)
        return np.repeat(values.reshape(rows, -1), size, axis=1)

    if encoding == "q5":
        s = per("scales", quant.SCALE_DTYPES[weights.scale_type], weights.block)
        if weights.zero == "min":
            return Terms(s * c, per("mins", quant.SCALE_DTYPES[weights.scale_type], weights.block))
        return Terms(s * c, -ZERO_OFFSETS["q5"] * s)
    sub = SUB_BLOCK_ELEMENTS[encoding]
    d = per("scales", np.dtype("<f2"), SUPER_BLOCK_ELEMENTS)
    sc = per("sub_scales", np.int8 if encoding == "q6k" else np.uint8, sub)
    if encoding == "q6k":
        return Terms(d * sc * c, -ZERO_OFFSETS["q6k"] * d * sc)
    return Terms(d * sc * c, -per("mins", np.dtype("<f2"), SUPER_BLOCK_ELEMENTS) * per("sub_mins", np.uint8, sub))
