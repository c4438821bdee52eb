"""Rotary position embedding (shaders/rope.wgsl): registry entry, host side, golden tests, bench hook.

    rope   qk [T, heads, head_dim] f32 (or rows of token_stride elements), rotated in place at
           positions start..start+T-1 with a (cos, sin) table [table_rows, rotary_dim/2]

The table is built on the host by `rope_table`, which calls the CPU reference's rope_tables:
GPU and CPU rotate by the same f32 numbers (on-device sin/cos of large angles is inaccurate on
some GPUs; see the WGSL header). The engine builds it once per model for the context length.
"""
from __future__ import annotations

from typing import NamedTuple

import numpy as np

from ..cpu.layers import rope_tables
from ..webgpu.interface import Device
from . import runner
from .golden import F32_TINY, GoldenContext, GoldenResult, compare_bound, gamma, golden, label
from .registry import CompiledKernel, KernelSpec, compile_kernel, register

CONVENTIONS = {"rotate-half": 0, "adjacent-pair": 1}   # -> the ADJACENT override
WORKGROUP_SIZES = runner.LAYER_WORKGROUP_SIZES

# Bindings: params, table (read) -> qk (updated in place; run_once takes its initial content).
register(KernelSpec("rope", ("rope.wgsl",), "rope", ("uniform", "read-only-storage", "storage"),
                    {"WG": WORKGROUP_SIZES, "ADJACENT": (0, 1)}))


# -- host side ------------------------------------------------------------------------------

def rope_table(table_rows: int, rotary_dim: int, base: float, position_offset: int = 0) -> np.ndarray:
    """[table_rows, rotary_dim/2, 2] f32: (cos, sin) of every pair at positions
    position_offset .. position_offset + table_rows - 1, exactly as the CPU engine computes them."""
    cos, sin = rope_tables(np.arange(table_rows) + position_offset, rotary_dim, base)
    return np.ascontiguousarray(np.stack([cos, sin], axis=-1), np.float32)


class RopePlan(NamedTuple):
    overrides: dict[str, int]        # {"WG": ..., "ADJACENT": 0|1}
    params: np.ndarray               # tokens, heads, head_dim, half, start, token_stride
    grid: tuple[int, int, int]       # one invocation per rotated pair


