"""Take a valid .slm apart and put it back together, so tests can make one precise defect.

split() returns the pieces as plain data; join() re-serializes them exactly as the writer
lays a file out, re-hashing what the caller asks it to re-hash. A defect made this way is
reached by the validator as that defect, not as a hash mismatch further up.
"""
from __future__ import annotations

import dataclasses
import hashlib
import json

from webslm.artifact import format as fmt
from webslm.artifact.writer import canonical_json


@dataclasses.dataclass
class Pieces:
    manifest: dict
    table: dict
    payload: bytearray


def split(data: bytes) -> Pieces:
    fields = fmt.HEADER.unpack_from(data)
    m_off, m_len, t_off, t_len, p_off, p_len = fields[3:9]
    return Pieces(json.loads(data[m_off:m_off + m_len]), json.loads(data[t_off:t_off + t_len]),
                  bytearray(data[p_off:p_off + p_len]))


def rehash_tensors(pieces: Pieces) -> None:
    """Best effort: entries a test has mangled beyond hashing are left as they are."""
    tensors = pieces.table.get("tensors") if isinstance(pieces.table, dict) else None
    for entry in tensors if isinstance(tensors, list) else []:
        try:
            # hash in the format's part order, which is offset order (JSON sorts the keys)
            spans = sorted(entry["parts"].values())
            digest = hashlib.sha256()
            for offset, length in spans:
                digest.update(pieces.payload[offset:offset + length])
            entry["sha256"] = digest.hexdigest()
        except (TypeError, KeyError, AttributeError, ValueError):
            continue


def join(pieces: Pieces, *, manifest_bytes: bytes | None = None, table_bytes: bytes | None = None,
         rehash: bool = True, header: dict | None = None, fix_trailer: bool = True) -> bytes:
    """Serialize; `header` overrides named header fields after they are computed."""
    if rehash:
        rehash_tensors(pieces)
    manifest_bytes = canonical_json(pieces.manifest) if manifest_bytes is None else manifest_bytes
    table_bytes = canonical_json(pieces.table) if table_bytes is None else table_bytes
    values = {
        "magic": fmt.MAGIC, "version": fmt.VERSION, "header_length": fmt.HEADER_LENGTH,
        "manifest_offset": fmt.HEADER_LENGTH, "manifest_length": len(manifest_bytes),
        "table_offset": fmt.HEADER_LENGTH + len(manifest_bytes), "table_length": len(table_bytes),
    }
    values["payload_offset"] = fmt.align_up(values["table_offset"] + len(table_bytes), fmt.PAYLOAD_ALIGNMENT)
    values["payload_length"] = len(pieces.payload)
    values["file_length"] = values["payload_offset"] + len(pieces.payload) + fmt.TRAILER_LENGTH
    values["payload_alignment"] = fmt.PAYLOAD_ALIGNMENT
    values |= header or {}
    head = fmt.HEADER.pack(*values.values()) + bytes(fmt.RESERVED)
    body = head + manifest_bytes + table_bytes
    body += bytes(max(0, fmt.align_up(len(body), fmt.PAYLOAD_ALIGNMENT) - len(body))) + bytes(pieces.payload)
    trailer = hashlib.sha256(body).digest() if fix_trailer else bytes(32)
    return body + trailer


def retrailer(data: bytes | bytearray) -> bytes:
    """The file with its trailer recomputed (after an edit made directly in the bytes)."""
    body = bytes(data[:-fmt.TRAILER_LENGTH])
    return body + hashlib.sha256(body).digest()
