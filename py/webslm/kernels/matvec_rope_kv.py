"""The stacked q|k|v mat-vec that also rotates q and k and appends k and v to the KV cache
(shaders/matvec_rope_kv.wgsl): registry entries, host side, golden tests.

    rkv_<mat-vec kernel>   the decode mat-vecs with a norm input (matvec_norm_*) or on
        activations quantized once (matvec_int8_*) of q4, q8, f16 and f32, entry main_rope_kv;
        their overrides and ADJACENT 0|1 (rotate-half, adjacent-pair), KV_F16 0|1 (the caches'
        element type)

In a decode layer the q|k|v mat-vec is followed by rope_kv_append (kernels/rope_kv.py): one
dispatch that reads back what the mat-vec just wrote. This kernel does that work in the
mat-vec's epilogue. A workgroup owns a "pair block" of one head, ROWS rows that hold every
RoPE partner of its rows (rotate-half: ROWS / 2 rows and the ROWS / 2 rows half a head further),
computed in one pass over x as the plain kernel computes ROWS consecutive rows (as many
workgroups as its launch), so it rotates them without reading another workgroup's output.

Bindings: the mat-vec's (params, weight parts, x [, norm weight] or xq, y), then
    rope       (uniform) the same block as params: the mat-vec's 8 words, then start, half,
               head_dim, capacity, q_rows, kv_rows, pair_blocks, 0 (`rope_words`)
    table      (read-only) rope.rope_table's [table_rows][head_dim / 2] (cos, sin)
    k_cache, v_cache  (storage) the layer's caches, kv_cache.KvLayout arrays
Limits, refused in `plan` before any GPU work: one token (decode), the device's storage buffers
a stage (the weight parts and six more: q4 with its mins needs 9; the k-quants and q5 would need
10 to 12 and have no fused form), whole-head rotation
(rotary_dim == head_dim) and no biases. ROWS is 4, 8 or 16 and divides head_dim: the
mat-vec's own ROWS where it is one of those, else 4 (each half of a pair block is whole f16
words, and ROWS rows are one pass of matvec_main's sums).

Rule (golden family "matvec_rope_kv"): y's k and v rows equal the plain mat-vec's of the same
launch shape bit for bit; its q rows, the cache rows at `start` and everything else are what
rope_kv_append's rules (rope_kv.check_rope_kv) allow for that plain y: rotations within rope's
bound, V bits exact, every other cache row unchanged.
"""
from __future__ import annotations

from typing import Mapping

import numpy as np

from . import kquant, matvec, matvec_prequant, runner
from .golden import GoldenContext, GoldenResult, compare_exact, golden, weight_format
from .golden import label as variant_label
from .kv_cache import KvLayout, KvShapeError
from .matvec import MatvecPlan, Weights
from .registry import KERNELS, KernelSpec, register
from .rope import CONVENTIONS, rope_table
from .rope_kv import RopeKvPlan, check_rope_kv, prior_cache
from .weights import PART_NAMES

PREFIX = matvec_prequant.ROPE_PREFIX
ROWS = (4, 8, 16)      # a pair block's halves are whole f16 words (and at most 16 rows: matvec_main's Partials)
EXTRA_BINDINGS = ("uniform", "read-only-storage", "storage", "storage")
# Storage buffers a stage that admission asks the device for (admission/pipelines.py
# KERNEL_LIMITS; WebGPU's default is 8), capped by the adapter.
STORAGE_BUFFERS_ASKED = 9


def kernel_name(matvec_kernel: str) -> str:
    return PREFIX + matvec_kernel


def storage_buffers(encoding: str) -> int:
    """Storage buffers the exact fused kernel of `encoding` binds (the pre-quantized one binds one
    fewer): its weight parts, x, the norm weight, y, the table and the two caches."""
    return len(PART_NAMES[encoding]) + 6


