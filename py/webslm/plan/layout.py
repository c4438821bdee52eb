"""How a memory plan's bytes are laid out (plan/memory.py builds the plan): its records (Buffer,
Region), the packer that places regions back to back in buffers of a bounded size, and the
weights' layout: every tensor part in file order at 256-aligned offsets, the projections that
read one input row stacked part-major (one dispatch for q, k, v), and parts too large for one
binding split by rows. Nothing here knows a GPU object.
"""
from __future__ import annotations

import dataclasses
import math
from typing import Any, Mapping

from ..errors import CodedError

WEIGHT_ALIGNMENT = 256                               # docs/slm-format.md: every part 256-aligned
# GPUBufferUsage flags, the WebGPU specification's values (as webgpu/interface.py BufferUsage).
USAGE = {"MAP_READ": 0x1, "MAP_WRITE": 0x2, "COPY_SRC": 0x4, "COPY_DST": 0x8, "UNIFORM": 0x40, "STORAGE": 0x80}


class PlanRejected(CodedError):
    """No plan exists for this model, these limits and this policy. Codes: missing-limit,
    bad-limit, bad-policy, bad-manifest, no-split, kv-layout, kv-too-large, too-large."""


def fail(code: str, where: str, sentence: str):
    raise PlanRejected(code, where, sentence)


