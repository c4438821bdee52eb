"""Prefill GEMM: Y[M, N] = X[M, K] W[N, K]^T for M > 1, W in q4, q8, f16 or f32.

Prefill multiplies many activation rows by the same weights, so it is compute-bound: the
kernels tile Y in 2-D per workgroup, dequantize each W tile into workgroup memory once per
K step (reused by every row of the tile), and multiply register blocks with f32 FMAs.
The WGSL comes from trusted bundle files only (registry "sources"):

    common_quant.wgsl     exact q4/q8/f16 decoding helpers
    gemm_<encoding>.wgsl  weight bindings and `decode_unit` (a few weights of one row)
    quant_scales.wgsl     q4/q8: scale_at (f16 or f32 scales); q4 also quant_mins.wgsl, min_at
    gemm_main.wgsl        the entry point, tiling, X and W tiles, register-blocked multiply

Kernels (all tier A: no optional feature; f16 is decoded with unpack2x16float):

    gemm_q4   BLOCK 32|64|128|256, ZERO_MIN 0|1, SCALE_F16 0|1
    gemm_q8   BLOCK 32|64|128|256, SCALE_F16 0|1
    gemm_f16, gemm_f32
    every one: WG_X 8|16, WG_Y 8|16, RM 4|8 (the tile, see TILES), ACCUMULATE 0|1 (Y += X W^T)

Bindings: 0 params, 1 x [M][x_stride] f32 (x_stride % 4 == 0), 2 y [M][y_stride] f32,
3.. the weight parts exactly as the artifact stores them (q4: codes, scales, mins; q8:
codes, scales; f16/f32: data); q4 "offset" binds its scales again in the mins slot.

Host side: `weights.Weights` describes a tensor's parts (shared with matvec.py),
`choose_tile` picks a tile the device admits, `plan` validates everything before a dispatch
and returns params and grid, `gemm` runs one product on fresh buffers. The oracle, golden
tests and the benchmark hook follow.
"""
from __future__ import annotations

import dataclasses

import numpy as np

from ..artifact import quant
from ..artifact.format import BLOCK_ELEMENTS, blocks_per_row
from ..errors import CodedError
from ..webgpu.interface import Device
from . import runner
from .golden import F32_TINY, GoldenContext, GoldenResult, compare_bound, gamma, golden, label
from .registry import KERNELS, QUANT_SOURCES, KernelSpec, compile_kernel, register
from .weights import ENCODINGS, PART_NAMES, Weights

KT = 32     # the K step of gemm_main.wgsl
U32_LIMIT = runner.U32_LIMIT


def kernel_name(encoding: str) -> str:
    return f"gemm_{encoding}"


def _specs():
    tile = {"WG_X": (8, 16), "WG_Y": (8, 16), "RM": (4, 8), "ACCUMULATE": (0, 1)}
    for encoding in ENCODINGS:
        overrides = dict(tile)
        if encoding in ("q4", "q8"):
            overrides |= {"BLOCK": BLOCK_ELEMENTS, "SCALE_F16": (0, 1)}
        if encoding == "q4":
            overrides |= {"ZERO_MIN": (0, 1)}
        yield KernelSpec(
            name=kernel_name(encoding),
            # the encoding file (and the scale helpers that use its SCALE_F16) precede
            # gemm_main.wgsl: see the note at the top of that file
            sources=("common_quant.wgsl", f"gemm_{encoding}.wgsl", *QUANT_SOURCES.get(encoding, ()),
                     "gemm_main.wgsl"),
            entry_point="main",
            bindings=("uniform", "read-only-storage", "storage")
            + ("read-only-storage",) * len(PART_NAMES[encoding]),
            overrides=overrides,
        )


register(*_specs())


class GemmError(CodedError):
    """A GEMM that cannot run as asked; codes: bad-encoding, dimension-mismatch,
    buffer-too-small, offset-overflow, binding-too-large, too-many-workgroups, tile-not-admitted."""


# -- tiles ----------------------------------------------------------------------------------

