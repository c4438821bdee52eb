"""Golden tests of the prefill GEMM (family "gemm", kernels gemm.py registers): the cases, run
through gemm.plan and gemm.gemm and compared with gemm_oracle.oracle under its error rules.

`_cases` yields them for one device and size: every admitted tile (full) or every tile the
host may choose (quick: what admission's self-test must see pass) on tail shapes; every
encoding option quantized from real-valued data; strided x and y (columns past N keep their
poison); ACCUMULATE; q | k | v column sections (gaps between sections keep their poison); q5
and the super-blocks (`_packed_cases`); adversarial codes, scales and activations; the real
blk.0.ffn_up when a model is given. docs/kernels.md ("gemm", **Cases**) lists them in full.
The comparison itself must reject wrong results, under both rules.
"""
from __future__ import annotations

import dataclasses

import numpy as np

from . import kquant
from .gemm import TILES, OuterTile, RegisterTile, Tile, candidates, gemm, plan
from .gemm_oracle import oracle, random_parts, wrong_results
from .golden import GoldenContext, GoldenResult, compare_bound, golden, label, weight_format
from .registry import KERNELS
from .weights import Weights


def _activations(rng, m: int, k: int, kind: str = "normal") -> np.ndarray:
    x = rng.standard_normal((m, k)).astype(np.float32)
    if kind == "constant":
        x[:] = x[:, :1]                       # each row one value
    elif kind == "alternating":
        x = (np.abs(x) + 0.5) * np.where(np.arange(k) % 2 == 0, 1, -1).astype(np.float32)
    return x


# (encoding, block, zero, scale_type): SmolLM2's q4 first, then every block size and option.
CONFIGS = [("q4", 32, "min", "f16"), ("q4", 64, "offset", "f32"), ("q4", 256, "min", "f32"),
           ("q4", 128, "offset", "f16"), ("q8", 32, None, "f16"), ("q8", 256, None, "f32"),
           ("q8", 64, None, "f16"), ("q8", 128, None, "f32"), ("f16", None, None, None),
           ("f32", None, None, None)]
SMOLLM, Q4_OFFSET_F32, Q4_OFFSET, Q8, Q8_F32, F16, F32 = (CONFIGS[i] for i in (0, 1, 3, 4, 5, 8, 9))
# (M, N, K): single element, M = 2/3/17/64+odd, odd K with partial last blocks, N not a
# multiple of any tile, exact tiles, M past 128.
TAIL_SHAPES = [(3, 1, 1), (2, 33, 33), (17, 65, 97), (67, 100, 300), (64, 64, 64), (129, 37, 257)]


@dataclasses.dataclass
class Case:
    name: str
    weights: Weights
    x: np.ndarray
    y0: np.ndarray | None = None       # ACCUMULATE into this
    tile: Tile | RegisterTile | None = None   # None: the host function's choice
    x_stride: int | None = None
    y_stride: int | None = None
    sections: list | None = None       # [(first column, offset, stride)]: y is flat


def _tag(config) -> str:
    return "/".join(str(v) for v in config if v is not None)


def _quantized(rng, config, w: np.ndarray) -> Weights:
    enc, block, zero, st = config
    return Weights.quantized(w.astype(np.float32), enc, block or 32, zero or "min", st or "f16")


def _random(rng, config, n: int, k: int, codes: str = "random", scale: float = 0.01) -> Weights:
    enc, block, zero, st = config
    return random_parts(rng, enc, n, k, block or 32, zero or "min", st or "f16", codes, scale)


def _tiles(ctx: GoldenContext) -> list:
    """The tiles this run covers outside admission: every variant the device admits (full), or
    the ones the host may choose on it (quick). (At admission: the plan's, `planned_tiles`.)"""
    limits, features = ctx.device.limits, ctx.device.features
    if not ctx.quick:
        return [t for t in TILES.values() if t.admitted(limits, features)]
    return candidates(limits, features)


def _compiled_as(tile, name: str, overrides: dict) -> bool:
    """Whether the pipeline (name, overrides) is `tile`'s kernel for its encoding."""
    encoding = name.rsplit("_", 1)[-1]
    return (name.startswith("gemm_") and tile.serves(encoding) and tile.kernel(encoding) == name
            and tile.overrides().items() <= overrides.items())