def fits(encoding: str, adapter_limits: Mapping[str, int]) -> bool:
    """Whether the fused kernel of `encoding` fits what a device of this adapter will allow."""
    allowed = min(STORAGE_BUFFERS_ASKED, int(adapter_limits.get("maxStorageBuffersPerShaderStage", 8)))
    return storage_buffers(encoding) <= allowed


def _specs():
    # only where the exact kernel fits the storage buffers admission asks for (q4, q8, f16, f32;
    # not the k-quants or q5, whose parts take more): the planner never takes the others
    bases = [spec for name, spec in KERNELS.items()
             if name.startswith(("matvec_norm_", "matvec_int8_")) and spec.entry_point == "main"
             and storage_buffers(weight_format(name, {})[0]) <= STORAGE_BUFFERS_ASKED]
    for base in bases:
        enables = tuple(name for name in base.sources if name.startswith("enable_"))
        rest = tuple(name for name in base.sources if name not in enables)
        yield KernelSpec(
            name=kernel_name(base.name),
            sources=enables + ("matvec_rope_kv_overrides.wgsl",) + rest + ("f16_round.wgsl", "matvec_rope_kv.wgsl"),
            entry_point="main_rope_kv",
            bindings=base.bindings + EXTRA_BINDINGS,
            overrides=base.overrides | {"ROWS": ROWS, "ADJACENT": (0, 1), "KV_F16": (0, 1)},
            requires=base.requires,
        )


register(*_specs())


