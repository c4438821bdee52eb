"""Encode and decode tensor payloads (numpy). The byte layouts are docs/slm-format.md's.

    f32   data: [rows][cols] little-endian f32
    f16   data: [rows][row_stride/2] f16, each row zero-padded to a multiple of 4 bytes
    q8    codes: [rows][blocks*block] int8;  scales: [rows][blocks] f16|f32
          value = scale * code
    q4    codes: [rows][blocks*block/2] bytes, two codes per byte, low nibble first
          (element 2i in the low nibble of byte i, element 2i+1 in the high nibble)
          "offset": value = scale * (code - 8)          scales: [rows][blocks]
          "min":    value = scale * code + min          scales, mins: [rows][blocks]
    q5    5-bit codes: their low 4 bits in "codes" as q4's, bit 4 in high_bits
          [rows][blocks*block/8] (element 8i+j at bit j of byte i)
          "offset": value = scale * (code - 16)         "min": value = scale * code + min
    q4k, q5k   super-blocks of 256 = 8 sub-blocks of 32; codes (and q5k's high_bits) as q4/q5;
          scales, mins [rows][blocks] f16; sub_scales, sub_mins [rows][blocks][8] u8 (0..63)
          value = (scale * sub_scale) * code - (min * sub_min)
    q6k   super-blocks of 256 = 16 sub-blocks of 16; 6-bit codes: low 4 bits in "codes",
          bits 4-5 in high_bits [rows][blocks*256/4] (element 4i+j at bits 2j..2j+1 of byte i);
          scales [rows][blocks] f16; sub_scales [rows][blocks][16] int8
          value = (scale * sub_scale) * (code - 32)

Codes past the last real element of a row (the tail block's padding) are zero; q5 and
the super-block encodings have no partial blocks. Decoding computes in f32 with exactly
the operations, in the order, the `gguf` package uses for Q8_0, Q4_0, Q4_1, Q5_0, Q5_1,
Q4_K, Q5_K and Q6_K (each product and difference rounded on its own, no fused
multiply-add), so a lossless GGUF repack dequantizes bit-identically.

The quantizers (round to nearest, per block) are used by the safetensors converter and
the fixture model; GGUF tensors are repacked, never requantized, when lossless is possible.
"""
from __future__ import annotations

import numpy as np

from .format import CODE_BITS, SUB_BLOCK_ELEMENTS, ZERO_OFFSET_Q4, ZERO_OFFSETS, blocks_per_row, row_stride

SCALE_DTYPES = {"f16": np.dtype("<f2"), "f32": np.dtype("<f4")}


def _blocks(w: np.ndarray, block: int) -> np.ndarray:
    """[rows, cols] -> [rows, blocks, block] f32, the tail padded with zeros."""
    rows, cols = w.shape
    padded = np.zeros((rows, blocks_per_row(cols, block) * block), np.float32)
    padded[:, :cols] = w
    return padded.reshape(rows, -1, block)


def pack_nibbles(codes: np.ndarray) -> np.ndarray:
    """[rows, n] codes 0..15 (n even) -> [rows, n/2] bytes, low nibble first."""
    codes = codes.astype(np.uint8)
    return (codes[:, 0::2] | (codes[:, 1::2] << 4)).astype(np.uint8)


def unpack_nibbles(packed: np.ndarray) -> np.ndarray:
    """[rows, n/2] bytes -> [rows, n] codes 0..15."""
    out = np.empty((packed.shape[0], packed.shape[1] * 2), np.uint8)
    out[:, 0::2] = packed & 0x0F
    out[:, 1::2] = packed >> 4
    return out


def pack_high_bits(values: np.ndarray, bits: int) -> np.ndarray:
    """[rows, n] values of `bits` (1 or 2) bits -> [rows, n*bits/8] bytes; element e of a row
    sits at bit bits*(e % per_byte) of byte e // per_byte, per_byte = 8 / bits."""
    per_byte = 8 // bits
    values = values.astype(np.uint8).reshape(values.shape[0], -1, per_byte)
    shifts = np.arange(0, 8, bits, dtype=np.uint8)
    return np.bitwise_or.reduce(values << shifts, axis=2).astype(np.uint8)


def unpack_high_bits(packed: np.ndarray, bits: int) -> np.ndarray:
    """[rows, n*bits/8] bytes -> [rows, n] values of `bits` bits (the inverse of pack_high_bits)."""
    shifts = np.arange(0, 8, bits, dtype=np.uint8)
    return ((packed[:, :, None] >> shifts) & np.uint8((1 << bits) - 1)).reshape(packed.shape[0], -1)


