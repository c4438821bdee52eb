"""Prefill GEMM: Y[M, N] = X[M, K] W[N, K]^T for M > 1, W in any .slm encoding (q4, q8, f16,
f32, and q5, q4k, q5k, q6k: their one decoder file gemm_<enc>.wgsl serves both kinds).

Prefill multiplies many activation rows by the same weights, so it is compute-bound: the
kernels tile Y in 2-D per workgroup, dequantize each W tile into workgroup memory once per
K step (reused by every row of the tile), and multiply register blocks with f32 FMAs.
The kernel kinds share bindings 0..2, the params and the stores (gemm_sections.wgsl; the
WGSL comes from trusted bundle files):

    classic  gemm_<enc>              gemm_main.wgsl + gemm_<enc>.wgsl: RM x 4 register blocks,
                                     one workgroup tile, two barriers a K step of 32
    tiled    gemm_tiled_<enc>        gemm_tiled_main.wgsl + gemm_tiled_<enc>.wgsl: RM x RN
             gemm_tiled_half_<enc>   register blocks (4 or 8 each way), the next step's loads in
                                     registers during the multiply, two workgroup tiles (one
                                     barrier a step), column sections; `_half` keeps the tiles
                                     in f16 (needs shader-f16; its own error bound)

    overrides  classic  WG_X 8|16, WG_Y 8|16, RM 4|8
               tiled    WG_X 16, WG_Y 8|16, RM 4|8, RN 4|8, BK 16|32, STAGES 1|2
               both     ACCUMULATE 0|1 (Y += X W^T); q4/q8/q5 BLOCK 32..256, SCALE_F16; q4/q5 ZERO_MIN

Bindings: 0 params, 1 x [M][x_stride] f32 (x_stride % 4 == 0), 2 y, 3.. the weight parts
exactly as the artifact stores them, in weights.PART_NAMES order (q4: codes, scales, mins; q8:
codes, scales; f16/f32: data; q6k: codes, high_bits, scales, sub_scales; ...); q4 and q5
"offset" bind their scales again in the mins slot.

Host side: `weights.Weights` describes a tensor's parts (shared with matvec.py); TILES names
every variant; `choose_tile` picks one for a device and shape from TILE_ORDER, the knob set
from bench/gemm_sweep.py's measurements; `plan` validates everything before a dispatch and
returns params and grid; `gemm` runs one product on fresh buffers. The oracle is in
gemm_oracle.py, the golden cases in gemm_cases.py; the benchmark hook follows here.
"""
from __future__ import annotations

import dataclasses

import numpy as np

from ..artifact.format import BLOCK_ELEMENTS
from ..errors import CodedError
from ..webgpu.interface import Device
from . import runner
from .gemm_oracle import decode64, oracle, random_parts, wrong_results  # noqa: F401  (the family's API)
from .golden import GoldenContext
from .registry import QUANT_SOURCES, KernelSpec, compile_kernel, register
from .weights import BLOCKED, ENCODINGS, PART_NAMES, Weights
from . import kquant

KT = 32     # the classic kernel's K step (gemm_main.wgsl)
U32_LIMIT = runner.U32_LIMIT
MAX_SECTIONS = 3   # column sections the tiled kernel can write (q | k | v)
# The outer-product kernel decodes 16 weights a row and K step: the encodings whose decoder
# file has UNIT = 16 (f16 and f32 keep the classic and tiled kernels).
OUTER_ENCODINGS = ("q4", "q8", "q5", "q4k", "q5k", "q6k")


def kernel_name(encoding: str) -> str:
    """The classic kernel of an encoding (tiles name their own: Tile.kernel)."""
    return f"gemm_{encoding}"


