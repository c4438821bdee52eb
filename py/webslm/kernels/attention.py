"""Causal grouped-query attention over the KV cache: decode (split-K) and prefill (tiled).

Kernels (shaders/attention_decode.wgsl, attention_prefill.wgsl, attention_prefill_rows.wgsl; the cache element type
comes from the prelude attention_kv_f32.wgsl or enable_f16.wgsl + attention_kv_f16.wgsl):

    attention_decode_{f32,f16}   one token at position p over positions 0..p, one workgroup
                                 per (KV head, block of its query heads, chunk of positions)
    attention_combine_{f32,f16}  the split-K second pass: rescale chunks to a common max, normalize
    attention_prefill_{f32,f16}  T tokens at start..start+T-1, causal, tiled with online softmax
    attention_prefill_rows_{f32,f16}  the same, one query row per invocation (head_dim <= 64)

The f16 variants read an f16 cache (tier B, need shader-f16); all arithmetic is f32. The
cache layout is kv_cache.py's: per layer K and V, each [n_kv_heads][capacity][head_dim].
Query head h reads KV head h // (n_heads / n_kv_heads). q is [T, n_heads * head_dim] f32
(after RoPE); the output has the same shape. The scale (default f32(1/sqrt(head_dim)), as
cpu/layers.attention) is a parameter. The engine appends a token's k and v (kv_append)
before attending, so the cache holds positions 0..start+T-1.

Host functions validate everything before a dispatch (KvShapeError names the problem) and
choose the variant's overrides: the workgroup size from the device limits, the heads per
workgroup GW, and for decode the chunk length from the context (one pass when short).
The engine binds a DecodePlan's two passes to one bind group (same bindings: params, q,
k_cache, v_cache, out, part_acc, part_ml) and submits them together; see `run_decode`.

Error rule (docs/kernels.md, section "attention"): see `error_bound`.
"""
from __future__ import annotations

import dataclasses

import numpy as np

from ..cpu import layers
from ..webgpu.interface import BufferBinding, Device, Dispatch
from . import runner
from .golden import F32_TINY, GoldenResult
from .kv_cache import DTYPES, WORKGROUPS, DispatchPlan, KvLayout, KvShapeError, check_workgroup, plan_append
from .registry import KernelSpec, register

DECODE_BINDINGS = ("uniform", "read-only-storage", "read-only-storage", "read-only-storage",
                   "storage", "storage", "storage")
PREFILL_BINDINGS = ("uniform", "read-only-storage", "read-only-storage", "read-only-storage", "storage")
HEADS_PER_GROUP = tuple(range(1, 9))
ROW_VEC4S = tuple(range(1, 65))      # head_dim / 4 for head_dim 4..256
PRELUDES = {"f32": ("attention_kv_f32.wgsl",), "f16": ("enable_f16.wgsl", "attention_kv_f16.wgsl")}
DECODE_SOURCES = ("attention_decode_core.wgsl", "attention_decode.wgsl")   # core: shared with attention_rope.py
for _dtype, _features in (("f32", frozenset()), ("f16", frozenset({"shader-f16"}))):
    register(
        KernelSpec(f"attention_decode_{_dtype}", (*PRELUDES[_dtype], *DECODE_SOURCES), "decode_chunk",
                   DECODE_BINDINGS, {"WG": WORKGROUPS, "GW": HEADS_PER_GROUP, "HD4": ROW_VEC4S}, _features),
        KernelSpec(f"attention_combine_{_dtype}", (*PRELUDES[_dtype], *DECODE_SOURCES), "combine",
                   DECODE_BINDINGS, {"WG": WORKGROUPS, "HD4": ROW_VEC4S}, _features),
        KernelSpec(f"attention_prefill_{_dtype}", (*PRELUDES[_dtype], "attention_prefill.wgsl"), "prefill",
                   PREFILL_BINDINGS, {"WG": WORKGROUPS, "HD4": ROW_VEC4S}, _features),
        KernelSpec(f"attention_prefill_rows_{_dtype}", (*PRELUDES[_dtype], "attention_prefill_rows.wgsl"),
                   "prefill_rows", PREFILL_BINDINGS, {"HD4": ROW_VEC4S[:16]}, _features),
    )

