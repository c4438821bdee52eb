"""Test helpers for reading .slm files without the validator, and for codec error bounds.

`read_slm` is an independent reader of docs/slm-format.md's layout (header, manifest, table,
parts, trailer): a second reading of the spec that cross-checks the writer and the validator.
`assert_within_bound` derives each quantized block's worst-case error from the scales and mins
actually stored and checks every decoded element against it.
"""
from __future__ import annotations

import dataclasses
import hashlib
import json
import pathlib

import numpy as np

from webslm.artifact import format as fmt
from webslm.artifact.quant import SCALE_DTYPES, dequantize, unpack_nibbles


# -- an independent reader of the .slm layout ------------------------------------------------

@dataclasses.dataclass
class Slm:
    manifest: dict
    entries: dict[str, dict]              # name -> table entry, in table order
    parts: dict[str, dict[str, bytes]]    # name -> part -> bytes
    sha256: str

    def decode(self, name: str) -> np.ndarray:
        e = self.entries[name]
        return dequantize(e["encoding"], tuple(e["shape"]), e["quant"], self.parts[name])


def read_slm(path) -> Slm:
    data = pathlib.Path(path).read_bytes()
    (magic, version, header_length, m_off, m_len, t_off, t_len, p_off, p_len, length,
     alignment) = fmt.HEADER.unpack_from(data)
    assert (magic, version, header_length, alignment) == (fmt.MAGIC, 1, 128, 256)
    assert data[fmt.HEADER.size:128] == bytes(fmt.RESERVED)
    assert m_off == 128 and t_off == m_off + m_len and p_off == fmt.align_up(t_off + t_len, 256)
    assert length == len(data) == p_off + p_len + 32
    assert data[t_off + t_len:p_off] == bytes(p_off - t_off - t_len)
    assert hashlib.sha256(data[:-32]).digest() == data[-32:]
    manifest = json.loads(data[m_off:m_off + m_len])
    table = json.loads(data[t_off:t_off + t_len])["tensors"]
    entries, parts, cursor = {}, {}, 0
    for e in table:
        zero = e["quant"]["zero"] if e["quant"] else "none"
        block = e["quant"]["block_elements"] if e["quant"] else None
        rows, cols = e["shape"] if len(e["shape"]) == 2 else (1, e["shape"][0])
        scale_bytes = SCALE_DTYPES[e["quant"]["scale_type"]].itemsize if e["quant"] else 2
        lengths = fmt.part_lengths(e["encoding"], zero, rows, cols, block, scale_bytes)
        assert set(e["parts"]) == set(lengths), e["name"]
        assert e["row_stride"] == fmt.row_stride(e["encoding"], cols, block)
        digest, own = hashlib.sha256(), {}
        for part in fmt.PARTS[(e["encoding"], zero)]:          # file order, whatever the JSON key order
            offset, size = e["parts"][part]
            assert offset == fmt.align_up(cursor, 256) and size == lengths[part], (e["name"], part)
            assert data[p_off + cursor:p_off + offset] == bytes(offset - cursor)
            own[part] = data[p_off + offset:p_off + offset + size]
            digest.update(own[part])
            cursor = offset + size
        assert digest.hexdigest() == e["sha256"], e["name"]
        entries[e["name"]], parts[e["name"]] = e, own
    assert cursor == p_len
    return Slm(manifest, entries, parts, data[-32:].hex())


# -- error bounds ----------------------------------------------------------------------------

def _source_blocks(source: np.ndarray, block: int) -> tuple[np.ndarray, np.ndarray]:
    """[rows, cols] -> [rows, blocks, block] values (the tail padded with 0) and the mask of real elements."""
    rows, cols = source.shape
    padded = np.zeros((rows, fmt.blocks_per_row(cols, block) * block), np.float64)
    padded[:, :cols] = source
    values = padded.reshape(rows, -1, block)
    real = np.arange(padded.shape[1]).reshape(1, -1, block) < cols
    return values, np.broadcast_to(real, values.shape)


