"""Converters into .slm (native only: they use the `gguf` and `safetensors` readers).

    gguf.py          llama-architecture GGUF -> .slm, lossless repack where possible
    safetensors.py   Hugging Face safetensors directory -> .slm, round-to-nearest quantization

Both return a ConversionReport and write through webslm.artifact.writer.
"""
from __future__ import annotations

import dataclasses


@dataclasses.dataclass
class ConversionReport:
    output: str
    sha256: str                                   # the written artifact's identity
    tensors: int
    lossless: list[str] = dataclasses.field(default_factory=list)        # repacked bit-exactly
    requantized: dict[str, float] = dataclasses.field(default_factory=dict)  # name -> max abs error
    notes: list[str] = dataclasses.field(default_factory=list)


class ConversionError(ValueError):
    """The source cannot be converted (unsupported architecture or tensor type, bad files)."""
