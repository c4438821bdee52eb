"""Split K across workgroups for the prefill GEMM's outer-product tiles.

Why: a prefill GEMM is fast only when its tiles keep every multiprocessor busy. Llama-3.2-1B's
down projection at 128 tokens has N = 2048 outputs and K = 8192: 16 tiles of 128 x 128 for the
H200's 132 multiprocessors, each walking 256 K steps alone (3.4 TFLOP/s measured, against 21
for gate|up). Smaller tiles help little (each still walks all of K); splitting K does: KPARTS
workgroups share a tile, each walking one run of K steps, and write their partial sums; a
second launch adds the parts into Y:

    gemm_outer_<enc>  KPARTS = p     P[p][M][N4] partial sums (gemm_outer_main.wgsl)
    gemm_reduce       KPARTS = p     Y (+)= sum of the parts in part order, into Y's column
                                     sections (gemm_reduce.wgsl)

Both launches read one params block (the GEMM's), so the step program's params slots do not
change; the partial sums live in the plan's `prefill.gemm_partials` region
(program/ops.py `gemm_partials_floats`), and the split never asks for more than it holds.
Numerics: the same products and additions in another order, so the GEMM's bound
(gemm_oracle.oracle: gamma(K) sum |terms|, for any order) holds unchanged.

`choose_parts` decides (1: no split) from the tile count and the K steps; `split` turns a
GemmPlan into the two launches. The golden family "gemm_split" runs every KPARTS on tails,
sections, ACCUMULATE and extreme codes against the oracle.
"""
from __future__ import annotations

import dataclasses

import numpy as np

from . import gemm, gemm_cases, runner
from .gemm_oracle import oracle, random_parts
from .golden import GoldenContext, GoldenResult, compare_bound, golden, label
from .registry import KERNELS, KernelSpec, register
from .weights import Weights

KPARTS = (2, 4, 8)            # the split factors (the outer kernel's KPARTS allowlist adds 1)
POLICIES = ("unsplit-first", "outer-first", "off")
POLICY = "outer-first"        # choose_tile's rule ("off": the tile choice of before split K); bench/engine.py --split-k
MIN_STEPS_PER_PART = 8        # a part walks at least this many K steps: below, the reduce costs more
REDUCE_WG = 256

register(KernelSpec("gemm_reduce", ("gemm_sections.wgsl", "gemm_reduce.wgsl"), "main",
                    ("uniform", "read-only-storage", "storage"),
                    {"KPARTS": KPARTS, "ACCUMULATE": (0, 1), "WG": (REDUCE_WG,)}))