@dataclasses.dataclass(frozen=True)
class Tile:
    wg_x: int     # invocations along N (4 columns each)
    wg_y: int     # invocations along M (RM rows each)
    rm: int

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

    def overrides(self) -> dict[str, int]:
        return {"WG_X": self.wg_x, "WG_Y": self.wg_y, "RM": self.rm}

    def admitted(self, limits: dict[str, int]) -> bool:
        return (self.invocations <= runner.max_invocations(limits)
                and self.workgroup_bytes <= limits["maxComputeWorkgroupStorageSize"])


# Largest first. 32x32 (64 invocations, 8 KiB) and 64x64 (128, 16 KiB) fit every device,
# compatibility mode included; the 256-invocation tiles need a core device, 128x64 also
# 24 KiB of workgroup memory.
TILES = {
    "128x64": Tile(16, 16, 8),
    "64x64w": Tile(16, 16, 4),
    "64x64": Tile(16, 8, 8),
    "32x32": Tile(8, 8, 4),
}
# Below this many tiles a large GPU idles (an H200 has 132 multiprocessors): prefer a smaller
# tile. Measured there (docs/kernels.md): 128x64 wins from ~128 tiles up, 32x32 below.
MIN_WORKGROUPS = 128


def choose_tile(limits: dict[str, int], m: int, n: int) -> Tile:
    """The largest admitted tile that still gives MIN_WORKGROUPS tiles (else the admitted
    tile giving the most), never a tile taller than M needs."""
    admitted = [t for t in TILES.values() if t.admitted(limits)]
    if not admitted:
        raise GemmError("tile-not-admitted", "limits", f"no GEMM tile fits {limits}")
    fitting = [t for t in admitted if t.tm <= max(32, m)] or admitted
    def count(t: Tile) -> int:
        return -(-m // t.tm) * -(-n // t.tn)

    busy = [t for t in fitting if count(t) >= MIN_WORKGROUPS]
    return busy[0] if busy else max(fitting, key=lambda t: (count(t), t.invocations))


# -- validation, params, grid ---------------------------------------------------------------

@dataclasses.dataclass(frozen=True)
class GemmPlan:
    kernel: str
    overrides: dict[str, int]
    tile: Tile
    params: np.ndarray
    grid: tuple[int, int, int]
    binding_bytes: dict[str, int]     # minimum bytes each binding must hold


def plan(limits: dict[str, int], weights: Weights, m: int, x_stride: int | None = None,
         y_stride: int | None = None, accumulate: bool = False, tile: Tile | None = None) -> GemmPlan:
    """Check every assumption of the kernel's addressing, then choose variant, params, grid.
    Raises GemmError before any GPU work."""
    w, n, k = weights, weights.rows, weights.cols
    x_stride = -(-k // 4) * 4 if x_stride is None else x_stride
    y_stride = n if y_stride is None else y_stride
    if w.encoding not in ENCODINGS:
        raise GemmError("bad-encoding", "weights", f"GEMM has no {w.encoding!r} encoding")
    if w.encoding in ("q4", "q8") and (w.block not in BLOCK_ELEMENTS or w.scale_type not in ("f16", "f32")):
        raise GemmError("bad-encoding", "weights", f"block {w.block} / scale type {w.scale_type!r} unsupported")
    if w.encoding == "q4" and w.zero not in ("min", "offset"):
        raise GemmError("bad-encoding", "weights", f"q4 zero must be 'min' or 'offset', not {w.zero!r}")
    if min(m, n, k) < 1:
        raise GemmError("dimension-mismatch", "shape", f"empty GEMM: M={m} N={n} K={k}")
    if k + KT + max(BLOCK_ELEMENTS) >= U32_LIMIT:   # the K loop and block count must not wrap
        raise GemmError("offset-overflow", "k", f"K={k} is too close to 2^32")
    if x_stride % 4 or x_stride < k:
        raise GemmError("dimension-mismatch", "x_stride", f"{x_stride} must be a multiple of 4 and >= K={k}")
    if y_stride < n:
        raise GemmError("dimension-mismatch", "y_stride", f"{y_stride} must be >= N={n}")
    # Minimum binding sizes: x is read as vec4 up to align4(K) in its last row.
    exact = w.part_bytes()
    need = {"x": ((m - 1) * x_stride + -(-k // 4) * 4) * 4, "y": ((m - 1) * y_stride + n) * 4}
    need |= {name: -(-length // 4) * 4 for name, length in exact.items()}   # f16 scales: whole words
    # Every index the shader computes is a u32 element (or word, or vec4) index below these.
    largest = {"x": m * x_stride, "y": m * y_stride, **{name: need[name] // 4 for name in exact}}
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
    tile = tile or choose_tile(limits, m, n)
    if not tile.admitted(limits):
        raise GemmError("tile-not-admitted", "tile", f"{tile} needs {tile.invocations} invocations and "
                        f"{tile.workgroup_bytes} bytes of workgroup memory")
    tiles_m = -(-m // tile.tm)
    tiles = tiles_m * -(-n // tile.tn)
    try:
        grid = runner.workgroup_grid(tiles, limits["maxComputeWorkgroupsPerDimension"])
    except ValueError as exc:
        raise GemmError("too-many-workgroups", "grid", str(exc)) from None
    params = runner.params_words(m, n, k, x_stride, y_stride, tiles_m, tiles)
    overrides = {**tile.overrides(), **w.overrides(), "ACCUMULATE": int(accumulate)}
    return GemmPlan(kernel_name(w.encoding), overrides, tile, params, grid, need)


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
               tile: Tile | None = None, x_stride: int | None = None, y_stride: int | None = None) -> np.ndarray:
    """Y = x [M, K] W^T (+ y0 [M, y_stride] when given: the ACCUMULATE variant), once, on fresh
    buffers. Returns [M, y_stride] (y_stride = N unless given; columns past N are whatever the
    buffer held: the NaN poison, or y0's)."""
    ctx = ctx_or_device if isinstance(ctx_or_device, GoldenContext) else GoldenContext(ctx_or_device, None)
    x = np.atleast_2d(np.asarray(x, np.float32))
    if x.shape[1] != weights.cols:
        raise GemmError("dimension-mismatch", "x", f"x has {x.shape[1]} columns, W has {weights.cols}")
    y_stride = weights.rows if y_stride is None else y_stride
    p = plan(ctx.device.limits, weights, x.shape[0], x_stride or -(-weights.cols // 4) * 4, y_stride,
             y0 is not None, tile)
    xs, _ = padded_activations(x, stride=x_stride)
    kernel = await ctx.kernel(p.kernel, **p.overrides)
    out = (np.ascontiguousarray(y0, np.float32).reshape(-1) if y0 is not None
           else (x.shape[0] * y_stride, np.float32))
    (y,) = await runner.run_once(ctx.device, kernel, p.params, [xs, *weights.bindings()], [out], p.grid)
    return y.reshape(x.shape[0], y_stride)


# -- the oracle and its error bound ---------------------------------------------------------

RULE = ("|y - exact| <= gamma(K + 2) * sum_k (|s c_k| + |m|) |x_k| + (K + 2) tiny; "
        "accumulate: gamma(K + 3) * (that sum + |y0|) + (K + 3) tiny")


def decode64(weights: Weights) -> tuple[np.ndarray, np.ndarray]:
    """(W, magnitude) in float64, [N, K]: W = s c + m exactly as the format defines it, and
    the magnitude |s c| + |m| (|s (c - 8)| for "offset", |w| for f16/f32) the bound uses."""
    n, k, enc = weights.rows, weights.cols, weights.encoding
    if enc in ("f16", "f32"):
        w = quant.dequantize(enc, (n, k), None, weights.parts).astype(np.float64)
        return w, np.abs(w)
    parts = {name: np.frombuffer(memoryview(v).cast("B"), np.uint8) for name, v in weights.parts.items()}
    dtype = quant.SCALE_DTYPES[weights.scale_type]

    def per_block(name: str) -> np.ndarray:   # [N, blocks] scales or mins -> [N, K]
        side = parts[name].view(dtype)[: n * weights.blocks].reshape(n, -1).astype(np.float64)
        return np.repeat(side, weights.block, axis=1)[:, :k]

    s = per_block("scales")
    if enc == "q8":
        c = parts["codes"].view(np.int8).reshape(n, -1)[:, :k].astype(np.float64)
        return s * c, np.abs(s * c)
    c = quant.unpack_nibbles(parts["codes"].reshape(n, -1))[:, :k].astype(np.float64)
    if weights.zero == "offset":
        return s * (c - 8), np.abs(s * (c - 8))
    mins = per_block("mins")
    return s * c + mins, np.abs(s * c) + np.abs(mins)


def oracle(weights: Weights, x: np.ndarray, y0: np.ndarray | None = None):
    """(exact Y in float64, elementwise bound, rule).

    The kernel decodes each weight with one rounding (fma(c, s, m), (c - 8) * s or c * s;
    none for f16/f32) and sums K products with FMAs in f32: by Higham's lemma 3.3 the two
    compose to gamma(K + 2) relative to sum (|s c| + |m|) |x|, for any summation order (so
    also for a kernel that sums s * sum(c x) + m * sum(x) per block). Each operation that
    flushes a subnormal loses at most `tiny`, hence the additive (K + 2) tiny. Accumulating
    into y0 adds one rounding of y0 + sum."""
    x64 = np.atleast_2d(x).astype(np.float64)
    w, magnitude = decode64(weights)
    k = weights.cols
    exact = x64 @ w.T
    size = np.abs(x64) @ magnitude.T
    if y0 is None:
        return exact, gamma(k + 2) * size + (k + 2) * F32_TINY, RULE
    y0 = np.asarray(y0, np.float64).reshape(exact.shape)
    return exact + y0, gamma(k + 3) * (size + np.abs(y0)) + (k + 3) * F32_TINY, RULE


def wrong_results(weights: Weights, x: np.ndarray) -> dict[str, np.ndarray]:
    """Results a broken kernel could produce; the comparison must reject each one."""
    w, _ = decode64(weights)
    x64 = np.atleast_2d(x).astype(np.float64)
    exact = x64 @ w.T
    m, n = exact.shape
    return {
        "transposed": (exact.T.reshape(m, n) if m != n else exact.T.copy()),
        "missing K tail": x64[:, :-1] @ w[:, :-1].T,
        "shifted row": np.roll(exact, 1, axis=0),
        "shifted column": np.roll(exact, 1, axis=1),
        "zeros": np.zeros_like(exact),
    }


# -- golden tests ---------------------------------------------------------------------------

def random_parts(rng, encoding: str, n: int, k: int, block: int = 32, zero: str = "min",
                 scale_type: str = "f16", codes: str = "random", scale: float = 0.01) -> Weights:
    """Parts built directly (no quantizer): random or extreme codes, scales of magnitude
    `scale` (times 0.5..1, random sign for mins). Padding codes past K stay 0 as the format
    requires. Also the benchmarks' fast random weights."""
    if encoding in ("f16", "f32"):
        w = (rng.standard_normal((n, k)) * scale).astype(np.float32)
        return Weights.quantized(w, encoding)
    blocks = blocks_per_row(k, block)
    width = blocks * block
    lo, hi = (0, 15) if encoding == "q4" else (-128, 127)
    if codes == "random":   # random bytes: every code value, and fast for benchmark sizes
        raw = rng.integers(0, 256, (n, width // 2 if encoding == "q4" else width), dtype=np.uint8)
    else:
        if codes in ("max", "min"):
            c = np.full((n, width), hi if codes == "max" else lo)
        elif codes == "eights":   # q4 "offset" values 0 and s: with a huge s, padding decodes to -8 s = -inf
            c = rng.choice([8, 9], (n, width))
        else:   # "mixed": extremes only (q8 also -127)
            c = rng.choice([lo, hi] if encoding == "q4" else [-128, -127, 127], (n, width))
        raw = quant.pack_nibbles(c.astype(np.uint8)) if encoding == "q4" else c.astype(np.int8).view(np.uint8)
    if encoding == "q8":
        raw[:, k:] = 0
    else:
        raw[:, (k + 1) // 2:] = 0
        if k % 2:
            raw[:, k // 2] &= 0x0F
    dtype = quant.SCALE_DTYPES[scale_type]
    s = (scale * rng.uniform(0.5, 1.0, (n, blocks))).astype(dtype)
    if encoding == "q8":
        return Weights("q8", n, k, {"codes": raw.tobytes(), "scales": s.tobytes()}, block, None, scale_type)
    parts = {"codes": raw.tobytes(), "scales": s.tobytes()}
    if zero == "min":
        finite = float(np.finfo(dtype).max)
        mins = np.clip(scale * rng.uniform(-8.0, 8.0, (n, blocks)), -finite, finite)
        parts["mins"] = mins.astype(dtype).tobytes()
    return Weights("q4", n, k, parts, block, zero, scale_type)


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
    tile: Tile | None = None           # None: the host function's choice
    x_stride: int | None = None
    y_stride: int | None = None


def _tag(config) -> str:
    return "/".join(str(v) for v in config if v is not None)


def _quantized(rng, config, w: np.ndarray) -> Weights:
    enc, block, zero, st = config
    return Weights.quantized(w.astype(np.float32), enc, block or 32, zero or "min", st or "f16")


def _random(rng, config, n: int, k: int, codes: str = "random", scale: float = 0.01) -> Weights:
    enc, block, zero, st = config
    return random_parts(rng, enc, n, k, block or 32, zero or "min", st or "f16", codes, scale)


def _cases(ctx: GoldenContext):
    rng, quick = ctx.rng, ctx.quick
    # Every tile on every tail shape, in the shipped encoding.
    for tile_name, tile in ([("chosen", None)] if quick else TILES.items()):
        for m, n, k in (TAIL_SHAPES[1:3] if quick else TAIL_SHAPES):
            yield Case(f"random {m}x{n}x{k} {_tag(SMOLLM)} tile {tile_name}", _random(rng, SMOLLM, n, k),
                       _activations(rng, m, k), tile=tile)
    # Every encoding option, quantized from real-valued data, on every tile.
    for config in ([Q8, F16] if quick else CONFIGS):
        for tile_name, tile in ([("chosen", None)] if quick else [("chosen", None), *TILES.items()]):
            shapes = [(3, 20, 45)] if quick else [(17, 70, 129), (3, 5, 257)] if tile is None else [(19, 37, 161)]
            for m, n, k in shapes:
                w = _quantized(rng, config, rng.standard_normal((n, k)))
                yield Case(f"quantized {m}x{n}x{k} {_tag(config)} tile {tile_name}", w, _activations(rng, m, k),
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
        for tile_name, tile in [("chosen", None)] + ([] if quick else [("128x64", TILES["128x64"])]):
            yield Case(f"accumulate {m}x{n}x{k} {_tag(config)} tile {tile_name}", _random(rng, config, n, k),
                       _activations(rng, m, k), y0=(rng.standard_normal((m, n)) * 4).astype(np.float32), tile=tile)
    if not quick:
        yield from _adversarial_cases(rng)
    if ctx.model is not None and "blk.0.ffn_up" in ctx.model.manifest.tensors:
        weights = Weights.from_model(ctx.model, "blk.0.ffn_up")
        m = 3 if quick else 17
        yield Case(f"real blk.0.ffn_up {m}x{weights.rows}x{weights.cols} {weights.encoding}", weights,
                   _activations(rng, m, weights.cols))


def _adversarial_cases(rng):
    m, n, k = 17, 45, 161   # K = 161: a partial last block for every block size
    for config in (SMOLLM, Q4_OFFSET, Q8, Q4_OFFSET_F32, Q8_F32):
        for codes in ("max", "min", "mixed"):   # q4 15 / 0, q8 127 / -128, and mixes of extremes
            yield Case(f"{codes} codes {m}x{n}x{k} {_tag(config)}", _random(rng, config, n, k, codes),
                       _activations(rng, m, k))
        for scale in ((6e-8, 6e4) if config[3] == "f16" else (1e-30, 1e30)):   # f16 subnormal .. huge
            yield Case(f"scale {scale:g} {m}x{n}x{k} {_tag(config)}", _random(rng, config, n, k, scale=scale),
                       _activations(rng, m, k))
    # q4 "offset", f32 scale near 3e38 (finite): real weights are 0 or s, but the last block's
    # padding codes (0) decode to -8 s = -inf, so the weights must be masked, not only x.
    yield Case(f"padding decodes to -inf {m}x{n}x{k} q4/64/offset/f32",
               random_parts(rng, "q4", n, k, 64, "offset", "f32", "eights", scale=3e38),
               _activations(rng, m, k) * np.float32(1e-3))
    for config in (SMOLLM, Q8, F16, F32):
        w = np.full((n, k), 0.37) + np.arange(n)[:, None] * 0.01
        yield Case(f"constant rows {m}x{n}x{k} {_tag(config)}", _quantized(rng, config, w),
                   _activations(rng, m, k, "constant"))
        w = np.abs(rng.standard_normal((n, k))) * np.where(np.arange(k) % 2, -1, 1)
        yield Case(f"alternating signs {m}x{n}x{k} {_tag(config)}", _quantized(rng, config, w),
                   _activations(rng, m, k, "alternating"))


@golden("gemm", kernels=("gemm_",))
async def golden_gemm(ctx: GoldenContext) -> list[GoldenResult]:
    results = []
    for case in _cases(ctx):
        m, n = case.x.shape[0], case.weights.rows
        p = plan(ctx.device.limits, case.weights, m, case.x_stride, case.y_stride, case.y0 is not None, case.tile)
        if not ctx.uses(p.kernel):
            continue
        exact, bound, rule = oracle(case.weights, case.x, case.y0)
        y = await gemm(ctx, case.weights, case.x, case.y0, case.tile, case.x_stride, case.y_stride)
        name = label(KERNELS[p.kernel], p.overrides)
        result = compare_bound("gemm", name, case.name, y[:, :n], exact, bound, rule)
        overwritten = int((~np.isnan(y[:, n:])).sum()) if case.y0 is None else 0   # strided y: padding kept
        results.append(dataclasses.replace(result, mismatched=result.mismatched + overwritten))
    # The comparison itself must reject wrong results (no GPU needed).
    weights = random_parts(ctx.rng, "q4", 33, 97)
    x = _activations(ctx.rng, 17, 97)
    exact, bound, rule = oracle(weights, x)
    for what, wrong in wrong_results(weights, x).items():
        check = compare_bound("gemm", "oracle", what, wrong, exact, bound, rule)
        results.append(GoldenResult("gemm", "oracle", f"rejects {what}", "a wrong result must fail the bound",
                                    check.max_abs_error, 0.0, 0, mismatched=int(check.passed)))
    return results


# -- benchmark hook -------------------------------------------------------------------------

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


async def prepare_bench(device: Device, name: str, shape: dict, rng, tile: Tile | None = None) -> runner.Prepared:
    """`name` is a kernel of this family (shape["kernel"]) or an encoding; the tile is the
    host function's choice for this device unless given. No readback."""
    encoding = name.removeprefix("gemm_")
    if encoding != shape["encoding"]:
        raise ValueError(f"{name} does not run {shape['encoding']} weights")
    m, n, k = shape["m"], shape["n"], shape["k"]
    weights = random_parts(rng, encoding, n, k, shape.get("block") or 32, shape.get("zero") or "min",
                           shape.get("scale_type") or "f16")
    x, stride = padded_activations(rng.standard_normal((m, k)).astype(np.float32), 0.0)
    p = plan(device.limits, weights, m, stride, n, tile=tile)
    kernel = await compile_kernel(device, p.kernel, **p.overrides)
    prepared = runner.prepare(device, kernel, p.params, [x, *weights.bindings()], [(m * n, np.float32)], p.grid)
    prepared.bytes_moved = weights.nbytes + m * k * 4 + m * n * 4
    prepared.flops = 2 * m * n * k
    return prepared