def align(n: int, a: int) -> int:
    return -(-n // a) * a


@dataclasses.dataclass(frozen=True)
class Buffer:
    name: str
    part: str
    size: int
    usage: tuple[str, ...]
    usage_bits: int


@dataclasses.dataclass(frozen=True)
class Region:
    name: str
    part: str
    buffer: str
    offset: int
    size: int
    alignment: int
    binding: str                      # "read-only-storage" | "storage" | "uniform" | "copy"
    schedule: str | None = None       # None: live for the whole session
    interval: tuple[int, int] | None = None
    source: Mapping[str, Any] | None = None   # weights: tensor, part, file_offset, length, rows
    slots: int | None = None          # uniforms: slot count, stride and bound size
    slot_stride: int | None = None
    binding_size: int | None = None


class Packer:
    """Regions packed next-fit, in the order given, into buffers of at most `cap` bytes."""

    def __init__(self, prefix: str, part: str, usage: tuple[str, ...], cap: int):
        self.prefix, self.part, self.usage, self.cap = prefix, part, usage, cap
        self.names: list[str] = []
        self.sizes: list[int] = []
        self.regions: list[Region] = []

    def add(self, name: str, size: int, alignment: int, binding: str, **fields) -> Region:
        if size > self.cap:
            fail("too-large", name, f"{name} needs {size} bytes in one buffer, more than maxBufferSize {self.cap}")
        offset = align(self.sizes[-1], alignment) if self.sizes else 0
        if not self.sizes or offset + size > self.cap:
            self.names.append(f"{self.prefix}.{len(self.sizes)}")
            self.sizes.append(0)
            offset = 0
        region = Region(name, self.part, self.names[-1], offset, size, alignment, binding, **fields)
        self.sizes[-1] = offset + size
        self.regions.append(region)
        return region

    def reserve(self, size: int) -> None:
        """Start a new buffer unless `size` more bytes fit in the current one (kept together)."""
        if self.sizes and align(self.sizes[-1], WEIGHT_ALIGNMENT) + size > self.cap:
            self.names.append(f"{self.prefix}.{len(self.sizes)}")
            self.sizes.append(0)

    def buffers(self) -> list[Buffer]:
        bits = sum(USAGE[u] for u in self.usage)
        return [Buffer(name, self.part, size, self.usage, bits) for name, size in zip(self.names, self.sizes)]


# -- the weights ---------------------------------------------------------------------------------

def tensors_in_file_order(manifest) -> list:
    """The tensor table ordered by where each tensor sits in the file, whatever the order of the
    mapping: the plan must not depend on a dict's iteration order."""
    return sorted(manifest.tensors.values(), key=lambda t: (min(o for _, o, _ in t.parts), t.name))


def split_rows(info, limit: int, w_align: int, s_align: int) -> int | None:
    """Rows per piece when some part of `info` exceeds one binding, None when none does.

    A piece's row count is a multiple of `unit`, the fewest rows whose bytes are a multiple of
    the weight alignment in every part and of the storage alignment in the output row (4 bytes
    a row), so the pieces of a part lie back to back at aligned offsets and the rows a piece
    produces can be bound as their own range of the output."""
    lengths = {part: length for part, _, length in info.parts}
    if all(align(length, 4) <= limit for length in lengths.values()):
        return None
    rows = info.rows
    for part, length in lengths.items():
        if length % rows:
            fail("bad-manifest", info.name, f"part {part} ({length} bytes) is not {rows} equal rows")
    row_bytes = [length // rows for length in lengths.values()]
    unit = math.lcm(*(w_align // math.gcd(w_align, rb) for rb in row_bytes), s_align // math.gcd(s_align, 4))
    per_piece = (limit // max(row_bytes)) // unit * unit
    if per_piece == 0:
        what = (f"a single row of {max(row_bytes)} bytes" if rows == 1 else
                f"{unit} rows (the fewest that keep a split aligned) take {unit * max(row_bytes)} bytes, which")
        fail("no-split", info.name, f"{what} exceeds the binding limit {limit}: no split strategy applies")
    return min(per_piece, rows)


# Projections that read the same input row: a layer's q, k, v and its gate, up. When their
# encodings match and every part is a whole number of alignment units, the planner lays them
# out part-major (q codes, k codes, v codes, q scales, ...) with no gaps, so the decode step
# can multiply them as one stacked matrix: one dispatch instead of three (or two).
ROW_GROUPS = (("attn_q", "attn_k", "attn_v"), ("ffn_gate", "ffn_up"))


def row_groups(manifest, limit: int, w_align: int) -> dict[str, list]:
    """tensor name -> its group's infos (in ROW_GROUPS order), for the groups that can stack."""
    out = {}
    layers = sorted({int(n.split(".")[1]) for n in manifest.tensors if n.startswith("blk.")})
    for layer in layers:
        for names in ROW_GROUPS:
            infos = [manifest.tensors.get(f"blk.{layer}.{n}") for n in names]
            if any(i is None or len(i.shape) != 2 for i in infos):
                continue
            first = infos[0]
            same = all((i.encoding, i.quant, i.shape[1], [p for p, _, _ in i.parts]) ==
                       (first.encoding, first.quant, first.shape[1], [p for p, _, _ in first.parts]) for i in infos)
            if not same or any(length % w_align for i in infos for _, _, length in i.parts):
                continue
            if max(sum(i.parts[k][2] for i in infos) for k in range(len(first.parts))) <= limit:
                out.update({i.name: infos for i in infos})
    return out


def weight_layout(manifest, limits, w_align: int, s_align: int) -> tuple[Packer, list[dict]]:
    limit = min(limits["maxStorageBufferBindingSize"], limits["maxBufferSize"])
    packer = Packer("weights", "weights", ("STORAGE", "COPY_DST"), limits["maxBufferSize"])
    splits = []
    groups = row_groups(manifest, limit, w_align)
    placed: set[str] = set()
    for info in tensors_in_file_order(manifest):
        if info.name in placed:
            continue
        group = groups.get(info.name)
        if group:       # part-major, back to back: the group binds as one matrix (see row_groups)
            packer.reserve(sum(align(length, 4) for member in group for _, _, length in member.parts))
            for part_index in range(len(info.parts)):
                for member in group:
                    part, file_offset, length = member.parts[part_index]
                    packer.add(f"w.{member.name}.{part}", align(length, 4), w_align, "read-only-storage",
                               source={"tensor": member.name, "part": part, "file_offset": file_offset,
                                       "length": length, "rows": [0, member.rows]})
            placed.update(member.name for member in group)
            continue
        per_piece = split_rows(info, limit, w_align, s_align)
        if per_piece is None:
            for part, file_offset, length in info.parts:
                packer.add(f"w.{info.name}.{part}", align(length, 4), w_align, "read-only-storage",
                           source={"tensor": info.name, "part": part, "file_offset": file_offset,
                                   "length": length, "rows": [0, info.rows]})
            continue
        cuts = list(range(0, info.rows, per_piece)) + [info.rows]
        pieces = {}
        for part, file_offset, length in info.parts:          # part by part, pieces in row order
            row_bytes, names = length // info.rows, []
            for a, z in zip(cuts, cuts[1:]):
                name = f"w.{info.name}.{part}[{a}:{z}]"
                packer.add(name, align((z - a) * row_bytes, 4), w_align, "read-only-storage",
                           source={"tensor": info.name, "part": part, "file_offset": file_offset + a * row_bytes,
                                   "length": (z - a) * row_bytes, "rows": [a, z]})
                names.append(name)
            pieces[part] = names
        biggest = max(info.parts, key=lambda p: p[2])
        splits.append({"tensor": info.name, "strategy": "split-rows", "rows": info.rows,
                       "rows_per_piece": per_piece, "pieces": pieces,
                       "part_lengths": {part: length for part, _, length in info.parts},
                       "buffers": sorted({r.buffer for r in packer.regions if r.source["tensor"] == info.name}),
                       "reason": f"part {biggest[0]} of {biggest[2]} bytes exceeds the binding limit {limit}"})
    return packer, splits