def _specs():
    classic = {"WG_X": (8, 16), "WG_Y": (8, 16), "RM": (4, 8), "ACCUMULATE": (0, 1)}
    tiled = {"WG_X": (16,), "WG_Y": (8, 16), "RM": (4, 8), "RN": (4, 8), "BK": (16, 32), "STAGES": (1, 2),
             "KSPLIT": (1, 2, 4), "ACCUMULATE": (0, 1)}
    outer = {"WG_X": (8, 16), "WG_Y": (4, 8, 16), "BK": (16, 32), "ACCUMULATE": (0, 1), "KPARTS": (1, 2, 4, 8)}
    bindings = ("uniform", "read-only-storage", "storage")
    for encoding in ENCODINGS:
        quant = QUANT_SOURCES.get(encoding, ())
        weights = {}
        if encoding in BLOCKED:
            weights |= {"BLOCK": BLOCK_ELEMENTS, "SCALE_F16": (0, 1)}
        if encoding in ("q4", "q5"):
            weights |= {"ZERO_MIN": (0, 1)}
        parts = ("read-only-storage",) * len(PART_NAMES[encoding])
        # q5 and the super-blocks: one decoder file (16-weight units) for both kernel kinds
        tiled_file = f"gemm_{encoding}.wgsl" if encoding in kquant.ENCODINGS else f"gemm_tiled_{encoding}.wgsl"
        # gemm_sections.wgsl (params, bindings 0..2, the stores: every kind shares them), then
        # the encoding file (and the scale helpers that use its SCALE_F16) precede the main
        # file: see the note at the top of gemm_main.wgsl
        shared = ("common_quant.wgsl", "gemm_sections.wgsl")
        yield KernelSpec(f"gemm_{encoding}", (*shared, f"gemm_{encoding}.wgsl", *quant, "gemm_main.wgsl"),
                         "main", bindings + parts, classic | weights)
        body = (*shared, tiled_file, *quant, "gemm_tiled_main.wgsl")
        yield KernelSpec(f"gemm_tiled_{encoding}", ("gemm_tiled_full.wgsl", *body), "main", bindings + parts,
                         tiled | weights)
        yield KernelSpec(f"gemm_tiled_half_{encoding}", ("enable_f16.wgsl", "gemm_tiled_half.wgsl", *body), "main",
                         bindings + parts, tiled | weights, frozenset({"shader-f16"}))
        if encoding in OUTER_ENCODINGS:
            yield KernelSpec(f"gemm_outer_{encoding}", (*shared, tiled_file, *quant, "gemm_outer_main.wgsl"),
                             "main", bindings + parts, outer | weights)


register(*_specs())


class GemmError(CodedError):
    """A GEMM that cannot run as asked; codes: bad-encoding, dimension-mismatch,
    buffer-too-small, offset-overflow, binding-too-large, too-many-workgroups, tile-not-admitted,
    bad-sections."""


# -- tiles ----------------------------------------------------------------------------------

@dataclasses.dataclass(frozen=True)
class Tile:
    """A classic tile: TM = RM WG_Y rows of Y by TN = 4 WG_X columns, K steps of 32."""
    wg_x: int     # invocations along N (4 columns each)
    wg_y: int     # invocations along M (RM rows each)
    rm: int
    half = False
    sections = False   # plan gives the classic tiles (the fallback) one [M][y_stride] output

    @property
    def tm(self) -> int:
        return self.rm * self.wg_y

    @property
    def tn(self) -> int:
        return 4 * self.wg_x

    @property
    def invocations(self) -> int:
        return self.wg_x * self.wg_y

    @property
    def workgroup_bytes(self) -> int:
        return (self.tm + self.tn) * KT * 4

    @property
    def name(self) -> str:
        return next((name for name, tile in TILES.items() if tile == self), f"classic {self.tm}x{self.tn}")

    def kernel(self, encoding: str) -> str:
        return f"gemm_{encoding}"

    def serves(self, encoding: str | None) -> bool:
        return True

    def overrides(self) -> dict[str, int]:
        return {"WG_X": self.wg_x, "WG_Y": self.wg_y, "RM": self.rm}

    def admitted(self, limits: dict[str, int], features=frozenset()) -> bool:
        return (self.invocations <= runner.max_invocations(limits)
                and self.workgroup_bytes <= limits["maxComputeWorkgroupStorageSize"])


