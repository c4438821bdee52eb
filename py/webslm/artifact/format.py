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
MAX_LAYERS = 4096                 # keeps the required tensor set (at most 16 per layer) within MAX_TENSORS
MAX_TENSORS = 1 << 16

FORMAT_NAME = "webslm.slm"
ENCODINGS = ("f32", "f16", "q8", "q4", "q5", "q4k", "q5k", "q6k")
BLOCK_ELEMENTS = (32, 64, 128, 256)
ROPE_CONVENTIONS = ("rotate-half", "adjacent-pair")

# Parts of each encoding's payload, in file order; a tensor's sha256 covers them in this order.
PARTS = {
    ("f32", "none"): ("data",),
    ("f16", "none"): ("data",),
    ("q8", "none"): ("codes", "scales"),
    ("q4", "offset"): ("codes", "scales"),
    ("q4", "min"): ("codes", "scales", "mins"),
    ("q5", "offset"): ("codes", "high_bits", "scales"),
    ("q5", "min"): ("codes", "high_bits", "scales", "mins"),
    ("q4k", "scaled-min"): ("codes", "scales", "mins", "sub_scales", "sub_mins"),
    ("q5k", "scaled-min"): ("codes", "high_bits", "scales", "mins", "sub_scales", "sub_mins"),
    ("q6k", "offset"): ("codes", "high_bits", "scales", "sub_scales"),
}
ZERO_OFFSET_Q4 = 8                # q4 "offset": value = scale * (code - 8)
ZERO_OFFSETS = {"q4": 8, "q5": 16, "q6k": 32}   # "offset" zero: value uses (code - offset)

# Bits per code. Codes wider than 4 bits store their low 4 bits as nibbles (part "codes",
# like q4) and the bits above in a separate "high_bits" part.
CODE_BITS = {"q8": 8, "q4": 4, "q5": 5, "q4k": 4, "q5k": 5, "q6k": 6}

# Super-block encodings (GGUF's K-quants): blocks of 256 elements, each cut into sub-blocks
# with their own small integer scale (and min) that multiply the super-block's f16 scale.
SUPER_BLOCK_ELEMENTS = 256
SUB_BLOCK_ELEMENTS = {"q4k": 32, "q5k": 32, "q6k": 16}
SUB_SCALE_TYPES = {"q4k": "u6", "q5k": "u6", "q6k": "i8"}   # u6: 0..63 held in a u8
# Encodings whose rows hold whole blocks only (no partial last block): GGUF's own rule for them.
WHOLE_BLOCKS = ("q5", "q4k", "q5k", "q6k")


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
    return padded if encoding == "q8" else padded // 2     # the others: one nibble per code


def part_lengths(encoding: str, zero: str, rows: int, cols: int, block_elements: int | None,
                 scale_bytes: int = 2) -> dict[str, int]:
    """Exact byte length of each part of a [rows, cols] tensor, in file order."""
    if encoding in ("f32", "f16"):
        return {"data": rows * row_stride(encoding, cols, block_elements)}
    blocks = rows * blocks_per_row(cols, block_elements)
    padded = blocks * block_elements                       # elements of all rows, padding included
    sizes = {
        "codes": rows * row_stride(encoding, cols, block_elements),
        "high_bits": padded * (CODE_BITS[encoding] - 4) // 8,
        "scales": blocks * scale_bytes,
        "mins": blocks * scale_bytes,
        "sub_scales": blocks * (block_elements // SUB_BLOCK_ELEMENTS.get(encoding, block_elements)),
    }
    sizes["sub_mins"] = sizes["sub_scales"]
    return {part: sizes[part] for part in PARTS[(encoding, zero)]}


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
        if arch.get("family") == "gemma3":      # per-head q/k norms, norms after attention and FFN
            shapes.update({p + "attn_q_norm": (hd,), p + "attn_k_norm": (hd,),
                           p + "post_attention_norm": (hidden,), p + "post_ffw_norm": (hidden,)})
    return shapes
