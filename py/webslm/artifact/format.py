"""The .slm v1 format: constants and the tensor set an architecture requires.

docs/slm-format.md is the specification; this module is its executable half. Pure Python
(runs in Pyodide; no numpy): the validator and the writer both import it.
"""
from __future__ import annotations

import struct

MAGIC = b"\x89SLM\r\n\x1a\n"     # PNG-style: catches text-mode and 7-bit transfer damage
VERSION = 1
HEADER_LENGTH = 128
PAYLOAD_ALIGNMENT = 256           # every tensor part starts on this boundary (bindable ranges)
TRAILER_LENGTH = 32               # sha256 of every byte before it

# magic, version, header_length, manifest (offset, length), table (offset, length),
# payload (offset, length), file_length, payload_alignment; then reserved zeros.
HEADER = struct.Struct("<8sII" + "Q" * 7 + "I")
RESERVED = HEADER_LENGTH - HEADER.size

# Limits: a file claiming more is rejected before anything is allocated for it.
MAX_MANIFEST_BYTES = 64 << 20
MAX_TABLE_BYTES = 16 << 20
MAX_FILE_BYTES = 16 << 30
MAX_DIMENSION = 1 << 24
MAX_LAYERS = 4096                 # keeps the required tensor set (12 per layer) within MAX_TENSORS
MAX_TENSORS = 1 << 16

FORMAT_NAME = "webslm.slm"
ENCODINGS = ("f32", "f16", "q8", "q4")
BLOCK_ELEMENTS = (32, 64, 128, 256)
ROPE_CONVENTIONS = ("rotate-half", "adjacent-pair")

# Parts of each encoding's payload, in file order; a tensor's sha256 covers them in this order.
PARTS = {
    ("f32", "none"): ("data",),
    ("f16", "none"): ("data",),
    ("q8", "none"): ("codes", "scales"),
    ("q4", "offset"): ("codes", "scales"),
    ("q4", "min"): ("codes", "scales", "mins"),
}
ZERO_OFFSET_Q4 = 8                # q4 "offset": value = scale * (code - 8)


def align_up(value: int, alignment: int) -> int:
    return -(-value // alignment) * alignment


def blocks_per_row(cols: int, block_elements: int) -> int:
    return -(-cols // block_elements)


def tail_elements(cols: int, block_elements: int) -> int:
    """Real elements in each row's last block (block_elements when it is full)."""
    return cols - (blocks_per_row(cols, block_elements) - 1) * block_elements


def row_stride(encoding: str, cols: int, block_elements: int | None) -> int:
    """Bytes per row of the data/codes part. Rows start 4-byte aligned (GPU reads u32)."""
    if encoding == "f32":
        return cols * 4
    if encoding == "f16":
        return align_up(cols * 2, 4)
    padded = blocks_per_row(cols, block_elements) * block_elements
    return padded if encoding == "q8" else padded // 2


def part_lengths(encoding: str, zero: str, rows: int, cols: int, block_elements: int | None,
                 scale_bytes: int = 2) -> dict[str, int]:
    """Exact byte length of each part of a [rows, cols] tensor."""
    lengths = {"data" if encoding in ("f32", "f16") else "codes": rows * row_stride(encoding, cols, block_elements)}
    if encoding in ("q8", "q4"):
        side = rows * blocks_per_row(cols, block_elements) * scale_bytes
        lengths["scales"] = side
        if zero == "min":
            lengths["mins"] = side
    return lengths


def required_tensors(arch: dict) -> dict[str, tuple[int, ...]]:
    """Every tensor an architecture needs, with its shape ([rows, cols] = [out, in])."""
    hidden, heads, kv, hd = arch["hidden"], arch["n_heads"], arch["n_kv_heads"], arch["head_dim"]
    ffn, vocab = arch["ffn"], arch["vocab"]
    shapes: dict[str, tuple[int, ...]] = {"token_embd": (vocab, hidden), "output_norm": (hidden,)}
    if not arch["tied_output"]:
        shapes["output"] = (vocab, hidden)
    for i in range(arch["n_layers"]):
        p = f"blk.{i}."
        shapes.update({
            p + "attn_norm": (hidden,),
            p + "attn_q": (heads * hd, hidden),
            p + "attn_k": (kv * hd, hidden),
            p + "attn_v": (kv * hd, hidden),
            p + "attn_output": (hidden, heads * hd),
            p + "ffn_norm": (hidden,),
            p + "ffn_gate": (ffn, hidden),
            p + "ffn_up": (ffn, hidden),
            p + "ffn_down": (hidden, ffn),
        })
        if arch["qkv_bias"]:
            shapes.update({p + "attn_q.bias": (heads * hd,), p + "attn_k.bias": (kv * hd,),
                           p + "attn_v.bias": (kv * hd,)})
    return shapes