# Workgroup memory the WGSL declares (bytes), checked against the device before dispatch.
DECODE_STORAGE = 256 * 16 + 256 * 4 + 2048 * 4 + 8 * 4
PREFILL_STORAGE = 528 * 16 + 272 * 16 + 512 * 4 + 2 * 16 * 4
# attention_prefill_rows.wgsl: one query row per invocation, its q and output in registers
# (head_dim <= 64), ROWS rows a workgroup, TILE keys a tile, K and V tiles double-buffered.
ROWS_KERNEL_ROWS, ROWS_KERNEL_TILE, ROWS_KERNEL_MAX_HD4 = 64, 16, 16
# The knob: prefill variants in the host's order of preference (the first that fits is taken
# unless admission measured the other faster: PrefillChoice; bench/gemm_sweep.py times both).
# "tiles" fits every shape and device.
PREFILL_VARIANTS = ("rows", "tiles")
PREFILL_CHOICE = "attention prefill"     # a PrefillChoice's key among a session's measured choices


@dataclasses.dataclass(frozen=True)
class PrefillChoice:
    """The prefill variant admission measured fastest on this device for this model's attention
    shape (backends/gpu/tuning_attention.py); the lowering passes it to `plan_prefill`."""
    variant: str

    def __post_init__(self):
        if self.variant not in PREFILL_VARIANTS:
            raise KvShapeError("shape", f"prefill variant {self.variant!r} is not one of {PREFILL_VARIANTS}")

    def as_dict(self) -> dict:
        return {"variant": self.variant}

    @classmethod
    def from_dict(cls, data) -> "PrefillChoice":
        """From cached JSON (untrusted): typed, or KvShapeError."""
        if not isinstance(data, dict) or set(data) != {"variant"} or not isinstance(data["variant"], str):
            raise KvShapeError("shape", f"not a prefill attention choice: {data!r}"[:200])
        return cls(data["variant"])