@dataclasses.dataclass(frozen=True)
class RegisterTile:
    """A tiled-kernel tile: TM = RM WG_Y rows of Y (tokens) by TN = RN * 16 columns (weight
    rows), each invocation an RM x RN register block; K steps of BK through STAGES workgroup
    tiles of f32 (or f16: half) with rows padded by 4 elements; KSPLIT slices of invocations
    share each step's k (their blocks added at the end through `red`)."""
    wg_y: int
    rm: int
    rn: int
    bk: int = 16
    stages: int = 2
    half: bool = False
    ksplit: int = 1
    wg_x = 16
    sections = True

    @property
    def tm(self) -> int:
        return self.rm * self.wg_y

    @property
    def tn(self) -> int:
        return self.rn * self.wg_x

    @property
    def invocations(self) -> int:
        return self.wg_x * self.wg_y * self.ksplit

    @property
    def workgroup_bytes(self) -> int:
        tiles = self.stages * (self.tm + self.tn) * (self.bk + 4) * (2 if self.half else 4)
        return tiles + (self.ksplit > 1) * self.tm * self.tn * 4 + 16      # + `red`

    @property
    def name(self) -> str:
        return (f"{self.tm}x{self.tn}/{self.rm}x{self.rn}/k{self.bk}/s{self.stages}" + ("/h" if self.half else "")
                + (f"/x{self.ksplit}" if self.ksplit > 1 else ""))

    def kernel(self, encoding: str) -> str:
        return f"gemm_tiled_half_{encoding}" if self.half else f"gemm_tiled_{encoding}"

    def serves(self, encoding: str | None) -> bool:
        return True

    def overrides(self) -> dict[str, int]:
        return {"WG_X": self.wg_x, "WG_Y": self.wg_y, "RM": self.rm, "RN": self.rn, "BK": self.bk,
                "STAGES": self.stages, "KSPLIT": self.ksplit}

    def admitted(self, limits: dict[str, int], features=frozenset()) -> bool:
        return (self.invocations <= runner.max_invocations(limits)
                and self.workgroup_bytes <= limits["maxComputeWorkgroupStorageSize"]
                and (not self.half or "shader-f16" in features))


@dataclasses.dataclass(frozen=True)
class OuterTile:
    """An outer-product tile (gemm_outer_main.wgsl): TM = 8 WG_Y rows of Y (tokens) by
    TN = 8 WG_X columns, each invocation an 8 x 8 block in named registers; K steps of BK
    (16 or 32) through two workgroup stages. Only the encodings decoded 16 weights at a time."""
    wg_x: int
    wg_y: int
    bk: int = 16
    half = False
    ksplit = 1
    sections = True

    @property
    def tm(self) -> int:
        return 8 * self.wg_y

    @property
    def tn(self) -> int:
        return 8 * self.wg_x

    @property
    def invocations(self) -> int:
        return self.wg_x * self.wg_y

    @property
    def workgroup_bytes(self) -> int:
        return 2 * (self.tm + self.tn) * self.bk * 4

    @property
    def name(self) -> str:
        return f"{self.tm}x{self.tn}" + ("/k32" if self.bk == 32 else "") + "/o"

    def kernel(self, encoding: str) -> str:
        return f"gemm_outer_{encoding}"

    def serves(self, encoding: str | None) -> bool:
        return encoding in OUTER_ENCODINGS

    def overrides(self) -> dict[str, int]:
        return {"WG_X": self.wg_x, "WG_Y": self.wg_y, "BK": self.bk}

    def admitted(self, limits: dict[str, int], features=frozenset()) -> bool:
        return (self.invocations <= runner.max_invocations(limits)
                and self.workgroup_bytes <= limits["maxComputeWorkgroupStorageSize"])


def _tiled(*tiles: RegisterTile) -> dict[str, RegisterTile]:
    return {tile.name: tile for tile in tiles}


