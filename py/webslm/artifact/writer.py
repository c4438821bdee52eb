"""Write a .slm v1 file from a manifest and encoded tensors (docs/slm-format.md).

Converters and the fixture generator build TensorRecords (parts from quant.py, or repacked
GGUF blocks) and call write_slm. Layout decisions live here only: table order = given order,
every part aligned to PAYLOAD_ALIGNMENT with zero padding, canonical JSON, sha256 trailer.
"""
from __future__ import annotations

import dataclasses
import hashlib
import json
import os
from typing import BinaryIO, Iterable

from . import format as fmt


@dataclasses.dataclass(frozen=True)
class TensorRecord:
    name: str
    shape: tuple[int, ...]
    encoding: str                 # one of format.ENCODINGS
    quant: dict | None            # the descriptor (quant_descriptor()); None for f32/f16
    parts: dict[str, bytes]       # part name -> bytes, names as format.PARTS lists them


def quant_descriptor(encoding: str, cols: int, block: int, zero: str, scale_type: str = "f16") -> dict:
    """Every quantization field stated, none left to inference (docs/slm-format.md)."""
    descriptor = {
        "block_elements": block,
        "blocks_per_row": fmt.blocks_per_row(cols, block),
        "tail_elements": fmt.tail_elements(cols, block),
        "scale_type": scale_type,
        "scale_layout": "rows-by-blocks",
        "zero": zero,
        "zero_offset": fmt.ZERO_OFFSETS[encoding] if zero == "offset" else None,
        "min_type": scale_type if zero in ("min", "scaled-min") else None,
        "code_signedness": "signed" if encoding == "q8" else "unsigned",
        "nibble_order": None if encoding == "q8" else "low-first",
    }
    if encoding in fmt.SUB_BLOCK_ELEMENTS:            # super-block encodings state their sub-blocks
        descriptor |= {
            "sub_block_elements": fmt.SUB_BLOCK_ELEMENTS[encoding],
            "sub_scale_type": fmt.SUB_SCALE_TYPES[encoding],
            "sub_min_type": fmt.SUB_SCALE_TYPES[encoding] if zero == "scaled-min" else None,
        }
    return descriptor


def canonical_json(value) -> bytes:
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False,
                      allow_nan=False).encode("utf-8")


def _zero_kind(record: TensorRecord) -> str:
    return record.quant["zero"] if record.quant else "none"


def layout_table(tensors: Iterable[TensorRecord]) -> tuple[list[dict], int]:
    """Table entries with payload-relative part offsets, and the payload length."""
    entries, cursor = [], 0
    for t in tensors:
        cols = t.shape[-1]
        block = t.quant["block_elements"] if t.quant else None
        digest, parts = hashlib.sha256(), {}
        for name in fmt.PARTS[(t.encoding, _zero_kind(t))]:
            data = t.parts[name]
            cursor = fmt.align_up(cursor, fmt.PAYLOAD_ALIGNMENT)
            parts[name] = [cursor, len(data)]
            cursor += len(data)
            digest.update(data)
        entries.append({"name": t.name, "shape": list(t.shape), "encoding": t.encoding,
                        "quant": t.quant, "row_stride": fmt.row_stride(t.encoding, cols, block),
                        "parts": parts, "sha256": digest.hexdigest()})
    return entries, cursor


def write_slm(out: str | os.PathLike | BinaryIO, manifest: dict, tensors: list[TensorRecord]) -> str:
    """Write the file; return its sha256 (the trailer, i.e. the artifact identity)."""
    manifest_bytes = canonical_json(manifest)
    table, payload_length = layout_table(tensors)
    table_bytes = canonical_json({"tensors": table})
    manifest_offset = fmt.HEADER_LENGTH
    table_offset = manifest_offset + len(manifest_bytes)
    payload_offset = fmt.align_up(table_offset + len(table_bytes), fmt.PAYLOAD_ALIGNMENT)
    file_length = payload_offset + payload_length + fmt.TRAILER_LENGTH
    header = fmt.HEADER.pack(fmt.MAGIC, fmt.VERSION, fmt.HEADER_LENGTH,
                             manifest_offset, len(manifest_bytes), table_offset, len(table_bytes),
                             payload_offset, payload_length, file_length, fmt.PAYLOAD_ALIGNMENT)
    header += bytes(fmt.RESERVED)

    digest = hashlib.sha256()
    handle = open(out, "wb") if isinstance(out, (str, os.PathLike)) else out
    try:
        def emit(data: bytes) -> None:
            digest.update(data)
            handle.write(data)
        emit(header)
        emit(manifest_bytes)
        emit(table_bytes)
        emit(bytes(payload_offset - table_offset - len(table_bytes)))
        written = 0
        for t, entry in zip(tensors, table):
            for name, (offset, length) in entry["parts"].items():
                emit(bytes(offset - written))
                emit(t.parts[name])
                written = offset + length
        emit(bytes(payload_length - written))
        identity = digest.digest()
        handle.write(identity)
    finally:
        if handle is not out:
            handle.close()
    return identity.hex()
