"""GGUF quantization blocks <-> .slm parts, in both directions, byte for byte.

    split_blocks(qtype, raw)           GGUF rows [rows, row bytes] -> (encoding, zero, {part: bytes})
    join_blocks(qtype, parts, rows, cols)   the inverse: the GGUF rows again, the same bytes

GGUF stores a row as a run of blocks, each a little struct (scale, codes, ...). An .slm tensor
keeps each field of all blocks in its own part (docs/slm-format.md), codes in element order:
the low 4 bits of element 2i in the low nibble of byte i, any bits above in "high_bits". Every
GGUF bit has exactly one place in the parts and back, so nothing is lost (join_blocks proves
it in the tests), and the decoders compute the same f32 expressions as gguf.quants.

GGUF block layouts (gguf-py quants.py, ggml-common.h), element e of the block:

    Q8_0  34 B  d f16 | qs i8[32]                     e = qs[e]
    Q4_0  18 B  d | qs[16]                            low nibble of qs[e] (e < 16), else high nibble of qs[e-16]
    Q4_1  20 B  d | m f16 | qs[16]                    as Q4_0
    Q5_0  22 B  d | qh u32 | qs[16]                   low 4 bits as Q4_0; bit 4 = bit e of qh
    Q5_1  24 B  d | m | qh | qs[16]                   as Q5_0
    Q4_K 144 B  d | dmin | scales[12] | qs[128]       chunk c = e // 64, j = e % 32: qs[32c + j],
                                                      low nibble for e % 64 < 32, else high
                scales: 8 six-bit sub-scales and 8 six-bit sub-mins packed in 12 bytes
    Q5_K 176 B  d | dmin | scales[12] | qh[32] | qs[128]   bit 4 = bit (e // 32) of qh[e % 32]
    Q6_K 210 B  ql[128] | qh[64] | scales i8[16] | d  half h = e // 128, r = e % 128:
                low 4 bits = nibble (r // 64) of ql[64h + r % 64];
                bits 4-5   = bits 2(r // 32).. of qh[32h + r % 32]
"""
from __future__ import annotations

import numpy as np

from ..artifact import format as fmt
from ..artifact.quant import pack_high_bits, pack_nibbles, unpack_high_bits, unpack_nibbles

try:
    from gguf import GGMLQuantizationType as GT
except ImportError as exc:  # native-only dependency; say which package is missing
    raise ImportError("webslm.convert.gguf_blocks needs the `gguf` package (pip install gguf)") from exc

# GGUF type -> (.slm encoding, zero, elements per block, bytes per block)
LOSSLESS = {
    GT.Q8_0: ("q8", "none", 32, 34),
    GT.Q4_0: ("q4", "offset", 32, 18),
    GT.Q4_1: ("q4", "min", 32, 20),
    GT.Q5_0: ("q5", "offset", 32, 22),
    GT.Q5_1: ("q5", "min", 32, 24),
    GT.Q4_K: ("q4k", "scaled-min", 256, 144),
    GT.Q5_K: ("q5k", "scaled-min", 256, 176),
    GT.Q6_K: ("q6k", "offset", 256, 210),
}

# Byte fields of each block, in block order: (name, length). "d" is the block (super-block)
# scale, "m" the min (dmin for the K types).
FIELDS = {
    GT.Q8_0: (("d", 2), ("qs", 32)),
    GT.Q4_0: (("d", 2), ("qs", 16)),
    GT.Q4_1: (("d", 2), ("m", 2), ("qs", 16)),
    GT.Q5_0: (("d", 2), ("qh", 4), ("qs", 16)),
    GT.Q5_1: (("d", 2), ("m", 2), ("qh", 4), ("qs", 16)),
    GT.Q4_K: (("d", 2), ("m", 2), ("scales", 12), ("qs", 128)),
    GT.Q5_K: (("d", 2), ("m", 2), ("scales", 12), ("qh", 32), ("qs", 128)),
    GT.Q6_K: (("ql", 128), ("qh", 64), ("scales", 16), ("d", 2)),
}