def planned_tiles(ctx: GoldenContext, split: bool) -> list[tuple]:
    """At admission: (tile, weight format, overrides) of each GEMM pipeline the plan compiled,
    split-K ones (KPARTS) or the others."""
    out = []
    for name, items in sorted(ctx.planned or ()):
        overrides = dict(items)
        fmt = weight_format(name, overrides)
        if not name.startswith("gemm_") or fmt is None or ("KPARTS" in overrides) != split:
            continue
        tile = next((t for t in TILES.values() if _compiled_as(t, name, overrides)), None)
        if tile is not None:
            out.append((tile, fmt, overrides))
    return out


def tail_k(fmt: tuple) -> int:
    """A K with a partial last block where the format has them (q4, q8, floats), else whole
    blocks (q5: its block; the super-blocks: 256) and more than one."""
    enc, block = fmt[0], fmt[1]
    return 2 * 256 if enc in ("q4k", "q5k", "q6k") else 3 * block if enc == "q5" else 161


def _planned_cases(ctx: GoldenContext):
    """At admission: on each GEMM pipeline the plan compiled (its tile, weight format and
    ACCUMULATE), random codes on a tail shape, extreme codes, and strided x and y."""
    rng = ctx.rng
    for tile, fmt, overrides in planned_tiles(ctx, split=False):
        enc, block, zero, st = fmt
        accumulate = bool(overrides.get("ACCUMULATE", 0))
        m, n, k = 17, 65, tail_k(fmt)
        # strided y with ACCUMULATE would need y0 strided too: that one is not strided
        strided = (None, None) if accumulate else (-(-k // 4) * 4 + 8, n + 5)
        for codes, (x_stride, y_stride) in (("random", (None, None)), ("max" if enc != "f32" else "random", strided)):
            weights = random_parts(rng, enc, n, k, block or 32, zero or "min", st or "f16", codes)
            y0 = (rng.standard_normal((m, n)) * 4).astype(np.float32) if accumulate else None
            what = "random" if codes == "random" else f"{codes} codes" + (", strided" if x_stride else "")
            yield Case(f"{what} {m}x{n}x{k} {_tag(fmt)} tile {tile.name}" + (" accumulate" if accumulate else ""),
                       weights, _activations(rng, m, k), y0=y0, tile=tile, x_stride=x_stride, y_stride=y_stride)


def _cases(ctx: GoldenContext):
    rng, quick = ctx.rng, ctx.quick
    if ctx.planned is not None:
        yield from _planned_cases(ctx)
        return
    tiles = _tiles(ctx) if ctx.device is not None else list(TILES.values())
    # Every tile on the tail shapes, in the shipped encoding (the classic tiles on all six).
    for tile in tiles:
        shapes = TAIL_SHAPES[2:3] if quick else TAIL_SHAPES if not tile.sections else TAIL_SHAPES[::2] + [(129, 37, 257)]
        for m, n, k in shapes:
            yield Case(f"random {m}x{n}x{k} {_tag(SMOLLM)} tile {tile.name}", _random(rng, SMOLLM, n, k),
                       _activations(rng, m, k), tile=tile)
    # Every encoding option, quantized from real-valued data: on the host's choice, and on every
    # tile two options in turn (each option meets several tiles).
    for config in ([Q8, F16] if quick else CONFIGS):
        for m, n, k in [(3, 20, 45)] if quick else [(17, 70, 129), (3, 5, 257)]:
            w = _quantized(rng, config, rng.standard_normal((n, k)))
            yield Case(f"quantized {m}x{n}x{k} {_tag(config)} tile chosen", w, _activations(rng, m, k))
    for i, tile in enumerate([] if quick else tiles):
        served = [c for c in CONFIGS if tile.serves(c[0])]
        for config in (served[i % len(served)], served[(i + 5) % len(served)]):
            m, n, k = 19, 37, 161
            w = _quantized(rng, config, rng.standard_normal((n, k)))
            yield Case(f"quantized {m}x{n}x{k} {_tag(config)} tile {tile.name}", w, _activations(rng, m, k),
                       tile=tile)
    # Strided x and y: columns past N must keep their poison.
    strided = [(5, 9, 33, SMOLLM)] if quick else [(17, 37, 97, SMOLLM), (67, 45, 161, Q8), (3, 70, 40, F16)]
    for m, n, k, config in strided:
        yield Case(f"strided {m}x{n}x{k} {_tag(config)}", _random(rng, config, n, k), _activations(rng, m, k),
                   x_stride=-(-k // 4) * 4 + 8, y_stride=n + 5)
    # Accumulate: Y += X W^T.
    accumulate = [(SMOLLM, 5, 9, 40)] if quick else [
        (config, m, n, k) for config in (SMOLLM, Q8_F32, F32) for m, n, k in [(17, 65, 97), (67, 33, 300)]]
    for config, m, n, k in accumulate:
        for tile in [None] + ([] if quick else [t for t in tiles if t.name in (
                "128x64", "128x128/8x8/k16/s2", "32x64/4x4/k16/s2", "32x64/4x4/k32/s2/h", "32x64/4x4/k32/s1/x4",
                "64x128/o", "32x64/o", "32x64/k32/o") and t.serves(config[0])]):
            yield Case(f"accumulate {m}x{n}x{k} {_tag(config)} tile {tile.name if tile else 'chosen'}",
                       _random(rng, config, n, k), _activations(rng, m, k),
                       y0=(rng.standard_normal((m, n)) * 4).astype(np.float32), tile=tile)
    yield from _section_cases(rng, quick, [t for t in tiles if t.sections])
    yield from _packed_cases(rng, quick, tiles)
    if not quick:
        yield from _adversarial_cases(rng, [None] + [t for t in tiles if t.name in (
            "64x128/4x8/k16/s2", "128x128/8x8/k16/s2/h", "64x64/4x4/k16/s1/x2", "64x128/o", "32x64/o",
            "64x64/k32/o")])
    if ctx.model is not None and "blk.0.ffn_up" in ctx.model.manifest.tensors:
        weights = Weights.from_model(ctx.model, "blk.0.ffn_up")
        m = 3 if quick else 17
        for tile in [None] + ([] if quick else [t for t in tiles if t.half][:1]):
            yield Case(f"real blk.0.ffn_up {m}x{weights.rows}x{weights.cols} {weights.encoding} tile "
                       f"{tile.name if tile else 'chosen'}", weights, _activations(rng, m, weights.cols), tile=tile)


# q5 and the super-blocks (kquant.py): (encoding, block, zero, scale type) of every form.
PACKED = [("q5", 32, "offset", "f16"), ("q5", 64, "min", "f32"), ("q5", 256, "min", "f16"),
          ("q4k", 256, "scaled-min", "f16"), ("q5k", 256, "scaled-min", "f16"), ("q6k", 256, "offset", "f16")]


def _packed_cases(rng, quick: bool, tiles: list):
    """q5 and the super-blocks: random parts on the host's tile and (full) on every tile in
    turn, extreme codes and scales (f16 +-65504, subnormals, zeros; f32 tiles only: the f16
    tiles' rule needs values inside the f16 range), with ACCUMULATE and q|k|v sections."""
    def parts(config, n, k, codes="random", scales="normal"):
        enc, block, zero, st = config
        return kquant.random_weights(rng, enc, n, k, block, zero, st, codes, scales)
    if quick:   # each form on a classic, an outer and a register tile: admission's self-test needs each kernel
        classic = [t for t in tiles if not t.sections][:1]
        register = ([t for t in tiles if isinstance(t, OuterTile)][:1]
                    + [t for t in tiles if isinstance(t, RegisterTile) and not t.half][:1])
        for config in PACKED + [Q8]:
            for tile in classic + register:
                weights = parts(config, 20, 256) if config in PACKED else _random(rng, config, 20, 256)
                yield Case(f"random 3x20x256 {_tag(config)} tile {tile.name}", weights, _activations(rng, 3, 256),
                           tile=tile)
        return
    for config in PACKED:
        m, n, k = 17, 70, 512
        yield Case(f"random {m}x{n}x{k} {_tag(config)} tile chosen", parts(config, n, k), _activations(rng, m, k))
    half = [t for t in tiles if t.half][:1]
    for i, tile in enumerate(tiles):      # each tile one form in turn; the first f16 tile every form
        for config in PACKED if tile in half else [PACKED[i % len(PACKED)]]:
            m, n, k = 19, 37, 256 if tile.half else 768
            yield Case(f"random {m}x{n}x{k} {_tag(config)} tile {tile.name}", parts(config, n, k),
                       _activations(rng, m, k), tile=tile)
    for config in PACKED:
        m, n, k = 17, 45, 512
        for codes, scales in (("max", "normal"), ("min", "normal"), ("mixed", "extreme")):
            yield Case(f"{codes} codes {scales} scales {m}x{n}x{k} {_tag(config)} tile chosen",
                       parts(config, n, k, codes, scales), _activations(rng, m, k))
        yield Case(f"accumulate {m}x{n}x{k} {_tag(config)} tile chosen", parts(config, n, k),
                   _activations(rng, m, k), y0=(rng.standard_normal((m, n)) * 4).astype(np.float32))
    sectioned = [t for t in tiles if t.sections and not t.half][:1]
    for config in PACKED[3:] if sectioned else ():
        m, widths, k = 9, (36, 12, 12), 256
        first, bases = [0, 36, 48], [0, m * 36 + 7, m * 48 + 13]
        yield Case(f"sections {m}x{widths}x{k} {_tag(config)} tile {sectioned[0].name}", parts(config, 60, k),
                   _activations(rng, m, k), tile=sectioned[0], sections=[(first[j], bases[j], widths[j]) for j in range(3)])


def _section_cases(rng, quick: bool, tiles: list):
    """q | k | v in one product: three column sections, each [M][width] at its own offset
    (gaps between them stay poisoned), as the planar qkv activation is laid out."""
    m, widths, k = (5, (12, 4, 4), 33) if quick else (19, (36, 12, 12), 97)
    n = sum(widths)
    first = [0, widths[0], widths[0] + widths[1]]
    bases = [0, m * widths[0] + 7, m * (widths[0] + widths[1]) + 13]
    sections = [(first[i], bases[i], widths[i]) for i in range(3)]
    for tile in tiles[:1] if quick else tiles:
        yield Case(f"sections {m}x{widths}x{k} {_tag(SMOLLM)} tile {tile.name}", _random(rng, SMOLLM, n, k),
                   _activations(rng, m, k), tile=tile, sections=sections)
    if not quick and tiles:
        y0 = (rng.standard_normal(bases[2] + m * widths[2]) * 4).astype(np.float32)
        yield Case(f"sections + accumulate {m}x{widths}x{k} {_tag(Q8)}", _random(rng, Q8, n, k),
                   _activations(rng, m, k), y0=y0, tile=tiles[0], sections=sections)


def _adversarial_cases(rng, tiles: list):
    m, n, k = 17, 45, 161   # K = 161: a partial last block for every block size
    for tile in tiles:
        half = tile is not None and tile.half
        tag = f" tile {tile.name if tile else 'chosen'}"
        for config in (SMOLLM, Q4_OFFSET, Q8, Q4_OFFSET_F32, Q8_F32):
            for codes in ("max", "min", "mixed"):   # q4 15 / 0, q8 127 / -128, and mixes of extremes
                yield Case(f"{codes} codes {m}x{n}x{k} {_tag(config)}{tag}", _random(rng, config, n, k, codes),
                           _activations(rng, m, k), tile=tile)
            # f16 subnormal .. huge (f16 tiles: tiny scales only; huge ones leave the f16 range)
            for scale in ((6e-8,) if half else (6e-8, 6e4) if config[3] == "f16" else (1e-30, 1e30)):
                yield Case(f"scale {scale:g} {m}x{n}x{k} {_tag(config)}{tag}",
                           _random(rng, config, n, k, scale=scale), _activations(rng, m, k), tile=tile)
        if not half:
            # q4 "offset", f32 scale near 3e38 (finite): real weights are 0 or s, but the last block's
            # padding codes (0) decode to -8 s = -inf, so the weights must be masked, not only x.
            yield Case(f"padding decodes to -inf {m}x{n}x{k} q4/64/offset/f32{tag}",
                       random_parts(rng, "q4", n, k, 64, "offset", "f32", "eights", scale=3e38),
                       _activations(rng, m, k) * np.float32(1e-3), tile=tile)
        for config in [c for c in (SMOLLM, Q8, F16, F32) if tile is None or tile.serves(c[0])]:
            w = np.full((n, k), 0.37) + np.arange(n)[:, None] * 0.01
            yield Case(f"constant rows {m}x{n}x{k} {_tag(config)}{tag}", _quantized(rng, config, w),
                       _activations(rng, m, k, "constant"), tile=tile)
            w = np.abs(rng.standard_normal((n, k))) * np.where(np.arange(k) % 2, -1, 1)
            yield Case(f"alternating signs {m}x{n}x{k} {_tag(config)}{tag}", _quantized(rng, config, w),
                       _activations(rng, m, k, "alternating"), tile=tile)


def _section_view(case: Case, y: np.ndarray) -> tuple[np.ndarray, int]:
    """(Y [M, N] gathered from the sections of flat y, elements outside every section that
    are not the poison (or y0's value))."""
    m, n = case.x.shape[0], case.weights.rows
    ends = [first for first, _, _ in case.sections[1:]] + [n]
    out = np.empty((m, n), np.float32)
    inside = np.zeros(y.size, bool)
    for (first, base, stride), end in zip(case.sections, ends):
        index = base + np.arange(m)[:, None] * stride + np.arange(end - first)[None, :]
        out[:, first:end] = y[index]
        inside[index] = True
    outside = y[~inside]
    kept = case.y0[~inside] if case.y0 is not None else None
    overwritten = int((~np.isnan(outside)).sum()) if kept is None else int((outside != kept).sum())
    return out, overwritten


@golden("gemm", kernels=("gemm_",))
async def golden_gemm(ctx: GoldenContext) -> list[GoldenResult]:
    results = []
    for case in _cases(ctx):
        m, n = case.x.shape[0], case.weights.rows
        p = plan(ctx.device.limits, case.weights, m, case.x_stride, case.y_stride, case.y0 is not None,
                 case.tile, case.sections, ctx.device.features)
        if not ctx.uses(p.kernel) or not ctx.planned_pipeline(p.kernel, p.overrides):
            continue
        y0 = case.y0
        if case.sections is not None and y0 is not None:
            y0 = _section_view(case, y0)[0]
        exact, bound, rule = oracle(case.weights, case.x, y0, half=p.tile.half)
        y = await gemm(ctx, case.weights, case.x, case.y0, case.tile, case.x_stride, case.y_stride, case.sections)
        name = label(KERNELS[p.kernel], p.overrides)
        if case.sections is not None:
            got, overwritten = _section_view(case, y)
        else:   # strided y: padding columns keep their poison
            got, overwritten = y[:, :n], int((~np.isnan(y[:, n:])).sum()) if case.y0 is None else 0
        result = compare_bound("gemm", name, case.name, got, exact, bound, rule)
        results.append(dataclasses.replace(result, mismatched=result.mismatched + overwritten))
    # The comparison itself must reject wrong results (no GPU needed), under both rules.
    weights = random_parts(ctx.rng, "q4", 33, 97)
    x = _activations(ctx.rng, 17, 97)
    for half in (False, True):
        exact, bound, rule = oracle(weights, x, half=half)
        for what, wrong in wrong_results(weights, x).items():
            check = compare_bound("gemm", "oracle", what, wrong, exact, bound, rule)
            results.append(GoldenResult("gemm", "oracle", f"{'f16 tiles ' if half else ''}rejects {what}",
                                        "a wrong result must fail the bound", check.max_abs_error, 0.0, 0,
                                        mismatched=int(check.passed)))
    return results
