"""One weight matrix as its artifact parts: the descriptor the mat-vec (matvec.py) and GEMM
(gemm.py) families share, so the engine describes a tensor once for decode and prefill.

The parts are bound exactly as the artifact stores them (docs/slm-format.md), in the order
of PART_NAMES; q4 and q5 "offset" have no mins part and bind their scales again in the mins
slot (`binding_names`).
"""
from __future__ import annotations

import dataclasses

import numpy as np

from ..artifact import quant
from ..artifact.format import SUB_SCALE_TYPES, blocks_per_row, part_lengths, row_stride

ENCODINGS = ("q4", "q8", "f16", "f32", "q5", "q4k", "q5k", "q6k")
# Binding order of each encoding's parts (the kernels' weight bindings): the file order.
PART_NAMES = {"q4": ("codes", "scales", "mins"), "q8": ("codes", "scales"), "f16": ("data",), "f32": ("data",),
              "q5": ("codes", "high_bits", "scales", "mins"),
              "q4k": ("codes", "scales", "mins", "sub_scales", "sub_mins"),
              "q5k": ("codes", "high_bits", "scales", "mins", "sub_scales", "sub_mins"),
              "q6k": ("codes", "high_bits", "scales", "sub_scales")}
# Encodings with a zero kind besides "none" (Weights.zero): q4/q5 "min" or "offset", the
# super-blocks "scaled-min" (q4k, q5k) or "offset" (q6k).
ZEROED = ("q4", "q5", "q4k", "q5k", "q6k")
# Encodings whose block size and scale type are overrides (BLOCK, SCALE_F16; ZERO_MIN for q4/q5).
# The super-block encodings have one form: 256-element blocks, f16 scales.
BLOCKED = ("q4", "q8", "q5")


def binding_names(encoding: str, zero: str | None) -> tuple[str, ...]:
    """The parts bound to the kernels' weight bindings, in order: q4/q5 "offset" bind their
    scales again in the mins slot (the kernels never read it)."""
    names = PART_NAMES[encoding]
    if encoding in ("q4", "q5") and zero == "offset":
        return tuple("scales" if name == "mins" else name for name in names)
    return names


@dataclasses.dataclass(frozen=True)
class Weights:
    """A weight matrix W [rows = N, cols = K] as its artifact parts (bytes-like)."""
    encoding: str
    rows: int
    cols: int
    parts: dict                      # part name (PART_NAMES) -> bytes-like
    block: int | None = None         # quantized encodings: block_elements (super-blocks: 256)
    zero: str | None = None          # ZEROED encodings: "min", "offset" or "scaled-min"
    scale_type: str | None = None    # quantized encodings: "f16" or "f32" (super-blocks: "f16")

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

    def binding_names(self) -> tuple[str, ...]:
        return binding_names(self.encoding, self.zero)

    def bindings(self) -> list[np.ndarray]:
        """The parts as uint8 arrays in binding order (q4/q5 "offset": scales in the mins slot)."""
        return [np.frombuffer(memoryview(self.parts[name]).cast("B"), np.uint8) for name in self.binding_names()]

    @property
    def nbytes(self) -> int:
        return sum(self.part_bytes().values())

    def overrides(self) -> dict[str, int]:
        """The encoding's overrides (BLOCK, SCALE_F16, ZERO_MIN), as both families name them."""
        out = {}
        if self.encoding in BLOCKED:
            out |= {"BLOCK": self.block, "SCALE_F16": int(self.scale_type == "f16")}
        if self.encoding in ("q4", "q5"):
            out["ZERO_MIN"] = int(self.zero == "min")
        return out

    def descriptor(self) -> dict | None:
        """The quantization fields artifact/quant.py's decoder reads (None for f32/f16)."""
        if self.block is None:
            return None
        out = {"block_elements": self.block, "zero": self.zero or "none", "scale_type": self.scale_type}
        if self.encoding in SUB_SCALE_TYPES:
            out |= {"sub_scale_type": SUB_SCALE_TYPES[self.encoding], "min_type": "f16"}
        return out

    def dequantize(self) -> np.ndarray:
        """W as f32 [rows, cols], by the artifact's own decoder."""
        return quant.dequantize(self.encoding, (self.rows, self.cols), self.descriptor(), self.parts)

    @classmethod
    def of_tensor(cls, info, rows: int | None = None, parts: dict | None = None) -> "Weights":
        """A manifest tensor's Weights (`rows` of them: a row piece), with `parts` or none (shape
        and encoding facts only: the engine's parts are on the GPU); a vector is one row."""
        all_rows, cols = info.shape if len(info.shape) == 2 else (1, info.shape[0])
        q = info.quant
        return cls(info.encoding, all_rows if rows is None else rows, cols, parts or {},
                   q.block_elements if q else None, q.zero if q and info.encoding in ZEROED else None,
                   q.scale_type if q else None)

    @classmethod
    def from_model(cls, model, name: str) -> "Weights":
        """A validated artifact tensor (of a Model or ValidatedModel); a vector is one row."""
        artifact = getattr(model, "artifact", model)
        return cls.of_tensor(artifact.manifest.tensors[name], parts=dict(artifact.tensor_parts(name)))

    @classmethod
    def quantized(cls, w: np.ndarray, encoding: str, block: int = 32, zero: str = "min",
                  scale_type: str = "f16") -> "Weights":
        """A float matrix encoded with the artifact's own codecs (tests and benchmarks)."""
        rows, cols = w.shape
        if encoding == "q4":
            return cls("q4", rows, cols, quant.quantize_q4(w, block, zero, scale_type), block, zero, scale_type)
        if encoding == "q8":
            return cls("q8", rows, cols, quant.quantize_q8(w, block, scale_type), block, None, scale_type)
        if encoding in ("f16", "f32"):
            encode = quant.encode_f16 if encoding == "f16" else quant.encode_f32
            return cls(encoding, rows, cols, encode(w))
        raise ValueError(f"no quantizer for {encoding!r} here: make its parts with kernels/kquant.py")
