"""The KV cache layout, its shape checks, and kv_append (shaders/kv_append.wgsl).

KV cache layout (the engine allocates exactly this; the attention kernels read it):

    per layer, two buffers, K and V, each  [n_kv_heads][capacity][head_dim]
    element (kv, position, e) at index (kv * capacity + position) * head_dim + e

Head-major: one KV head's positions are contiguous, so decode attention streams a head's
rows linearly. The element type is f32 (tier A) or f16 (tier B: a device with shader-f16;
half the memory and bandwidth, accumulation stays f32 in every kernel). head_dim is a
multiple of 4 (the kernels read rows as vec4) and at most 256. Element offsets are u32 in
WGSL, so n_kv_heads * capacity * head_dim must stay below 2^32, and a buffer must fit the
device's maxStorageBufferBindingSize. Positions past the last appended one are never read.

kv_append writes the keys and values of T new tokens (after RoPE), given as
[T, n_kv_heads * head_dim] f32, at positions start..start+T-1. It is exact: the f32 variant
copies bits; the f16 variant rounds to nearest even in integer arithmetic, which is what
numpy's astype(float16) does (the oracle; bits compared exactly). Neither variant needs
shader-f16 (the cache is written as u32 words); attention over an f16 cache does.
"""
from __future__ import annotations

import dataclasses

import numpy as np

from ..webgpu.interface import Device
from . import runner
from .golden import GoldenContext, GoldenResult, compare_exact, label
from .registry import KernelSpec, register

WORKGROUPS = (64, 128, 256)          # the allowlist of every kernel of the attention family
DTYPES = {"f32": np.dtype(np.float32), "f16": np.dtype(np.float16)}
MAX_HEAD_DIM = 256
U32_LIMIT = runner.U32_LIMIT


class KvShapeError(ValueError):
    """A KV cache or attention call whose shape or position the kernels cannot serve.
    `problem` names it: "head-dim", "head-ratio", "position", "offset-overflow",
    "binding-size", "binding-count", "shape", "workgroup", "device"."""

    def __init__(self, problem: str, message: str):
        super().__init__(f"{problem}: {message}")
        self.problem = problem


@dataclasses.dataclass(frozen=True)
class KvLayout:
    """One layer's K (or V) buffer: [n_kv_heads][capacity][head_dim] of `dtype`."""
    n_kv_heads: int
    capacity: int
    head_dim: int
    dtype: str = "f32"               # "f32" or "f16"

    def __post_init__(self):
        for name in ("n_kv_heads", "capacity", "head_dim"):
            value = getattr(self, name)
            if not isinstance(value, (int, np.integer)) or value < 1:
                raise KvShapeError("shape", f"{name} must be a positive integer, not {value!r}")
        if self.dtype not in DTYPES:
            raise KvShapeError("shape", f"cache dtype must be one of {sorted(DTYPES)}, not {self.dtype!r}")
        if self.head_dim % 4 or self.head_dim > MAX_HEAD_DIM:
            raise KvShapeError("head-dim", f"head_dim {self.head_dim} must be a multiple of 4 and "
                                           f"at most {MAX_HEAD_DIM} (rows are read as vec4)")
        if self.elements >= U32_LIMIT:
            raise KvShapeError("offset-overflow", f"{self.n_kv_heads} x {self.capacity} x "
                                                  f"{self.head_dim} elements overflow u32 offsets")

    @property
    def elements(self) -> int:
        return self.n_kv_heads * self.capacity * self.head_dim

    @property
    def nbytes(self) -> int:
        return self.elements * DTYPES[self.dtype].itemsize

    def index(self, kv_head: int, position: int) -> int:
        """Element offset of row (kv_head, position)."""
        return (kv_head * self.capacity + position) * self.head_dim

    def check_device(self, limits: dict) -> None:
        limit = limits.get("maxStorageBufferBindingSize", 2 ** 27)
        if self.nbytes > limit:
            raise KvShapeError("binding-size", f"a {self.nbytes}-byte cache buffer exceeds "
                                               f"maxStorageBufferBindingSize {limit}")

    def check_array(self, name: str, cache: np.ndarray) -> None:
        if cache.dtype != DTYPES[self.dtype] or cache.size != self.elements:
            raise KvShapeError("shape", f"{name} must hold {self.elements} {self.dtype} elements "
                                        f"([{self.n_kv_heads}][{self.capacity}][{self.head_dim}]), "
                                        f"got {cache.size} of {cache.dtype}")