# Every variant by name. Classic tiles: 32x32 (64 invocations, 8 KiB) and 64x64 (128, 16 KiB)
# fit every device, compatibility mode included. Tiled: 128 to 512 invocations, 15-40 KiB.
TILES: dict[str, Tile | RegisterTile | OuterTile] = {
    "128x64": Tile(16, 16, 8),
    "64x64w": Tile(16, 16, 4),
    "64x64": Tile(16, 8, 8),
    "32x32": Tile(8, 8, 4),
} | _tiled(
    RegisterTile(16, 8, 8, 16, 2),     # 128x128, 40 KiB
    RegisterTile(16, 8, 8, 16, 1),     # 128x128, 20 KiB
    RegisterTile(16, 8, 8, 32, 1),     # 128x128, 36 KiB
    RegisterTile(16, 4, 8, 16, 2),     # 64x128, 30 KiB
    RegisterTile(16, 8, 4, 16, 2),     # 128x64, 30 KiB
    RegisterTile(8, 8, 8, 16, 2),      # 64x128, 128 invocations, 30 KiB
    RegisterTile(16, 4, 4, 32, 2),     # 64x64, 36 KiB
    RegisterTile(16, 4, 4, 16, 2),     # 64x64, 20 KiB
    RegisterTile(8, 8, 4, 16, 2),      # 64x64, 128 invocations, 20 KiB
    RegisterTile(8, 4, 8, 16, 2),      # 32x128, 128 invocations, 25 KiB
    RegisterTile(8, 4, 4, 16, 2),      # 32x64, 128 invocations, 15 KiB: fits every core device
    RegisterTile(8, 4, 4, 32, 2),      # 32x64, 128 invocations, 27 KiB
    RegisterTile(16, 4, 8, 32, 1),     # 64x128, 27 KiB
    RegisterTile(8, 4, 4, 16, 2, ksplit=2),      # 32x64, 2 K slices: 256 invocations, 23 KiB
    RegisterTile(8, 4, 4, 32, 1, ksplit=4),      # 32x64, 4 K slices: 512 invocations, 22 KiB
    RegisterTile(16, 4, 4, 16, 1, ksplit=2),     # 64x64, 2 K slices: 512 invocations, 26 KiB
    RegisterTile(8, 4, 8, 16, 1, ksplit=2),      # 32x128, 2 K slices: 256 invocations, 29 KiB
    RegisterTile(16, 8, 8, 32, 2, half=True),    # 128x128, f16 tiles, 36 KiB
    RegisterTile(16, 8, 8, 16, 2, half=True),    # 128x128, f16 tiles, 20 KiB
    RegisterTile(16, 4, 8, 32, 2, half=True),    # 64x128, f16 tiles, 27 KiB
    RegisterTile(8, 4, 4, 32, 2, half=True),     # 32x64, f16 tiles, 14 KiB
) | {tile.name: tile for tile in (
    OuterTile(16, 16),                 # 128x128, 256 invocations, 32 KiB
    OuterTile(16, 8),                  # 64x128, 128 invocations, 24 KiB
    OuterTile(8, 8),                   # 64x64, 64 invocations, 16 KiB: fits every core device
    OuterTile(16, 4),                  # 32x128, 64 invocations, 20 KiB
    OuterTile(8, 4),                   # 32x64, 32 invocations, 12 KiB
    OuterTile(16, 8, 32),              # 64x128, K steps of 32: 48 KiB
    OuterTile(8, 8, 32),               # 64x64, 32 KiB
    OuterTile(16, 4, 32),              # 32x128, 40 KiB
    OuterTile(8, 4, 32),               # 32x64, 24 KiB
)}

