"""The admitted session's buffers seen through the memory plan: named ranges to bind.

Admission created one GPU buffer per planned buffer and uploaded the weights into their
regions; everything the executor binds is a region of the plan (docs/architecture.md,
"memory plan"): weights (one region per tensor part, or per row piece of a split tensor),
the KV cache per layer, the params uniforms, the RoPE table, the activations of each
schedule, the readback staging. Nothing here allocates.
"""
from __future__ import annotations

import dataclasses

import numpy as np

from ...kernels.weights import Weights
from ...webgpu.interface import BufferBinding


class Regions:
    """Name -> BufferBinding of a region (or a sub-range of it) of the session's buffers."""

    def __init__(self, plan, buffers: dict):
        self.plan = plan
        self.buffers = buffers
        self.by_name = {r.name: r for r in plan.regions}

    def __getitem__(self, name: str):
        return self.by_name[name]

    def bind(self, name: str, offset: int = 0, size: int | None = None) -> BufferBinding:
        """Bytes [offset, offset + size) of region `name` (to the region's end by default)."""
        region = self.by_name[name]
        size = region.size - offset if size is None else size
        if offset < 0 or size <= 0 or offset + size > region.size:
            raise ValueError(f"range [{offset}, {offset + size}) is outside region {name} ({region.size} bytes)")
        return BufferBinding(self.buffers[region.buffer], region.offset + offset, size)

    def buffer(self, name: str):
        return self.buffers[self.by_name[name].buffer]

    def offset(self, name: str) -> int:
        return self.by_name[name].offset


@dataclasses.dataclass(frozen=True)
class MatrixPiece:
    """Rows [row_start, row_start + weights.rows) of a weight matrix, bound as stored."""
    weights: Weights                 # shape and encoding facts only (parts are on the GPU)
    row_start: int
    parts: tuple[BufferBinding, ...]  # in the kernels' binding order (PART_NAMES)


def matrix(regions: Regions, manifest, tensor: str) -> list[MatrixPiece]:
    """The pieces of a 2-D weight tensor: one, or the planner's row split (plan.splits)."""
    info = manifest.tensors[tensor]
    rows = info.shape[0]
    split = next((s for s in regions.plan.splits if s["tensor"] == tensor), None)
    cuts = [(0, rows)] if split is None else [
        (a, min(a + split["rows_per_piece"], rows)) for a in range(0, rows, split["rows_per_piece"])]
    pieces = []
    for a, z in cuts:
        weights = Weights.of_tensor(info, z - a)
        names = weights.binding_names()          # q4/q5 "offset": scales again in the mins slot
        suffix = "" if split is None else f"[{a}:{z}]"
        parts = tuple(regions.bind(f"w.{tensor}.{name}{suffix}") for name in names)
        pieces.append(MatrixPiece(weights, a, parts))
    return pieces


def stacked(regions: Regions, manifest, tensors: list[str]) -> MatrixPiece | None:
    """The tensors as one matrix of their rows stacked, when the planner laid them out part
    by part back to back (plan/memory.py ROW_GROUPS); None when it did not."""
    pieces = [matrix(regions, manifest, name) for name in tensors]
    if any(len(p) != 1 for p in pieces):
        return None
    pieces = [p[0] for p in pieces]
    parts = []
    for index in range(len(pieces[0].parts)):
        ranges = [p.parts[index] for p in pieces]
        for a, b in zip(ranges, ranges[1:]):
            if b.buffer is not a.buffer or b.offset != a.offset + a.size:
                return None
        parts.append(BufferBinding(ranges[0].buffer, ranges[0].offset, sum(r.size for r in ranges)))
    first = pieces[0].weights
    weights = dataclasses.replace(first, rows=sum(p.weights.rows for p in pieces))
    return MatrixPiece(weights, 0, tuple(parts))


def vector(regions: Regions, tensor: str) -> BufferBinding:
    """A norm weight (f32, one region)."""
    return regions.bind(f"w.{tensor}.data")


class ParamsTable:
    """The params uniforms of one schedule: one slot per distinct kernel launch (program/ops.py
    Op.slot: the same for every layer of one shape and weight form), written from this host-side copy.

    Slot i lives at region offset i * stride and is bound with the kernels' 64-byte size. The
    slots that change every decode step (RoPE, KV append, attention: the position) come
    first, so a step rewrites one contiguous range."""

    def __init__(self, regions: Regions, schedule: str, names: list[str]):
        self.region = regions[f"params.{schedule}"]
        if len(names) > self.region.slots:
            raise ValueError(f"{len(names)} params slots needed, the plan has {self.region.slots}")
        self.regions, self.name = regions, f"params.{schedule}"
        self.stride = self.region.slot_stride
        self.index = {name: i for i, name in enumerate(names)}
        self.words = np.zeros(len(names) * self.stride // 4, np.uint32)

    def set(self, slot: str, words: np.ndarray) -> None:
        start = self.index[slot] * self.stride // 4
        self.words[start:start + self.stride // 4] = 0
        self.words[start:start + words.size] = words

    def binding(self, slot: str) -> BufferBinding:
        return self.regions.bind(self.name, self.index[slot] * self.stride, self.region.binding_size)

    def write(self, first: int = 0, count: int | None = None) -> tuple:
        """(buffer, offset, words) writing slots first .. first + count - 1."""
        count = len(self.index) - first if count is None else count
        per = self.stride // 4
        return (self.regions.buffer(self.name), self.region.offset + first * self.stride,
                self.words[first * per:(first + count) * per])