def pick_workgroup(limits: dict, preferred: int, storage_bytes: int = 0) -> int:
    """The largest allowlisted workgroup size <= preferred that the device admits
    (compatibility devices: 128 invocations), after checking workgroup memory."""
    if storage_bytes > limits.get("maxComputeWorkgroupStorageSize", 16384):
        raise KvShapeError("device", f"kernel needs {storage_bytes} bytes of workgroup memory, device "
                                     f"offers {limits.get('maxComputeWorkgroupStorageSize')}")
    size = runner.largest_workgroup(limits, WORKGROUPS, preferred)
    if size is None:
        raise KvShapeError("device", f"the device admits {runner.max_invocations(limits)} invocations; "
                                     f"kernels need 64")
    return size


def check_workgroup(limits: dict, workgroup: int | None, preferred: int, storage_bytes: int = 0) -> int:
    chosen = pick_workgroup(limits, preferred if workgroup is None else 256, storage_bytes)
    if workgroup is None:
        return chosen
    if workgroup not in WORKGROUPS or workgroup > chosen:
        raise KvShapeError("workgroup", f"workgroup {workgroup} is not in {WORKGROUPS} or exceeds the device")
    return workgroup


# -- kv_append ---------------------------------------------------------------------------

APPEND_BINDINGS = ("uniform", "read-only-storage", "read-only-storage", "storage", "storage")
register(
    KernelSpec("kv_append_f32", ("f16_round.wgsl", "kv_append.wgsl"), "append_f32", APPEND_BINDINGS, {"WG": WORKGROUPS}),
    KernelSpec("kv_append_f16", ("f16_round.wgsl", "kv_append.wgsl"), "append_f16", APPEND_BINDINGS, {"WG": WORKGROUPS}),
)


@dataclasses.dataclass(frozen=True)
class DispatchPlan:
    """What the host hands to one dispatch: the variant, its overrides, the uniform block, the grid."""
    kernel: str
    overrides: dict
    params: np.ndarray
    grid: tuple[int, int, int]


