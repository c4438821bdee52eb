"""Encode and decode tensor payloads (numpy). The byte layouts are docs/slm-format.md's.

    f32   data: [rows][cols] little-endian f32
    f16   data: [rows][row_stride/2] f16, each row zero-padded to a multiple of 4 bytes
    q8    codes: [rows][blocks*block] int8;  scales: [rows][blocks] f16|f32
          value = scale * code
    q4    codes: [rows][blocks*block/2] bytes, two codes per byte, low nibble first
          (element 2i in the low nibble of byte i, element 2i+1 in the high nibble)
          "offset": value = scale * (code - 8)          scales: [rows][blocks]
          "min":    value = scale * code + min          scales, mins: [rows][blocks]

Codes past the last real element of a row (the tail block's padding) are zero.
Decoding computes in f32 exactly as the `gguf` package does for Q8_0/Q4_0/Q4_1, so a
lossless GGUF repack dequantizes bit-identically.

The quantizers (round to nearest, per block) are used by the safetensors converter and
the fixture model; GGUF tensors are repacked, never requantized, when lossless is possible.
"""
from __future__ import annotations

import numpy as np

from .format import ZERO_OFFSET_Q4, blocks_per_row, row_stride

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
        else:
            packed = np.frombuffer(parts["codes"], np.uint8).reshape(rows, nblocks * block // 2)
            codes = unpack_nibbles(packed).reshape(rows, nblocks, block)
            if quant["zero"] == "offset":
                values = scales * (codes.astype(np.int8) - np.int8(ZERO_OFFSET_Q4)).astype(np.float32)
            else:
                mins = np.frombuffer(parts["mins"], scale_dtype).reshape(rows, nblocks, 1).astype(np.float32)
                values = scales * codes.astype(np.float32) + mins
        out = values.reshape(rows, nblocks * block)[:, :cols]
    return out.reshape(shape).astype(np.float32, copy=False)
