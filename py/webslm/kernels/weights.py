"""One weight matrix as its artifact parts: the descriptor the mat-vec (matvec.py) and GEMM
(gemm.py) families share, so the engine describes a tensor once for decode and prefill.

The parts are bound exactly as the artifact stores them (docs/slm-format.md), in the order
of PART_NAMES; q4 "offset" has no mins part and binds its scales again in the mins slot.
"""
from __future__ import annotations

import dataclasses

import numpy as np

from ..artifact import quant
from ..artifact.format import blocks_per_row, part_lengths, row_stride

ENCODINGS = ("q4", "q8", "f16", "f32")
# Binding order of each encoding's parts (the kernels' weight bindings).
PART_NAMES = {"q4": ("codes", "scales", "mins"), "q8": ("codes", "scales"), "f16": ("data",), "f32": ("data",)}


@dataclasses.dataclass(frozen=True)
class Weights:
    """A weight matrix W [rows = N, cols = K] as its artifact parts (bytes-like)."""
    encoding: str
    rows: int
    cols: int
    parts: dict                      # part name (PART_NAMES) -> bytes-like
    block: int | None = None         # q4/q8
    zero: str | None = None          # q4: "min" or "offset"
    scale_type: str | None = None    # q4/q8: "f16" or "f32"

    @property
    def blocks(self) -> int:
        return blocks_per_row(self.cols, self.block) if self.block else 0

    @property
    def row_words(self) -> int:
        return row_stride(self.encoding, self.cols, self.block) // 4

    def part_bytes(self) -> dict[str, int]:
        """The exact length of each part (docs/slm-format.md)."""
        lengths = part_lengths(self.encoding, self.zero or "none", self.rows, self.cols, self.block,
                               4 if self.scale_type == "f32" else 2)
        return {name: lengths[name] for name in PART_NAMES[self.encoding] if name in lengths}

    def bindings(self) -> list[np.ndarray]:
        """The parts as uint8 arrays in binding order (q4 "offset": scales in the mins slot)."""
        parts = dict(self.parts)
        if self.encoding == "q4" and self.zero == "offset":
            parts["mins"] = parts["scales"]
        return [np.frombuffer(memoryview(parts[name]).cast("B"), np.uint8) for name in PART_NAMES[self.encoding]]

    @property
    def nbytes(self) -> int:
        return sum(self.part_bytes().values())

    def overrides(self) -> dict[str, int]:
        """The encoding's overrides (BLOCK, SCALE_F16, ZERO_MIN), as both families name them."""
        out = {}
        if self.encoding in ("q4", "q8"):
            out |= {"BLOCK": self.block, "SCALE_F16": int(self.scale_type == "f16")}
        if self.encoding == "q4":
            out["ZERO_MIN"] = int(self.zero == "min")
        return out

    def dequantize(self) -> np.ndarray:
        """W as f32 [rows, cols], by the artifact's own decoder."""
        descriptor = {"block_elements": self.block, "zero": self.zero, "scale_type": self.scale_type}
        return quant.dequantize(self.encoding, (self.rows, self.cols), descriptor, self.parts)

    @classmethod
    def from_model(cls, model, name: str) -> "Weights":
        """A validated artifact tensor (of a Model or ValidatedModel); a vector is one row."""
        artifact = getattr(model, "artifact", model)
        info = artifact.manifest.tensors[name]
        rows, cols = info.shape if len(info.shape) == 2 else (1, info.shape[0])
        q = info.quant
        return cls(info.encoding, rows, cols, dict(artifact.tensor_parts(name)),
                   q.block_elements if q else None, q.zero if q and info.encoding == "q4" else None,
                   q.scale_type if q else None)

    @classmethod
    def quantized(cls, w: np.ndarray, encoding: str, block: int = 32, zero: str = "min",
                  scale_type: str = "f16") -> "Weights":
        """A float matrix encoded with the artifact's own codecs (tests and benchmarks)."""
        rows, cols = w.shape
        if encoding == "q4":
            return cls("q4", rows, cols, quant.quantize_q4(w, block, zero, scale_type), block, zero, scale_type)
        if encoding == "q8":
            return cls("q8", rows, cols, quant.quantize_q8(w, block, scale_type), block, None, scale_type)
        encode = quant.encode_f16 if encoding == "f16" else quant.encode_f32
        return cls(encoding, rows, cols, encode(w))