def plan_append(limits: dict, layout: KvLayout, start: int, n_tokens: int,
                workgroup: int | None = None) -> DispatchPlan:
    """Validate and plan kv_append of n_tokens rows at positions start.. (before dispatch)."""
    if n_tokens < 1 or start < 0:
        raise KvShapeError("shape", f"need n_tokens >= 1 and start >= 0, got {n_tokens}, {start}")
    if start + n_tokens > layout.capacity:
        raise KvShapeError("position", f"positions {start}..{start + n_tokens - 1} exceed the "
                                       f"capacity {layout.capacity}")
    layout.check_device(limits)
    wg = check_workgroup(limits, workgroup, 256)
    items = n_tokens * layout.n_kv_heads * layout.head_dim // 4
    params = runner.params_words(layout.n_kv_heads, layout.head_dim, layout.capacity, start, n_tokens)
    grid = runner.workgroup_grid(-(-items // wg), limits.get("maxComputeWorkgroupsPerDimension", 65535))
    return DispatchPlan(f"kv_append_{layout.dtype}", {"WG": wg}, params, grid)


async def run_append(device: Device, kernel, plan: DispatchPlan, layout: KvLayout, k_new: np.ndarray,
                     v_new: np.ndarray, k_cache: np.ndarray, v_cache: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Append on fresh buffers holding the given caches; returns the caches afterwards."""
    n_tokens = int(plan.params[4])
    for name, new in (("k_new", k_new), ("v_new", v_new)):
        if new.dtype != np.float32 or new.shape != (n_tokens, layout.n_kv_heads * layout.head_dim):
            raise KvShapeError("shape", f"{name} must be f32 [{n_tokens}, {layout.n_kv_heads * layout.head_dim}], "
                                        f"got {new.dtype} {new.shape}")
    layout.check_array("k_cache", k_cache)
    layout.check_array("v_cache", v_cache)
    k_out, v_out = await runner.run_once(device, kernel, plan.params, [k_new, v_new],
                                         [k_cache.reshape(-1), v_cache.reshape(-1)], plan.grid)
    return k_out, v_out


def append_reference(layout: KvLayout, cache: np.ndarray, new: np.ndarray, start: int) -> np.ndarray:
    """The oracle: the cache with rows start.. replaced (astype(float16) rounds to nearest even)."""
    out = cache.reshape(layout.n_kv_heads, layout.capacity, layout.head_dim).copy()
    rows = new.reshape(new.shape[0], layout.n_kv_heads, layout.head_dim).transpose(1, 0, 2)
    with np.errstate(over="ignore"):          # beyond 65504: infinity, as IEEE rounding gives
        out[:, start:start + new.shape[0]] = rows.astype(DTYPES[layout.dtype])
    return out.reshape(-1)


def adversarial_values(rng: np.random.Generator, n: int) -> np.ndarray:
    """f32 values that probe an f16 conversion: exact ties (to even, both directions), the
    overflow edge (65504 stays, 65520 becomes infinity), the subnormal range and its edges,
    signed zeros and infinities, mixed with ordinary values."""
    halves = rng.integers(0, 0x7bff, n, dtype=np.uint16).view(np.float16).astype(np.float32)
    ulp = np.spacing(halves.astype(np.float16)).astype(np.float32)
    ties = halves + ulp / 2                     # exactly halfway (f32 holds it exactly)
    special = np.array([0.0, -0.0, 65504.0, 65519.996, 65520.0, 1e5, np.inf, -np.inf, 2.0 ** -24,
                        2.0 ** -25, 2.0 ** -25 * 1.0000001, 3 * 2.0 ** -26, 2.0 ** -14, 2.0 ** -14 * (1 - 2 ** -12),
                        6e-8, 1e-8, 1e-30, -3e-5, 1 + 2.0 ** -11, 1 + 3 * 2.0 ** -11], np.float32)
    pool = np.concatenate([ties, -ties, halves * rng.choice([1, -1], n), special,
                           rng.standard_normal(n).astype(np.float32) * 10.0 ** rng.integers(-9, 5, n)])
    return rng.choice(pool, n).astype(np.float32)


async def golden_append(ctx: GoldenContext, family: str) -> list[GoldenResult]:
    """Exact comparisons of both append variants, untouched rows included."""
    cases = [(2, 40, 33, 32, 1), (3, 64, 300, 0, 37)] if ctx.quick else [
        (3, 64, 40, 0, 1),          # SmolLM2 geometry, first token
        (2, 40, 33, 32, 1),         # last position of the cache
        (8, 128, 700, 200, 129),    # a prompt chunk in the middle
        (1, 256, 64, 5, 59),        # one KV head, the widest head
        (3, 64, 3100, 2999, 101),   # up to the end of a long cache
    ]
    results = []
    for spec in ctx.variants("kv_append_"):
        dtype = spec.name.rsplit("_", 1)[1]
        for n_kv, head_dim, capacity, start, n_tokens in cases:
            layout = KvLayout(n_kv, capacity, head_dim, dtype)
            asked = plan_append(ctx.device.limits, layout, start, n_tokens)
            for overrides in ctx.launches(asked.kernel, asked.overrides):
                plan = plan_append(ctx.device.limits, layout, start, n_tokens, overrides["WG"])
                kernel = await ctx.kernel(plan.kernel, **plan.overrides)
                width = n_kv * head_dim
                k_new = adversarial_values(ctx.rng, n_tokens * width).reshape(n_tokens, width)
                v_new = ctx.rng.standard_normal((n_tokens, width)).astype(np.float32)
                bits = np.uint32 if dtype == "f32" else np.uint16     # prior content: random bit patterns
                k_cache = ctx.rng.integers(0, 2 ** 31, layout.elements).astype(bits).view(DTYPES[dtype])
                v_cache = ctx.rng.integers(0, 2 ** 31, layout.elements).astype(bits).view(DTYPES[dtype])
                k_got, v_got = await run_append(ctx.device, kernel, plan, layout, k_new, v_new, k_cache, v_cache)
                for what, got, cache, new in (("K", k_got, k_cache, k_new), ("V", v_got, v_cache, v_new)):
                    want = append_reference(layout, cache, new, start)
                    case = f"{what} {n_kv}x{capacity}x{head_dim} start={start} T={n_tokens}"
                    results.append(compare_exact(family, label(spec, plan.overrides), case,
                                                 got.view(bits), want.view(bits)))
    return results