# THE KNOB (set from `bench/gemm_sweep.py`'s H200 run: it prints a recommended setting). Per
# tier, the tiles the host may choose, largest first; `choose_tile` takes the first one the
# device admits that gives >= MIN_WORKGROUPS workgroups for the shape and is not taller than
# M needs, else the admitted one giving the most workgroups (ties: the most invocations, so a
# split-K "/x2" tile wins where no tile fills the GPU). Tier A: f32 tiles only; tier B
# (shader-f16) may list "/h" tiles, whose bound is looser and which need activations within
# the f16 range (docs/kernels.md), so they are not listed until measured to win. The classic
# tiles are the fallback for a device that admits none of the listed ones.
#
# Set from the H200 sweeps of 2026-12-02. First (bench/results/gemm_sweep_h200.json): the classic
# tiles were the fastest in every one of the 16 q4 cells (13.9 ms summed, against 23.6 ms for the
# best register tile of each cell). Then (gemm_sweep_outer_h200.json, gemm_sweep_outer_k32_h200.json)
# the outer-product tiles won 13 of the 16 q4 cells and 12 of 16 q8 ones (Llama-3.2-1B gate|up
# 20.4 TFLOP/s at T = 128 and 512, 2.9x the classic 128x64; the cells they lose are within 7%,
# where every tile sits at the ~90 us a small K costs), K steps of 32 another 5-10% where K is
# long and workgroups few. So, for the encodings they serve (OUTER_ENCODINGS), they come first:
# this order with MIN_WORKGROUPS 96 sums to 1.05x the best tile of every q4 cell (the sweep's
# table replayed through choose_tile); the smaller tiles after the first two are for devices
# with less workgroup memory. f16 and f32 weights skip them (`serves`) and keep the classic
# tiles, then the register tiles for what only those do (q|k|v column sections).
_OUTER_ORDER = ("128x128/o", "64x128/k32/o", "64x128/o", "64x64/k32/o", "64x64/o", "32x128/o")
_REGISTER_ORDER = ("128x128/8x8/k32/s1", "128x64/8x4/k16/s2", "64x64/4x4/k32/s2", "32x128/4x8/k16/s2",
                   "64x64/4x4/k16/s1/x2", "32x128/4x8/k16/s1/x2", "32x64/4x4/k32/s1/x4")
TILE_ORDER: dict[str, tuple[str, ...]] = {
    "A": _OUTER_ORDER + ("128x64", "64x64w", "64x64", "32x32") + _REGISTER_ORDER,
    "B": _OUTER_ORDER + ("128x64", "64x64w", "64x64", "32x32") + _REGISTER_ORDER,
}
CLASSIC_FALLBACK = ("128x64", "64x64w", "64x64", "32x32")
# Below this many tiles a large GPU idles (an H200 has 132 multiprocessors): prefer a smaller tile.
MIN_WORKGROUPS = 96


def tier_of(features) -> str:
    return "B" if "shader-f16" in set(features or ()) else "A"


def candidates(limits: dict[str, int], features=frozenset(), order: tuple[str, ...] | None = None,
               encoding: str | None = None) -> list:
    """The tiles `choose_tile` picks among on this device, in preference order: those of the
    tier's order the device admits (and that serve `encoding`, when given), or the classic
    tiles when it admits none of them."""
    names = order if order is not None else TILE_ORDER[tier_of(features)]
    ordered = [TILES[name] for name in dict.fromkeys(names)
               if TILES[name].admitted(limits, features) and (encoding is None or TILES[name].serves(encoding))]
    return ordered or [TILES[name] for name in CLASSIC_FALLBACK if TILES[name].admitted(limits, features)]