def plan_rope(limits: dict[str, int], tokens: int, heads: int, head_dim: int, rotary_dim: int,
              start: int, table_rows: int, convention: str, token_stride: int | None = None,
              workgroup: int | None = None) -> RopePlan:
    """Validate one RoPE launch and build it. Raises ValueError naming the problem."""
    if convention not in CONVENTIONS:
        raise ValueError(f"rope convention must be one of {sorted(CONVENTIONS)}, not {convention!r}")
    if min(tokens, heads, head_dim) < 1:
        raise ValueError(f"rope needs tokens, heads, head_dim >= 1, got {tokens}, {heads}, {head_dim}")
    if rotary_dim < 2 or rotary_dim % 2 or rotary_dim > head_dim:
        raise ValueError(f"rotary_dim {rotary_dim} must be even, >= 2 and <= head_dim {head_dim}")
    token_stride = heads * head_dim if token_stride is None else token_stride
    if token_stride < heads * head_dim:
        raise ValueError(f"token_stride {token_stride} is shorter than heads * head_dim = {heads * head_dim}")
    if start < 0 or start + tokens > table_rows:
        raise ValueError(f"positions {start}..{start + tokens - 1} need table rows up to {start + tokens}, "
                         f"but the table has {table_rows} (position >= capacity)")
    half = rotary_dim // 2
    runner.check_binding_size(limits, f"rope table [{table_rows}, {half}] (cos, sin)", table_rows * half * 8)
    runner.check_binding_size(limits, f"qk [{tokens}, {token_stride}] f32",
                       ((tokens - 1) * token_stride + heads * head_dim) * 4)
    pairs = tokens * heads * half
    wg = runner.layer_workgroup(limits, workgroup, 256)
    groups = -(-pairs // wg)
    if groups * wg >= runner.U32_LIMIT:
        raise ValueError(f"{pairs} pairs overflow the u32 invocation index")
    grid = runner.workgroup_grid(groups, limits["maxComputeWorkgroupsPerDimension"])
    params = runner.params_words(tokens, heads, head_dim, half, start, token_stride)
    return RopePlan({"WG": wg, "ADJACENT": CONVENTIONS[convention]}, params, grid)


async def apply_rope(device: Device, qk: np.ndarray, table: np.ndarray, start: int, convention: str,
                     heads: int | None = None, head_dim: int | None = None,
                     kernel: CompiledKernel | None = None) -> np.ndarray:
    """Rotate a copy of qk on the GPU and return it.

    qk [T, heads, head_dim], or [T, token_stride] with heads and head_dim given (the first
    heads * head_dim elements of each row are rotated); table from rope_table."""
    if table.ndim != 3 or table.shape[2] != 2:
        raise ValueError(f"table must be [rows, rotary_dim/2, 2], got {table.shape}")
    if qk.ndim == 3:
        tokens, heads, head_dim = qk.shape
        stride = heads * head_dim
    elif qk.ndim == 2 and heads and head_dim:
        tokens, stride = qk.shape
    else:
        raise ValueError(f"qk must be [T, heads, head_dim] (or [T, stride] with heads, head_dim), got {qk.shape}")
    plan = plan_rope(device.limits, tokens, heads, head_dim, 2 * table.shape[1], start, table.shape[0],
                     convention, stride, kernel.overrides.get("WG") if kernel else None)
    if kernel is None:
        kernel = await compile_kernel(device, "rope", **plan.overrides)
    elif kernel.overrides.get("ADJACENT", 0) != plan.overrides["ADJACENT"]:
        raise ValueError(f"kernel {kernel.overrides} does not implement the {convention} convention")
    out, = await runner.run_once(device, kernel, plan.params, [table.astype(np.float32)],
                                 [qk.astype(np.float32).copy()], plan.grid)
    return out.reshape(qk.shape)


# -- the oracle and its tolerance --------------------------------------------------------------

ROPE_RULE = ("|err| <= gamma(2) (|a cos| + |b sin|) + 2^-126 for rotated elements, with the table's f32 "
             "cos/sin; elements past rotary_dim (and past heads*head_dim in a row) unchanged")


def rope_oracle(qk: np.ndarray, table: np.ndarray, start: int, convention: str, heads: int,
                head_dim: int) -> tuple[np.ndarray, np.ndarray]:
    """float64 rotation of f32 inputs by the table's f32 (cos, sin), and the error bound.

    a cos - b sin is two products and one sum: gamma(2) (|a cos| + |b sin|) for any evaluation,
    with or without a fused multiply-add. Untouched elements have bound 0 (compare_bound
    still allows 2^-126, far below any rotation's change)."""
    tokens, width = qk.shape[0], heads * head_dim
    rows = qk.reshape(tokens, -1).astype(np.float64)
    exact, bound = rows.copy(), np.zeros_like(rows)
    half = table.shape[1]
    cos = table[start:start + tokens, :, 0].astype(np.float64)[:, None, :]   # [T, 1, half]
    sin = table[start:start + tokens, :, 1].astype(np.float64)[:, None, :]
    if convention == "rotate-half":
        first, second = np.arange(half), np.arange(half) + half
    else:
        first, second = 2 * np.arange(half), 2 * np.arange(half) + 1
    heads_in = rows[:, :width].reshape(tokens, heads, head_dim)
    a, b = heads_in[:, :, first], heads_in[:, :, second]
    heads_exact = heads_in.copy()
    heads_bound = np.zeros_like(heads_in)
    heads_exact[:, :, first] = a * cos - b * sin
    heads_exact[:, :, second] = b * cos + a * sin
    heads_bound[:, :, first] = gamma(2) * (np.abs(a * cos) + np.abs(b * sin)) + F32_TINY
    heads_bound[:, :, second] = gamma(2) * (np.abs(b * cos) + np.abs(a * sin)) + F32_TINY
    exact[:, :width] = heads_exact.reshape(tokens, width)
    bound[:, :width] = heads_bound.reshape(tokens, width)
    return exact.reshape(qk.shape), bound.reshape(qk.shape)


def check_rope(kernel: str, case: str, qk: np.ndarray, table: np.ndarray, start: int, convention: str,
               heads: int, head_dim: int, got: np.ndarray) -> GoldenResult:
    exact, bound = rope_oracle(qk, table, start, convention, heads, head_dim)
    return compare_bound("rope", kernel, case, got, exact, bound, ROPE_RULE)


# -- golden cases ---------------------------------------------------------------------------------

class RopeCase(NamedTuple):
    name: str
    qk: np.ndarray                # [T, heads, head_dim] or [T, stride]
    heads: int
    head_dim: int
    rotary_dim: int
    base: float
    start: int
    table_rows: int
    position_offset: int = 0


def rope_cases(rng: np.random.Generator, quick_only: bool, model=None) -> list[RopeCase]:
    n = rng.standard_normal
    cases = [
        RopeCase("random smollm2 heads 9x64, positions 5..7", n((3, 9, 64)), 9, 64, 64, 1e5, 5, 8),
        RopeCase("partial rotary 8 of 12, 4 heads", n((2, 4, 12)), 4, 12, 8, 1e4, 1, 64),
        RopeCase("long positions 30000..30003, 3 heads", n((4, 3, 64)), 3, 64, 64, 1e5, 30000, 30004),
    ]
    if quick_only:
        return cases
    alternating = np.where(np.arange(128) % 2 == 0, 1.0, -1.0) * np.linspace(1, 100, 128)
    qkv = n((2, (4 + 2 + 2) * 16))               # a fused QKV row: rotate Q and K (6 heads), not V
    cases += [
        RopeCase("llama-3-8b head_dim 128, base 5e5, positions 0..4", n((5, 3, 128)), 3, 128, 128, 5e5, 0, 5),
        RopeCase("odd head_dim 7, rotary 4, 9 heads", n((3, 9, 7)), 9, 7, 4, 1e4, 2, 5),
        RopeCase("single pair rotary 2", n((2, 3, 6)), 3, 6, 2, 1e4, 11, 13),
        RopeCase("huge values", 1e30 * n((2, 3, 64)), 3, 64, 64, 1e4, 1000, 1002),
        RopeCase("tiny values", 1e-30 * n((2, 3, 64)), 3, 64, 64, 1e4, 1000, 1002),
        RopeCase("alternating signs", np.tile(alternating, (3, 5, 1)), 5, 128, 96, 1e4, 77, 80),
        RopeCase("fused QKV row, token_stride 128", qkv, 6, 16, 16, 1e4, 9, 11),
        RopeCase("position offset 3, positions 40..41", n((2, 2, 12)), 2, 12, 12, 1e4, 40, 64, 3),
        RopeCase("many tokens 600 x 9 heads", n((600, 9, 64)), 9, 64, 64, 1e5, 100, 700),
    ]
    if model is not None:
        a = model.architecture
        r = a.rope
        tokens = min(3, a.context_length)
        cases.append(RopeCase(f"model rope ({r.convention}), last positions of the context",
                              n((tokens, a.n_heads, a.head_dim)), a.n_heads, a.head_dim, r.rotary_dim,
                              r.base, a.context_length - tokens, a.context_length, r.position_offset))
    return cases


@golden("rope", kernels=("rope",))
async def golden_rope(ctx: GoldenContext) -> list[GoldenResult]:
    results = []
    sizes = ctx.workgroups()
    tables = {}
    for case in rope_cases(ctx.rng, ctx.quick, ctx.model):
        key = (case.table_rows, case.rotary_dim, case.base, case.position_offset)
        if key not in tables:
            tables[key] = rope_table(*key)
        table = tables[key]
        qk = case.qk.astype(np.float32)
        for convention, adjacent in CONVENTIONS.items():
            for overrides in (o for wg in sizes for o in ctx.launches("rope", {"WG": wg, "ADJACENT": adjacent})):
                kernel = await ctx.kernel("rope", **overrides)
                got = await apply_rope(ctx.device, qk, table, case.start, convention,
                                       case.heads, case.head_dim, kernel)
                results.append(check_rope(label(kernel.spec, kernel.overrides), case.name, qk, table,
                                          case.start, convention, case.heads, case.head_dim, got))
    return results


# -- benchmark hook -----------------------------------------------------------------------------

BENCH_KERNELS = ("rope",)
# Q and K of a fused QKV buffer rotated in one dispatch: heads = query + KV heads, token_stride
# the whole QKV row. Decode rotates one token at position 1000; prefill 512 tokens from 0.
BENCH_SHAPES: dict[str, dict] = {
    f"{model} {phase}": {"tokens": tokens, "heads": h + k, "head_dim": e, "rotary_dim": e,
                         "token_stride": (h + 2 * k) * e, "start": start, "table_rows": start + tokens,
                         "base": base, "convention": "rotate-half"}
    for model, h, k, e, base in (("smollm2-135m", 9, 3, 64, 1e5), ("llama-3.2-1b", 32, 8, 64, 5e5),
                                 ("llama-3-8b", 32, 8, 128, 5e5))
    for phase, tokens, start in (("decode", 1, 1000), ("prefill", 512, 0))
}


async def prepare_bench(device: Device, name: str, shape: dict, rng: np.random.Generator) -> runner.Prepared:
    s = shape
    plan = plan_rope(device.limits, s["tokens"], s["heads"], s["head_dim"], s["rotary_dim"], s["start"],
                     s["table_rows"], s["convention"], s["token_stride"])
    kernel = await compile_kernel(device, name, **plan.overrides)
    table = rope_table(s["table_rows"], s["rotary_dim"], s["base"])
    qk = rng.standard_normal((s["tokens"], s["token_stride"]), np.float32)
    prepared = runner.prepare(device, kernel, plan.params, [table], [qk], plan.grid)
    rotated = s["tokens"] * s["heads"] * s["rotary_dim"]
    # rotated elements read and written, one (cos, sin) table row per token
    prepared.bytes_moved = 4 * 2 * rotated + 4 * s["tokens"] * s["rotary_dim"]
    prepared.flops = 3 * rotated
    return prepared