def rope_words(matvec_params: np.ndarray, start: int, layout: KvLayout, heads: int, rows_per_group: int) -> np.ndarray:
    """The fused launch's uniform block: the mat-vec's 8 words, then the RoPE and cache words."""
    e = layout.head_dim
    tail = runner.params_words(start, e // 2, e, layout.capacity, heads * e, layout.n_kv_heads * e,
                               e // rows_per_group, 0)
    return np.concatenate([np.asarray(matvec_params, np.uint32)[:8], tail])


START_WORD = 8          # the position's word in the fused launch's uniform block


def params_at(words: np.ndarray, start: int, capacity: int) -> np.ndarray:
    """A fused launch's params for another position: what a decode step rewrites. The launch
    planned at the cache's last position vouches for every earlier one."""
    if not 0 <= start < capacity:
        raise KvShapeError("position", f"position {start} exceeds the capacity {capacity}")
    out = words.copy()
    out[START_WORD] = start
    return out


def plan(device, matvec_plan: MatvecPlan, weights: Weights, heads: int, layout: KvLayout, rotary_dim: int,
         start: int, table_rows: int, convention: str) -> MatvecPlan:
    """The mat-vec `matvec_plan` (matvec.plan with input "norm", or matvec_prequant.plan(...).matvec)
    as its RoPE + KV append form for one token at `start`: one workgroup per pair block of its
    ROWS rows (4 where its ROWS is not 4, 8 or 16 or splits a head). Refuses (KvShapeError)
    what the kernel cannot do; the params carry `start` (`rope_words`), which a decode step
    rewrites."""
    if convention not in CONVENTIONS:
        raise KvShapeError("shape", f"rope convention must be one of {sorted(CONVENTIONS)}, not {convention!r}")
    e = layout.head_dim
    if rotary_dim != e:
        raise KvShapeError("shape", f"the fused RoPE rotates whole heads: rotary_dim {rotary_dim} != head_dim {e}")
    if weights.rows != (heads + 2 * layout.n_kv_heads) * e:
        raise KvShapeError("shape", f"{weights.rows} rows are not q|k|v of {heads} + 2 x {layout.n_kv_heads} heads of {e}")
    if matvec_plan.grid[2] != 1:
        raise KvShapeError("shape", f"the fused RoPE + KV append takes one token, not {matvec_plan.grid[2]}")
    if not 0 <= start < min(layout.capacity, table_rows):
        raise KvShapeError("position", f"position {start} is outside the cache ({layout.capacity}) or the "
                                       f"table ({table_rows})")
    layout.check_device(device.limits)
    if matvec_plan.overrides.get("ACCUMULATE"):
        raise KvShapeError("shape", "q|k|v is written, not added to (ACCUMULATE)")
    rows_per_group = matvec_plan.overrides["ROWS"]
    if rows_per_group not in ROWS or e % rows_per_group:
        rows_per_group = 4        # head_dim is a multiple of 4 (KvLayout): pair blocks of 2 + 2 rows fit
    name = kernel_name(matvec_plan.kernel)
    if name not in KERNELS:
        raise KvShapeError("binding-count", f"{matvec_plan.kernel} has no fused RoPE form (its weight parts "
                                            f"take more than {STORAGE_BUFFERS_ASKED} storage buffers with it)")
    storage = sum(kind != "uniform" for kind in KERNELS[name].bindings)
    if storage > device.limits.get("maxStorageBuffersPerShaderStage", 8):
        raise KvShapeError("binding-count", f"{name} binds {storage} storage buffers; the device allows "
                                            f"{device.limits.get('maxStorageBuffersPerShaderStage', 8)} a stage")
    groups = weights.rows // rows_per_group
    gx, gy, _ = runner.workgroup_grid(groups, device.limits["maxComputeWorkgroupsPerDimension"])
    overrides = dict(matvec_plan.overrides) | {"ROWS": rows_per_group, "ADJACENT": CONVENTIONS[convention],
                                               "KV_F16": int(layout.dtype == "f16")}
    return MatvecPlan(name, overrides,
                      rope_words(matvec_plan.params, start, layout, heads, rows_per_group), (gx, gy, 1),
                      matvec_plan.inputs)


async def run(ctx: GoldenContext, weights: Weights, x: np.ndarray, g: np.ndarray, heads: int, layout: KvLayout,
              table: np.ndarray, start: int, convention: str, k_prior: np.ndarray, v_prior: np.ndarray, *,
              int8: bool = False, workgroup: int | None = None, rows_per_group: int | None = None,
              residual: bool = True, squares: bool = True, variant: str | None = None
              ) -> tuple[np.ndarray, np.ndarray, np.ndarray, dict, MatvecPlan]:
    """(y, K cache, V cache, overrides, the mat-vec's plan) of one fused launch on fresh buffers:
    y = W RMSNorm(x) g, exact (`variant` of the encoding's mat-vecs) or (`int8`) on x quantized
    by quantize_x_norm (`residual`: two bytes; `squares`: "xq2s", else the header), then RoPE and
    the append at `start`."""
    xs, stride = matvec.padded_activations(np.atleast_2d(np.asarray(x, np.float32)))
    gp = matvec.padded_norm_weight(g, weights.cols)
    norm = {"eps": 1e-5, "norm_elements": weights.cols}
    if int8:
        base = matvec_prequant.plan(ctx.device, weights, 1, stride, weights.rows, "norm", False, **norm,
                                    workgroup=workgroup, rows_per_group=rows_per_group, residual=residual,
                                    squares=squares)
        quantizer = await ctx.kernel(base.quantize.kernel, **base.quantize.overrides)
        (xq,) = await runner.run_once(ctx.device, quantizer, base.quantize.params, [xs, gp],
                                      [(matvec_prequant.xq_bytes(matvec_prequant.x_units(weights), 1, residual) // 4,
                                        np.uint32)], base.quantize.grid)
        mv, inputs = base.matvec, [xq]
    else:
        mv = matvec.plan(ctx.device, weights, 1, stride, weights.rows, "norm", **norm, workgroup=workgroup,
                         rows_per_group=rows_per_group, variant=variant)
        inputs = [xs, gp]
    p = plan(ctx.device, mv, weights, heads, layout, layout.head_dim, start, table.shape[0], convention)
    kernel = await ctx.kernel(p.kernel, **p.overrides)
    y, k_cache, v_cache = await runner.run_once(
        ctx.device, kernel, p.params, [*weights.bindings(), *inputs, np.asarray(table, np.float32)],
        [(weights.rows, np.float32), k_prior.reshape(-1).copy(), v_prior.reshape(-1).copy()], p.grid)
    return y, k_cache, v_cache, p.overrides, mv


async def plain_y(ctx: GoldenContext, weights: Weights, x: np.ndarray, g: np.ndarray, matvec_kernel: str,
                  overrides: dict, int8: bool) -> np.ndarray:
    """y of the plain mat-vec (exact, or on the same quantized x) with the fused launch's WG and ROWS."""
    norm = {"input": "norm", "norm_weight": g, "eps": 1e-5}
    if int8:
        return (await matvec_prequant.run(ctx, weights, np.atleast_2d(x), workgroup=overrides["WG"],
                                          rows_per_group=overrides["ROWS"], residual=bool(overrides["RESIDUAL"]),
                                          squares=bool(overrides["ROW_NORM"]), **norm)).reshape(-1)
    own = {k: v for k, v in overrides.items() if k in KERNELS[matvec_kernel].overrides}
    return (await matvec.matvec(ctx, weights, np.atleast_2d(x), matvec_kernel, own, **norm)).reshape(-1)


# -- golden tests ---------------------------------------------------------------------------

FAMILY = "matvec_rope_kv"

# (label, encoding, heads, kv heads, head_dim, cols, convention, cache dtype, start, capacity,
#  ROWS, WG, int8, x scale[, options: "format" (golden.weight_format's), int8 "residual" and
#  "squares" (default: two bytes, "xq2s"), the exact "variant"])
CASES = [
    ("SmolLM2-like q4", "q4", 9, 3, 64, 256, "rotate-half", "f16", 5, 40, 4, 64, False, 1.0),
    ("q8 adjacent pairs, f32 cache, ROWS 2 -> 4", "q8", 4, 2, 32, 128, "adjacent-pair", "f32", 0, 8, 2, 32, False, 1.0),
    ("f16 weights, 16 rows a block", "f16", 2, 1, 64, 96, "rotate-half", "f16", 17, 18, 16, 128, False, 1.0),
    ("head_dim 128, the last position", "q4", 4, 1, 128, 128, "rotate-half", "f32", 63, 64, 8, 256, False, 1e3),
    ("head_dim 8, 16 rows a block -> 4", "q8", 3, 1, 8, 64, "rotate-half", "f16", 1, 2, 16, 64, False, 1.0),
    ("q4 offset zero, f32 scales, adjacent pairs", "q4", 2, 2, 32, 256, "adjacent-pair", "f16", 3, 4, 4, 64, False, 1.0,
     {"format": ("q4", 64, "offset", "f32")}),
    ("int8 q4 (xq2s)", "q4", 8, 2, 64, 256, "rotate-half", "f16", 9, 12, 4, 64, True, 1.0),
    ("int8 q8 adjacent", "q8", 4, 4, 32, 256, "adjacent-pair", "f32", 2, 3, 8, 32, True, 1e-3),
    ("int8 q4 (xq2, the header), 16 rows", "q4", 2, 1, 32, 256, "rotate-half", "f16", 0, 2, 16, 32, True, 1.0,
     {"squares": False}),
    ("int8 q4 (xq, one byte)", "q4", 4, 2, 32, 256, "adjacent-pair", "f32", 1, 3, 4, 64, True, 10.0,
     {"residual": False, "squares": False}),
]
QUICK_CASES = [CASES[0], CASES[6]]


def _weights(rng, fmt: tuple, rows: int, cols: int) -> Weights:
    """Random weights of `fmt` = golden.weight_format's (encoding, block, zero, scale type)."""
    encoding, block, zero, scale_type = fmt
    if encoding in kquant.ENCODINGS:
        return kquant.random_weights(rng, encoding, rows, cols, block, zero, scale_type or "f16")
    return matvec.random_weights_fast(rng, encoding, rows, cols, block or 32, zero or "min", scale_type or "f16")


def _default_format(encoding: str) -> tuple:
    return weight_format(f"matvec_{encoding}", {})


def _planned_cases(ctx: GoldenContext) -> list[tuple]:
    """(case, options) to run: the case list outside admission; at admission one case of each
    planned pipeline, in its weight format, launch shape, convention, cache type and byte form."""
    if ctx.planned is None:
        return [(case[:14], case[14] if len(case) > 14 else {}) for case in (QUICK_CASES if ctx.quick else CASES)]
    out = []
    for name, items in sorted(ctx.planned):
        if not name.startswith(PREFIX):
            continue
        o = dict(items)
        base = name[len(PREFIX):]
        int8 = base.startswith("matvec_int8_")
        fmt = weight_format(base, o)
        options = {"format": fmt, "variant": matvec.variant_of(base), "residual": bool(o.get("RESIDUAL", 1)),
                   "squares": bool(o.get("ROW_NORM", 1))}
        out.append((("the plan's pipeline", fmt[0], 2, 1, 2 * o["ROWS"], 256,
                     "adjacent-pair" if o["ADJACENT"] else "rotate-half", "f16" if o["KV_F16"] else "f32",
                     1, 4, o["ROWS"], o["WG"], int8, 1.0), options))
    return out


@golden(FAMILY, kernels=(PREFIX,))
async def golden_matvec_rope_kv(ctx: GoldenContext) -> list[GoldenResult]:
    results = []
    for case, options in _planned_cases(ctx):
        label, encoding, heads, kv, e, cols, convention, dtype, start, capacity, rows_per_group, wg, int8, scale = case
        fmt = options.get("format") or _default_format(encoding)
        weights = _weights(ctx.rng, fmt, (heads + 2 * kv) * e, cols)
        if int8 and not matvec_prequant.serves(ctx.device, weights):
            continue
        layout = KvLayout(kv, capacity, e, dtype)
        x = (scale * ctx.rng.standard_normal(cols)).astype(np.float32)
        g = (1 + 0.5 * ctx.rng.standard_normal(cols)).astype(np.float32)
        table = rope_table(capacity, e, 1e4)
        k_prior, v_prior = prior_cache(ctx.rng, layout, start, 1), prior_cache(ctx.rng, layout, start, 1)
        try:
            y, k_cache, v_cache, overrides, mv = await run(
                ctx, weights, x, g, heads, layout, table, start, convention, k_prior, v_prior, int8=int8,
                workgroup=wg, rows_per_group=rows_per_group, residual=options.get("residual", True),
                squares=options.get("squares", True), variant=options.get("variant"))
        except KvShapeError as exc:
            if exc.problem != "binding-count" or ctx.planned is not None:
                raise
            continue            # a device with fewer storage buffers a stage (a browser's 8): not run
        name = variant_label(KERNELS[kernel_name(mv.kernel)], overrides)
        want = await plain_y(ctx, weights, x, g, mv.kernel, overrides, int8)
        what = (f"{label}: {encoding} {heads}/{kv} heads of {e}, K={cols}, {convention}, {dtype} cache, "
                f"position {start} of {capacity}{', int8 x' if int8 else ''}")
        q_rows = heads * e
        results.append(compare_exact(FAMILY, name, f"{what}: y's k and v rows against the plain mat-vec",
                                     y[q_rows:].view(np.uint32), want[q_rows:].view(np.uint32)))
        q = want[:q_rows].reshape(1, heads, e)
        k = want[q_rows:q_rows + kv * e].reshape(1, kv, e)
        v = want[q_rows + kv * e:].reshape(1, kv, e)
        sections = RopeKvPlan("", {}, np.zeros(4, np.uint32), (1, 1, 1), 0, q_rows, q_rows + kv * e, weights.rows)
        results += check_rope_kv(name, what, layout, q, k, v, table, start, convention, k_prior, v_prior,
                                 want, sections, y, k_cache, v_cache, family=FAMILY)
    return results