def _fields(qtype, blocks: np.ndarray) -> dict[str, np.ndarray]:
    """[rows, nblocks, block bytes] -> {field: [rows, nblocks, field bytes]} (views)."""
    out, at = {}, 0
    for name, length in FIELDS[qtype]:
        out[name] = blocks[:, :, at:at + length]
        at += length
    return out


# -- the element orders --------------------------------------------------------------------
# Each pair below maps GGUF's packed field to [rows, nblocks, elements] values and back.

def _q4_low(qs):            # Q4_0/Q4_1/Q5_*: [.., 16] -> [.., 32]
    return np.concatenate([qs & 0x0F, qs >> 4], axis=2)


def _q4_low_inverse(low):
    return low[:, :, :16] | (low[:, :, 16:] << 4)


def _k_low(qs):             # Q4_K/Q5_K: [.., 128] -> [.., 256], 64-element chunks of low|high nibbles
    r, n = qs.shape[:2]
    q = qs.reshape(r, n, 4, 1, 32)
    return np.concatenate([q & 0x0F, q >> 4], axis=3).reshape(r, n, 256)


def _k_low_inverse(low):
    r, n = low.shape[:2]
    low = low.reshape(r, n, 4, 2, 32)
    return (low[:, :, :, 0] | (low[:, :, :, 1] << 4)).reshape(r, n, 128)


def _q5k_high(qh):          # [.., 32] -> [.., 256]: element 32b + j is bit b of qh[j]
    r, n = qh.shape[:2]
    shifts = np.arange(8, dtype=np.uint8).reshape(1, 1, 8, 1)
    return ((qh[:, :, None, :] >> shifts) & 1).reshape(r, n, 256)


def _q5k_high_inverse(high):
    r, n = high.shape[:2]
    shifts = np.arange(8, dtype=np.uint8).reshape(1, 1, 8, 1)
    return np.bitwise_or.reduce(high.reshape(r, n, 8, 32) << shifts, axis=2).astype(np.uint8)


def _q6k_low(ql):           # [.., 128] -> [.., 256]: halves of 128, each 64 low then 64 high nibbles
    r, n = ql.shape[:2]
    q = ql.reshape(r, n, 2, 1, 64)
    return np.concatenate([q & 0x0F, q >> 4], axis=3).reshape(r, n, 256)


def _q6k_low_inverse(low):
    r, n = low.shape[:2]
    low = low.reshape(r, n, 2, 2, 64)
    return (low[:, :, :, 0] | (low[:, :, :, 1] << 4)).reshape(r, n, 128)


def _q6k_high(qh):          # [.., 64] -> [.., 256]: half h, 4 runs of 32 take bits 0-1, 2-3, 4-5, 6-7
    r, n = qh.shape[:2]
    shifts = np.arange(0, 8, 2, dtype=np.uint8).reshape(1, 1, 1, 4, 1)
    return ((qh.reshape(r, n, 2, 1, 32) >> shifts) & 3).reshape(r, n, 256)


def _q6k_high_inverse(high):
    r, n = high.shape[:2]
    shifts = np.arange(0, 8, 2, dtype=np.uint8).reshape(1, 1, 1, 4, 1)
    return np.bitwise_or.reduce(high.reshape(r, n, 2, 4, 32) << shifts, axis=3).astype(np.uint8).reshape(r, n, 64)


def _k_scales(packed):      # [.., 12] -> sub_scales [.., 8], sub_mins [.., 8], six bits each
    d, m, md = packed[:, :, 0:4], packed[:, :, 4:8], packed[:, :, 8:12]
    scales = np.concatenate([d & 0x3F, (md & 0x0F) | ((d >> 2) & 0x30)], axis=2)
    mins = np.concatenate([m & 0x3F, (md >> 4) | ((m >> 2) & 0x30)], axis=2)
    return scales, mins


def _k_scales_inverse(scales, mins):
    d = scales[:, :, :4] | ((scales[:, :, 4:] >> 4) << 6)
    m = mins[:, :, :4] | ((mins[:, :, 4:] >> 4) << 6)
    md = (scales[:, :, 4:] & 0x0F) | ((mins[:, :, 4:] & 0x0F) << 4)
    return np.concatenate([d, m, md], axis=2).astype(np.uint8)