def assert_within_bound(source: np.ndarray, entry: dict, parts: dict[str, bytes]) -> float:
    """Check a decoded tensor against its float source; return the max abs error.

    f32 must be exact and f16 exactly the f16 rounding of the source. For a quantized block with
    stored scale s (and min m), round-to-nearest is off by at most s/2 inside the grid the codes
    can reach; outside it the error is the distance to the grid's end, which exists only because
    s and m are rounded to the scale type:
        q8           grid [-127s, 127s]     bound max(s/2, amax - 127s)
        q4 offset    grid [-8s, 7s]         bound max(s/2, amax - 7s)
        q4 min       grid [m, m + 15s]      bound max(s/2, m - lo, hi - (m + 15s))
    plus f32 arithmetic slack (2^-22 of the block's largest magnitude). The bound itself must be
    close to the ideal one (half a step of the block's own range), or a broken quantizer that
    stores huge scales would pass.
    """
    shape, encoding, quant = tuple(entry["shape"]), entry["encoding"], entry["quant"]
    decoded = dequantize(encoding, shape, quant, parts)
    assert decoded.shape == source.shape and decoded.dtype == np.float32
    error = np.abs(decoded.astype(np.float64) - source)
    if encoding == "f32":
        np.testing.assert_array_equal(decoded, source)
        return float(error.max())
    if encoding == "f16":
        np.testing.assert_array_equal(decoded, source.astype(np.float16).astype(np.float32))
        return float(error.max())

    rows2d = source.reshape(1, -1) if source.ndim == 1 else source
    block, scale_dtype = quant["block_elements"], SCALE_DTYPES[quant["scale_type"]]
    values, real = _source_blocks(rows2d, block)
    nblocks = values.shape[1]
    s = np.frombuffer(parts["scales"], scale_dtype).reshape(-1, nblocks).astype(np.float64)
    amax = np.where(real, np.abs(values), 0).max(axis=2)
    lo = np.where(real, values, np.inf).min(axis=2)
    hi = np.where(real, values, -np.inf).max(axis=2)
    scale_rounding = 2.0 ** -11 if quant["scale_type"] == "f16" else 2.0 ** -24
    if encoding == "q8":
        bound = np.maximum(s / 2, amax - 127 * s)
        ideal = amax / 127 / 2
        codes = np.frombuffer(parts["codes"], np.int8).reshape(values.shape)
    elif quant["zero"] == "offset":
        bound = np.maximum(s / 2, amax - 7 * s)
        ideal = amax / 7 / 2
        codes = unpack_nibbles(np.frombuffer(parts["codes"], np.uint8).reshape(values.shape[0], -1)).reshape(values.shape)
    else:
        m = np.frombuffer(parts["mins"], scale_dtype).reshape(-1, nblocks).astype(np.float64)
        bound = np.maximum.reduce([s / 2, m - lo, hi - (m + 15 * s)])
        ideal = (hi - lo) / 15 / 2 + np.abs(lo) * scale_rounding    # the min's own rounding
        codes = unpack_nibbles(np.frombuffer(parts["codes"], np.uint8).reshape(values.shape[0], -1)).reshape(values.shape)
    assert not codes[~real].any(), f"{entry['name']}: padding codes of the tail block must be 0"
    slack = amax * 2.0 ** -22 + 1e-30
    per_element = (bound + slack)[:, :, None]
    block_error = np.zeros(values.shape)
    block_error.reshape(values.shape[0], -1)[:, :rows2d.shape[1]] = error.reshape(rows2d.shape)
    over = (block_error > per_element) & real
    assert not over.any(), (f"{entry['name']}: {over.sum()} elements exceed the bound, worst "
                            f"{(block_error - per_element)[over].max():.3g} over")
    assert (bound <= ideal * (1 + 4 * scale_rounding) + slack).all(), f"{entry['name']}: scales larger than needed"
    return float(error.max())