def choose_tile(limits: dict[str, int], m: int, n: int, features=frozenset(),
                order: tuple[str, ...] | None = None, min_workgroups: int | None = None,
                need_sections: bool = False, encoding: str | None = None):
    """The first admitted tile of the tier's order that still gives MIN_WORKGROUPS tiles (else
    the admitted tile giving the most), never a tile taller than M needs; a tiled one when the
    output has column sections."""
    admitted = [t for t in candidates(limits, features, order, encoding) if t.sections or not need_sections]
    if not admitted:
        raise GemmError("tile-not-admitted", "limits", f"no GEMM tile fits {limits}")
    fitting = [t for t in admitted if t.tm <= max(32, m)] or admitted
    least = MIN_WORKGROUPS if min_workgroups is None else min_workgroups

    def count(t) -> int:
        return -(-m // t.tm) * -(-n // t.tn)

    busy = [t for t in fitting if count(t) >= least]
    return busy[0] if busy else max(fitting, key=lambda t: (count(t), t.invocations))


# -- validation, params, grid ---------------------------------------------------------------

@dataclasses.dataclass(frozen=True)
class GemmPlan:
    kernel: str
    overrides: dict[str, int]
    tile: Tile | RegisterTile
    params: np.ndarray
    grid: tuple[int, int, int]
    binding_bytes: dict[str, int]     # minimum bytes each binding must hold


def _check_sections(sections, n: int, m: int) -> list[tuple[int, int, int]]:
    """[(first column, float offset, row stride)] sorted, section 0 at column 0 and offset 0."""
    if not 1 <= len(sections) <= MAX_SECTIONS or tuple(sections[0][:2]) != (0, 0):
        raise GemmError("bad-sections", "sections", f"1..{MAX_SECTIONS} sections, the first at column 0 "
                        f"and offset 0: {sections}")
    ends = [first for first, _, _ in sections[1:]] + [n]
    for (first, base, stride), end in zip(sections, ends):
        if not first < end or stride < end - first or base < 0:
            raise GemmError("bad-sections", "sections", f"section {(first, base, stride)} must hold columns "
                            f"{first}..{end} with a row stride >= its width")
    spans = sorted((base, base + (m - 1) * stride + (end - first)) for (first, base, stride), end
                   in zip(sections, ends))
    if any(a_end > b_start for (_, a_end), (b_start, _) in zip(spans, spans[1:])):
        raise GemmError("bad-sections", "sections", f"sections overlap in y: {sections}")
    return list(sections)


def plan(limits: dict[str, int], weights: Weights, m: int, x_stride: int | None = None,
         y_stride: int | None = None, accumulate: bool = False, tile=None,
         sections: list[tuple[int, int, int]] | None = None, features=frozenset()) -> GemmPlan:
    """Check every assumption of the kernel's addressing, then choose variant, params, grid.
    `sections` [(first column, float offset, row stride)] splits Y's columns over up to three
    arrays (the tiled kernels only; the first must be (0, 0, y_stride)). Raises GemmError
    before any GPU work."""
    w, n, k = weights, weights.rows, weights.cols
    x_stride = -(-k // 4) * 4 if x_stride is None else x_stride
    y_stride = (n if sections is None else sections[0][2]) if y_stride is None else y_stride
    if w.encoding not in ENCODINGS:
        raise GemmError("bad-encoding", "weights", f"GEMM has no {w.encoding!r} encoding")
    if w.encoding in BLOCKED and (w.block not in BLOCK_ELEMENTS or w.scale_type not in ("f16", "f32")):
        raise GemmError("bad-encoding", "weights", f"block {w.block} / scale type {w.scale_type!r} unsupported")
    if w.encoding in ("q4", "q5") and w.zero not in ("min", "offset"):
        raise GemmError("bad-encoding", "weights", f"{w.encoding} zero must be 'min' or 'offset', not {w.zero!r}")
    if w.encoding in kquant.ENCODINGS and (k % (w.block or 1) or (w.encoding != "q5" and (w.block, w.scale_type)
                                                                   != (256, "f16"))):
        raise GemmError("bad-encoding", "weights", f"{w.encoding} needs whole blocks (K={k}, block {w.block}) and "
                        f"super-blocks of 256 with f16 scales")
    if min(m, n, k) < 1:
        raise GemmError("dimension-mismatch", "shape", f"empty GEMM: M={m} N={n} K={k}")
    if k + KT + max(BLOCK_ELEMENTS) >= U32_LIMIT:   # the K loop and block count must not wrap
        raise GemmError("offset-overflow", "k", f"K={k} is too close to 2^32")
    if x_stride % 4 or x_stride < k:
        raise GemmError("dimension-mismatch", "x_stride", f"{x_stride} must be a multiple of 4 and >= K={k}")
    if sections is None and y_stride < n:
        raise GemmError("dimension-mismatch", "y_stride", f"{y_stride} must be >= N={n}")
    sections = _check_sections(sections or [(0, 0, y_stride)], n, m)
    if sections[0][2] != y_stride:
        raise GemmError("bad-sections", "sections", f"section 0's stride {sections[0][2]} is not y_stride {y_stride}")
    # Minimum binding sizes: x is read as vec4 up to align4(K) in its last row.
    exact = w.part_bytes()
    ends = [first for first, _, _ in sections[1:]] + [n]
    y_floats = max(base + (m - 1) * stride + end - first for (first, base, stride), end in zip(sections, ends))
    need = {"x": ((m - 1) * x_stride + -(-k // 4) * 4) * 4, "y": y_floats * 4}
    need |= {name: -(-length // 4) * 4 for name, length in exact.items()}   # f16 scales: whole words
    # Every index the shader computes is a u32 element (or word, or vec4) index below these.
    largest = {"x": m * x_stride, "y": y_floats + max(stride for _, _, stride in sections),
               **{name: need[name] // 4 for name in exact}}
    for name, count in largest.items():
        if count >= U32_LIMIT:
            raise GemmError("offset-overflow", name, f"{count} elements cannot be indexed with u32")
    binding_limit = limits["maxStorageBufferBindingSize"]
    for name, size in need.items():
        if size > binding_limit:
            raise GemmError("binding-too-large", name, f"{size} bytes exceed maxStorageBufferBindingSize "
                            f"{binding_limit}: the memory planner must split this tensor")
    for name, length in exact.items() if w.parts else ():   # the engine passes GPU buffers: check_bindings
        have = len(memoryview(w.parts[name]).cast("B")) if name in w.parts else 0
        if have < length:
            raise GemmError("buffer-too-small", name, f"part {name} has {have} bytes, needs {length}")
    tile = tile or choose_tile(limits, m, n, features, encoding=w.encoding)
    if not tile.serves(w.encoding):
        raise GemmError("tile-not-admitted", "tile", f"{tile.name} has no {w.encoding} decoder")
    if not tile.admitted(limits, features):
        raise GemmError("tile-not-admitted", "tile", f"{tile} needs {tile.invocations} invocations, "
                        f"{tile.workgroup_bytes} bytes of workgroup memory" + (" and shader-f16" if tile.half else ""))
    if len(sections) > 1 and not tile.sections:
        raise GemmError("bad-sections", "tile", f"the classic tile {tile.name} writes one output array")
    tiles_m = -(-m // tile.tm)
    tiles = tiles_m * -(-n // tile.tn)
    try:
        grid = runner.workgroup_grid(tiles, limits["maxComputeWorkgroupsPerDimension"])
    except ValueError as exc:
        raise GemmError("too-many-workgroups", "grid", str(exc)) from None
    # every kind reads the same params (gemm_sections.wgsl); one section: split1 = split2 = N
    padded = sections + [(n, 0, 0)] * (MAX_SECTIONS - len(sections))
    params = runner.params_words(m, n, k, x_stride, y_stride, tiles_m, tiles,
                                 padded[1][0], padded[2][0], padded[1][1], padded[2][1], padded[1][2], padded[2][2])
    overrides = {**tile.overrides(), **w.overrides(), "ACCUMULATE": int(accumulate)}
    return GemmPlan(tile.kernel(w.encoding), overrides, tile, params, grid, need)


def check_bindings(gemm_plan: GemmPlan, sizes: dict[str, int]) -> None:
    """The engine's buffers (name -> bound bytes, names as in binding_bytes) are big enough."""
    for name, need in gemm_plan.binding_bytes.items():
        if sizes.get(name, 0) < need:
            raise GemmError("buffer-too-small", name, f"{sizes.get(name, 0)} bytes bound, needs {need}")


def padded_activations(x: np.ndarray, fill: float = np.nan, stride: int | None = None) -> tuple[np.ndarray, int]:
    """x [M, K] -> ([M, x_stride] f32, x_stride), x_stride = align4(K) unless given. Tests fill
    the padding with NaN: the kernel must mask it, never multiply it."""
    m, k = x.shape
    stride = -(-k // 4) * 4 if stride is None else stride
    out = np.full((m, stride), fill, np.float32)
    out[:, :k] = x
    return out, stride


async def gemm(ctx_or_device, weights: Weights, x: np.ndarray, y0: np.ndarray | None = None,
               tile=None, x_stride: int | None = None, y_stride: int | None = None,
               sections: list[tuple[int, int, int]] | None = None) -> np.ndarray:
    """Y = x [M, K] W^T (+ y0 when given: the ACCUMULATE variant), once, on fresh buffers.
    Returns [M, y_stride] (y_stride = N unless given; columns past N are whatever the buffer
    held: the NaN poison, or y0's); with sections, the whole flat y buffer (y0 flat too)."""
    ctx = ctx_or_device if isinstance(ctx_or_device, GoldenContext) else GoldenContext(ctx_or_device, None)
    x = np.atleast_2d(np.asarray(x, np.float32))
    if x.shape[1] != weights.cols:
        raise GemmError("dimension-mismatch", "x", f"x has {x.shape[1]} columns, W has {weights.cols}")
    y_stride = (weights.rows if sections is None else sections[0][2]) if y_stride is None else y_stride
    p = plan(ctx.device.limits, weights, x.shape[0], x_stride or -(-weights.cols // 4) * 4, y_stride,
             y0 is not None, tile, sections, ctx.device.features)
    xs, _ = padded_activations(x, stride=x_stride)
    kernel = await ctx.kernel(p.kernel, **p.overrides)
    size = x.shape[0] * y_stride if sections is None else p.binding_bytes["y"] // 4
    out = np.ascontiguousarray(y0, np.float32).reshape(-1) if y0 is not None else (size, np.float32)
    (y,) = await runner.run_once(ctx.device, kernel, p.params, [xs, *weights.bindings()], [out], p.grid)
    return y if sections is not None else y.reshape(x.shape[0], y_stride)


# -- benchmark hook (bench/kernels.py; bench/gemm_sweep.py times every variant) -------------------

def _bench_shapes() -> dict[str, dict]:
    models = {
        "smollm2-135m": {"q/o": (576, 576), "k/v": (192, 576), "gate+up": (3072, 576), "down": (576, 1536)},
        "llama-3.2-1b": {"q/o": (2048, 2048), "k/v": (512, 2048), "gate+up": (16384, 2048), "down": (2048, 8192)},
        "llama-3-8b": {"q/o": (4096, 4096), "k/v": (1024, 4096), "gate+up": (28672, 4096), "down": (4096, 14336)},
    }
    encodings = {"q4min32": {"encoding": "q4", "block": 32, "zero": "min", "scale_type": "f16"},
                 "q8b32": {"encoding": "q8", "block": 32, "zero": None, "scale_type": "f16"}}
    shapes = {}
    for model, layers in models.items():
        for layer, (n, k) in layers.items():
            for m in (128, 512):
                for tag, enc in encodings.items():
                    shapes[f"{model} {layer} {n}x{k} M={m} {tag}"] = {
                        "m": m, "n": n, "k": k, **enc, "kernel": kernel_name(enc["encoding"])}
    return shapes


BENCH_SHAPES: dict[str, dict] = _bench_shapes()


async def prepare_bench(device: Device, name: str, shape: dict, rng, tile=None) -> runner.Prepared:
    """`name` is a classic kernel of this family (shape["kernel"]) or an encoding; the tile is
    the host function's choice for this device unless given. No readback."""
    encoding = name.removeprefix("gemm_")
    if encoding != shape["encoding"]:
        raise ValueError(f"{name} does not run {shape['encoding']} weights")
    m, n, k = shape["m"], shape["n"], shape["k"]
    weights = random_parts(rng, encoding, n, k, shape.get("block") or 32, shape.get("zero") or "min",
                           shape.get("scale_type") or "f16")
    x, stride = padded_activations(rng.standard_normal((m, k)).astype(np.float32), 0.0)
    p = plan(device.limits, weights, m, stride, n, tile=tile, features=device.features)
    kernel = await compile_kernel(device, p.kernel, **p.overrides)
    prepared = runner.prepare(device, kernel, p.params, [x, *weights.bindings()], [(m * n, np.float32)], p.grid)
    prepared.bytes_moved = weights.nbytes + m * k * 4 + m * n * 4
    prepared.flops = 2 * m * n * k
    return prepared