def partial_floats(m: int, n: int, parts: int) -> int:
    """Floats of the partial sums P[parts][M][N rounded up to 4]."""
    return parts * m * -(-n // 4) * 4


def choose_parts(tile, m: int, n: int, k: int, capacity_floats: int, min_workgroups: int | None = None) -> int:
    """How many K ranges to split a GEMM into (1: none): only for outer-product tiles, only
    while the tiles alone leave the GPU idle (fewer than min_workgroups), each part walking at
    least MIN_STEPS_PER_PART steps, and the partial sums fitting `capacity_floats`. The
    smallest split that fills the GPU, else the largest allowed."""
    if not isinstance(tile, gemm.OuterTile):
        return 1
    min_workgroups = gemm.MIN_WORKGROUPS if min_workgroups is None else min_workgroups
    tiles = -(-m // tile.tm) * -(-n // tile.tn)
    steps = -(-k // tile.bk)
    chosen = 1
    for parts in KPARTS if tiles < min_workgroups else ():
        if steps < parts * MIN_STEPS_PER_PART or partial_floats(m, n, parts) > capacity_floats:
            break
        chosen = parts
        if tiles * parts >= min_workgroups:
            break
    return chosen


def choose_tile(limits: dict[str, int], m: int, n: int, k: int, features, encoding: str, capacity_floats: int,
                need_sections: bool = False) -> tuple:
    """(tile, parts) for a prefill GEMM. With POLICY "unsplit-first": the first outer tile of
    the order (the fastest kernel) that fills the GPU (>= MIN_WORKGROUPS workgroups) as it is,
    else the first that fills it split; "outer-first": the first that fills it either way;
    else (and with "off") gemm.choose_tile's (the encodings without outer tiles, small shapes),
    split where that helps unless "off". Before split K, a shape with few large tiles fell back
    to the small classic tiles, the slowest kernel (Llama-3.2-1B's down and o at 128 tokens ran
    32x32 classic tiles at 3.4 TFLOP/s)."""
    least = gemm.MIN_WORKGROUPS
    outers = [t for t in gemm.candidates(limits, features, encoding=encoding)
              if isinstance(t, gemm.OuterTile) and t.tm <= max(32, m)] if POLICY != "off" else []
    options = [(t, choose_parts(t, m, n, k, capacity_floats)) for t in outers]
    if POLICY == "unsplit-first":
        options = [(t, 1) for t in outers] + options
    for tile, parts in options:
        if -(-m // tile.tm) * -(-n // tile.tn) * parts >= least:
            return tile, parts
    tile = gemm.choose_tile(limits, m, n, features, need_sections=need_sections, encoding=encoding)
    return tile, choose_parts(tile, m, n, k, capacity_floats) if POLICY != "off" else 1


@dataclasses.dataclass(frozen=True)
class SplitPlan:
    gemm: gemm.GemmPlan          # the first launch: KPARTS, tiles x parts workgroups, y = the partials
    reduce_overrides: dict[str, int]
    reduce_grid: tuple[int, int, int]
    parts: int
    partial_bytes: int

    reduce_kernel = "gemm_reduce"


def split(limits: dict[str, int], p: gemm.GemmPlan, m: int, n: int, parts: int, accumulate: bool) -> SplitPlan:
    """The two launches of `p` (a plan of an outer-product tile) split `parts` ways."""
    if parts not in KPARTS or not isinstance(p.tile, gemm.OuterTile):
        raise gemm.GemmError("tile-not-admitted", "split", f"split K takes an outer tile and one of {KPARTS} "
                                                           f"parts, not {p.tile.name} x {parts}")
    tiles = -(-m // p.tile.tm) * -(-n // p.tile.tn)
    floats = partial_floats(m, n, parts)
    if floats >= runner.U32_LIMIT:
        raise gemm.GemmError("offset-overflow", "partials", f"{floats} partial sums cannot be indexed with u32")
    per_dimension = limits["maxComputeWorkgroupsPerDimension"]
    try:
        grid = runner.workgroup_grid(tiles * parts, per_dimension)
        reduce_grid = runner.workgroup_grid(-(-(m * -(-n // 4)) // REDUCE_WG), per_dimension)
    except ValueError as exc:
        raise gemm.GemmError("too-many-workgroups", "grid", str(exc)) from None
    first = dataclasses.replace(p, overrides={**p.overrides, "KPARTS": parts, "ACCUMULATE": 0}, grid=grid,
                                binding_bytes={**p.binding_bytes, "y": 4 * floats})
    return SplitPlan(first, {"KPARTS": parts, "ACCUMULATE": int(accumulate), "WG": REDUCE_WG}, reduce_grid,
                     parts, 4 * floats)


async def gemm_split(ctx: GoldenContext, weights: Weights, x: np.ndarray, parts: int, tile,
                     y0: np.ndarray | None = None, sections=None) -> np.ndarray:
    """Y = x W^T (+ y0) through the two launches, once, on fresh buffers (the partial sums are
    read back between them, then uploaded: the same bytes the engine keeps on the GPU). The
    partials buffer starts as NaN: a lane the reduce should not read would show."""
    m, n = x.shape[0], weights.rows
    y_stride = n if sections is None else sections[0][2]
    p = gemm.plan(ctx.device.limits, weights, m, -(-weights.cols // 4) * 4, y_stride, y0 is not None, tile,
                  sections, ctx.device.features)
    s = split(ctx.device.limits, p, m, n, parts, y0 is not None)
    xs, _ = gemm.padded_activations(x)
    kernel = await ctx.kernel(s.gemm.kernel, **s.gemm.overrides)
    (partials,) = await runner.run_once(ctx.device, kernel, p.params, [xs, *weights.bindings()],
                                        [(s.partial_bytes // 4, np.float32)], s.gemm.grid)
    reduce = await ctx.kernel(s.reduce_kernel, **s.reduce_overrides)
    size = m * y_stride if sections is None else p.binding_bytes["y"] // 4
    out = np.ascontiguousarray(y0, np.float32).reshape(-1) if y0 is not None else (size, np.float32)
    (y,) = await runner.run_once(ctx.device, reduce, p.params, [partials], [out], s.reduce_grid)
    return y if sections is not None else y.reshape(m, y_stride)


# -- golden tests ---------------------------------------------------------------------------

def _cases(ctx: GoldenContext):
    """(name, weights, x, y0, parts, tile, sections): every split on an odd tail shape (K runs
    that do not divide evenly, and a part with no K step at all), the encodings the outer tile
    serves, ACCUMULATE, q|k|v sections, and extreme codes."""
    rng, quick = ctx.rng, ctx.quick
    limits, features = ctx.device.limits, ctx.device.features
    if ctx.planned is not None:
        yield from _planned_cases(ctx)
        return
    tiles = [t for t in gemm.candidates(limits, features, encoding="q4") if isinstance(t, gemm.OuterTile)]
    if not tiles:
        return
    small = min(tiles, key=lambda t: t.tm * t.tn)
    configs = [("q4", 32, "min", "f16"), ("q8", 32, None, "f16")] if quick else [
        ("q4", 32, "min", "f16"), ("q4", 64, "offset", "f32"), ("q8", 32, None, "f16"), ("q8", 256, None, "f32"),
        ("q5", 32, "min", "f16"), ("q4k", 256, None, "f16"), ("q6k", 256, None, "f16")]
    for enc, block, zero, scale_type in configs:
        k = 512 if enc in ("q4k", "q6k") else 33 * 16 + 7 if enc != "q5" else 544   # whole super-blocks for K-quants
        for parts in (KPARTS[:1] if quick else KPARTS):
            m, n = (19, 45)
            weights = random_parts(rng, enc, n, k, block, zero or "min", scale_type)
            x = rng.standard_normal((m, k)).astype(np.float32)
            yield (f"{m}x{n}x{k} {enc}/{block} parts {parts} tile {small.name}", weights, x, None, parts, small, None)
    if quick:
        return
    m, n, k = 17, 37, 16 * 9          # 9 steps of 16 in 8 parts: the last part has no step
    weights = random_parts(rng, "q4", n, k, 32, "min", "f16")
    x = rng.standard_normal((m, k)).astype(np.float32)
    yield (f"{m}x{n}x{k} q4 parts 8 (an empty part) tile {small.name}", weights, x, None, 8, small, None)
    y0 = (rng.standard_normal((m, n)) * 4).astype(np.float32)
    yield (f"accumulate {m}x{n}x{k} q4 parts 4 tile {small.name}", weights, x, y0, 4, small, None)
    for codes in ("max", "min"):
        w = random_parts(rng, "q8", 33, 400, 32, "min", "f16", codes)
        yield (f"{codes} codes 9x33x400 q8 parts 2", w, rng.standard_normal((9, 400)).astype(np.float32), None, 2,
               small, None)
    m, widths, k = 9, (36, 12, 12), 256
    first, bases = [0, 36, 48], [0, m * 36 + 7, m * 48 + 13]
    sections = [(first[j], bases[j], widths[j]) for j in range(3)]
    weights = random_parts(rng, "q4", 60, k, 32, "min", "f16")
    x = rng.standard_normal((m, k)).astype(np.float32)
    yield (f"sections {m}x{widths}x{k} q4 parts 2", weights, x, None, 2, small, sections)
    y0 = (rng.standard_normal(bases[2] + m * widths[2]) * 4).astype(np.float32)
    yield (f"sections + accumulate {m}x{widths}x{k} q4 parts 4", weights, x, y0, 4, small, sections)


def _planned_cases(ctx: GoldenContext):
    """At admission: one case on each split the plan compiled (its tile, weight format, parts
    and ACCUMULATE as its reduce was compiled), on a tail shape; nothing else is compiled."""
    rng, limits, features = ctx.rng, ctx.device.limits, ctx.device.features
    m, n = 19, 45
    for tile, fmt, overrides in gemm_cases.planned_tiles(ctx, split=True):
        enc, block, zero, scale_type = fmt
        k = gemm_cases.tail_k(fmt)
        weights = random_parts(rng, enc, n, k, block or 32, zero or "min", scale_type or "f16")
        parts = overrides["KPARTS"]
        for accumulate in (False, True):
            try:
                s = split(limits, gemm.plan(limits, weights, m, -(-k // 4) * 4, n, accumulate, tile, None, features),
                          m, n, parts, accumulate)
            except gemm.GemmError:
                continue
            if s.gemm.overrides == overrides and ctx.planned_pipeline(s.reduce_kernel, s.reduce_overrides):
                x = rng.standard_normal((m, k)).astype(np.float32)
                y0 = (rng.standard_normal((m, n)) * 4).astype(np.float32) if accumulate else None
                yield (f"{m}x{n}x{k} {'/'.join(str(v) for v in fmt if v)} parts {parts} tile {tile.name}"
                       + (" accumulate" if accumulate else ""), weights, x, y0, parts, tile, None)


@golden("gemm_split", kernels=("gemm_reduce",))
async def golden_gemm_split(ctx: GoldenContext) -> list[GoldenResult]:
    """Each case through both launches against gemm_oracle's bound; sectioned outputs must
    leave every element outside the sections as it was (poison, or y0's)."""
    results = []
    if not ctx.uses("gemm_reduce"):
        return results
    for name, weights, x, y0, parts, tile, sections in _cases(ctx):
        y = await gemm_split(ctx, weights, x, parts, tile, y0, sections)
        case = gemm_cases.Case(name, weights, x, y0, tile, sections=sections)
        if sections is not None:
            got, overwritten = gemm_cases._section_view(case, y)
            base = gemm_cases._section_view(case, y0)[0] if y0 is not None else None
        else:
            got, overwritten, base = y, 0, y0
        exact, bound, rule = oracle(weights, x, base)
        kernel = label(KERNELS["gemm_reduce"], {"KPARTS": parts, "ACCUMULATE": int(y0 is not None)})
        result = compare_bound("gemm_split", f"{tile.kernel(weights.encoding)} + {kernel}", name, got, exact,
                               bound, rule)
        results.append(dataclasses.replace(result, mismatched=result.mismatched + overwritten))
    return results