def unpack_codes(encoding: str, parts: dict, rows: int, elements: int) -> np.ndarray:
    """The [rows, elements] uint8 codes of a q4/q5/q4k/q5k/q6k tensor: low nibbles from
    "codes", the bits above 4 (if any) from "high_bits"."""
    codes = unpack_nibbles(np.frombuffer(parts["codes"], np.uint8).reshape(rows, elements // 2))
    high = CODE_BITS[encoding] - 4
    if high:
        packed = np.frombuffer(parts["high_bits"], np.uint8).reshape(rows, elements * high // 8)
        codes |= unpack_high_bits(packed, high) << np.uint8(4)
    return codes


# -- encoders: [rows, cols] float -> {part: bytes} --------------------------------------

def encode_f32(w: np.ndarray) -> dict[str, bytes]:
    return {"data": np.ascontiguousarray(w, dtype="<f4").tobytes()}


def encode_f16(w: np.ndarray) -> dict[str, bytes]:
    rows, cols = w.shape
    out = np.zeros((rows, row_stride("f16", cols, None) // 2), "<f2")
    out[:, :cols] = w
    return {"data": out.tobytes()}


def quantize_q8(w: np.ndarray, block: int, scale_type: str = "f16") -> dict[str, bytes]:
    blocks = _blocks(w, block)
    scale = (np.abs(blocks).max(axis=2) / 127.0).astype(SCALE_DTYPES[scale_type])
    s = scale.astype(np.float32)[:, :, None]
    codes = np.where(s > 0, np.rint(blocks / np.where(s > 0, s, 1)), 0).clip(-127, 127).astype(np.int8)
    return {"codes": codes.reshape(w.shape[0], -1).tobytes(), "scales": scale.tobytes()}


def quantize_q4(w: np.ndarray, block: int, zero: str, scale_type: str = "f16") -> dict[str, bytes]:
    rows, cols = w.shape
    blocks = _blocks(w, block)
    real = (np.arange(blocks.shape[1] * block) < cols).reshape(1, -1, block)   # mask of real elements
    dtype = SCALE_DTYPES[scale_type]
    if zero == "min":
        lo = np.where(real, blocks, np.inf).min(axis=2)
        hi = np.where(real, blocks, -np.inf).max(axis=2)
        mins = lo.astype(dtype)
        scale = ((hi - mins.astype(np.float32)) / 15.0).astype(dtype)
        s, m = scale.astype(np.float32)[:, :, None], mins.astype(np.float32)[:, :, None]
        codes = np.where(s > 0, np.rint((blocks - m) / np.where(s > 0, s, 1)), 0).clip(0, 15)
    elif zero == "offset":
        scale = (np.abs(blocks).max(axis=2) / 7.0).astype(dtype)
        s = scale.astype(np.float32)[:, :, None]
        codes = np.where(s > 0, np.rint(blocks / np.where(s > 0, s, 1)), 0).clip(-8, 7) + ZERO_OFFSET_Q4
    else:
        raise ValueError(f"q4 zero must be 'min' or 'offset', not {zero!r}")
    codes = np.where(real, codes, 0).astype(np.uint8).reshape(rows, -1)   # tail padding is code 0
    parts = {"codes": pack_nibbles(codes).tobytes(), "scales": scale.tobytes()}
    if zero == "min":
        parts["mins"] = mins.tobytes()
    return parts


# -- decoder: parts -> [rows, cols] f32 --------------------------------------------------

def dequantize(encoding: str, shape: tuple[int, ...], quant: dict | None, parts: dict) -> np.ndarray:
    """Decode one tensor's parts (bytes-like, already validated) into f32 of `shape`."""
    rows, cols = shape if len(shape) == 2 else (1, shape[0])
    if encoding == "f32":
        out = np.frombuffer(parts["data"], "<f4").reshape(rows, cols)
    elif encoding == "f16":
        stride = row_stride("f16", cols, None) // 2
        out = np.frombuffer(parts["data"], "<f2").reshape(rows, stride)[:, :cols].astype(np.float32)
    else:
        block = quant["block_elements"]
        nblocks = blocks_per_row(cols, block)
        scale_dtype = SCALE_DTYPES[quant["scale_type"]]
        scales = np.frombuffer(parts["scales"], scale_dtype).reshape(rows, nblocks, 1).astype(np.float32)
        if encoding == "q8":
            codes = np.frombuffer(parts["codes"], np.int8).reshape(rows, nblocks, block).astype(np.float32)
            values = scales * codes
        elif encoding in SUB_BLOCK_ELEMENTS:
            values = _dequantize_super_blocks(encoding, quant, parts, rows, nblocks, scales)
        else:   # q4, q5
            codes = unpack_codes(encoding, parts, rows, nblocks * block).reshape(rows, nblocks, block)
            if quant["zero"] == "offset":
                offset = np.int8(ZERO_OFFSETS[encoding])
                values = scales * (codes.astype(np.int8) - offset).astype(np.float32)
            else:
                mins = np.frombuffer(parts["mins"], scale_dtype).reshape(rows, nblocks, 1).astype(np.float32)
                values = scales * codes.astype(np.float32) + mins
        out = values.reshape(rows, nblocks * block)[:, :cols]
    return out.reshape(shape).astype(np.float32, copy=False)


def _dequantize_super_blocks(encoding: str, quant: dict, parts: dict, rows: int, nblocks: int,
                             scales: np.ndarray) -> np.ndarray:
    """q4k/q5k/q6k -> [rows, nblocks, 256] f32. The sub-block scale is rounded to f32 first
    (scale * sub_scale), as gguf computes it; then the code term, then the min term."""
    sub = SUB_BLOCK_ELEMENTS[encoding]
    per_block = quant["block_elements"] // sub
    codes = unpack_codes(encoding, parts, rows, nblocks * per_block * sub).reshape(rows, nblocks, per_block, sub)
    sub_dtype = np.int8 if quant["sub_scale_type"] == "i8" else np.uint8
    sub_scales = np.frombuffer(parts["sub_scales"], sub_dtype).reshape(rows, nblocks, per_block, 1)
    scale = scales[..., None] * sub_scales.astype(np.float32)                  # [rows, blocks, subs, 1]
    if quant["zero"] == "offset":                                               # q6k
        values = scale * (codes.astype(np.int8) - np.int8(ZERO_OFFSETS[encoding])).astype(np.float32)
    else:                                                                       # q4k, q5k: "scaled-min"
        mins = np.frombuffer(parts["mins"], SCALE_DTYPES[quant["min_type"]]).reshape(rows, nblocks, 1, 1)
        sub_mins = np.frombuffer(parts["sub_mins"], np.uint8).reshape(rows, nblocks, per_block, 1)
        values = scale * codes.astype(np.float32) - mins.astype(np.float32) * sub_mins.astype(np.float32)
    return values.reshape(rows, nblocks, per_block * sub)