# -- both directions -----------------------------------------------------------------------

def _codes(qtype, f: dict) -> tuple[np.ndarray, np.ndarray | None]:
    """A block's codes in element order: low 4 bits, and the bits above (None for 4-bit types)."""
    if qtype in (GT.Q4_K, GT.Q5_K):
        return _k_low(f["qs"]), (_q5k_high(f["qh"]) if qtype == GT.Q5_K else None)
    if qtype == GT.Q6_K:
        return _q6k_low(f["ql"]), _q6k_high(f["qh"])
    high = None
    if "qh" in f:                                     # Q5_0/Q5_1: bit e of the little-endian u32
        r, n = f["qh"].shape[:2]
        high = unpack_high_bits(f["qh"].reshape(r * n, 4), 1).reshape(r, n, 32)
    return _q4_low(f["qs"]), high


def split_blocks(qtype, raw: np.ndarray) -> tuple[str, str, dict[str, bytes]]:
    """GGUF rows [rows, row bytes] (uint8) of a lossless type -> (encoding, zero, parts)."""
    encoding, zero, block, size = LOSSLESS[qtype]
    rows = raw.shape[0]
    f = _fields(qtype, np.ascontiguousarray(raw, dtype=np.uint8).reshape(rows, -1, size))
    cols = f["d"].shape[1] * block
    parts = {"scales": f["d"].tobytes()}
    if "m" in f:
        parts["mins"] = f["m"].tobytes()
    if qtype == GT.Q8_0:
        parts["codes"] = f["qs"].tobytes()
    else:
        low, high = _codes(qtype, f)
        parts["codes"] = pack_nibbles(low.reshape(rows, cols)).tobytes()
        if high is not None:
            parts["high_bits"] = pack_high_bits(high.reshape(rows, cols), fmt.CODE_BITS[encoding] - 4).tobytes()
    if qtype in (GT.Q4_K, GT.Q5_K):
        sub_scales, sub_mins = _k_scales(f["scales"])
        parts["sub_scales"], parts["sub_mins"] = sub_scales.tobytes(), sub_mins.tobytes()
    elif qtype == GT.Q6_K:
        parts["sub_scales"] = f["scales"].tobytes()          # int8, as stored
    return encoding, zero, {name: parts[name] for name in fmt.PARTS[(encoding, zero)]}


def join_blocks(qtype, parts: dict, rows: int, cols: int) -> np.ndarray:
    """The inverse of split_blocks: parts -> GGUF rows [rows, cols / block * bytes] uint8."""
    encoding, _, block, size = LOSSLESS[qtype]
    n = cols // block

    def part(name: str, width: int) -> np.ndarray:
        return np.frombuffer(parts[name], np.uint8).reshape(rows, n, width)

    f = {"d": part("scales", 2)}
    if "mins" in parts:
        f["m"] = part("mins", 2)
    if qtype == GT.Q8_0:
        f["qs"] = part("codes", block)
    else:
        low = unpack_nibbles(np.frombuffer(parts["codes"], np.uint8).reshape(rows, cols // 2)).reshape(rows, n, block)
        bits = fmt.CODE_BITS[encoding] - 4
        high = None
        if bits:
            packed = np.frombuffer(parts["high_bits"], np.uint8).reshape(rows, cols * bits // 8)
            high = unpack_high_bits(packed, bits).reshape(rows, n, block)
        if qtype in (GT.Q4_K, GT.Q5_K):
            f["scales"] = _k_scales_inverse(part("sub_scales", 8), part("sub_mins", 8))
            f["qs"] = _k_low_inverse(low)
            if high is not None:
                f["qh"] = _q5k_high_inverse(high)
        elif qtype == GT.Q6_K:
            f["ql"], f["qh"], f["scales"] = _q6k_low_inverse(low), _q6k_high_inverse(high), part("sub_scales", 16)
        else:
            f["qs"] = _q4_low_inverse(low)
            if high is not None:
                f["qh"] = part("high_bits", 4)
    blocks = np.concatenate([f[name] for name, _ in FIELDS[qtype]], axis=2)
    assert blocks.shape[2] == size
    return blocks.reshape(rows, n * size)