def rows_storage(head_dim: int) -> int:
    return 2 * 2 * ROWS_KERNEL_TILE * (head_dim // 4) * 16
SCORE_WORDS = 2048           # decode: GW * chunk <= 2048
# Decode tuning, measured on an NVIDIA H200 (docs/kernels.md): a dispatch costs ~7 us there, so
# the combine pass is worth it only past a few hundred positions; about 256 workgroups of 256
# invocations keep the chip busy; one query head per workgroup is best (the G heads of a KV
# head re-read its rows from L2) until the layer's K/V pass 8 MiB, where two heads share.
TARGET_WORKGROUPS = 256      # split until about this many workgroups are in flight
MIN_CHUNK = 64               # shorter chunks cost more in the combine than they gain
SINGLE_PASS_MAX = 256        # contexts up to this length take one pass
SHARED_HEADS_BYTES = 8 << 20 # K + V bytes of a layer's context past which GW = 2
U_WGSL = 2.0 ** -23          # WGSL rounds either way: one operation errs by < 1 ULP <= 2^-23 |x|


def default_scale(head_dim: int) -> float:
    return float(np.float32(1.0 / np.sqrt(head_dim)))


def _scale(shape: "AttentionShape", scale: float | None) -> float:
    value = default_scale(shape.head_dim) if scale is None else float(scale)
    if not abs(value) <= float(np.finfo(np.float32).max) or value == 0:   # NaN fails too
        raise KvShapeError("shape", f"scale {scale!r} must be a finite non-zero f32")
    return value


@dataclasses.dataclass(frozen=True)
class AttentionShape:
    """A layer's attention geometry, with its cache; validated on construction."""
    n_heads: int
    n_kv_heads: int
    head_dim: int
    capacity: int
    dtype: str = "f32"

    def __post_init__(self):
        if self.n_heads < 1 or self.n_kv_heads < 1 or self.n_heads % self.n_kv_heads:
            raise KvShapeError("head-ratio", f"n_heads {self.n_heads} must be a positive multiple "
                                             f"of n_kv_heads {self.n_kv_heads}")
        _ = self.layout   # validates head_dim, capacity and cache offsets

    @property
    def layout(self) -> KvLayout:
        return KvLayout(self.n_kv_heads, self.capacity, self.head_dim, self.dtype)

    @property
    def group(self) -> int:
        return self.n_heads // self.n_kv_heads


@dataclasses.dataclass(frozen=True)
class DecodePlan:
    chunk_pass: DispatchPlan
    combine: DispatchPlan | None     # None: one chunk, the first pass writes the output
    chunk: int
    n_chunks: int
    slices: int                      # most slices any workgroup splits its positions into
    scratch_acc: int                 # f32 elements of part_acc (>= 4: bound as one vec4)
    scratch_ml: int                  # f32 elements of part_ml (>= 2)
    window: int | None = None        # a sliding window: the token sees its last `window` positions

    @property
    def summation_depth(self) -> int:
        """Most roundings a term meets in the sums: product, chunk sum, slices, combine."""
        return self.chunk + self.slices + self.n_chunks + 3

    @property
    def exp_chain(self) -> int:
        return 2 if self.combine else 1

    def params_at(self, position: int, chunk: int) -> np.ndarray:
        """The params for another position (and chunk), with this plan's heads, workgroups and
        scale: what a decode step rewrites, without planning again. Words 4..6 and 8 (keys,
        chunk, chunks, workgroups) follow the position; the rest was validated by plan_decode.
        The grid stays this plan's: workgroups past the position's chunks exit. With a window,
        word 10 (the first key) follows the position too."""
        words = self.chunk_pass.params.copy()
        n_heads, n_kv_heads, head_dim, capacity, blocks = (int(w) for w in words[[0, 1, 2, 3, 7]])
        if not 0 <= position < capacity:
            raise KvShapeError("position", f"position {position} is outside the cache (capacity {capacity})")
        if not 1 <= chunk <= SCORE_WORDS // self.chunk_pass.overrides["GW"]:
            raise KvShapeError("shape", f"chunk {chunk} does not fit this plan's workgroup memory")
        n_keys, first_key = window_keys(position, self.window)
        n_chunks = -(-n_keys // chunk)
        if n_heads * n_chunks * head_dim >= runner.U32_LIMIT:
            raise KvShapeError("offset-overflow", "split-K scratch offsets overflow u32")
        words[4:7] = (n_keys, chunk, n_chunks)
        words[8] = n_kv_heads * blocks * n_chunks
        if self.window is not None:
            words[10] = first_key
        return words


def window_keys(position: int, window: int | None) -> tuple[int, int]:
    """(keys, first key position) the token at `position` attends to: 0..position, or its last
    `window` positions (cpu/layers.attention's window: position - window + 1 .. position)."""
    n_keys = position + 1 if window is None else min(position + 1, window)
    return n_keys, position + 1 - n_keys


def _check_window(window: int | None) -> None:
    if window is not None and not (isinstance(window, int) and 1 <= window < runner.U32_LIMIT):
        raise KvShapeError("shape", f"window {window!r} must be a positive integer or None")


def plan_decode(limits: dict, shape: AttentionShape, position: int, scale: float | None = None,
                chunk: int | None = None, workgroup: int | None = None,
                heads_per_workgroup: int | None = None, window: int | None = None) -> DecodePlan:
    """Validate and plan decode attention for the token at `position` (keys 0..position, or
    with a sliding window its last `window` positions)."""
    if not 0 <= position < shape.capacity:
        raise KvShapeError("position", f"position {position} is outside the cache (capacity {shape.capacity})")
    _check_window(window)
    shape.layout.check_device(limits)
    wg = check_workgroup(limits, workgroup, 256, DECODE_STORAGE)
    e4 = shape.head_dim // 4
    n_keys, first_key = window_keys(position, window)
    if heads_per_workgroup is None:
        kv_bytes = 2 * shape.n_kv_heads * n_keys * shape.head_dim * DTYPES[shape.dtype].itemsize
        heads_per_workgroup = 2 if kv_bytes > SHARED_HEADS_BYTES else 1
    if not 1 <= heads_per_workgroup <= 8:
        raise KvShapeError("shape", f"heads_per_workgroup {heads_per_workgroup} must be in 1..8")
    blocks = -(-shape.group // min(8, 256 // e4, heads_per_workgroup))
    gw = -(-shape.group // blocks)                       # balanced blocks of <= 8 heads
    smallest = shape.group - (blocks - 1) * gw
    max_chunk = SCORE_WORDS // gw
    if chunk is None:
        wanted = -(-TARGET_WORKGROUPS // (shape.n_kv_heads * blocks))
        chunk = min(max_chunk, max(MIN_CHUNK, -(-n_keys // wanted)))
        if n_keys <= min(SINGLE_PASS_MAX, max_chunk):
            chunk = n_keys
    if not 1 <= chunk <= max_chunk:
        raise KvShapeError("shape", f"chunk {chunk} must be in 1..{max_chunk} for {gw} heads per workgroup")
    n_chunks = -(-n_keys // chunk)
    if shape.n_heads * n_chunks * shape.head_dim >= runner.U32_LIMIT:
        raise KvShapeError("offset-overflow", "split-K scratch offsets overflow u32")
    groups = shape.n_kv_heads * blocks * n_chunks
    params = runner.params_words(shape.n_heads, shape.n_kv_heads, shape.head_dim, shape.capacity,
                                 n_keys, chunk, n_chunks, blocks, groups, _scale(shape, scale), first_key)
    max_dim = limits.get("maxComputeWorkgroupsPerDimension", 65535)
    first = DispatchPlan(f"attention_decode_{shape.dtype}", {"WG": wg, "GW": gw, "HD4": e4}, params,
                         runner.workgroup_grid(groups, max_dim))
    second = None
    if n_chunks > 1:
        items = shape.n_heads * e4
        second = DispatchPlan(f"attention_combine_{shape.dtype}", {"WG": wg, "HD4": e4}, params,
                              runner.workgroup_grid(-(-items // wg), max_dim))
    split = n_chunks > 1
    return DecodePlan(first, second, chunk, n_chunks, max(1, wg // (smallest * e4)),
                      shape.n_heads * n_chunks * shape.head_dim if split else 4,
                      shape.n_heads * n_chunks * 2 if split else 2, window)


@dataclasses.dataclass(frozen=True)
class PrefillPlan:
    dispatch: DispatchPlan
    rows: int
    tile: int
    n_tiles: int                     # key tiles of the longest row

    @property
    def summation_depth(self) -> int:
        """Product, the tile's own sum, then a rescale and an add per later tile."""
        return self.tile + 2 * self.n_tiles + 2

    @property
    def exp_chain(self) -> int:
        return self.n_tiles + 1


def plan_prefill(limits: dict, shape: AttentionShape, start: int, n_tokens: int,
                 scale: float | None = None, workgroup: int | None = None,
                 variant: str | None = None, window: int | None = None) -> PrefillPlan:
    """Validate and plan prefill attention for tokens at start..start+n_tokens-1 (with a sliding
    window, token t sees only its last `window` positions). Variant "rows"
    (attention_prefill_rows: a query row per invocation, head_dim <= 64) where it fits, else
    "tiles" (attention_prefill: rows x keys tiles in workgroup memory, any head_dim)."""
    if n_tokens < 1 or start < 0:
        raise KvShapeError("shape", f"need n_tokens >= 1 and start >= 0, got {n_tokens}, {start}")
    _check_window(window)
    if start + n_tokens > shape.capacity:
        raise KvShapeError("position", f"positions {start}..{start + n_tokens - 1} exceed the "
                                       f"capacity {shape.capacity}")
    if n_tokens * shape.n_heads * shape.head_dim >= runner.U32_LIMIT:
        raise KvShapeError("offset-overflow", "T x n_heads x head_dim overflows u32 offsets")
    shape.layout.check_device(limits)
    fits_rows = (shape.head_dim // 4 <= ROWS_KERNEL_MAX_HD4 and workgroup is None
                 and rows_storage(shape.head_dim) <= limits.get("maxComputeWorkgroupStorageSize", 16384)
                 and ROWS_KERNEL_ROWS <= runner.max_invocations(limits))
    if variant not in (None, *PREFILL_VARIANTS) or (variant == "rows" and not fits_rows):
        raise KvShapeError("shape", f"prefill variant {variant!r} is not one of {PREFILL_VARIANTS} or does not "
                                    f"fit head_dim {shape.head_dim} (rows: <= 64, no workgroup size) on this device")
    if (variant or next(v for v in PREFILL_VARIANTS if v == "tiles" or fits_rows)) == "rows":
        row_blocks = -(-n_tokens * shape.group // ROWS_KERNEL_ROWS)
        groups = shape.n_kv_heads * row_blocks
        params = runner.params_words(shape.n_heads, shape.n_kv_heads, shape.head_dim, shape.capacity, start,
                                     n_tokens, ROWS_KERNEL_ROWS, ROWS_KERNEL_TILE, row_blocks, groups,
                                     _scale(shape, scale), window or 0)
        grid = runner.workgroup_grid(groups, limits.get("maxComputeWorkgroupsPerDimension", 65535))
        dispatch = DispatchPlan(f"attention_prefill_rows_{shape.dtype}", {"HD4": shape.head_dim // 4}, params, grid)
        return PrefillPlan(dispatch, ROWS_KERNEL_ROWS, ROWS_KERNEL_TILE, -(-(start + n_tokens) // ROWS_KERNEL_TILE))
    wg = check_workgroup(limits, workgroup, 256, PREFILL_STORAGE)
    rows = min(16, 2048 // shape.head_dim)
    tile = min(32, 272 // (shape.head_dim // 4 + 1), 512 // rows)
    row_blocks = -(-n_tokens * shape.group // rows)
    groups = shape.n_kv_heads * row_blocks
    params = runner.params_words(shape.n_heads, shape.n_kv_heads, shape.head_dim, shape.capacity,
                                 start, n_tokens, rows, tile, row_blocks, groups, _scale(shape, scale), window or 0)
    grid = runner.workgroup_grid(groups, limits.get("maxComputeWorkgroupsPerDimension", 65535))
    dispatch = DispatchPlan(f"attention_prefill_{shape.dtype}", {"WG": wg, "HD4": shape.head_dim // 4},
                            params, grid)
    return PrefillPlan(dispatch, rows, tile, -(-(start + n_tokens) // tile))


def _check_inputs(shape: AttentionShape, q: np.ndarray, n_tokens: int, k_cache, v_cache) -> None:
    if q.dtype != np.float32 or q.size != n_tokens * shape.n_heads * shape.head_dim:
        raise KvShapeError("shape", f"q must be f32 [{n_tokens}, {shape.n_heads * shape.head_dim}], "
                                    f"got {q.dtype} {q.shape}")
    shape.layout.check_array("k_cache", k_cache)
    shape.layout.check_array("v_cache", v_cache)


async def run_decode(device: Device, kernels, plan: DecodePlan, shape: AttentionShape,
                     q: np.ndarray, k_cache: np.ndarray, v_cache: np.ndarray) -> np.ndarray:
    """Both passes in one submit on fresh buffers (as the engine runs them); returns [H * E]."""
    _check_inputs(shape, q, 1, k_cache, v_cache)
    first, combine = kernels
    device.push_error_scope("validation")
    prepared = None
    try:
        prepared = runner.prepare(device, first, plan.chunk_pass.params, [q, k_cache, v_cache],
                                  [(shape.n_heads * shape.head_dim, np.float32),
                                   (plan.scratch_acc, np.float32), (plan.scratch_ml, np.float32)],
                                  plan.chunk_pass.grid)
        dispatches = [prepared.dispatch]
        if plan.combine is not None:     # same buffers, same bindings: one more bind group
            group = device.create_bind_group(combine.bind_group_layout,
                                             [BufferBinding(b) for b in prepared.buffers])
            dispatches.append(Dispatch(combine.pipeline, [group], plan.combine.grid))
        device.submit(dispatches)
        out = (await prepared.read_outputs(device))[0]
    finally:
        error = await device.pop_error_scope()
        if prepared is not None:
            prepared.release(device)
    if error is not None:
        raise runner.KernelRunError(f"attention decode: GPU {error.kind} error: {error.message}")
    return out


async def run_prefill(device: Device, kernel, plan: PrefillPlan, shape: AttentionShape, q: np.ndarray,
                      k_cache: np.ndarray, v_cache: np.ndarray) -> np.ndarray:
    n_tokens = int(plan.dispatch.params[5])
    _check_inputs(shape, q, n_tokens, k_cache, v_cache)
    (out,) = await runner.run_once(device, kernel, plan.dispatch.params, [q, k_cache, v_cache],
                                   [(q.size, np.float32)], plan.dispatch.grid)
    return out


# -- the oracle and the error rule -------------------------------------------------------

RULE = ("|gpu - exact| <= (sum_j p_j R_j |v_j| + |o| sum_j p_j R_j) / (1 - sum_j p_j R_j) "
        "+ 2.5 ULP division + n tiny (1 + max|v|); R_j = e^{d_j} (1 + (4 r + 6 x_j) 2^-23) "
        "(1 + gamma(D)) - 1, d_j = gamma(E + 1) scale sum|q k_j|, x_j = m - s_j + 2 max d, "
        "r exps per weight, D summation depth, gamma(n) = n 2^-23 / (1 - n 2^-23)")


def _gamma(n: int | np.ndarray) -> float | np.ndarray:
    return n * U_WGSL / (1 - n * U_WGSL)


def error_bound(q: np.ndarray, k: np.ndarray, v: np.ndarray, start: int, scale: float,
                depth: int, exps: int, q_magnitude: np.ndarray | None = None,
                score_roundings: int | None = None, window: int | None = None) -> tuple[np.ndarray, np.ndarray]:
    """(exact, bound), both [T, H * E]: the float64 oracle (cpu/layers.attention) and the
    elementwise bound of RULE for a kernel whose weights each pass through `exps` exp()
    calls and whose sums give each term at most `depth` roundings.

    q [T, H, E], k and v [n, K, E] hold exactly the values the kernel reads (f16-rounded
    for an f16 cache). Derivation (u = 2^-23: WGSL lets every operation round either way):
    - a score s_j = scale q.k_j is computed with |error| <= d_j = gamma(E + 1) scale sum|q k_j|;
      softmax ignores a common shift, so each weight's factor is within e^{+-d_j};
    - exp(x) errs by (3 + 2|x|) ULP (WGSL accuracy table); the r exps of a weight (its own and
      the rescales by max changes) have arguments summing to x_j = m - s_j <= max score gap,
      and each subtraction rounds once more: relative (4r + 6 x_j) u, x_j widened by 2 max d;
    - sums: each term meets at most D roundings, gamma(D) (Higham, 3.1), products included;
    - with every weight w_j (1 + rho_j), |rho_j| <= R_j, in numerator and denominator,
      out - o = (sum p_j rho_j v_j - o sum p_j sigma_j) / (1 + sum p_j sigma_j);
    - the final division errs by 2.5 ULP; flushed subnormals add n tiny (1 + max|v|).
    A kernel that computes q itself (attention_rope.py: RoPE in the kernel) passes the exact q,
    q_magnitude [T, H, E] (the sum of |term| that make up each q element, e.g. |a cos| + |b sin|)
    and score_roundings (the most roundings one of those terms meets in a score, E + 1 when q
    is read as is): d_j = gamma(score_roundings) scale sum_e q_magnitude_e |k_je|.
    With a sliding window, the keys outside a token's window count as masked, as in the oracle."""
    t, heads, e = q.shape
    n, kv_heads, _ = k.shape
    exact = layers.attention(q, k, v, start, scale, window)                   # [T, H * E]
    g = heads // kv_heads
    qg = q.reshape(t, kv_heads, g, e).transpose(1, 2, 0, 3)                  # [K, G, T, E]
    kt = k.transpose(1, 2, 0)                                                 # [K, E, n]
    s = (qg @ kt[:, None]) * scale                                            # [K, G, T, n]
    mg = qg if q_magnitude is None else q_magnitude.reshape(t, kv_heads, g, e).transpose(1, 2, 0, 3)
    d = _gamma(e + 1 if score_roundings is None else score_roundings) * abs(scale) * (np.abs(mg) @ np.abs(kt)[:, None])
    positions = (start + np.arange(t))[:, None]
    visible = np.arange(n)[None, :] <= positions                              # [T, n]
    if window is not None:
        visible &= np.arange(n)[None, :] > positions - window
    s = np.where(visible, s, -np.inf)
    m = s.max(axis=-1, keepdims=True)
    p = np.exp(s - m)
    p /= p.sum(axis=-1, keepdims=True)
    d = np.where(visible, d, 0.0)
    x = np.where(visible, m - s, 0.0) + 2 * d.max(axis=-1, keepdims=True)
    r = np.exp(d) * (1 + (4 * exps + 6 * x) * U_WGSL) * (1 + _gamma(depth)) - 1
    pr = p * r
    weighted = pr @ np.abs(v.transpose(1, 0, 2))[:, None]                     # [K, G, T, E]
    total = pr.sum(axis=-1, keepdims=True)
    o = np.abs(exact.reshape(t, kv_heads, g, e).transpose(1, 2, 0, 3))
    with np.errstate(divide="ignore"):
        first = np.where(total < 1, (weighted + o * total) / (1 - total), np.inf)
    floor = 2 * n * F32_TINY * (1 + np.abs(v).max())
    bound = first + 2.5 * U_WGSL * (o + first) + floor / np.maximum(1 - total, 1e-30)
    return exact, bound.transpose(2, 0, 1, 3).reshape(t, heads * e)


# -- test inputs (the golden cases in attention_cases.py, the tuning stage, benchmarks) -----

def make_case(rng: np.random.Generator, shape: AttentionShape, n_tokens: int, start: int, data: str):
    """q [T, H*E] f32 and caches [K][capacity][E] of shape.dtype. Rows past the last position
    are NaN: a kernel that reads beyond the causal end cannot pass."""
    h, kv, e, cap = shape.n_heads, shape.n_kv_heads, shape.head_dim, shape.capacity
    n = start + n_tokens
    q = rng.standard_normal((n_tokens, h * e)).astype(np.float32)
    k = rng.standard_normal((kv, n, e))
    v = rng.standard_normal((kv, n, e))
    # The rule's rounding term grows as E^1.5 at a given score size (gamma(E + 1) scale
    # sum |q k|): past E = 64 the large scores shrink as much, so that the bound still says
    # something (at E = 256 and 1e4 it would be infinite: a case that cannot pass).
    large = min(1.0, (64 / e) ** 1.5)
    if data == "huge":          # scores of order +-1e4 (E <= 64): softmax must not overflow
        q *= np.float32(1e4 * large)
    elif data == "close":       # scores ~1e3 that differ by ~10: large values, near-ties at the top
        q *= np.float32(1e3 * large)
        k = k[:, :1] + 1e-2 * k
    elif data == "identical":   # every key of a head equal: uniform weights, output = mean of V
        k[:] = k[:, :1]
    dtype = DTYPES[shape.dtype]
    caches = []
    for rows in (k, v):
        cache = np.full((kv, cap, e), np.nan, dtype)
        cache[:, :n] = rows.astype(np.float32).astype(dtype)
        caches.append(cache.reshape(-1))
    return q, caches[0], caches[1]


def checked(result: GoldenResult, bound: np.ndarray) -> GoldenResult:
    """A bound that says nothing (infinite: sum p R >= 1) cannot pass a case."""
    vacuous = int((~np.isfinite(bound)).sum())
    return dataclasses.replace(result, mismatched=result.mismatched + vacuous) if vacuous else result


def oracle_inputs(shape: AttentionShape, q, k_cache, v_cache, n_keys: int):
    """The float64 views the oracle reads: q [T, H, E], k and v [n, K, E]."""
    e = shape.head_dim
    k = k_cache.reshape(shape.n_kv_heads, shape.capacity, e)[:, :n_keys].astype(np.float64).transpose(1, 0, 2)
    v = v_cache.reshape(shape.n_kv_heads, shape.capacity, e)[:, :n_keys].astype(np.float64).transpose(1, 0, 2)
    return q.astype(np.float64).reshape(-1, shape.n_heads, e), k, v


# -- benchmark hook ------------------------------------------------------------------------

_MODELS = {"smollm2-135m": (9, 3, 64), "llama-3.2-1b": (32, 8, 64), "llama-3-8b": (32, 8, 128)}
BENCH_SHAPES: dict[str, dict] = {   # "big": skipped by quick (software-adapter) benchmark runs
    f"{model}/{kind}": {"n_heads": h, "n_kv_heads": kv, "head_dim": e, "tokens": tokens, "context": context,
                        "big": model == "llama-3-8b" or context == 4096}
    for model, (h, kv, e) in _MODELS.items()
    for kind, tokens, context in (("decode-1024", 1, 1024), ("decode-4096", 1, 4096), ("prefill-512", 512, 512))
}
BENCH_KERNELS = tuple(f"{kind}_{dtype}" for kind in ("attention_decode", "attention_combine",
                                                     "attention_prefill", "attention_prefill_rows", "kv_append")
                      for dtype in ("f32", "f16"))


async def prepare_bench(device: Device, name: str, shape: dict, rng: np.random.Generator) -> runner.Prepared:
    """One dispatch of kernel `name` (one of BENCH_KERNELS) on random data for a BENCH_SHAPES
    entry: `context` positions in the cache, the last `tokens` of them new. Decode kernels
    take only one-token shapes (ValueError otherwise); attention_decode times the first pass
    with the host's chunking, attention_combine the second pass for that chunking."""
    from .registry import compile_kernel
    dtype = name.rsplit("_", 1)[1]
    h, kv, e, t, n = (shape[key] for key in ("n_heads", "n_kv_heads", "head_dim", "tokens", "context"))
    geometry = AttentionShape(h, kv, e, n, dtype)
    item = DTYPES[dtype].itemsize
    k_cache = rng.standard_normal(geometry.layout.elements).astype(DTYPES[dtype])
    v_cache = rng.standard_normal(geometry.layout.elements).astype(DTYPES[dtype])
    q = rng.standard_normal(t * h * e).astype(np.float32)
    kv_bytes = 2 * kv * n * e * item
    if name.startswith(("attention_decode", "attention_combine")):
        if t != 1:
            raise ValueError(f"{name} attends one token; shape has {t}")
        plan = plan_decode(device.limits, geometry, n - 1)
        scratch = [(plan.scratch_acc, np.float32), (plan.scratch_ml, np.float32)]
        if name.startswith("attention_combine"):
            if plan.combine is None:
                raise ValueError(f"context {n} is decoded in one pass: there is nothing to combine")
            step = plan.combine
            scratch = [rng.standard_normal(plan.scratch_acc).astype(np.float32),
                       rng.standard_normal(plan.scratch_ml).astype(np.float32)]
            bytes_moved = 4 * (plan.scratch_acc + plan.scratch_ml + h * e)
            flops = 4 * plan.scratch_acc
        else:
            step = plan.chunk_pass
            bytes_moved = kv_bytes + 4 * h * e * (2 if plan.combine is None else 1) + \
                4 * (plan.scratch_acc + plan.scratch_ml) * (plan.combine is not None)
            flops = 4 * h * n * e
        kernel = await compile_kernel(device, name, **step.overrides)
        return dataclasses.replace(
            runner.prepare(device, kernel, step.params, [q, k_cache, v_cache],
                           [(h * e, np.float32), *scratch], step.grid),
            bytes_moved=bytes_moved, flops=flops)
    if name.startswith("attention_prefill"):
        variant = "rows" if name.startswith("attention_prefill_rows") else "tiles"
        plan = plan_prefill(device.limits, geometry, n - t, t, variant=variant).dispatch
        kernel = await compile_kernel(device, name, **plan.overrides)
        pairs = sum(n - t + i + 1 for i in range(t))           # (query, visible key) pairs per head
        return dataclasses.replace(
            runner.prepare(device, kernel, plan.params, [q, k_cache, v_cache], [(t * h * e, np.float32)],
                           plan.grid),
            bytes_moved=kv_bytes + 8 * t * h * e, flops=4 * h * e * pairs)
    if name.startswith("kv_append"):
        plan = plan_append(device.limits, geometry.layout, n - t, t)
        kernel = await compile_kernel(device, name, **plan.overrides)
        new = [rng.standard_normal(t * kv * e).astype(np.float32) for _ in range(2)]
        return dataclasses.replace(
            runner.prepare(device, kernel, plan.params, new, [k_cache, v_cache], plan.grid),
            bytes_moved=2 * t * kv * e * (4 + item), flops=0)
    raise ValueError(f"{name!r} is not one of {BENCH_KERNELS}")
