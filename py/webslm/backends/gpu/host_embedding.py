"""Embedding rows gathered on the host, for a token_embd the plan split into row pieces.

A table larger than one storage binding (Gemma 3's 262,144 x 640 embedding in q8 is 168 MB;
the compatibility tier binds 128 MiB) is cut into row pieces by the planner (plan/memory.py
split-rows). The head multiplies piece by piece (one matmul op per piece), but the gather
kernel (kernels/embed.py) binds the table whole, so the step program's embed op becomes
"host_embed" (program/ops.py): the host decodes the step's T rows from the artifact, exactly
as artifact/quant.py dequantizes (the CPU path's values), and writes them into the x
activation with the token ids, before the step's dispatches. A decode step adds one row
(D f32) to its writes; a prefill chunk T rows.
"""
from __future__ import annotations

import numpy as np

import dataclasses

from ...artifact.quant import dequantize


class HostEmbedding:
    """token_embd's rows on demand, decoded from the validated artifact's parts (no copy)."""

    def __init__(self, model):
        info = model.manifest.tensors["token_embd"]
        self.encoding, self.quant = info.encoding, info.quant
        self.rows, self.cols = info.shape
        self.parts = {part: np.frombuffer(view, np.uint8) for part, view in model.tensor_parts("token_embd").items()}
        self.row_bytes = {part: data.size // self.rows for part, data in self.parts.items()}

    def rows_of(self, ids) -> np.ndarray:
        """[T, D] f32: the rows of `ids` (checked by the backend: 0 <= id < vocab)."""
        out = np.empty((len(ids), self.cols), np.float32)
        quant = dataclasses.asdict(self.quant) if self.quant else None
        for i, token in enumerate(ids):
            parts = {part: data[token * self.row_bytes[part]:(token + 1) * self.row_bytes[part]].tobytes()
                     for part, data in self.parts.items()}
            out[i] = dequantize(self.encoding, (1, self.cols), quant, parts)[0]
        return out
